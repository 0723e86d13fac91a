//! Reliability battery, through the real binary: signals reach every process of the
//! command's group, nothing survives a SIGKILLed oomguard, faults of the command or of the
//! disk never hang or stop supervision, and the run folder stays private.
//!
//! Fills the gaps left by `tests/cli.rs`, `tests/launch_orphans.rs`, `tests/launch_tty.rs`,
//! `tests/sim_trainer.rs` and the unit tests in `src/launch/tests.rs` (docs/reference.md's
//! "Guarantees" section lists which test checks what). The child programs are written into
//! a temporary folder by each test. Every wait polls with a deadline; no assertion rests on
//! a fixed sleep.

mod common;
use common::{OOMGUARD, alive, proc_state};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OOM_LINE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free.";

/// Flags that give the default policy a step to take after an OOM (8 -> 4, accumulation
/// 1 -> 2), so "no relaunch" is a decision and not a lack of options.
const KNOB_FLAGS: [&str; 4] = [
    "--per_device_train_batch_size",
    "8",
    "--gradient_accumulation_steps",
    "1",
];

/// A child and a grandchild in the child's process group. Each handles the signals named
/// in argv[2] (comma-separated) by printing `<role> received <NAME>`; for SIGINT, SIGTERM,
/// SIGHUP and SIGQUIT it then exits with 128+N, unless argv[3] is `stay`. Once both have
/// their handlers the child prints
/// `ready child=PID grandchild=PID`. argv[1]: a line to print first on stderr (or "").
const FAMILY: &str = r#"
import os, signal, sys, time
first, names = sys.argv[1], sys.argv[2]
stay = len(sys.argv) > 3 and sys.argv[3] == "stay"
ENDING = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}

def install(role):
    def handler(signum, _frame):
        os.write(1, f"{role} received {signal.Signals(signum).name}\n".encode())
        if signum in ENDING and not stay:
            if role == "child":
                try:
                    os.waitpid(gpid, 0)
                except ChildProcessError:
                    pass
            os._exit(128 + signum)
    for n in filter(None, names.split(",")):
        signal.signal(getattr(signal, n), handler)

r, w = os.pipe()
gpid = os.fork()
if gpid == 0:
    install("grandchild")
    os.write(w, b"x")
    while True:
        time.sleep(3600)
install("child")
os.read(r, 1)
if first:
    sys.stderr.write(first + "\n"); sys.stderr.flush()
os.write(1, f"ready child={os.getpid()} grandchild={gpid}\n".encode())
while True:
    time.sleep(3600)
"#;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn write_script(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety implications.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// oomguard started with `--run-dir <tmp>/run`, stdout and stderr into files.
struct Og {
    child: Child,
    cmd: String,
    dir: tempfile::TempDir,
}

impl Og {
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Og {
        let dir = tmp();
        Og::start_in(dir, args, envs)
    }

    fn start_in(dir: tempfile::TempDir, args: &[&str], envs: &[(&str, &str)]) -> Og {
        Og::start_limited(dir, args, envs, None, None)
    }

