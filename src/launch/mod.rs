//! Launch one attempt: spawn in its own process group, pass output through, watch it.
//!
//! # Theory of operation
//!
//! `run()` resolves argv[0] itself (so "not found" and "not executable" are distinct errors
//! that list what was tried), spawns the child as the leader of a new process group (pipe
//! mode) or of a new session on a fresh pseudo-terminal (tty mode), starts a guardian
//! process (see `guard`), and then runs one single-threaded `poll(2)` loop over:
//!
//! * the child's stdout and stderr pipes (grown to 1 MiB; one pipe for both when our own
//!   stdout and stderr are one file, as with `> log 2>&1`, so their order is kept; or the pty
//!   master), read straight into the bounded log's ring (its last 1 MiB by default), at
//!   most 64 KiB at a time, each chunk then written to our stdout/stderr first, then fed
//!   to the scanner; a turn that emptied its
//!   pipes of a burst waits 250 µs before the next poll, so that chatty output is read in
//!   fewer, fuller reads (`GATHER_FOR`);
//! * the self-pipe of `Signals`, whose handlers only count signals.
//!
//! Only one extra thread exists while the loop runs, in tty mode: it forwards our stdin to
//! the pty master. Once an attempt is over, a short-lived thread reaps its guardian.
//!
//! The loop keeps reading at all times, including while the group is being terminated, so a
//! child blocked on a full pipe can always make progress and exit. The attempt ends when:
//!
//! 1. the direct child has exited and been reaped,
//! 2. nothing of the attempt is alive: no non-zombie member in the process group and no live
//!    process carrying the attempt's marker (`tree`) — if something is, it gets SIGTERM,
//!    `grace` later SIGKILL, and we wait a little more for it to disappear (bounded), and
//! 3. the output reached end of file, or 200 ms passed since (2): a process that left the
//!    group may hold the pipe open for ever, and must not hang oomguard.
//!
//! So when `run()` returns, the next attempt may start: nothing of this one holds GPU memory.
//!
//! Why a marker as well as the group: torchrun starts each worker with
//! `start_new_session=True`, so the workers — the processes holding GPU memory — are NOT in
//! the child's process group. The child's environment gets `OOMGUARD_ATTEMPT=<unique id>`
//! (`MARKER_VAR`), which the workers inherit; cleanup and the guardian signal every live
//! process of ours whose /proc/PID/environ carries it. The one exception left: a descendant
//! that leaves the group (setsid/setpgid) AND is started with a cleaned environment
//! (`env -i`) escapes both nets; `run()` still returns (the output stops being awaited 200 ms
//! after the rest is gone), but that process survives.
//!
//! Hang detection: once the scanner is armed (an OOM in a fatal form: the exception line
//! ending a traceback, or `torch.OutOfMemoryError`; never a line that merely mentions an
//! OOM), `hang_timeout` with no output while the direct child is still alive means the run
//! is stuck (NCCL ranks waiting for a dead peer, typically): SIGTERM the group, SIGKILL
//! after `grace`, `hung = true`.
//!
//! Known limits: if our own stdout blocks (a reader that stopped reading), the loop blocks in
//! write(2) with it, hang detection included. In pipe mode the child inherits our stdin but
//! is not the terminal's foreground group: a child that reads a terminal stdin is stopped by
//! SIGTTIN (torchrun does not read stdin). `run()` must be called from a thread that lives
//! until it returns (PR_SET_PDEATHSIG is tied to the spawning thread); it always does.

mod guard;
mod output;
mod signals;
mod slurm;
mod spawn;
mod taskfiles;
mod tree;

#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::detect;
pub use crate::signal::Signal;

pub use guard::guard_main;
pub use signals::{Signals, inherited_ignored};
pub use taskfiles::{TaskFiles, from_srun as task_files_of_srun};
pub use tree::MARKER_VAR;

use output::{Log, RawOut, Sink};

/// After the group is gone, how long to keep waiting for end of file on the output.
const EOF_WAIT: Duration = Duration::from_millis(200);
/// How often, at most, the attempt's process tree is looked at (for the kernel's
/// OOM-killer record); the poll loop wakes at least every 500 ms while the child lives.
const PID_SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// After SIGKILL, how long to wait for the processes to disappear before giving up.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// How often [`Spec::stop_when`] is asked while the command runs.
const STOP_CHECK_EVERY: Duration = Duration::from_millis(500);
/// After a stop at a torchrun worker's OOM, how often to look for workers it started
/// again (a worker imports torch for a second or more before it trains).
const RESTART_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Asked every [`STOP_CHECK_EVERY`] while the command runs; `Some(why)` ends the
/// attempt as a hang does (SIGTERM to its processes, SIGKILL after the grace
/// period), and the report says why (`Report::stopped`). A job's copy uses it to
/// hear, while its own ranks still run, that the job has moved on.
#[derive(Clone)]
pub struct StopWhen(pub std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>);

impl fmt::Debug for StopWhen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StopWhen(..)")
    }
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Byte-exact, never through a shell; argv[0] is looked up in PATH (the PATH of
    /// `env_set` if it sets one, else ours).
    pub argv: Vec<OsString>,
    /// Set on top of the inherited environment.
    pub env_set: Vec<(OsString, OsString)>,
    /// true: the child gets a pseudo-terminal (stdout and stderr both to it); false: pipes.
    pub tty: bool,
    /// Save a bounded copy of the output here (created mode 0600; the caller creates the
    /// directories).
    pub log: Option<PathBuf>,
    /// Keep the first N bytes ...
    pub log_head_bytes: u64,
    /// ... and the last M bytes, with "\n[oomguard: N bytes omitted]\n" between.
    pub log_tail_bytes: u64,
    /// After an OOM is seen: no output for this long and still alive => kill, `hung`.
    pub hang_timeout: Duration,
    /// SIGTERM -> wait `grace` -> SIGKILL.
    pub grace: Duration,
    /// When the command is `srun` writing its tasks' output to files
    /// (`--output=logs/%j-%t.out`): those files are read and scanned too.
    pub task_files: Option<TaskFiles>,
    /// Ends the attempt early when it answers (see [`StopWhen`]).
    pub stop_when: Option<StopWhen>,
    /// A relaunch after an OOM: watch the output for the step the failed
    /// attempt died at ([`Report::back_at`]).
    pub back_to: Option<crate::progress::StepWatch>,
    /// The command is torchrun with `--max-restarts N` (N > 0): torchrun's worker
    /// group failures (its `failed (exitcode: ...)` lines) are counted into this
    /// attempt, and once a worker died of a pending GPU OOM the attempt is ended
    /// at once, before torchrun re-runs the settings that ran out (see
    /// [`Report::torchrun`]).
    pub torchrun_restarts: Option<u32>,
}

