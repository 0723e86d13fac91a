//! Unit tests of `launch`, with real child processes (`sh`, and the python3 programs in
//! tests/children/). Output is captured by `run_with`, which is `run` with the destinations
//! of stdout/stderr given; everything else (spawn, group, guardian, signals) is the real path.
//!
//! Signal handling is process-wide: tests that send a signal to this test process take the
//! write side of `SIGNAL_LOCK`, every other test the read side, so a signal never reaches
//! another test's attempt.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::*;

static SIGNAL_LOCK: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    SIGNAL_LOCK.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    SIGNAL_LOCK.write().unwrap_or_else(|e| e.into_inner())
}

fn child(name: &str) -> String {
    format!("{}/tests/children/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn spec(argv: &[&str]) -> Spec {
    Spec {
        argv: argv.iter().map(OsString::from).collect(),
        env_set: Vec::new(),
        tty: false,
        log: None,
        log_head_bytes: 1 << 20,
        log_tail_bytes: 1 << 20,
        hang_timeout: Duration::from_secs(60),
        grace: Duration::from_secs(2),
        task_files: None,
        stop_when: None,
        back_to: None,
        torchrun_restarts: None,
    }
}

/// Runs with stdout/stderr captured; returns the report and both outputs.
fn run_captured(spec: &Spec) -> (Result<Report, Error>, Vec<u8>, Vec<u8>) {
    let signals = Signals::install().expect("install signals");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = run_with(spec, &signals, &mut out, &mut err);
    (r, out, err)
}

fn ok(r: Result<Report, Error>, out: &[u8], err: &[u8]) -> Report {
    match r {
        Ok(r) => r,
        Err(e) => panic!(
            "run failed: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(out),
            String::from_utf8_lossy(err)
        ),
    }
}

/// Polls `f` until it is true or `limit` passes; never a fixed sleep as the assertion.
fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn alive(pids: &[i32]) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|&p| tree::pid_alive(p))
        .collect()
}

/// A writer other threads can read while `run` writes to it.
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs `spec` in a thread with output into shared buffers.
fn run_in_thread(
    spec: Spec,
) -> (
    std::thread::JoinHandle<Result<Report, Error>>,
    SharedBuf,
    SharedBuf,
) {
    let (out, err) = (SharedBuf::default(), SharedBuf::default());
    let (mut o, mut e) = (out.clone(), err.clone());
    let signals = Signals::install().expect("install signals");
    let h = std::thread::spawn(move || run_with(&spec, &signals, &mut o, &mut e));
    (h, out, err)
}

fn raise(sig: i32) {
    // SAFETY: sending a signal to ourselves; the handlers only count it.
    assert_eq!(unsafe { libc::kill(libc::getpid(), sig) }, 0);
}

// ---------------------------------------------------------------- the guardian's entry