    /// As `start_in`; `as_limit`: an address-space limit (bytes) for oomguard, so that a
    /// runaway allocation fails fast instead of pushing a shared machine into its OOM killer.
    /// `file_size`: RLIMIT_FSIZE for oomguard, with SIGXFSZ ignored, so that every write to a
    /// file past that size fails (EFBIG) as a full disk fails it (ENOSPC); its stdout and
    /// stderr then come through pipes, copied into the files by the test.
    fn start_limited(
        dir: tempfile::TempDir,
        args: &[&str],
        envs: &[(&str, &str)],
        as_limit: Option<u64>,
        file_size: Option<u64>,
    ) -> Og {
        let mut cmd = Command::new(OOMGUARD);
        if !args.contains(&"--run-dir") {
            cmd.arg("--run-dir").arg(dir.path().join("run"));
        }
        cmd.args(args);
        if as_limit.is_some() || file_size.is_some() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit and signal are async-signal-safe and touch only the child.
            unsafe {
                cmd.pre_exec(move || {
                    for (what, limit) in
                        [(libc::RLIMIT_AS, as_limit), (libc::RLIMIT_FSIZE, file_size)]
                    {
                        let Some(limit) = limit else { continue };
                        let r = libc::rlimit {
                            rlim_cur: limit,
                            rlim_max: limit,
                        };
                        if libc::setrlimit(what, &r) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    if file_size.is_some() {
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    }
                    Ok(())
                });
            }
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let shown = format!("{cmd:?}");
        let (out, err) = if file_size.is_some() {
            (Stdio::piped(), Stdio::piped())
        } else {
            (
                std::fs::File::create(dir.path().join("stdout"))
                    .unwrap()
                    .into(),
                std::fs::File::create(dir.path().join("stderr"))
                    .unwrap()
                    .into(),
            )
        };
        let mut child = cmd
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
        if file_size.is_some() {
            for (name, pipe) in [
                (
                    "stdout",
                    child
                        .stdout
                        .take()
                        .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
                ),
                (
                    "stderr",
                    child
                        .stderr
                        .take()
                        .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
                ),
            ] {
                let mut pipe = pipe.unwrap();
                let mut file = std::fs::File::create(dir.path().join(name)).unwrap();
                std::thread::spawn(move || std::io::copy(&mut pipe, &mut file));
            }
        }
        Og {
            child,
            cmd: shown,
            dir,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn journal(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("run/journal.jsonl")).unwrap_or_default()
    }

    fn fail(&self, expected: &str) -> ! {
        panic!(
            "command: {}\ncwd: {}\nexpected: {expected}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- journal ---\n{}",
            self.cmd,
            self.dir.path().display(),
            self.stdout(),
            self.stderr(),
            self.journal()
        )
    }

    fn wait_stdout(&self, needle: &str, limit: Duration) {
        if !common::wait_until(limit, || self.stdout().contains(needle)) {
            self.fail(&format!("stdout containing {needle:?} within {limit:?}"));
        }
    }

    /// (child pid, grandchild pid) from FAMILY's ready line.
    fn family_pids(&self) -> (i32, i32) {
        self.wait_stdout("ready child=", Duration::from_secs(20));
        let out = self.stdout();
        let line = out.lines().find(|l| l.starts_with("ready child=")).unwrap();
        let num = |key: &str| -> i32 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        (num("child="), num("grandchild="))
    }

    fn wait_exit(&mut self, limit: Duration) -> i32 {
        let mut status = None;
        if !common::wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        }) {
            self.fail(&format!("oomguard to exit within {limit:?}"));
        }
        status.unwrap().code().unwrap_or(-1)
    }

    fn attempt_starts(&self) -> usize {
        self.journal()
            .matches("\"event\":\"attempt_start\"")
            .count()
    }
}

impl Drop for Og {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn family_args<'a>(script: &'a str, first: &'a str, names: &'a str) -> Vec<&'a str> {
    let mut v = vec!["python3", script, first, names];
    v.extend(KNOB_FLAGS);
    v
}

// ------------------------------------------------------------------------------- signals

#[test]
fn user_interrupts_reach_child_and_grandchild_exit_128_plus_n_and_never_relaunch() {
    let t = tmp();
    let script = write_script(t.path(), "family.py", FAMILY);
    for (sig, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
    ] {
        // The OOM line printed first means an interrupt that were not honoured would be
        // followed by a relaunch with a smaller micro-batch.
        let names = "SIGINT,SIGTERM,SIGHUP,SIGQUIT";
        let mut g = Og::start(&family_args(&script, OOM_LINE, names), &[]);
        let (c, gc) = g.family_pids();
        kill(g.pid(), sig);
        let code = g.wait_exit(Duration::from_secs(20));
        for role in ["child", "grandchild"] {
            if !g.stdout().contains(&format!("{role} received {name}\n")) {
                g.fail(&format!("{role} to print `received {name}`"));
            }
        }
        if code != 128 + sig {
            g.fail(&format!("exit {} after {name}, found {code}", 128 + sig));
        }
        if g.attempt_starts() != 1 || !g.journal().contains("\"outcome\":\"interrupted\"") {
            g.fail(&format!("one attempt, interrupted, after {name}"));
        }
        assert!(
            !alive(c) && !alive(gc),
            "{name}: the group outlived oomguard"
        );
    }
}