/// torchrun's own restarts within one attempt (`--max-restarts N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TorchrunRestarts {
    /// `--max-restarts N`.
    pub max_restarts: u32,
    /// How many times torchrun restarted its workers within this attempt.
    pub restarts: u32,
    /// A worker died of a GPU OOM and oomguard ended the attempt before torchrun
    /// restarted the workers with the same settings.
    pub stopped_at_oom: bool,
}

/// How the direct child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(Signal),
}

impl Exit {
    /// The shell's convention: the exit code, or 128+N for death by signal N.
    pub fn status_code(&self) -> i32 {
        match *self {
            Exit::Code(c) => c,
            Exit::Signal(s) => s.exit_code(),
        }
    }

    fn from_status(status: ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(Signal::from_raw(s)),
            (None, None) => Exit::Code(status.into_raw()),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(
                f,
                "signal {} ({})",
                s.raw(),
                s.name().unwrap_or("unknown signal")
            ),
        }
    }
}

/// What happened during one attempt.
#[derive(Debug)]
pub struct Report {
    /// The direct child's pid (also its process group id).
    pub pid: u32,
    pub exit: Exit,
    /// The user signal (SIGINT/SIGTERM/SIGHUP/SIGQUIT) received and forwarded during this
    /// attempt, if any (the first one).
    pub interrupted: Option<Signal>,
    /// Killed by us because it hung after an OOM.
    pub hung: bool,
    /// Everything the child printed went through `scanner.feed(stream, bytes)`.
    pub scanner: detect::Scanner,
    pub duration: Duration,
    /// Time from start to the OOM that was pending at the end (see `detect`), if any.
    pub oom_at: Option<Duration>,
    /// Problems that did not stop supervision, e.g. "could not write log ...: disk full".
    pub warnings: Vec<String>,
    /// The processes of the attempt's tree seen while it ran (sampled every 250-500 ms),
    /// the direct child first: whose death the kernel's OOM-killer record may explain.
    pub pids: detect::kernel::RunPids,
    /// The names (`comm`) of those processes: a kernel record must name one.
    pub names: std::collections::BTreeSet<String>,
    /// Their memory cgroups (`/proc/PID/cgroup`): a kernel record that names another
    /// is not this run's.
    pub cgroups: std::collections::BTreeSet<String>,
    /// When it started, in milliseconds since boot (the kernel log's clock).
    pub started_ms: Option<detect::kernel::Millis>,
    /// Why [`Spec::stop_when`] ended the attempt, if it did.
    pub stopped: Option<String>,
    /// The per-task output files read (see [`Spec::task_files`]).
    pub task_files: Vec<PathBuf>,
    /// The per-task file the pending OOM was found in, when it was in one.
    pub oom_file: Option<PathBuf>,
    /// Time from start until the output first showed the step [`Spec::back_to`]
    /// watches for; `None` when it never did (or nothing was watched).
    pub back_at: Option<Duration>,
    /// The checkpoints the output announced it saved (`detect::saves`).
    pub saves: Vec<detect::saves::Announced>,
    /// torchrun's own restarts in this attempt (when [`Spec::torchrun_restarts`]).
    pub torchrun: Option<TorchrunRestarts>,
    /// The last [`TAIL_BYTES`] of the output (stdout, stderr and the tasks' output files,
    /// as they came): where a parser's refusal of an argument oomguard added is read (`detect::refusal`).
    pub tail: Vec<u8>,
}

/// How much of an attempt's last output [`Report::tail`] keeps.
pub const TAIL_BYTES: usize = 64 << 10;