/// Not a test: the entry point of the guardian process in unit tests (see
/// `guard::guard_command`). Does nothing in a normal test run.
#[test]
fn guardian_entry() {
    if std::env::var_os("OOMGUARD_TEST_GUARDIAN").is_none() {
        return;
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    // [exe, name, --exact, --test-threads=1, --nocapture, pgid, marker]
    guard_main(&args[5..]);
}

/// Not a test: a stand-in for the oomguard process, for tests that SIGKILL "oomguard".
/// Runs the argv in OOMGUARD_TEST_HARNESS_ARGV (separated by 0x1F) through `run`.
#[test]
fn harness_entry() {
    let Some(argv) = std::env::var_os("OOMGUARD_TEST_HARNESS_ARGV") else {
        return;
    };
    let argv: Vec<String> = argv
        .to_str()
        .unwrap()
        .split('\x1f')
        .map(str::to_owned)
        .collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut s = spec(&argv);
    s.tty = std::env::var_os("OOMGUARD_TEST_HARNESS_TTY").is_some();
    let signals = Signals::install().unwrap();
    let code = match run(&s, &signals) {
        Ok(r) => r.exit.status_code(),
        Err(_) => 255,
    };
    std::process::exit(code);
}

// ---------------------------------------------------------------- output

#[test]
fn output_passes_through_byte_exact() {
    let _g = shared();
    // Non-UTF-8, \r progress updates, ANSI colours, and a 3 MB chunk with no newline at the
    // end, on both streams.
    let script = r#"
import sys
o, e = sys.stdout.buffer, sys.stderr.buffer
o.write(b"\xff\xfe\x00 not utf-8\n")
for i in range(5):
    o.write(b"\rprogress %d%%" % (i * 25)); o.flush()
o.write(b"\n\x1b[31mred\x1b[0m\n")
e.write(b"err \xc3\x28 line\r\n"); e.flush()
o.write(b"y" * 3_000_000); o.flush()
"#;
    let s = spec(&["python3", "-c", script]);
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    let mut want = b"\xff\xfe\x00 not utf-8\n".to_vec();
    for i in 0..5 {
        want.extend_from_slice(format!("\rprogress {}%", i * 25).as_bytes());
    }
    want.extend_from_slice(b"\n\x1b[31mred\x1b[0m\n");
    want.extend(std::iter::repeat_n(b'y', 3_000_000));
    assert!(
        out == want,
        "stdout differs: {} bytes vs {} expected",
        out.len(),
        want.len()
    );
    assert_eq!(err, b"err \xc3\x28 line\r\n");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

/// Counts bytes and checks they are all `b'z'`, without keeping them.
struct CountingZ {
    n: u64,
    other: u64,
}

impl Write for CountingZ {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.n += buf.len() as u64;
        self.other += buf.iter().filter(|&&b| b != b'z').count() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_100_mb_line_without_newline_passes_through() {
    let _g = shared();
    let s = spec(&[
        "python3",
        "-c",
        "import sys\nb = b'z' * (1 << 20)\nfor _ in range(100): sys.stdout.buffer.write(b)",
    ]);
    let signals = Signals::install().unwrap();
    let mut out = CountingZ { n: 0, other: 0 };
    let mut err = Vec::new();
    let r = run_with(&s, &signals, &mut out, &mut err).unwrap();
    assert_eq!(r.exit, Exit::Code(0));
    assert_eq!(out.n, 100 << 20);
    assert_eq!(out.other, 0);
}

/// A writer that fails like a closed pipe.
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::EPIPE))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn sink_stops_writing_after_an_error_and_records_it() {
    let mut sink = output::Sink::new(Vec::new());
    sink.write(b"abc");
    sink.write(b"\r\xff");
    assert_eq!(sink.into_inner(), b"abc\r\xff");

    let mut sink = output::Sink::new(Broken);
    sink.write(b"one");
    sink.write(b"two");
    assert_eq!(
        sink.error.as_ref().and_then(|e| e.raw_os_error()),
        Some(libc::EPIPE)
    );
}

#[test]
fn closed_stdout_keeps_the_child_drained_and_scanned() {
    let _g = shared();
    // 2 MB (more than a pipe holds) after our stdout broke, then an OOM line: the child must
    // not block, and the scanner must still see the OOM.
    let script = "import sys\nsys.stdout.write('x' * 2_000_000 + '\\n')\nsys.stdout.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\\n')";
    let s = spec(&["python3", "-c", script]);
    let signals = Signals::install().unwrap();
    let mut err = Vec::new();
    let r = run_with(&s, &signals, &mut Broken, &mut err).unwrap();
    assert_eq!(r.exit, Exit::Code(0));
    assert!(r.oom_at.is_some(), "scanner did not see the OOM");
    assert!(r.scanner.first_oom().is_some());
    assert!(
        r.warnings.iter().any(|w| w.contains("stdout")),
        "{:?}",
        r.warnings
    );
}

// ---------------------------------------------------------------- exit status

#[test]
fn exit_code_and_death_by_signal() {
    let _g = shared();
    let (r, out, err) = run_captured(&spec(&["sh", "-c", "exit 3"]));
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(3));
    assert_eq!(r.exit.status_code(), 3);
    assert_eq!(r.exit.to_string(), "exit code 3");
    assert_eq!(r.interrupted, None);
    assert!(!r.hung);

    let (r, out, err) = run_captured(&spec(&["sh", "-c", "kill -KILL $$"]));
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Signal(Signal::KILL));
    assert_eq!(r.exit.status_code(), 137);
    assert_eq!(r.exit.to_string(), "signal 9 (SIGKILL)");
}

#[test]
fn argv_is_passed_byte_exact_and_env_is_set() {
    let _g = shared();
    use std::os::unix::ffi::OsStringExt;
    let mut s = spec(&["sh", "-c", r#"printf '%s|' "$@" "$OOMG_TEST_VAR""#, "sh"]);
    s.argv.push(OsString::from("two words"));
    s.argv.push(OsString::from_vec(b"\xff;$(x)".to_vec()));
    s.env_set
        .push(("OOMG_TEST_VAR".into(), "set by spec".into()));
    let (r, out, err) = run_captured(&s);
    ok(r, &out, &err);
    assert_eq!(out, b"two words|\xff;$(x)|set by spec|");
}

// ---------------------------------------------------------------- the group

#[test]
fn rest_of_the_group_is_killed_when_the_child_exits() {
    let _g = shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    let f = file.to_str().unwrap();
    let (r, out, err) = run_captured(&spec(&["python3", &child("spawn_tree.py"), f, "exit"]));
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    let pids = read_pids(&file);
    assert_eq!(pids.len(), 5, "{pids:?}");
    // run() returns only when nothing of the attempt is left.
    assert_eq!(alive(&pids), Vec::<i32>::new());
    // They die of SIGTERM: no need to wait for the grace period.
    assert!(r.duration < Duration::from_secs(2), "{:?}", r.duration);
}

#[test]
fn workers_in_their_own_session_are_killed_too() {
    let _g = shared();
    // torchrun starts workers with start_new_session=True: outside the group.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    let f = file.to_str().unwrap();
    let (r, out, err) = run_captured(&spec(&[
        "python3",
        &child("spawn_tree.py"),
        f,
        "setsid-exit",
    ]));
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    let pids = read_pids(&file);
    assert_eq!(pids.len(), 5, "{pids:?}");
    // On failure, say what each process of the tree was then.
    let left = alive(&pids);
    let seen: Vec<String> = pids
        .iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            let marked = String::from_utf8_lossy(&env).contains(tree::MARKER_VAR);
            format!(
                "{p}: environ {} bytes, marked {marked}, stat {stat}",
                env.len()
            )
        })
        .collect();
    assert_eq!(
        left,
        Vec::<i32>::new(),
        "after {:?}, warnings {:?}:\n{}",
        r.duration,
        r.warnings,
        seen.join("\n")
    );
}