#[test]
fn sigusr1_and_sigusr2_reach_child_and_grandchild_and_the_attempt_goes_on() {
    let t = tmp();
    let script = write_script(t.path(), "family.py", FAMILY);
    let mut g = Og::start(&family_args(&script, "", "SIGUSR1,SIGUSR2,SIGTERM"), &[]);
    let _ = g.family_pids();
    for name in ["SIGUSR1", "SIGUSR2"] {
        let sig = if name == "SIGUSR1" {
            libc::SIGUSR1
        } else {
            libc::SIGUSR2
        };
        kill(g.pid(), sig);
        for role in ["child", "grandchild"] {
            g.wait_stdout(
                &format!("{role} received {name}\n"),
                Duration::from_secs(10),
            );
        }
        if g.child.try_wait().unwrap().is_some() {
            g.fail(&format!("oomguard still running after {name}"));
        }
    }
    kill(g.pid(), libc::SIGTERM);
    let code = g.wait_exit(Duration::from_secs(20));
    if code != 143 || g.attempt_starts() != 1 {
        g.fail("exit 143 after SIGTERM, one attempt");
    }
}

#[test]
fn a_second_sigint_kills_a_group_that_ignores_the_first() {
    let t = tmp();
    let script = write_script(t.path(), "family.py", FAMILY);
    let mut args = vec!["python3", &script, "", "SIGINT,SIGTERM", "stay"];
    args.extend(KNOB_FLAGS);
    let mut g = Og::start(&args, &[]);
    let (c, gc) = g.family_pids();
    kill(g.pid(), libc::SIGINT);
    g.wait_stdout("child received SIGINT\n", Duration::from_secs(10));
    g.wait_stdout("grandchild received SIGINT\n", Duration::from_secs(10));
    if g.child.try_wait().unwrap().is_some() || !alive(c) {
        g.fail("the first SIGINT only forwarded: oomguard and the child still running");
    }
    kill(g.pid(), libc::SIGINT);
    let code = g.wait_exit(Duration::from_secs(10));
    if code != 130 {
        g.fail(&format!("exit 130 after the second SIGINT, found {code}"));
    }
    if !common::wait_until(Duration::from_secs(5), || !alive(c) && !alive(gc)) {
        g.fail("child and grandchild SIGKILLed by the second SIGINT");
    }
    if g.attempt_starts() != 1 {
        g.fail("one attempt");
    }
}

#[test]
fn ctrl_z_stops_oomguard_and_the_whole_group_and_sigcont_resumes_them() {
    let t = tmp();
    let script = write_script(t.path(), "family.py", FAMILY);
    // No handler for SIGTSTP: the default action (stop) is what Ctrl-Z should cause.
    let mut g = Og::start(&family_args(&script, "", "SIGTERM"), &[]);
    let (c, gc) = g.family_pids();
    kill(g.pid(), libc::SIGTSTP);
    let all_stopped = || [g.pid(), c, gc].iter().all(|&p| proc_state(p) == Some('T'));
    if !common::wait_until(Duration::from_secs(10), all_stopped) {
        g.fail(&format!(
            "oomguard, child and grandchild stopped (T); states {:?}",
            [g.pid(), c, gc].map(proc_state)
        ));
    }
    kill(g.pid(), libc::SIGCONT);
    let none_stopped = || {
        [g.pid(), c, gc]
            .iter()
            .all(|&p| matches!(proc_state(p), Some(s) if s != 'T'))
    };
    if !common::wait_until(Duration::from_secs(10), none_stopped) {
        g.fail(&format!(
            "all running again after SIGCONT; states {:?}",
            [g.pid(), c, gc].map(proc_state)
        ));
    }
    kill(g.pid(), libc::SIGTERM);
    let code = g.wait_exit(Duration::from_secs(20));
    if code != 143 {
        g.fail(&format!("exit 143, found {code}"));
    }
}