#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// Exit 127.
    #[error(
        "{}: command not found (searched: {}); is it installed, and is its environment \
         (venv, conda) activated?",
        .program.to_string_lossy(),
        show_dirs(.searched)
    )]
    NotFound {
        program: OsString,
        searched: Vec<PathBuf>,
    },
    /// Exit 126.
    #[error("{}: cannot execute: {reason}", .program.to_string_lossy())]
    NotExecutable { program: OsString, reason: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn show_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "nothing: the command is empty".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs one attempt to its end; see the module documentation.
pub fn run(spec: &Spec, signals: &Signals) -> Result<Report, Error> {
    let merge = !spec.tty && spawn::same_output();
    run_wired(
        spec,
        signals,
        &mut RawOut::stdout(),
        &mut RawOut::stderr(),
        merge,
    )
}

/// `run` with the destinations of the child's stdout and stderr given (tests capture them).
#[cfg(test)]
pub(crate) fn run_with(
    spec: &Spec,
    signals: &Signals,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Report, Error> {
    run_wired(spec, signals, out, err, false)
}

/// `run` with the destinations given; `merge`: one pipe for the child's stdout and
/// stderr (see `spawn::Wiring::Merged`), its output going to `out`.
pub(crate) fn run_wired(
    spec: &Spec,
    signals: &Signals,
    out: &mut dyn Write,
    err: &mut dyn Write,
    merge: bool,
) -> Result<Report, Error> {
    let Some(program) = spec.argv.first() else {
        return Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty command",
        )));
    };
    let resolved = spawn::resolve(program, search_path(spec).as_deref())?;

    let mut warnings = Vec::new();
    let wiring = if spec.tty {
        spawn::Wiring::Pty(spawn::open_pty(spawn::our_winsize())?)
    } else if merge {
        spawn::Wiring::merged()?
    } else {
        spawn::Wiring::Pipes
    };
    let marker = new_marker();
    let mut env = spec.env_set.clone();
    env.push((MARKER_VAR.into(), marker.clone().into()));

    // Noted before the command starts: what the task files held before is not its.
    let files = spec.task_files.as_ref().map(taskfiles::Reader::new);
    // Signals that arrived between attempts and only make sense for a running child.
    signals.forget_stale();
    let start = Instant::now();
    let started_ms = detect::kernel::now_ms();
    let child = spawn::spawn_child(&resolved, &spec.argv, &env, &wiring)
        .map_err(|e| spawn::map_spawn_error(program, &resolved, e))?;
    let pid = child.id() as i32;
    // From here on, any early return drops `attempt`, which kills and reaps.
    let mut attempt = Attempt {
        child,
        pid,
        marker,
        born: tree::start_time(pid),
        srun: slurm::is_srun(program),
        cancelled: false,
        done: false,
        guardian: None,
        stdin_fwd: None,
    };

    let (mut streams, master) = output_streams(&mut attempt.child, wiring)?;
    match guard::Guardian::start(pid, &attempt.marker, attempt.srun) {
        Ok(g) => attempt.guardian = Some(g),
        Err(e) => {
            tracing::warn!("could not start the guardian: {e}");
            warnings.push(format!(
                "could not start the guardian process ({e}): if oomguard is killed, \
                 processes of this attempt may survive it"
            ));
        }
    }
    if let Some(m) = &master {
        match StdinForwarder::start(m.try_clone()?) {
            Ok(f) => attempt.stdin_fwd = Some(f),
            Err(e) => warnings.push(format!("could not forward stdin to the terminal: {e}")),
        }
    }

    let mut w = Watch::new(spec, start, out, err);
    w.files = files;
    if let Some(files) = w.files.as_ref()
        && attempt.srun
    {
        files.find_step(pid as u32);
    }
    let outcome = supervise(&mut attempt, &mut streams, &mut w, signals, master.as_ref())?;
    let torchrun = spec.torchrun_restarts.map(|max_restarts| {
        // Each worker group failure was followed by a restart, except the one
        // that ended the attempt: oomguard stopped torchrun at it, or torchrun
        // gave up (a failed exit of its own, not a hang or a signal).
        let gave_up = !outcome.worker_oom
            && !outcome.hung
            && outcome.interrupted.is_none()
            && outcome.stopped.is_none()
            && outcome.exit != Exit::Code(0);
        let last = u32::from(outcome.worker_oom || gave_up);
        TorchrunRestarts {
            max_restarts,
            restarts: w.group_failures.saturating_sub(last).min(max_restarts),
            stopped_at_oom: outcome.worker_oom,
        }
    });
    drop(streams);
    attempt.finish();

    w.read_files(Instant::now(), true);
    w.finish(&mut warnings);
    warnings.extend(outcome.warnings);
    Ok(Report {
        pid: pid as u32,
        exit: outcome.exit,
        interrupted: outcome.interrupted,
        hung: outcome.hung,
        scanner: w.scanner,
        duration: start.elapsed(),
        oom_at: w.oom_at,
        pids: std::mem::take(&mut w.pids),
        names: std::mem::take(&mut w.names),
        cgroups: std::mem::take(&mut w.cgroups),
        started_ms,
        stopped: outcome.stopped,
        task_files: w.files.as_ref().map(|f| f.files()).unwrap_or_default(),
        oom_file: w.oom_file.take(),
        back_at: w.back_at,
        saves: std::mem::replace(&mut w.saves, detect::saves::Saves::new(Default::default()))
            .finish(),
        tail: w.log.last(TAIL_BYTES),
        warnings,
        torchrun,
    })
}

/// The PATH argv[0] is looked up in: the last one `env_set` sets, else ours.
fn search_path(spec: &Spec) -> Option<OsString> {
    spec.env_set
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var_os("PATH"))
}

/// The child's output, ready for the poll loop (non-blocking, pipes grown): its
/// stdout and stderr pipes, or the pty master; and in tty mode a second handle
/// on the master, for stdin and window sizes.
fn output_streams(
    child: &mut Child,
    wiring: spawn::Wiring,
) -> io::Result<(Vec<StreamFd>, Option<OwnedFd>)> {
    let mut streams: Vec<StreamFd> = Vec::new();
    let mut master: Option<OwnedFd> = None;
    match wiring {
        spawn::Wiring::Pipes => {
            if let Some(o) = child.stdout.take() {
                streams.push(StreamFd::new(OwnedFd::from(o), detect::Stream::Out));
            }
            if let Some(e) = child.stderr.take() {
                streams.push(StreamFd::new(OwnedFd::from(e), detect::Stream::Err));
            }
        }
        spawn::Wiring::Merged { read, write } => {
            drop(write); // only the child holds the write end now: EOF when it is done
            // Scanned as one stream: the scanner keeps one partial line per stream.
            streams.push(StreamFd::new(read, detect::Stream::Out));
        }
        spawn::Wiring::Pty(pty) => {
            drop(pty.slave); // only the child holds the slave now: EOF when it is done
            master = Some(pty.master.try_clone()?);
            streams.push(StreamFd::new(pty.master, detect::Stream::Out));
        }
    }
    for s in &mut streams {
        output::set_nonblocking(&s.fd)?;
        s.size = output::grow_pipe(&s.fd);
    }
    Ok((streams, master))
}

fn new_marker() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}.{}.{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// One output fd of the child.
struct StreamFd {
    fd: OwnedFd,
    kind: detect::Stream,
    open: bool,
    /// The pipe's size (0: a pty, or not known).
    size: usize,
}

impl StreamFd {
    fn new(fd: OwnedFd, kind: detect::Stream) -> Self {
        StreamFd {
            fd,
            kind,
            open: true,
            size: 0,
        }
    }
}

/// Where output goes and what it told us.
struct Watch<'a> {
    spec: &'a Spec,
    start: Instant,
    out: Sink<&'a mut dyn Write>,
    err: Sink<&'a mut dyn Write>,
    /// The output's log, and its last bytes (see [`Report::tail`]).
    log: Log,
    scanner: detect::Scanner,
    oom_at: Option<Duration>,
    last_output: Instant,
    /// The attempt's processes seen so far, and when the tree was last looked at.
    pids: detect::kernel::RunPids,
    names: std::collections::BTreeSet<String>,
    cgroups: std::collections::BTreeSet<String>,
    pids_at: Option<Instant>,
    /// The tasks' output files, when srun writes them (see `taskfiles`).
    files: Option<taskfiles::Reader>,
    /// The file the pending OOM came from, when it came from one.
    oom_file: Option<PathBuf>,
    /// The step watched for (see `Spec::back_to`), and when it was seen.
    back: Option<crate::progress::StepWatch>,
    back_at: Option<Duration>,
    /// The checkpoints the output announced (see [`Report::saves`]).
    saves: detect::saves::Saves,
    /// torchrun's worker group failures seen (with [`Spec::torchrun_restarts`]),
    /// and the last bytes of each stream, for a line split across chunks.
    group_failures: u32,
    failure_carry: [Vec<u8>; 3],
    /// A worker died (a group failure) while a GPU OOM was pending: torchrun
    /// would now restart it with the same settings.
    worker_oom: bool,
}