#[test]
fn processes_ignoring_sigterm_are_killed_after_grace() {
    let _g = shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gc");
    let mut s = spec(&[
        "sh",
        "-c",
        r#"python3 "$0" "$1" & while [ ! -s "$1" ]; do sleep 0.02; done; echo "$!" >> "$1.sh"; exit 0"#,
        &child("ignore_term.py"),
        file.to_str().unwrap(),
    ]);
    s.grace = Duration::from_millis(500);
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    let mut pids = read_pids(&file);
    pids.extend(read_pids(&dir.path().join("gc.sh")));
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_eq!(alive(&pids), Vec::<i32>::new());
    assert!(r.duration >= s.grace, "{:?}", r.duration);
    assert!(
        r.duration < s.grace + Duration::from_secs(3),
        "{:?}",
        r.duration
    );
}

#[test]
fn a_hang_after_an_oom_is_killed() {
    let _g = shared();
    let mut s = spec(&["python3", &child("oom_then_hang.py")]);
    s.hang_timeout = Duration::from_millis(500);
    s.grace = Duration::from_millis(500);
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert!(r.hung);
    assert_eq!(r.exit, Exit::Signal(Signal::TERM));
    let oom_at = r.oom_at.expect("OOM seen");
    assert!(r.scanner.first_oom().is_some());
    assert!(
        r.duration >= oom_at + s.hang_timeout,
        "{:?} {oom_at:?}",
        r.duration
    );
    assert!(
        r.duration < oom_at + s.hang_timeout + s.grace + Duration::from_secs(2),
        "{:?}",
        r.duration
    );
    assert!(String::from_utf8_lossy(&err).contains("CUDA out of memory"));
}

/// A torchrun that swallows the SIGTERM oomguard sends at a worker's OOM (Python's
/// logging catches the exception torchrun's handler raises and goes on) and restarts
/// its workers: the restarted worker is killed as it starts, before it trains with the
/// settings that ran out, and not after the grace period.
#[test]
fn a_torchrun_that_swallows_the_stop_and_restarts_is_killed_at_once() {
    let _g = shared();
    let dir = tempfile::tempdir().unwrap();
    let trained = dir.path().join("trained");
    let script = r#"trap 'echo "--- Logging error ---" >&2' TERM
python3 -c 'import sys; sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.32 GiB is reserved by PyTorch but unallocated.\n")'
echo "E1127 13:55:05.022000 12896 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 12918) of binary: python" >&2
sleep 1
python3 -c 'import sys, time; time.sleep(1.5); open(sys.argv[1], "w").write("trained")' "$0"
exit 0"#;
    let mut s = spec(&["sh", "-c", script, trained.to_str().unwrap()]);
    s.torchrun_restarts = Some(2);
    s.grace = Duration::from_secs(30);
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    let text = String::from_utf8_lossy(&err);
    assert!(text.contains("--- Logging error ---"), "{text}");
    assert_eq!(r.exit, Exit::Signal(Signal::KILL), "{text}");
    assert!(
        r.duration < Duration::from_secs(10),
        "killed at the restart, not after the grace period: {:?}",
        r.duration
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(!trained.exists(), "the restarted worker trained");
    let t = r.torchrun.expect("torchrun's restarts are counted");
    assert!(t.stopped_at_oom);
    assert_eq!(t.restarts, 0);
}

/// `stop_when` ends a command that would run for a minute, as soon as it answers
/// (asked every half second), and the report says why.
#[test]
fn stop_when_ends_a_running_command_and_says_why() {
    let _g = shared();
    let t = tempfile::tempdir().unwrap();
    let flag = t.path().join("decision");
    let mut s = spec(&["sh", "-c", "echo started; sleep 60"]);
    s.grace = Duration::from_millis(500);
    let f = flag.clone();
    s.stop_when = Some(StopWhen(Arc::new(move || {
        f.exists().then(|| "copy 0 decided".to_string())
    })));
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        std::fs::write(&flag, "").unwrap();
    });
    let (r, out, err) = run_captured(&s);
    writer.join().unwrap();
    let r = ok(r, &out, &err);
    assert_eq!(r.stopped.as_deref(), Some("copy 0 decided"));
    assert_eq!(r.exit, Exit::Signal(Signal::TERM));
    assert!(!r.hung);
    assert!(r.duration < Duration::from_secs(5), "{:?}", r.duration);
    assert_eq!(out, b"started\n");
}