// ------------------------------------------------------------------------------- no orphans

/// A tree: the child, a grandchild in its group, and a torchrun-like worker that calls
/// setsid (keeping the inherited environment, hence the marker) and forks one more.
const TREE: &str = r#"
import os, sys, time
def hold():
    while True:
        time.sleep(3600)
if os.fork() == 0:
    hold()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        hold()
    hold()
hold()
"#;

/// Live processes whose environment carries `TAG=<tag>` (everything the test started
/// inherits it through oomguard), other than zombies.
fn tagged(tag: &str) -> Vec<i32> {
    let needle = format!("OOMGUARD_TEST_TAG={tag}").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == needle.as_slice()))
        })
        .filter(|&pid| alive(pid))
        .collect()
}

#[test]
fn sigkill_of_oomguard_at_random_moments_leaves_no_process_of_the_tree() {
    let t = tmp();
    let script = write_script(t.path(), "tree.py", TREE);
    // A small xorshift, seeded from the clock; the seed is printed on failure.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut x = seed;
    let trials: usize = std::env::var("OOMGUARD_ORPHAN_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for trial in 0..trials {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = Duration::from_millis(x % 301);
        let tag = format!("{}-{seed}-{trial}", std::process::id());
        let mut g = Og::start(&["python3", &script], &[("OOMGUARD_TEST_TAG", &tag)]);
        std::thread::sleep(delay); // the random moment (not an assertion)
        g.child.kill().unwrap();
        g.child.wait().unwrap();
        if !common::wait_until(Duration::from_secs(5), || tagged(&tag).is_empty()) {
            let left = tagged(&tag);
            for &p in &left {
                kill(p, libc::SIGKILL);
            }
            panic!(
                "trial {trial} (seed {seed}, SIGKILL after {delay:?}): still alive 5 s later: {left:?}"
            );
        }
    }
}

// ------------------------------------------------------------------------------- faults

#[test]
fn a_group_ignoring_sigterm_after_an_oom_hang_is_killed_after_the_grace_period() {
    let t = tmp();
    let child = write_script(
        t.path(),
        "stubborn.py",
        &format!(
            r#"
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = os.fork()
if g == 0:
    while True: time.sleep(3600)
print(f"ready child={{os.getpid()}} grandchild={{g}}", flush=True)
sys.stderr.write("{OOM_LINE}\n"); sys.stderr.flush()
while True: time.sleep(3600)
"#
        ),
    );
    let mut args = vec![
        "--hang-timeout",
        "0.2",
        "--grace",
        "1",
        "--max-attempts",
        "1",
        "python3",
        &child,
    ];
    args.extend(KNOB_FLAGS);
    let mut g = Og::start(&args, &[]);
    let (c, gc) = g.family_pids();
    let started = Instant::now();
    let code = g.wait_exit(Duration::from_secs(30));
    let took = started.elapsed();
    if code != 75 {
        g.fail(&format!(
            "exit 75 (hung after OOM, --max-attempts 1), found {code}"
        ));
    }
    if took < Duration::from_millis(1000) {
        g.fail(&format!("SIGKILL only after the 1 s grace; took {took:?}"));
    }
    if alive(c) || alive(gc) {
        g.fail("child and grandchild dead");
    }
    if !g.journal().contains("\"outcome\":\"hung_after_oom\"") {
        g.fail("the journal to say hung_after_oom");
    }
}