impl<'a> Watch<'a> {
    fn new(spec: &'a Spec, start: Instant, out: &'a mut dyn Write, err: &'a mut dyn Write) -> Self {
        Watch {
            spec,
            start,
            out: Sink::new(out),
            err: Sink::new(err),
            log: Log::open(
                spec.log.as_deref(),
                spec.log_head_bytes,
                spec.log_tail_bytes,
                TAIL_BYTES,
            ),
            scanner: detect::Scanner::new(),
            oom_at: None,
            last_output: Instant::now(),
            pids: detect::kernel::RunPids::new(),
            names: Default::default(),
            cgroups: Default::default(),
            pids_at: None,
            files: None,
            oom_file: None,
            back: spec.back_to.clone(),
            back_at: None,
            saves: detect::saves::Saves::new(std::env::current_dir().unwrap_or_default()),
            group_failures: 0,
            failure_carry: Default::default(),
            worker_oom: false,
        }
    }

    /// torchrun's worker group failures in `chunk` (its agent's `failed
    /// (exitcode: N) local_rank: R (pid: P)` line, one per failed group); a
    /// failure while a GPU OOM is pending means the OOM ended a worker.
    fn group_failures_in(&mut self, kind: detect::Stream, chunk: &[u8]) {
        const NEEDLE: &[u8] = b"failed (exitcode: ";
        // A failure's line has its exit code after the words: a digit, or `-` of a signal's
        // (-9). Torchrun's logging, interrupted by our SIGTERM while it wrote that line,
        // prints its format string instead ("Message: 'failed (exitcode: %s) ..."), which
        // is no failure (it made one OOM's stop count as two restarts).
        let counts = |text: &[u8], at: usize| {
            text.get(at + NEEDLE.len())
                .is_some_and(|b| b.is_ascii_digit() || *b == b'-')
        };
        let carry = &mut self.failure_carry[kind as usize];
        // A line split across chunks: matches that start in the carry (a match whose
        // exit code has not come yet stays in the carry: the carry is a whole needle long).
        let mut window = std::mem::take(carry);
        let from_carry = window.len();
        window.extend_from_slice(&chunk[..chunk.len().min(NEEDLE.len())]);
        let mut n = memchr::memmem::find_iter(&window, NEEDLE)
            .filter(|&at| at < from_carry && counts(&window, at))
            .count();
        n += memchr::memmem::find_iter(chunk, NEEDLE)
            .filter(|&at| counts(chunk, at))
            .count();
        // The next carry, the last needle's length of what came, in the window's own
        // buffer: no allocation per chunk on the output path.
        if chunk.len() >= NEEDLE.len() {
            window.clear();
            window.extend_from_slice(&chunk[chunk.len() - NEEDLE.len()..]);
        } else {
            window.drain(..window.len().saturating_sub(NEEDLE.len()));
        }
        *carry = window;
        if n == 0 {
            return;
        }
        self.group_failures += n as u32;
        if self
            .scanner
            .first_oom()
            .is_some_and(|f| f.kind == detect::Kind::GpuOom)
        {
            self.worker_oom = true;
        }
    }

    /// New lines of the tasks' output files (when due, or all of them at the
    /// `last` read): scanned and logged, not passed through (srun sent them to
    /// files, not to the terminal); they count as output for the hang timer.
    fn read_files(&mut self, now: Instant, last: bool) {
        let Some(files) = self.files.as_mut() else {
            return;
        };
        let (scanner, log) = (&mut self.scanner, &mut self.log);
        let (oom_at, oom_file) = (&mut self.oom_at, &mut self.oom_file);
        let (start, last_output) = (self.start, &mut self.last_output);
        let (back, back_at) = (&mut self.back, &mut self.back_at);
        let saves = &mut self.saves;
        files.read(now, last, |path, bytes| {
            saves.feed(detect::Stream::Files as usize, bytes);
            if let Some(b) = back.as_mut()
                && b.feed(detect::Stream::Files as usize, bytes)
            {
                *back_at = Some(start.elapsed());
            }
            if scanner.feed(detect::Stream::Files, bytes) {
                *oom_at = Some(start.elapsed());
                *oom_file = Some(path.to_path_buf());
            } else if scanner.first_oom().is_none() {
                *oom_at = None;
                *oom_file = None;
            }
            log.feed(bytes);
            *last_output = now;
        });
    }

    /// The output is over: let the scanner and the log finish, and turn what
    /// could not be written into warnings.
    fn finish(&mut self, warnings: &mut Vec<String>) {
        self.scanner.finish();
        self.log.finish();
        warnings.extend(self.log.warning.take());
        for (name, sink) in [
            ("stdout", &mut self.out.error),
            ("stderr", &mut self.err.error),
        ] {
            if let Some(e) = sink.take() {
                warnings.push(format!(
                    "could not write the command's output to our {name} ({e}); \
                     kept reading, scanning and logging it"
                ));
            }
        }
    }

    /// Note the processes of the attempt's tree, at most every 250 ms (a walk of
    /// /proc/PID/task/PID/children from the child: a few reads for a training's tree).
    fn sample_pids(&mut self, pid: i32) {
        let now = Instant::now();
        if self
            .pids_at
            .is_some_and(|t| now.duration_since(t) < PID_SAMPLE_EVERY)
        {
            return;
        }
        self.pids_at = Some(now);
        tree::descendants(pid, &mut self.pids, &mut self.names, &mut self.cgroups);
    }

    /// Reads once from `fd` (one of the child's streams) into the log, and passes what
    /// came on: Ok(Some((n, filled))) with `n` the bytes read (0: end of file) and whether
    /// the read got all it asked for (more may be waiting); Ok(None): nothing now.
    fn read_from(&mut self, kind: detect::Stream, fd: RawFd) -> io::Result<Option<(usize, bool)>> {
        let Some((ring, at, filled)) = self.log.read_from(fd)? else {
            return Ok(None);
        };
        let n = at.len();
        if n > 0 {
            self.pass(kind, ring.bytes(at.clone()));
        }
        self.log.put_back(ring, at);
        Ok(Some((n, filled)))
    }