/// Task files (as `srun --output=logs/%t.out` writes them) are read while the
/// command runs: the OOM in one of them is found, named, arms the hang timer, and
/// their lines reach neither our stdout nor stderr; a file's older content is not read.
#[test]
fn an_oom_in_a_task_file_is_found_and_named() {
    let _g = shared();
    let t = tempfile::tempdir().unwrap();
    let logs = t.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(
        logs.join("0.out"),
        "old: torch.OutOfMemoryError: CUDA out of memory.\n",
    )
    .unwrap();
    let script = format!(
        "cd {}; echo 'step 1' > logs/0.out; printf 'Traceback (most recent call last):\\n  File \"t.py\", line 1\\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\\n' > logs/1.out; echo through; sleep 60",
        t.path().display()
    );
    let mut s = spec(&["sh", "-c", &script]);
    s.hang_timeout = Duration::from_millis(1500);
    s.grace = Duration::from_millis(500);
    s.task_files = Some(TaskFiles {
        patterns: vec!["logs/%t.out".into()],
        cwd: t.path().to_path_buf(),
        job: None,
    });
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert_eq!(r.oom_file.as_deref(), Some(logs.join("1.out").as_path()));
    let f = r.scanner.first_oom().expect("the OOM in logs/1.out");
    assert!(f.line.starts_with("torch.OutOfMemoryError"), "{}", f.line);
    assert!(r.hung, "the OOM in the file armed the hang timer");
    assert!(r.duration < Duration::from_secs(10), "{:?}", r.duration);
    assert_eq!(r.task_files, [logs.join("0.out"), logs.join("1.out")]);
    assert_eq!(out, b"through\n");
    assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
}

#[test]
fn no_hang_detection_without_an_oom() {
    let _g = shared();
    let mut s = spec(&["sh", "-c", "sleep 1; echo done"]);
    s.hang_timeout = Duration::from_millis(100);
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert!(!r.hung);
    assert_eq!(r.exit, Exit::Code(0));
    assert_eq!(out, b"done\n");
}

#[test]
fn a_process_that_left_the_group_and_holds_stdout_does_not_hang_run() {
    let _g = shared();
    // setsid leaves the group and `env -i` drops the attempt marker: the documented escape.
    // It keeps our stdout pipe open; run() must return anyway.
    let (r, out, err) = run_captured(&spec(&[
        "sh",
        "-c",
        "setsid env -i sleep 30 & echo $!; exit 0",
    ]));
    let r = ok(r, &out, &err);
    let pid: i32 = String::from_utf8_lossy(&out).trim().parse().unwrap();
    tree::kill_pid(pid, Signal::KILL);
    assert_eq!(r.exit, Exit::Code(0));
    assert!(r.duration < Duration::from_secs(2), "{:?}", r.duration);
}

#[test]
fn a_background_grandchild_holding_stdout_is_killed_quickly() {
    let _g = shared();
    let (r, out, err) = run_captured(&spec(&["sh", "-c", "sleep 30 & echo $!; exit 0"]));
    let r = ok(r, &out, &err);
    let pid: i32 = String::from_utf8_lossy(&out).trim().parse().unwrap();
    assert!(!tree::pid_alive(pid));
    assert!(r.duration < Duration::from_secs(2), "{:?}", r.duration);
}

// ---------------------------------------------------------------- cannot run