#[test]
fn a_grandchild_holding_stdout_after_the_child_exits_does_not_hang_oomguard() {
    let t = tmp();
    let pidfile = t.path().join("gc.pid");
    let pidfile_s = pidfile.to_str().unwrap().to_owned();
    // In the group: cleaned up. Escaped (setsid + env -i, the documented exception): left
    // alone, but oomguard still returns.
    for escaped in [false, true] {
        let launcher = if escaped {
            "setsid env -i sleep 60"
        } else {
            "sleep 60"
        };
        let script = format!("{launcher} & echo $! > '{pidfile_s}'; echo parent done; exit 0");
        let mut g = Og::start(&["sh", "-c", &script], &[]);
        let code = g.wait_exit(Duration::from_secs(20));
        let gc: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if code != 0 || !g.stdout().contains("parent done") {
            kill(gc, libc::SIGKILL);
            g.fail(&format!(
                "exit 0 with the child's output, escaped grandchild={escaped}"
            ));
        }
        if !escaped && !common::wait_until(Duration::from_secs(5), || !alive(gc)) {
            g.fail("the grandchild in the group killed");
        }
        kill(gc, libc::SIGKILL);
    }
}

#[test]
fn a_child_that_closes_its_output_early_is_still_awaited_for_its_status() {
    let mut g = Og::start(
        &[
            "python3",
            "-c",
            "import os,time; print('bye', flush=True); os.close(1); os.close(2); time.sleep(0.5); os._exit(7)",
        ],
        &[],
    );
    let code = g.wait_exit(Duration::from_secs(20));
    if code != 7 || !g.stdout().contains("bye") {
        g.fail(&format!(
            "exit 7 (the child's status, after its output closed), found {code}"
        ));
    }
}

#[test]
fn a_child_killed_by_a_signal_at_start_stops_oomguard_at_once_with_128_plus_n() {
    let mut args = vec!["sh", "-c", "kill -SEGV $$", "sh"];
    args.extend(KNOB_FLAGS);
    let mut g = Og::start(&args, &[]);
    let code = g.wait_exit(Duration::from_secs(20));
    if code != 128 + libc::SIGSEGV || g.attempt_starts() != 1 {
        g.fail("exit 139 after one attempt");
    }
    let err = g.stderr();
    if !(err.contains("signal 11 (SIGSEGV)") && err.contains("not an out-of-memory error")) {
        g.fail("a message naming the signal and saying it is not an OOM");
    }
}

#[test]
fn an_oom_at_start_every_time_is_bounded_by_max_attempts_with_exit_75() {
    let oom = format!("import sys; sys.stderr.write('{OOM_LINE}\\n'); sys.exit(1)");
    let mut g = Og::start(
        &[
            "--max-attempts",
            "3",
            "python3",
            "-c",
            &oom,
            "--per_device_train_batch_size",
            "64",
            "--gradient_accumulation_steps",
            "1",
        ],
        &[],
    );
    let code = g.wait_exit(Duration::from_secs(60));
    if code != 75 || g.attempt_starts() != 3 {
        g.fail("exit 75 after exactly 3 attempts");
    }
    if !g.stderr().contains("--max-attempts 3") {
        g.fail("the message to name --max-attempts");
    }
}

/// Attempt 1 prints an OOM and exits 1; attempt 2 (the flag file exists) finishes.
fn oom_once(flag: &Path) -> String {
    format!(
        "import os,sys\nf={flag:?}\nprint('training output', flush=True)\nif not os.path.exists(f):\n    open(f,'w').close(); sys.stderr.write('{OOM_LINE}\\n'); sys.exit(1)\nprint('finished', flush=True)\n"
    )
}

#[test]
fn an_unwritable_run_folder_is_a_warning_and_training_finishes() {
    let t = tmp();
    let flag = t.path().join("flag");
    let mut args = vec!["--run-dir", "/proc/oomguard-cannot-write-here"];
    let code = oom_once(&flag);
    args.extend(["python3", "-c", &code]);
    args.extend(KNOB_FLAGS);
    let mut g = Og::start(&args, &[]);
    let status = g.wait_exit(Duration::from_secs(60));
    if status != 0 || !g.stdout().contains("finished") {
        g.fail("exit 0 after the relaunch, without a run folder");
    }
    if !g.stderr().contains("cannot write the run folder") {
        g.fail("a warning about the run folder");
    }
}

/// A disk that is full for oomguard: every write to a file fails. We cannot mount a small
/// tmpfs without privileges, and a run folder whose journal and logs are links to /dev/full
/// is refused (links in a run folder are never followed), so oomguard runs with a file size
/// limit of 0 bytes: every write(2) to a file fails (EFBIG, "File too large"), the way a
/// full disk fails it (ENOSPC).
const FULL_DISK: Option<u64> = Some(0);