    /// Our stream first (live), then the scanner and the other readers; not the log
    /// (which the bytes were read into).
    fn pass(&mut self, kind: detect::Stream, chunk: &[u8]) {
        match kind {
            detect::Stream::Err => self.err.write(chunk),
            _ => self.out.write(chunk),
        }
        if self.scanner.feed(kind, chunk) {
            self.oom_at = Some(self.start.elapsed());
            self.oom_file = None;
        } else if self.scanner.first_oom().is_none() {
            self.oom_at = None; // the OOM was survived (see detect's "pending")
            self.oom_file = None;
        }
        if let Some(b) = self.back.as_mut()
            && b.feed(kind as usize, chunk)
        {
            self.back_at = Some(self.start.elapsed());
        }
        self.saves.feed(kind as usize, chunk);
        if self.spec.torchrun_restarts.is_some() {
            self.group_failures_in(kind, chunk);
        }
        self.last_output = Instant::now();
    }
}

/// The in-flight attempt. Dropping it unfinished (an error or a panic in the loop) kills
/// everything and reaps, so no exit path leaves processes behind.
struct Attempt {
    child: Child,
    pid: i32,
    marker: String,
    /// When the child started (see `tree::start_time`): its marker's carriers started
    /// then or later. None when it could not be read: every process is looked at.
    born: Option<u64>,
    /// The child is `srun`: its tasks are Slurm's, ended through the controller (`slurm`).
    srun: bool,
    /// `scancel` was run for this attempt's step.
    cancelled: bool,
    done: bool,
    guardian: Option<guard::Guardian>,
    stdin_fwd: Option<StdinForwarder>,
}

impl Attempt {
    /// SIGKILL everything of the attempt; for `srun`, cancel its step first
    /// (killing srun alone would leave its tasks running on the nodes).
    fn kill_all(&mut self) {
        if self.srun && !self.cancelled {
            self.cancelled = true;
            if let Some(what) = slurm::cancel_step_of(self.pid as u32) {
                tracing::info!("cancelled Slurm {what}");
            }
        }
        tree::kill_group(self.pid, Signal::KILL);
        self.kill_marked(Signal::KILL);
    }

    /// Sends `sig` to every live process carrying the attempt's marker.
    fn kill_marked(&self, sig: Signal) {
        tree::kill_marked_born(&self.marker, self.born, sig);
    }

    /// Normal end: the group is gone; tell the guardian so and stop the stdin thread.
    fn finish(&mut self) {
        self.done = true;
        if let Some(f) = self.stdin_fwd.take() {
            f.stop();
        }
        if let Some(g) = self.guardian.take() {
            // Reaped on a thread of its own: the next attempt does not wait for it.
            drop(g.release());
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.kill_all();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(f) = self.stdin_fwd.take() {
            f.stop();
        }
        // Dropping the guardian unreleased closes its pipe: it SIGKILLs the group too.
        self.guardian.take();
    }
}

struct Outcome {
    exit: Exit,
    interrupted: Option<Signal>,
    hung: bool,
    stopped: Option<String>,
    /// Ended by oomguard when a torchrun worker died of a GPU OOM.
    worker_oom: bool,
    warnings: Vec<String>,
}

/// The poll loop; see the module documentation.
fn supervise(
    attempt: &mut Attempt,
    streams: &mut [StreamFd],
    w: &mut Watch<'_>,
    signals: &Signals,
    master: Option<&OwnedFd>,
) -> Result<Outcome, Error> {
    let mut st = LoopState::new();

    loop {
        // ---- how long may poll sleep?
        let timeout = st.poll_timeout(w);

        // ---- wait for output or a signal
        let (wake_ready, ready) = wait_ready(streams, signals, timeout)?;

        // ---- signals
        if wake_ready {
            signals.drain_wake();
        }
        let mut child_signal = st.handle_signals(signals, attempt, w, master);

        // ---- output
        let turn = read_output(streams, &ready, w, &mut st.warnings);
        if turn.eof {
            child_signal = true; // EOF: the child has likely exited
        }

        // ---- the direct child
        st.reap(attempt, streams, child_signal)?;
        if st.exited.is_none() {
            w.sample_pids(attempt.pid);
        }

        let now = Instant::now();
        if st.exited.is_none() {
            w.read_files(now, false);
        }
        st.check_stop(attempt, w, now);
        st.check_worker_oom(attempt, w, now);
        st.escalate(attempt, w, now);

        // ---- done?
        if let (Some(exit), Some(gone)) = (st.exited, st.gone_at) {
            let all_eof = streams.iter().all(|s| !s.open);
            if all_eof || now >= gone + EOF_WAIT {
                drain_rest(streams, w);
                return Ok(Outcome {
                    exit,
                    interrupted: st.interrupted,
                    hung: st.hung,
                    stopped: st.stop_why,
                    worker_oom: st.worker_oom,
                    warnings: st.warnings,
                });
            }
        }

        // ---- a chatty child: let its output gather before the next read
        if turn.gather() {
            std::thread::sleep(GATHER_FOR);
        }
    }
}

/// What the poll loop knows between turns: how the direct child ended, how
/// far the termination of the rest has gone, and the user's signals so far.
struct LoopState {
    exited: Option<Exit>,
    term_at: Option<Instant>,
    kill_at: Option<Instant>,
    gone_at: Option<Instant>,
    hung: bool,
    interrupted: Option<Signal>,
    /// Why `Spec::stop_when` ended the attempt, and when it was last asked.
    stop_why: Option<String>,
    /// The attempt was ended because a torchrun worker died of a GPU OOM.
    worker_oom: bool,
    /// The attempt's processes when it was told to stop at a worker's OOM, and when
    /// they were last compared with the live ones (see `check_restart_after_stop`).
    stopped_pids: Vec<i32>,
    restart_checked: Instant,
    stop_checked: Instant,
    /// How many of each user interrupt arrived: a second SIGINT, SIGTERM or SIGHUP
    /// kills the group at once (a first SIGTERM or SIGHUP starts the grace period).
    sigints: usize,
    sigterms: usize,
    sighups: usize,
    sigquits: usize,
    /// When to send `srun` the second SIGINT that makes it end its step.
    second_sigint_at: Option<Instant>,
    stopped: bool,
    /// try_wait costs a system call: only after a SIGCHLD, at end of output, or
    /// every 500 ms as a backstop (keeps pass-through CPU near `cat`'s).
    last_wait: Instant,
    warnings: Vec<String>,
}

impl LoopState {
    fn new() -> Self {
        LoopState {
            exited: None,
            term_at: None,
            kill_at: None,
            gone_at: None,
            hung: false,
            interrupted: None,
            stop_why: None,
            worker_oom: false,
            stopped_pids: Vec::new(),
            restart_checked: Instant::now(),
            stop_checked: Instant::now(),
            sigints: 0,
            sigterms: 0,
            sighups: 0,
            sigquits: 0,
            second_sigint_at: None,
            stopped: false,
            last_wait: Instant::now(),
            warnings: Vec::new(),
        }
    }