#[test]
fn not_found_lists_the_path_directories() {
    let _g = shared();
    let mut s = spec(&["oomguard-no-such-command"]);
    s.env_set
        .push(("PATH".into(), "/nonexistent/a:/nonexistent/b".into()));
    match run_captured(&s).0 {
        Err(e @ Error::NotFound { .. }) => {
            let msg = e.to_string();
            let Error::NotFound { program, searched } = e else {
                unreachable!()
            };
            assert_eq!(program, "oomguard-no-such-command");
            assert_eq!(
                searched,
                vec![
                    PathBuf::from("/nonexistent/a"),
                    PathBuf::from("/nonexistent/b")
                ]
            );
            assert!(msg.contains("/nonexistent/a, /nonexistent/b"), "{msg}");
            assert!(msg.contains("not found"), "{msg}");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let s = spec(&["/nonexistent/dir/prog"]);
    assert!(matches!(run_captured(&s).0, Err(Error::NotFound { .. })));
}

#[test]
fn not_executable_is_distinct_and_says_why() {
    let _g = shared();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    match run_captured(&spec(&[script.to_str().unwrap()])).0 {
        Err(Error::NotExecutable { reason, .. }) => {
            assert!(reason.contains("permission denied"), "{reason}")
        }
        other => panic!("expected NotExecutable, got {other:?}"),
    }
    // Found in PATH but not executable: NotExecutable too (as execvp's EACCES).
    let mut s = spec(&["train.sh"]);
    s.env_set
        .push(("PATH".into(), dir.path().as_os_str().to_owned()));
    assert!(matches!(
        run_captured(&s).0,
        Err(Error::NotExecutable { .. })
    ));
    // A directory.
    match run_captured(&spec(&[dir.path().to_str().unwrap()])).0 {
        Err(Error::NotExecutable { reason, .. }) => {
            assert!(reason.contains("directory"), "{reason}")
        }
        other => panic!("expected NotExecutable, got {other:?}"),
    }
    // A bad interpreter line.
    let bad = dir.path().join("bad.py");
    std::fs::write(&bad, "#!/nonexistent/python3\n").unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
    match run_captured(&spec(&[bad.to_str().unwrap()])).0 {
        Err(Error::NotExecutable { reason, .. }) => {
            assert!(reason.contains("interpreter"), "{reason}")
        }
        other => panic!("expected NotExecutable, got {other:?}"),
    }
}

// ---------------------------------------------------------------- the log

#[test]
fn log_keeps_head_and_tail_with_a_marker_and_mode_0600() {
    let _g = shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("attempt.log");
    let mut s = spec(&[
        "python3",
        "-c",
        "import sys\nfor c, n in ((b'A', 100), (b'B', 1000), (b'C', 50)):\n    sys.stdout.buffer.write(c * n); sys.stdout.flush()",
    ]);
    s.log = Some(log.clone());
    s.log_head_bytes = 100;
    s.log_tail_bytes = 50;
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert_eq!(out.len(), 1150, "the terminal gets everything");
    let mut want = vec![b'A'; 100];
    want.extend_from_slice(b"\n[oomguard: 1000 bytes omitted]\n");
    want.extend(std::iter::repeat_n(b'C', 50));
    assert_eq!(
        String::from_utf8(std::fs::read(&log).unwrap()).unwrap(),
        String::from_utf8(want).unwrap()
    );
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Short output: an exact copy, no marker.
    let mut s = spec(&["sh", "-c", "printf 'short\\r\\n'"]);
    s.log = Some(log.clone());
    let (r, out, err) = run_captured(&s);
    ok(r, &out, &err);
    assert_eq!(std::fs::read(&log).unwrap(), b"short\r\n");
}

#[test]
fn log_bounds_hold_for_any_chunking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    // `keep`: what the report's tail asks the same ring for (more than the log's tail, or
    // less); the log's file is the same either way.
    for (chunk, keep) in [1, 7, 100, 4096, 10_000]
        .into_iter()
        .flat_map(|c| [(c, 0), (c, 3_000), (c, 64 << 10)])
    {
        let mut log = output::Log::open(Some(&path), 1234, 567, keep);
        for c in data.chunks(chunk) {
            log.feed(c);
        }
        assert!(
            log.last(keep) == data[10_000 - keep.min(10_000)..],
            "keep {keep}"
        );
        log.finish();
        assert!(log.warning.is_none());
        let mut want = data[..1234].to_vec();
        want.extend_from_slice(
            format!("\n[oomguard: {} bytes omitted]\n", 10_000 - 1234 - 567).as_bytes(),
        );
        want.extend_from_slice(&data[10_000 - 567..]);
        assert!(std::fs::read(&path).unwrap() == want, "chunk size {chunk}");
        // Nothing but the log is left in the folder.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["l"]);
    }
    // Fewer bytes past the head than the tail keeps: all of them, in order, no marker.
    let mut log = output::Log::open(Some(&path), 1234, 20_000, 64 << 10);
    for c in data.chunks(999) {
        log.feed(c);
    }
    log.finish();
    assert!(std::fs::read(&path).unwrap() == data);
}

#[test]
fn an_unwritable_log_is_a_warning_not_a_failure() {
    let _g = shared();
    let mut s = spec(&["sh", "-c", "echo fine"]);
    s.log = Some(PathBuf::from("/nonexistent/dir/attempt.log"));
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    assert_eq!(out, b"fine\n");
    assert!(
        r.warnings.iter().any(|w| w.contains("could not write log")),
        "{:?}",
        r.warnings
    );
    // The report's last output does not depend on the log's file.
    assert_eq!(r.tail, b"fine\n");

    if Path::new("/dev/full").exists() {
        // Disk full.
        let mut s = spec(&["sh", "-c", "echo fine"]);
        s.log = Some(PathBuf::from("/dev/full"));
        let (r, out, err) = run_captured(&s);
        let r = ok(r, &out, &err);
        assert_eq!(r.exit, Exit::Code(0));
        assert!(
            r.warnings.iter().any(|w| w.contains("No space left")),
            "{:?}",
            r.warnings
        );
        assert_eq!(r.tail, b"fine\n");
    }
}

// ---------------------------------------------------------------- tty mode

#[test]
fn tty_mode_gives_a_terminal_and_keeps_bytes_exact() {
    let _g = shared();
    let mut s = spec(&[
        "python3",
        "-c",
        "import os, sys\nprint(os.isatty(1), os.isatty(2), os.getsid(0) == os.getpid(), os.tcgetpgrp(1) == os.getpgrp())\nsys.stderr.write('e\\n'); sys.stderr.flush()\nsys.stdout.write('a\\rb'); sys.stdout.flush()",
    ]);
    s.tty = true;
    let (r, out, err) = run_captured(&s);
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    // No "\n" -> "\r\n" translation: what the child wrote is what we get.
    assert_eq!(
        String::from_utf8_lossy(&out),
        "True True True True\ne\na\rb"
    );
    assert!(err.is_empty());
}

#[test]
fn tty_mode_forwards_our_stdin_to_the_command() {
    let _g = shared();
    use std::io::Read;
    // A separate "oomguard" process (the harness), so that its stdin can be a pipe we hold.
    let argv = ["python3", "-c", "print('got', repr(input()))"].join("\x1f");
    let mut harness = std::process::Command::new("/proc/self/exe")
        .args([
            "launch::tests::harness_entry",
            "--exact",
            "--nocapture",
            "--quiet",
        ])
        .env("OOMGUARD_TEST_HARNESS_ARGV", argv)
        .env("OOMGUARD_TEST_HARNESS_TTY", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    harness
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello \xc3\xa9\n")
        .unwrap();
    let mut out = String::new();
    harness
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = harness.wait().unwrap();
    assert!(out.contains("got 'hello \u{e9}'"), "{out:?}");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn tty_mode_exit_code() {
    let _g = shared();
    let mut s = spec(&["sh", "-c", "exit 5"]);
    s.tty = true;
    let (r, out, err) = run_captured(&s);
    assert_eq!(ok(r, &out, &err).exit, Exit::Code(5));
}

// ---------------------------------------------------------------- signals

fn wait_ready(h: &std::thread::JoinHandle<Result<Report, Error>>, out: &SharedBuf) {
    assert!(
        wait_until(Duration::from_secs(10), || out
            .text()
            .contains("ready (pid:")
            || h.is_finished()),
        "child never got ready: {}",
        out.text()
    );
    assert!(!h.is_finished(), "run ended early: {}", out.text());
}

#[test]
fn signals_are_forwarded_and_sigterm_is_an_interrupt() {
    let _g = exclusive();
    let (h, out, _err) = run_in_thread(spec(&["python3", &child("print_signals.py")]));
    wait_ready(&h, &out);
    for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP] {
        raise(sig);
        let name = Signal::from_raw(sig);
        assert!(
            wait_until(Duration::from_secs(5), || out
                .text()
                .contains(&format!("received {name}"))),
            "{name} not forwarded: {}",
            out.text()
        );
    }
    raise(libc::SIGTERM);
    let r = h.join().unwrap().unwrap();
    assert!(out.text().contains("received SIGTERM"), "{}", out.text());
    assert_eq!(r.exit, Exit::Code(143));
    // SIGHUP came first; it is what interrupted the attempt.
    assert_eq!(r.interrupted, Some(Signal::HUP));
}

#[test]
fn a_second_ctrl_c_kills_the_group() {
    let _g = exclusive();
    let (h, out, _err) = run_in_thread(spec(&["python3", &child("print_signals.py")]));
    wait_ready(&h, &out);
    raise(libc::SIGINT);
    assert!(
        wait_until(Duration::from_secs(5), || out
            .text()
            .contains("received SIGINT")),
        "{}",
        out.text()
    );
    assert!(!h.is_finished(), "the first SIGINT is only forwarded");
    raise(libc::SIGINT);
    let r = h.join().unwrap().unwrap();
    assert_eq!(r.exit, Exit::Signal(Signal::KILL));
    assert_eq!(r.interrupted, Some(Signal::INT));
}

#[test]
fn ctrl_z_stops_the_group_and_fg_continues_it() {
    let _g = exclusive();
    let (h, out, _err) = run_in_thread(spec(&["python3", &child("print_signals.py")]));
    wait_ready(&h, &out);
    // We stop ourselves on SIGTSTP; a helper plays the shell's `fg`.
    let me = std::process::id().to_string();
    let mut fg = std::process::Command::new("sh")
        .args(["-c", "sleep 0.5; kill -CONT \"$0\"", &me])
        .spawn()
        .unwrap();
    raise(libc::SIGTSTP);
    assert!(
        wait_until(Duration::from_secs(5), || out
            .text()
            .contains("received SIGCONT")),
        "{}",
        out.text()
    );
    fg.wait().unwrap();
    assert!(out.text().contains("received SIGTSTP"), "{}", out.text());
    raise(libc::SIGTERM);
    let r = h.join().unwrap().unwrap();
    assert_eq!(r.exit, Exit::Code(143));
}

#[test]
fn pending_reports_an_interrupt_between_attempts() {
    let _g = exclusive();
    let signals = Signals::install().unwrap();
    assert_eq!(signals.pending(), None);
    raise(libc::SIGUSR1);
    assert_eq!(signals.pending(), None, "SIGUSR1 is not an interrupt");
    raise(libc::SIGTERM);
    assert!(wait_until(Duration::from_secs(2), || signals.pending()
        == Some(Signal::TERM)));
    assert_eq!(
        signals.pending(),
        Some(Signal::TERM),
        "asking does not consume it"
    );
}

// ---------------------------------------------------------------- never outlive oomguard

#[test]
fn the_guardian_kills_the_group_when_its_pipe_closes() {
    let _g = shared();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = sleeper.id() as i32;
    let guardian = guard::Guardian::start(pgid, "no-such-marker", false).unwrap();
    drop(guardian); // as if oomguard died: the write end closes without a byte
    let status = sleeper.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[test]
fn a_released_guardian_kills_nothing() {
    let _g = shared();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = sleeper.id() as i32;
    let reaper = guard::Guardian::start(pgid, "no-such-marker", false)
        .unwrap()
        .release();
    // The guardian is reaped on a thread: once it is done, it has acted.
    if let Some(r) = reaper {
        r.join().unwrap();
    }
    assert_eq!(
        sleeper.try_wait().unwrap(),
        None,
        "released guardian killed the group"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

fn sigkill_oomguard_and_check_tree(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    let argv = [
        "python3",
        &child("spawn_tree.py"),
        file.to_str().unwrap(),
        mode,
    ]
    .join("\x1f");
    let mut harness = std::process::Command::new("/proc/self/exe")
        .args(["launch::tests::harness_entry", "--exact", "--nocapture"])
        .env("OOMGUARD_TEST_HARNESS_ARGV", argv)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || read_pids(&file).len() == 5),
        "tree did not start"
    );
    let pids = read_pids(&file);
    assert_eq!(alive(&pids).len(), 5);
    harness.kill().unwrap(); // SIGKILL: no cleanup code of oomguard runs
    harness.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || alive(&pids).is_empty()),
        "still alive after oomguard was SIGKILLed: {:?}",
        alive(&pids)
    );
}

#[test]
fn nothing_outlives_a_sigkilled_oomguard() {
    let _g = shared();
    sigkill_oomguard_and_check_tree("");
}

#[test]
fn setsid_workers_do_not_outlive_a_sigkilled_oomguard() {
    let _g = shared();
    sigkill_oomguard_and_check_tree("setsid");
}

// ---------------------------------------------------------------- one output file

#[test]
fn merged_output_keeps_the_order_across_stdout_and_stderr_and_is_scanned() {
    let _g = shared();
    let s = spec(&["python3", &child("interleave.py"), "300"]);
    let signals = Signals::install().expect("install signals");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = run_wired(&s, &signals, &mut out, &mut err, true);
    let r = ok(r, &out, &err);
    assert_eq!(r.exit, Exit::Code(0));
    let want: String = (0..300).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out), want);
    assert!(err.is_empty(), "all of it goes to our stdout, the one file");

    let s = spec(&[
        "sh",
        "-c",
        "echo working; echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.' >&2; exit 1",
    ]);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = ok(
        run_wired(&s, &signals, &mut out, &mut err, true),
        &out,
        &err,
    );
    assert!(
        r.scanner.first_oom().is_some(),
        "the merged stream is scanned"
    );
}