fn expect_full_disk_warnings(g: &Og) {
    let err = g.stderr();
    if !(err.contains("cannot write the journal") && err.contains("could not write log")) {
        g.fail("warnings about the journal and the log (a full disk)");
    }
    if !err.contains("File too large") {
        g.fail("the OS error in the warning");
    }
}

#[test]
fn a_full_disk_for_the_journal_and_log_is_a_warning_and_training_finishes() {
    let t = tmp();
    let mut args = vec![
        "python3",
        "-c",
        "print('training output'); print('finished')",
    ];
    args.extend(KNOB_FLAGS);
    let mut g = Og::start_limited(t, &args, &[], Some(4 << 30), FULL_DISK);
    let status = g.wait_exit(Duration::from_secs(60));
    if status != 0
        || !common::wait_until(Duration::from_secs(10), || g.stdout().contains("finished"))
    {
        g.fail("exit 0, with every journal and log write failing");
    }
    expect_full_disk_warnings(&g);
}

/// After an OOM, oomguard reads the attempt's log tail for the step reached: a log that
/// could not be written must not stop the relaunch. (A log that is not a regular file, such
/// as /dev/full, which reads as endless zeros, once made oomguard read it for ever: 23 GiB
/// RSS, then SIGKILL; logs are now opened without following links, and oomguard still runs
/// with a 4 GiB address-space limit so such a regression fails fast.)
#[test]
fn a_full_disk_across_a_relaunch_is_a_warning_and_training_finishes() {
    let t = tmp();
    let flag = t.path().join("flag");
    let code = oom_once(&flag);
    let mut args = vec!["python3", "-c", &code];
    args.extend(KNOB_FLAGS);
    let mut g = Og::start_limited(t, &args, &[], Some(4 << 30), FULL_DISK);
    let status = g.wait_exit(Duration::from_secs(60));
    if status != 0
        || !common::wait_until(Duration::from_secs(10), || g.stdout().contains("finished"))
    {
        g.fail("exit 0 after the relaunch, with every journal and log write failing");
    }
    expect_full_disk_warnings(&g);
}

#[test]
fn a_100_mb_line_and_binary_output_pass_through_the_binary_byte_exact_on_both_streams() {
    let t = tmp();
    let src = t.path().join("payload");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&src).unwrap();
        f.write_all(&vec![b'x'; 100 << 20]).unwrap(); // one 100 MB line, no newline yet
        // Every byte value, malformed UTF-8, NULs, lone \r, and no final newline.
        let mut bin: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
        bin.extend_from_slice(b"\xc3(\xff\xfe\r\x00end");
        f.write_all(&bin).unwrap();
    }
    let want = std::fs::read(&src).unwrap();
    let src_s = src.to_str().unwrap().to_owned();
    for (stream, script) in [("stdout", "cat \"$0\""), ("stderr", "cat \"$0\" >&2")] {
        let mut g = Og::start(&["-q", "sh", "-c", script, &src_s], &[]);
        let code = g.wait_exit(Duration::from_secs(120));
        let got = std::fs::read(g.dir.path().join(stream)).unwrap();
        // On stderr, oomguard's own summary follows the command's bytes.
        let ok = if stream == "stdout" {
            got == want
        } else {
            got.starts_with(&want)
        };
        if code != 0 || !ok {
            g.fail(&format!(
                "{stream} byte-exact ({} bytes), found {} bytes",
                want.len(),
                got.len()
            ));
        }
    }
}