    /// How long poll may sleep: until the nearest deadline (a backstop, the
    /// hang timeout, the end of the grace period, the wait for end of file).
    fn poll_timeout(&self, w: &Watch<'_>) -> Duration {
        let now = Instant::now();
        let mut deadline: Option<Instant> = None;
        let mut at = |t: Instant| deadline = Some(deadline.map_or(t, |d: Instant| d.min(t)));
        if self.exited.is_none() {
            // Backstop for a SIGCHLD we could not see (e.g. reaped by a wait elsewhere).
            at(now + Duration::from_millis(500));
            if w.scanner.armed() && self.term_at.is_none() && !self.stopped {
                at(w.last_output + w.spec.hang_timeout);
            }
            if w.spec.stop_when.is_some() && self.term_at.is_none() {
                at(self.stop_checked + STOP_CHECK_EVERY);
            }
            if self.worker_oom && self.kill_at.is_none() {
                at(self.restart_checked + RESTART_CHECK_EVERY);
            }
            if let Some(f) = &w.files {
                at(f.next_at());
            }
        } else {
            // Cleanup: watch the group closely (each look scans /proc).
            at(now + Duration::from_millis(50));
        }
        if let (Some(t), None) = (self.term_at, self.kill_at) {
            at(t + w.spec.grace);
        }
        if let Some(t) = self.second_sigint_at {
            at(t);
        }
        if let Some(g) = self.gone_at {
            at(g + EOF_WAIT);
        }
        deadline
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(500))
    }

    /// Forwards the signals we received to the group (a second Ctrl-C kills
    /// it); true when one of them was SIGCHLD.
    fn handle_signals(
        &mut self,
        signals: &Signals,
        attempt: &mut Attempt,
        w: &mut Watch<'_>,
        master: Option<&OwnedFd>,
    ) -> bool {
        let pgid = attempt.pid;
        let mut child_signal = false;
        for (sig, n) in signals.take_new() {
            let now = Instant::now();
            match sig {
                Signal::INT | Signal::TERM | Signal::HUP | Signal::QUIT => {
                    self.interrupted.get_or_insert(sig);
                    // Why: SIGTERM (`kill`, a scheduler) and SIGHUP (`tmux kill-server`, a
                    // closed terminal) mean "stop now": a command that ignores them would
                    // otherwise keep the GPUs with nobody left to stop it. They are
                    // forwarded, and `escalate` sends SIGKILL when `grace` is over; the
                    // same one again kills at once, as a second Ctrl-C does.
                    let ends = matches!(sig, Signal::TERM | Signal::HUP);
                    let count = match sig {
                        Signal::INT => &mut self.sigints,
                        Signal::TERM => &mut self.sigterms,
                        Signal::HUP => &mut self.sighups,
                        _ => &mut self.sigquits,
                    };
                    *count += n;
                    let again = *count >= 2 && sig != Signal::QUIT;
                    if again {
                        tracing::info!("second interrupt: killing process group {pgid}");
                        attempt.kill_all();
                        self.term_at.get_or_insert(now);
                        self.kill_at.get_or_insert(now);
                    } else {
                        tree::kill_group(pgid, sig);
                        if ends {
                            self.term_at.get_or_insert(now);
                        }
                        // srun ignores one SIGINT ("one more within 1 sec to abort"):
                        // the second, a moment later, ends the step (the tasks get
                        // Ctrl-C). The grace period then applies as for SIGTERM.
                        if sig == Signal::INT && attempt.srun && self.exited.is_none() {
                            self.second_sigint_at = Some(now + slurm::SECOND_SIGINT);
                            self.term_at.get_or_insert(now);
                        }
                    }
                }
                Signal::USR1 | Signal::USR2 => {
                    tree::kill_group(pgid, sig);
                }
                Signal::TSTP => {
                    // In tty mode the child's group is orphaned (its parent is in another
                    // session), and the kernel discards SIGTSTP sent to an orphaned group.
                    let stop = if w.spec.tty {
                        Signal::STOP
                    } else {
                        Signal::TSTP
                    };
                    tree::kill_group(pgid, stop);
                    self.stopped = true;
                    // Stopped by the signal the user sent, so the shell reports 148
                    // (SIGTSTP), not 147; we continue here on SIGCONT.
                    signals::stop_self();
                }
                Signal::CONT => {
                    tree::kill_group(pgid, Signal::CONT);
                    self.stopped = false;
                    w.last_output = now; // time spent stopped is not a hang
                }
                Signal::WINCH => {
                    if let (Some(m), Some(ws)) = (master, spawn::our_winsize()) {
                        spawn::set_winsize(m.as_raw_fd(), &ws);
                    }
                }
                _ => child_signal = true, // SIGCHLD: the try_wait in `reap`
            }
        }
        child_signal
    }