#[test]
fn same_output_compares_the_files_behind_stdout_and_stderr() {
    // Under the test harness both are whatever cargo gave us; the answer must be
    // what fstat says, whichever it is.
    let id = |fd| {
        std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .ok()
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
    };
    let expected = matches!((id(1), id(2)), (Some(a), Some(b)) if a == b);
    assert_eq!(spawn::same_output(), expected);
}

/// The pass-through allocates nothing per line: ten times the lines cost (almost) no more
/// allocations. Counted by the test build's allocator (`alloc_count`), on this thread,
/// which runs the whole poll loop (read, write through, scan, log).
#[test]
fn pass_through_allocates_nothing_per_line() {
    let _g = shared();
    let signals = Signals::install().expect("install signals");
    let dir = tempfile::tempdir().unwrap();
    let count = |lines: u32| {
        let script = format!(
            "yes 'step 1234/100000 loss 2.3456 lr 2.0e-05 tokens/s 51234' | head -n {lines}"
        );
        let mut s = spec(&["sh", "-c", &script]);
        s.log = Some(dir.path().join(format!("log-{lines}")));
        let before = crate::alloc_count::allocations();
        let t0 = std::time::Instant::now();
        let r = run_with(&s, &signals, &mut io::sink(), &mut io::sink());
        let n = crate::alloc_count::allocations() - before;
        assert!(r.is_ok(), "run failed: {:?}", r.err());
        (n, t0.elapsed().as_secs_f64())
    };
    let (small, t_small) = count(20_000);
    let (large, t_large) = count(200_000);
    // 180000 more lines (about 10 MB, some 150 more reads): a handful of allocations more
    // at most (a buffer grown once), never one per line. What the loop does by the clock
    // (the process tree sampled for the kernel's record, 2 to 4 times a second, reading
    // /proc) allocates per sample, not per line: allowed for by the longer run's extra
    // time, so a loaded machine does not fail the test.
    let by_time = (200.0 * (t_large - t_small).max(0.0)) as u64;
    assert!(
        large <= small + 20 + by_time,
        "20000 lines: {small} allocations in {t_small:.2} s; 200000 lines: {large} in {t_large:.2} s (allowed {by_time} for the time)"
    );
}