// ------------------------------------------------------------------------------- security

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn run_folder_journal_logs_and_derived_configs_are_private() {
    let t = tmp();
    std::fs::write(
        t.path().join("ds.json"),
        "{\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"gradient_accumulation_steps\": 1\n}\n",
    )
    .unwrap();
    let flag = t.path().join("flag");
    let code = oom_once(&flag);
    let mut g = Og::start_in(t, &["python3", "-c", &code, "--deepspeed", "ds.json"], &[]);
    let status = g.wait_exit(Duration::from_secs(60));
    if status != 0 {
        g.fail("exit 0 after one relaunch");
    }
    let run = g.dir.path().join("run");
    let mut checked = vec![
        (run.clone(), 0o700),
        (run.join("journal.jsonl"), 0o600),
        (run.join("attempt-1"), 0o700),
        (run.join("attempt-1/output.log"), 0o600),
        (run.join("attempt-2"), 0o700),
        (run.join("attempt-2/output.log"), 0o600),
    ];
    // The changed copy of ds.json, wherever the journal says it went.
    let journal = g.journal();
    let copy = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "attempt_start")
        .flat_map(|v| v["files"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["copy"].as_str().map(PathBuf::from))
        .next();
    match copy {
        Some(c) => checked.push((g.dir.path().join(c), 0o600)),
        None => g.fail("a derived copy of ds.json in attempt 2"),
    }
    for (p, want) in checked {
        let m = mode(&p);
        if m != want {
            g.fail(&format!("{} mode {want:o}, found {m:o}", p.display()));
        }
    }
}

#[test]
fn a_policy_cannot_name_a_command_unknown_keys_fail_with_file_line_key() {
    let t = tmp();
    let pwned = t.path().join("pwned");
    for (text, line, key) in [
        (
            format!(
                "max_attempts = 3\ncommand = \"touch {}\"\n[[step]]\nkind = \"halve_micro_batch\"\n",
                pwned.display()
            ),
            2,
            "command",
        ),
        (
            format!(
                "[[step]]\nkind = \"halve_micro_batch\"\nexec = \"touch {}\"\n",
                pwned.display()
            ),
            3,
            "exec",
        ),
        (
            format!(
                "[hooks]\non_oom = \"touch {}\"\n[[step]]\nkind = \"halve_micro_batch\"\n",
                pwned.display()
            ),
            1,
            "hooks",
        ),
    ] {
        let p = t.path().join(format!("{key}.toml"));
        std::fs::write(&p, &text).unwrap();
        let out = Command::new(OOMGUARD)
            .args(["--run-dir"])
            .arg(t.path().join("run"))
            .arg("--policy")
            .arg(&p)
            .args(["true"])
            .current_dir(t.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let want = format!("{}:{line}: ", p.display());
        let field = format!("unknown field `{key}`");
        assert!(
            out.status.code() == Some(2) && err.contains(&want) && err.contains(&field),
            "policy:\n{text}\nexpected exit 2, {want:?} and {field:?}; found {:?}: {err}",
            out.status
        );
        assert!(!pwned.exists(), "the policy ran something");
    }
}

/// A policy's `[env]` table is meant for the allocator/tokenizer defaults. Today it may set
/// ANY variable (only ones the user has not set), so a shared or downloaded policy file can
/// make the command load code: LD_PRELOAD, PYTHONPATH (sitecustomize), PYTHONSTARTUP,
/// BASH_ENV, or change which program PATH resolves. The policy parser allow-lists the names
/// (PYTORCH_*, NCCL_*, CUDA_*, a few thread and Python settings) and names file:line:key.
#[test]
fn a_policy_env_table_cannot_set_code_loading_variables() {
    let t = tmp();
    for var in ["LD_PRELOAD", "PYTHONPATH", "BASH_ENV", "PATH"] {
        let p = t.path().join(format!("{var}.toml"));
        std::fs::write(
            &p,
            format!("[env]\n{var} = \"/tmp/evil\"\n[[step]]\nkind = \"halve_micro_batch\"\n"),
        )
        .unwrap();
        let out = Command::new(OOMGUARD)
            .arg("plan")
            .arg("--policy")
            .arg(&p)
            .args(["python3", "t.py"])
            .env_remove(var)
            .current_dir(t.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && err.contains(&format!("{}:2: env.{var}", p.display())),
            "{var} in a policy's [env]: expected exit 2 naming {}:2: env.{var}; found {:?}: {err}",
            p.display(),
            out.status
        );
    }
}