    /// Reaps the direct child if it has exited (see `last_wait` for when we look).
    fn reap(
        &mut self,
        attempt: &mut Attempt,
        streams: &[StreamFd],
        child_signal: bool,
    ) -> Result<(), Error> {
        let backstop = self.last_wait.elapsed() >= Duration::from_millis(500);
        if self.exited.is_none() && (child_signal || backstop || streams.iter().all(|s| !s.open)) {
            self.last_wait = Instant::now();
            match attempt.child.try_wait() {
                Ok(Some(status)) => self.exited = Some(Exit::from_status(status)),
                Ok(None) => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
        Ok(())
    }

    /// Asks `Spec::stop_when` (when due, while the command runs and is not being
    /// ended already); an answer ends the attempt as a hang does.
    fn check_stop(&mut self, attempt: &Attempt, w: &Watch<'_>, now: Instant) {
        let Some(stop) = &w.spec.stop_when else {
            return;
        };
        if self.exited.is_some()
            || self.term_at.is_some()
            || now < self.stop_checked + STOP_CHECK_EVERY
        {
            return;
        }
        self.stop_checked = now;
        if let Some(why) = (stop.0)() {
            let pgid = attempt.pid;
            tracing::info!("{why}: terminating process group {pgid}");
            tree::kill_group(pgid, Signal::TERM);
            attempt.kill_marked(Signal::TERM);
            self.term_at = Some(now);
            self.stop_why = Some(why);
        }
    }

    /// A torchrun worker died of a GPU OOM (see [`Spec::torchrun_restarts`]): end
    /// the attempt now, as a hang is ended, before torchrun restarts the workers
    /// with the settings that just ran out of memory.
    fn check_worker_oom(&mut self, attempt: &mut Attempt, w: &Watch<'_>, now: Instant) {
        if self.worker_oom {
            self.check_restart_after_stop(attempt, now);
            return;
        }
        if !w.worker_oom || self.exited.is_some() || self.term_at.is_some() {
            return;
        }
        let pgid = attempt.pid;
        tracing::info!("a torchrun worker died of an OOM: terminating process group {pgid}");
        self.stopped_pids = tree::marked_pids_born(&attempt.marker, attempt.born);
        tree::kill_group(pgid, Signal::TERM);
        for &pid in &self.stopped_pids {
            tree::kill_pid(pid, Signal::TERM);
        }
        self.term_at = Some(now);
        self.restart_checked = now;
        self.worker_oom = true;
    }

    /// torchrun can swallow the SIGTERM that stops it: its handler raises an exception,
    /// and when that lands inside a `try: ... except Exception` (Python's logging, while
    /// it writes the very "failed (exitcode: 1)" line oomguard acted on, prints
    /// "--- Logging error ---" and goes on), torchrun restarts the workers with the
    /// settings that ran out of memory. A process of the attempt born after the stop is
    /// such a restart: everything of the attempt is killed at once.
    fn check_restart_after_stop(&mut self, attempt: &mut Attempt, now: Instant) {
        if self.exited.is_some()
            || self.kill_at.is_some()
            || now < self.restart_checked + RESTART_CHECK_EVERY
        {
            return;
        }
        self.restart_checked = now;
        let new: Vec<i32> = tree::marked_pids_born(&attempt.marker, attempt.born)
            .into_iter()
            .filter(|p| !self.stopped_pids.contains(p))
            .collect();
        if !new.is_empty() {
            let pgid = attempt.pid;
            tracing::info!(
                "process group {pgid} started {new:?} after it was told to stop at a worker's OOM \
                 (its SIGTERM was swallowed): killing it"
            );
            attempt.kill_all();
            self.kill_at = Some(now);
        }
    }

    /// The next step towards nothing of the attempt being alive: SIGTERM on a
    /// hang after an OOM or once the direct child has exited, SIGKILL when the
    /// grace period is over, and noting when the group is gone.
    fn escalate(&mut self, attempt: &mut Attempt, w: &Watch<'_>, now: Instant) {
        let pgid = attempt.pid;
        if let Some(t) = self.second_sigint_at
            && now >= t
        {
            self.second_sigint_at = None;
            if self.exited.is_none() && self.kill_at.is_none() {
                tracing::info!("second SIGINT to srun {pgid}: it ends the step");
                tree::kill_group(pgid, Signal::INT);
            }
        }
        if self.exited.is_none() {
            if w.scanner.armed()
                && self.term_at.is_none()
                && !self.stopped
                && now.duration_since(w.last_output) >= w.spec.hang_timeout
            {
                tracing::info!(
                    "no output for {:?} after an OOM: terminating process group {pgid}",
                    w.spec.hang_timeout
                );
                self.hung = true;
                tree::kill_group(pgid, Signal::TERM);
                attempt.kill_marked(Signal::TERM);
                self.term_at = Some(now);
            }
        } else if self.gone_at.is_none() {
            self.clean_up_after_exit(attempt, now);
        }
        if let (Some(t), None) = (self.term_at, self.kill_at)
            && now >= t + w.spec.grace
        {
            tracing::info!("grace period over: killing process group {pgid}");
            attempt.kill_all();
            self.kill_at = Some(now);
        }
    }

    /// The direct child has exited: terminate the rest of the attempt, or note
    /// that it is gone (or that it outlived SIGKILL, which we stop waiting for).
    fn clean_up_after_exit(&mut self, attempt: &Attempt, now: Instant) {
        let pgid = attempt.pid;
        let alive = tree::group_alive(pgid)
            || !tree::marked_pids_born(&attempt.marker, attempt.born).is_empty();
        if !alive {
            self.gone_at = Some(now);
        } else if self.term_at.is_none() {
            tracing::debug!("child exited; terminating the rest of group {pgid}");
            tree::kill_group(pgid, Signal::TERM);
            attempt.kill_marked(Signal::TERM);
            self.term_at = Some(now);
        } else if let Some(k) = self.kill_at
            && now >= k + KILL_WAIT
        {
            let msg = format!(
                "processes of group {pgid} were still present {:?} after SIGKILL",
                KILL_WAIT
            );
            tracing::warn!("{msg}");
            self.warnings.push(msg);
            self.gone_at = Some(now);
        }
    }
}

/// Polls our wake fd and the open streams for at most `timeout`: whether the
/// wake fd is ready, and which streams are.
fn wait_ready(
    streams: &[StreamFd],
    signals: &Signals,
    timeout: Duration,
) -> Result<(bool, [bool; 2]), Error> {
    // At most two streams (stdout and stderr, or the pty master): fixed arrays
    // keep allocation off this per-chunk path.
    debug_assert!(streams.len() <= 2);
    let mut ready = [false; 2];
    let mut wake_ready = false;
    // A fixed array, not a Vec: a Vec here was one allocation per read
    // (`pass_through_allocates_nothing_per_line`). Unused slots are not polled.
    let mut fds = [
        PollFd::new(signals.wake_fd(), PollFlags::POLLIN),
        PollFd::new(signals.wake_fd(), PollFlags::empty()),
        PollFd::new(signals.wake_fd(), PollFlags::empty()),
    ];
    let (mut open, mut n_open) = ([0usize; 2], 0);
    for (i, st) in streams.iter().enumerate().filter(|(_, st)| st.open) {
        fds[1 + n_open] = PollFd::new(st.fd.as_fd(), PollFlags::POLLIN);
        open[n_open] = i;
        n_open += 1;
    }
    let open = &open[..n_open];
    // Round up: rounding down would spin on poll(0) for the last
    // fraction of a millisecond before every deadline.
    let ms = timeout.as_micros().div_ceil(1000).clamp(0, 60_000) as u16;
    match nix::poll::poll(&mut fds[..1 + n_open], PollTimeout::from(ms)) {
        Ok(_) => {
            wake_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
            for (slot, &i) in open.iter().enumerate() {
                ready[i] = fds[slot + 1].revents().is_some_and(|r| !r.is_empty());
            }
        }
        Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(Error::Io(e.into())),
    }
    Ok((wake_ready, ready))
}

/// A turn of the loop that read at least this much from pipes it emptied...
const GATHER_AFTER: usize = 16 << 10;

/// ...waits this long before it polls again, so that the next turn takes the output
/// in fewer, fuller reads. A command printing at training speed (a line now and then)
/// never waits; one printing megabytes a second costs oomguard far less CPU (about a
/// third less for 256 MiB of progress lines: benches/README.md), and its output reaches
/// the screen at most this much later. The pipe holds what comes meanwhile: a 1 MiB one
/// fills in 250 µs only at 4 GB/s, so the command is not held up (it is never waited for
/// with a smaller pipe, or a terminal's).
const GATHER_FOR: Duration = Duration::from_micros(250);

/// What one turn read.
struct Turn {
    /// A stream reached end of file.
    eof: bool,
    bytes: usize,
    /// Every stream read was emptied, and each is a pipe of [`output::PIPE_SIZE`].
    caught_up: bool,
}

impl Turn {
    /// Whether the loop waits [`GATHER_FOR`] before its next poll.
    fn gather(&self) -> bool {
        !self.eof && self.caught_up && self.bytes >= GATHER_AFTER
    }
}

/// Reads the ready streams and passes on what they hold.
fn read_output(
    streams: &mut [StreamFd],
    ready: &[bool; 2],
    w: &mut Watch<'_>,
    warnings: &mut Vec<String>,
) -> Turn {
    let mut turn = Turn {
        eof: false,
        bytes: 0,
        caught_up: true,
    };
    for (i, s) in streams.iter_mut().enumerate() {
        if !ready[i] || !s.open {
            continue;
        }
        turn.caught_up &= s.size >= output::PIPE_SIZE;
        // Drain what is there (bounded, so the other stream and signals
        // get their turn): fewer polls per byte. A pipe's read takes up to 64 KiB, a
        // terminal's at most 4 KiB: the same bound in bytes is more reads.
        let mut emptied = false;
        let reads = if s.size > 0 { 8 } else { 64 };
        for _ in 0..reads {
            match w.read_from(s.kind, s.fd.as_raw_fd()) {
                Ok(Some((0, _))) => {
                    s.open = false;
                    turn.eof = true;
                    break;
                }
                Ok(Some((n, filled))) => {
                    turn.bytes += n;
                    // A pipe gives all it holds, so a short read emptied it; a terminal
                    // gives at most a line discipline's buffer (4 KiB) a read, so only
                    // "nothing now" says it is empty (one poll per 4 KiB was most of the
                    // loop's turns in tty mode).
                    if !filled && s.size > 0 {
                        emptied = true;
                        break; // the pipe is empty for now
                    }
                }
                Ok(None) => {
                    emptied = true;
                    break;
                }
                Err(e) => {
                    warnings.push(format!("reading the command's output failed: {e}"));
                    s.open = false;
                    break;
                }
            }
        }
        turn.caught_up &= emptied;
    }
    turn
}

/// What is already in the pipes is output too: take it, boundedly (a process
/// that left the group could write for ever).
fn drain_rest(streams: &mut [StreamFd], w: &mut Watch<'_>) {
    for s in streams.iter_mut().filter(|s| s.open) {
        for _ in 0..64 {
            match w.read_from(s.kind, s.fd.as_raw_fd()) {
                Ok(Some((n, _))) if n > 0 => {}
                _ => break,
            }
        }
        s.open = false;
    }
}

/// Tty mode: a thread copying our stdin to the pty master, so the child can be answered
/// (a pdb prompt, "overwrite? [y/N]"). Our terminal stays in cooked mode: the user edits a
/// line and Ctrl-C/Ctrl-Z are signals to oomguard, which forwards them.
struct StdinForwarder {
    stop: Option<OwnedFd>,
    handle: Option<JoinHandle<()>>,
}

impl StdinForwarder {
    fn start(master: OwnedFd) -> io::Result<StdinForwarder> {
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let handle = std::thread::Builder::new()
            .name("oomguard-stdin".into())
            .spawn(move || forward_stdin(master, stop_r))?;
        Ok(StdinForwarder {
            stop: Some(stop_w),
            handle: Some(handle),
        })
    }

    fn stop(mut self) {
        self.stop.take(); // closing the write end wakes the thread
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn forward_stdin(master: OwnedFd, stop: OwnedFd) {
    // SAFETY: fd 0 is open for the life of the process (or poll reports POLLNVAL).
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let is_tty = nix::unistd::isatty(stdin).unwrap_or(false);
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            PollFd::new(stdin, PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        let Some(r) = fds[1].revents() else { continue };
        if r.contains(PollFlags::POLLNVAL) {
            return;
        }
        if r.is_empty() {
            continue;
        }
        // In the background, leave the terminal's input to the foreground job.
        if is_tty && nix::unistd::tcgetpgrp(stdin).ok() != Some(nix::unistd::getpgrp()) {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let n = match output::read_some(0, &mut buf) {
            Ok(Some(0)) if is_tty => {
                // Ctrl-D on a terminal: pass the end-of-file on (VEOF of the pty, ^D).
                if !write_master(master.as_raw_fd(), b"\x04", &stop) {
                    return;
                }
                continue;
            }
            Ok(Some(0)) | Err(_) => return,
            Ok(Some(n)) => n,
            Ok(None) => continue,
        };
        if !write_master(master.as_raw_fd(), &buf[..n], &stop) {
            return;
        }
    }
}

/// Writes all of `bytes` to the (non-blocking) master; false when told to stop or on error.
fn write_master(master: RawFd, mut bytes: &[u8], stop: &OwnedFd) -> bool {
    while !bytes.is_empty() {
        // SAFETY: bytes is a valid slice; master is open (we hold a dup).
        let n = unsafe { libc::write(master, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                // SAFETY: master stays open for this call.
                let m = unsafe { std::os::fd::BorrowedFd::borrow_raw(master) };
                let mut fds = [
                    PollFd::new(stop.as_fd(), PollFlags::POLLIN),
                    PollFd::new(m, PollFlags::POLLOUT),
                ];
                let _ = nix::poll::poll(&mut fds, PollTimeout::from(200u16));
                if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}