/// A pipe of the child's as the loop sees it: non-blocking, grown to 1 MiB or left
/// at its 64 KiB, with `bytes` waiting in it.
fn loaded_pipe(grow: bool, bytes: usize) -> (StreamFd, OwnedFd) {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    output::set_nonblocking(&r).unwrap();
    output::set_nonblocking(&w).unwrap();
    let mut s = StreamFd::new(r, detect::Stream::Out);
    if grow {
        s.size = output::grow_pipe(&s.fd);
    }
    let data = vec![b'x'; bytes];
    let mut f = std::fs::File::from(w.try_clone().unwrap());
    f.write_all(&data).unwrap();
    (s, w)
}

#[test]
fn a_chatty_pipe_is_read_in_gathered_turns_and_nothing_else_waits() {
    let s = spec(&["true"]);
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut w = Watch::new(&s, Instant::now(), &mut out, &mut err);
    let mut warnings = Vec::new();
    let mut turn = |streams: &mut [StreamFd], w: &mut Watch<'_>| {
        read_output(streams, &[true, false], w, &mut warnings)
    };
    // A burst the turn read all of, from a 1 MiB pipe: the loop waits before polling again.
    let (p, _keep) = loaded_pipe(true, 100 << 10);
    assert_eq!(
        p.size,
        output::PIPE_SIZE,
        "this kernel grows pipes to 1 MiB"
    );
    let mut streams = [p];
    let t = turn(&mut streams, &mut w);
    assert_eq!((t.bytes, t.caught_up, t.eof), (100 << 10, true, false));
    assert!(t.gather());
    // A line now and then (a training's pace): never waited for.
    let (p, _keep) = loaded_pipe(true, 200);
    let mut streams = [p];
    let t = turn(&mut streams, &mut w);
    assert_eq!(t.bytes, 200);
    assert!(!t.gather());
    // More than one turn reads (8 x 64 KiB): the rest is read at once, not waited for.
    let (p, _keep) = loaded_pipe(true, 600 << 10);
    let mut streams = [p];
    let t = turn(&mut streams, &mut w);
    assert_eq!((t.bytes, t.caught_up), (8 * output::READ_BUF, false));
    assert!(!t.gather());
    let t = turn(&mut streams, &mut w);
    assert_eq!(
        (t.bytes, t.caught_up),
        ((600 << 10) - 8 * output::READ_BUF, true)
    );
    // A pipe left at its 64 KiB (or a terminal): waiting could hold the command up.
    let (p, _keep) = loaded_pipe(false, 40 << 10);
    let mut streams = [p];
    let t = turn(&mut streams, &mut w);
    assert_eq!(t.bytes, 40 << 10);
    assert!(!t.gather());
    // A terminal gives at most 4 KiB a read: its turn reads on until nothing is left
    // (not one poll per 4 KiB), and never waits (a terminal's buffer is small).
    // The slave is written without blocking, as much of 12 KiB as the terminal holds
    // with nobody reading (a blocking write could wait for a reader: on some kernels a
    // terminal takes a few KiB at once, then 512 bytes a wake-up).
    let pty = spawn::open_pty(None).unwrap();
    output::set_nonblocking(&pty.master).unwrap();
    output::set_nonblocking(&pty.slave).unwrap();
    let mut slave = std::fs::File::from(pty.slave);
    let mut held = 0;
    let until = Instant::now() + Duration::from_secs(2);
    while held < 12 << 10 && Instant::now() < until {
        match slave.write(&[b'y'; 512]) {
            Ok(n) => held += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("writing to the terminal: {e}"),
        }
    }
    assert!(held > 4 << 10, "the terminal held {held} bytes");
    let mut p = StreamFd::new(pty.master, detect::Stream::Out);
    p.size = output::grow_pipe(&p.fd);
    assert_eq!(p.size, 0);
    let mut streams = [p];
    let t = turn(&mut streams, &mut w);
    assert_eq!((t.bytes, t.caught_up), (held, false));
    assert!(!t.gather());
    drop(slave);
    // End of file: the child is likely gone, so the loop goes on at once.
    let (p, keep) = loaded_pipe(true, 30 << 10);
    drop(keep);
    let mut streams = [p];
    // (A test running beside this one may fork while the pipe's write end is open: its
    // copy closes at the child's exec, so the end of file can come a turn later.)
    let until = Instant::now() + Duration::from_secs(2);
    let mut t = turn(&mut streams, &mut w);
    while !t.eof && Instant::now() < until {
        t = turn(&mut streams, &mut w);
    }
    assert!(t.eof && !t.gather());
    drop(w);
    // Every byte passed through.
    assert_eq!(
        out.len(),
        (100 << 10) + 200 + (600 << 10) + (40 << 10) + held + (30 << 10)
    );
}

/// Torchrun's failure lines count, in any chunking; its logging's dump of the line's
/// format string (printed when our SIGTERM interrupts the write) does not.
#[test]
fn torchruns_failure_lines_count_and_its_format_string_does_not() {
    let text = b"E1127 21:24:27.9 2659 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 2675) of binary: python\n\
--- Logging error ---\n\
Message: 'failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s'\n\
Arguments: (1, 1, 2675, 'python')\n\
E1127 21:24:29.1 2659 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 2680) of binary: python\n\
failed (exitcode: ";
    let mut s = spec(&["true"]);
    s.torchrun_restarts = Some(2);
    for size in [1, 2, 7, 18, 19, 64, text.len()] {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut w = Watch::new(&s, Instant::now(), &mut out, &mut err);
        for c in text.chunks(size) {
            w.group_failures_in(detect::Stream::Err, c);
        }
        // The last words have no exit code yet: not a failure until one comes.
        assert_eq!(w.group_failures, 2, "chunks of {size}");
        w.group_failures_in(detect::Stream::Err, b"2) local_rank: 1\n");
        assert_eq!(w.group_failures, 3, "chunks of {size}, then the code");
    }
}

/// Counting torchrun's failure lines allocates nothing per chunk (it runs on every chunk of
/// a torchrun command's output): the carry between chunks keeps its buffer.
#[test]
fn torchruns_failure_count_allocates_nothing_per_chunk() {
    let mut s = spec(&["true"]);
    s.torchrun_restarts = Some(2);
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut w = Watch::new(&s, Instant::now(), &mut out, &mut err);
    let text = b"step 1234/100000 loss 2.3456 lr 2.0e-05 tokens/s 51234 failed (exitcode: 1)\n";
    // Warm: the carry's buffer is made once.
    for size in [3, 100] {
        for c in text.chunks(size) {
            w.group_failures_in(detect::Stream::Err, c);
        }
    }
    let before = crate::alloc_count::allocations();
    for _ in 0..1000 {
        for size in [3, 100] {
            for c in text.chunks(size) {
                w.group_failures_in(detect::Stream::Err, c);
            }
        }
    }
    assert_eq!(crate::alloc_count::allocations() - before, 0);
    assert_eq!(w.group_failures, 2 * 1001);
}
