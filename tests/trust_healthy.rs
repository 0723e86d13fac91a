//! Trust: oomguard never hurts a healthy run. Through the real binary, with the
//! purpose-built children of `tests/children/`:
//!
//! - a line that merely mentions an OOM (a logged config, a caught OOM) never kills,
//!   relaunches or arms the hang timer; a real, uncaught OOM still does;
//! - the first attempt runs exactly as the user wrote it;
//! - SIGTERM and SIGHUP escalate to SIGKILL after `--grace`; Ctrl-Z reports SIGTSTP;
//! - stdout and stderr sent to one file keep their order; an OOM at the end of a long
//!   line is found;
//! - numbers, policies and knob values that cannot work are usage errors (exit 2)
//!   before anything runs.
//!
//! The "Guarantees" section of docs/reference.md names each test here.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{OOMGUARD, Run, alive};

/// Flags that give the default policy a step to take after an OOM (8 -> 4, accumulation
/// 1 -> 2), so "not relaunched" is a decision and not a lack of options.
const KNOB_FLAGS: [&str; 4] = [
    "--per_device_train_batch_size",
    "8",
    "--gradient_accumulation_steps",
    "1",
];

fn child(name: &str) -> String {
    common::repo()
        .join("tests/children")
        .join(name)
        .to_str()
        .unwrap()
        .to_owned()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// How the test runs oomguard: its environment, and whether stdout and stderr go to one file.
#[derive(Default)]
struct How<'a> {
    envs: &'a [(&'a str, &'a str)],
    /// stdout and stderr both to `<cwd>/both.log` (as `> log 2>&1` does).
    one_file: bool,
}

/// Run `oomguard ARGS` in `cwd` (its run folder `<cwd>/run`), stdin from /dev/null.
fn og(cwd: &Path, args: &[&str], how: How<'_>, limit: Duration) -> Run {
    let mut c = Command::new(OOMGUARD);
    c.arg("--run-dir").arg(cwd.join("run"));
    c.args(args).current_dir(cwd).stdin(Stdio::null());
    for (k, v) in how.envs {
        c.env(k, v);
    }
    let cmd = format!(
        "oomguard --run-dir {}/run {}",
        cwd.display(),
        args.join(" ")
    );
    if how.one_file {
        let f = std::fs::File::create(cwd.join("both.log")).unwrap();
        c.stdout(f.try_clone().unwrap()).stderr(f);
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
        let started = Instant::now();
        let mut status = None;
        common::wait_until(limit, || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        use std::os::unix::process::ExitStatusExt;
        let run = Run {
            cmd,
            cwd: cwd.to_path_buf(),
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stdout: std::fs::read_to_string(cwd.join("both.log")).unwrap_or_default(),
            stderr: String::new(),
            elapsed: started.elapsed(),
        };
        if status.is_none() {
            run.fail("oomguard finishes in time", &format!("{limit:?}"), "killed");
        }
        return run;
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let read = |r: &mut dyn std::io::Read| {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    };
    common::Running {
        cmd,
        cwd: cwd.to_path_buf(),
        child,
        out: std::thread::spawn(move || read(&mut so)),
        err: std::thread::spawn(move || read(&mut se)),
        started: Instant::now(),
    }
    .wait(limit)
}

fn attempts(run: &Run) -> usize {
    common::events(&run.journal(&run.cwd.join("run")), "attempt_start").len()
}

fn outcomes(run: &Run) -> Vec<String> {
    common::events(&run.journal(&run.cwd.join("run")), "attempt_end")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap_or("").to_string())
        .collect()
}

// ------------------------------------------------------------------ false alarms

#[test]
fn a_line_that_mentions_an_oom_then_a_quiet_spell_is_not_a_hang() {
    let t = tmp();
    let script = child("mention_oom_then_quiet.py");
    let mut args = vec![
        "--hang-timeout",
        "1",
        "--grace",
        "1",
        "python3",
        &script,
        "3",
    ];
    args.extend(KNOB_FLAGS);
    let run = og(t.path(), &args, How::default(), Duration::from_secs(60));
    run.check("exit code of a healthy run", Some(0), run.code);
    run.check("attempts", 1, attempts(&run));
    run.ensure(
        "the child finished its quiet spell",
        run.stdout.contains("finished"),
        "stdout with `finished`",
        &run.stdout,
    );
}

#[test]
fn a_caught_oom_then_another_failure_keeps_the_status_and_is_not_relaunched() {
    let t = tmp();
    let script = child("caught_oom_then_fail.py");
    let mut args = vec!["python3", &script];
    args.extend(KNOB_FLAGS);
    let run = og(t.path(), &args, How::default(), Duration::from_secs(60));
    run.check("the child's own status", Some(3), run.code);
    run.check("attempts", 1, attempts(&run));
    run.check("outcome", vec!["other_failure".to_string()], outcomes(&run));
    run.ensure(
        "the message names the real error",
        run.stderr.contains("ValueError: label 7 is out of range"),
        "stderr naming the ValueError",
        &run.stderr,
    );
}

#[test]
fn an_uncaught_oom_is_still_relaunched() {
    for kind in ["torch", "runtime"] {
        let t = tmp();
        let flag = t.path().join("flag");
        let script = child("traceback_oom.py");
        let mut args = vec!["python3", &script, kind, "exit", flag.to_str().unwrap()];
        args.extend(KNOB_FLAGS);
        let run = og(t.path(), &args, How::default(), Duration::from_secs(60));
        run.check(
            &format!("{kind}: exit after the relaunch"),
            Some(0),
            run.code,
        );
        run.check(&format!("{kind}: attempts"), 2, attempts(&run));
        run.check(
            &format!("{kind}: outcomes"),
            vec!["cuda_oom".to_string(), "success".to_string()],
            outcomes(&run),
        );
    }
}

#[test]
fn a_hang_after_a_real_oom_is_still_killed() {
    // `RuntimeError: CUDA out of memory` ending a traceback (older torch): the hang timer
    // is armed by the traceback's end, not only by the torch.OutOfMemoryError class name.
    for kind in ["runtime", "torch"] {
        let t = tmp();
        let script = child("traceback_oom.py");
        let mut args = vec![
            "--hang-timeout",
            "1",
            "--grace",
            "1",
            "--max-attempts",
            "1",
            "python3",
            &script,
            kind,
            "hang",
        ];
        args.extend(KNOB_FLAGS);
        let run = og(t.path(), &args, How::default(), Duration::from_secs(60));
        run.check(
            &format!("{kind}: exit (hung, --max-attempts 1)"),
            Some(75),
            run.code,
        );
        run.check(
            &format!("{kind}: outcome"),
            vec!["hung_after_oom".to_string()],
            outcomes(&run),
        );
    }
}

// ------------------------------------------------------------ first attempt as given

const DS_JSON: &str = "{\n  \"train_batch_size\": 64,\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"gradient_accumulation_steps\": 4,\n  \"zero_optimization\": {\n    \"stage\": 1\n  }\n}\n";

#[test]
fn the_first_attempt_runs_as_given_when_the_world_size_is_unknown() {
    // WORLD_SIZE=2 is set by the launcher in real life; oomguard cannot know it, so it
    // must not "fix" a train_batch_size of 64 = 8 × 4 × 2 into 32 = 8 × 4 × 1.
    let t = tmp();
    std::fs::write(t.path().join("ds.json"), DS_JSON).unwrap();
    let flag = t.path().join("flag");
    let script = child("deepspeed_batch_check.py");
    let args = [
        "python3",
        &script,
        flag.to_str().unwrap(),
        "--deepspeed",
        "ds.json",
    ];
    let envs = [("WORLD_SIZE", "2")];
    let how = How {
        envs: &envs,
        one_file: false,
    };
    let run = og(t.path(), &args, how, Duration::from_secs(60));
    run.check("exit after one relaunch", Some(0), run.code);
    let journal = run.journal(&t.path().join("run"));
    let starts = common::events(&journal, "attempt_start");
    run.check("attempts", 2, starts.len());
    run.check(
        "attempt 1's argv is the command",
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        common::argv_of(starts[0]),
    );
    run.ensure(
        "attempt 1 writes no config copy",
        starts[0]["files"].as_array().is_none_or(|f| f.is_empty()),
        "no files",
        &starts[0]["files"],
    );
    run.ensure(
        "attempt 2 keeps train_batch_size = micro × accum × world",
        run.stdout.contains("micro=4 accum=8 train_batch_size=64"),
        "micro=4 accum=8 train_batch_size=64",
        &run.stdout,
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("ds.json")).unwrap(),
        DS_JSON,
        "the user's file is never modified"
    );
}

#[test]
fn plan_shows_attempt_1_exactly_as_given() {
    let t = tmp();
    std::fs::write(t.path().join("ds.json"), DS_JSON).unwrap();
    for cmd in [
        &["deepspeed", "train.py", "--deepspeed", "ds.json"][..],
        &[
            "deepspeed",
            "--include",
            "localhost:0,1",
            "train.py",
            "--deepspeed",
            "ds.json",
        ][..],
    ] {
        let out = Command::new(OOMGUARD)
            .args(["plan", "--json"])
            .args(cmd)
            .current_dir(t.path())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let plan: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{cmd:?}: plan --json: {e}\n{text}\n{:?}", out));
        let first = &plan["ladder"][0];
        assert_eq!(
            common::argv_of(first),
            cmd.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "{cmd:?}: attempt 1's argv"
        );
        assert!(
            first["files"].as_array().is_none_or(|f| f.is_empty()),
            "{cmd:?}: attempt 1 rewrites no file: {:#}",
            first["files"]
        );
        // Later rungs keep train_batch_size: micro × accum is unchanged by halving.
        for r in plan["ladder"].as_array().unwrap() {
            let diffs = r["files"].to_string();
            assert!(
                !diffs.contains("train_batch_size\\\": 32"),
                "{cmd:?}: {} rewrote train_batch_size: {diffs}",
                r["step"]
            );
        }
    }
}

// ------------------------------------------------------------------------ signals

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety implications.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// oomguard running `ignore_term_hup.py`, with its output in files under `dir`.
struct Stubborn {
    og: std::process::Child,
    dir: PathBuf,
    child: i32,
    grandchild: i32,
}

impl Stubborn {
    fn start(dir: &Path, grace: &str) -> Stubborn {
        let script = child("ignore_term_hup.py");
        let mut c = Command::new(OOMGUARD);
        c.arg("--run-dir")
            .arg(dir.join("run"))
            .args(["--grace", grace, "python3", &script])
            .args(KNOB_FLAGS)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
        let og = c.spawn().unwrap();
        let mut s = Stubborn {
            og,
            dir: dir.to_path_buf(),
            child: 0,
            grandchild: 0,
        };
        if !common::wait_until(Duration::from_secs(20), || {
            s.stdout().contains("ready child=")
        }) {
            s.fail("the child's ready line");
        }
        let out = s.stdout();
        let line = out.lines().find(|l| l.starts_with("ready child=")).unwrap();
        let num = |key: &str| -> i32 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        s.child = num("child=");
        s.grandchild = num("grandchild=");
        s
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default()
    }

    fn fail(&self, expected: &str) -> ! {
        panic!(
            "expected: {expected}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout(),
            std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
        )
    }

    /// oomguard's exit code, within `limit`.
    fn exit_within(&mut self, limit: Duration) -> i32 {
        let mut status = None;
        if !common::wait_until(limit, || {
            status = self.og.try_wait().unwrap();
            status.is_some()
        }) {
            self.fail(&format!("oomguard to exit within {limit:?}"));
        }
        status.unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Stubborn {
    fn drop(&mut self) {
        let _ = self.og.kill();
        let _ = self.og.wait();
        for p in [self.child, self.grandchild] {
            if p > 0 && alive(p) {
                kill(p, libc::SIGKILL);
            }
        }
    }
}

#[test]
fn sigterm_and_sighup_escalate_to_sigkill_after_the_grace_period() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let t = tmp();
        let mut s = Stubborn::start(t.path(), "1");
        let sent = Instant::now();
        kill(s.og.id() as i32, sig);
        let code = s.exit_within(Duration::from_secs(20));
        let took = sent.elapsed();
        if code != 128 + sig {
            s.fail(&format!("exit {} after {name}, found {code}", 128 + sig));
        }
        if !s.stdout().contains(&format!("{} ignored {name}", s.child)) {
            s.fail(&format!("{name} forwarded to the child first"));
        }
        if took < Duration::from_millis(900) {
            s.fail(&format!("SIGKILL only after the 1 s grace; took {took:?}"));
        }
        if !common::wait_until(Duration::from_secs(5), || {
            !alive(s.child) && !alive(s.grandchild)
        }) {
            s.fail(&format!(
                "{name}: child and grandchild SIGKILLed after --grace"
            ));
        }
    }
}

#[test]
fn a_second_sigterm_kills_the_group_at_once() {
    let t = tmp();
    let mut s = Stubborn::start(t.path(), "600");
    kill(s.og.id() as i32, libc::SIGTERM);
    if !common::wait_until(Duration::from_secs(10), || {
        s.stdout().contains(&format!("{} ignored SIGTERM", s.child))
    }) {
        s.fail("the first SIGTERM forwarded");
    }
    kill(s.og.id() as i32, libc::SIGTERM);
    let code = s.exit_within(Duration::from_secs(20));
    if code != 143 {
        s.fail(&format!("exit 143, found {code}"));
    }
    if !common::wait_until(Duration::from_secs(5), || {
        !alive(s.child) && !alive(s.grandchild)
    }) {
        s.fail("child and grandchild SIGKILLed by the second SIGTERM");
    }
}

#[test]
fn ctrl_z_reports_sigtstp_not_sigstop() {
    use std::os::unix::process::CommandExt;
    let t = tmp();
    let script = child("print_signals.py");
    let mut og = Command::new(OOMGUARD)
        .arg("--run-dir")
        .arg(t.path().join("run"))
        .args(["python3", &script])
        .current_dir(t.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(t.path().join("stdout")).unwrap())
        .stderr(Stdio::null())
        // A group of its own whose parent (this test) is in another group of the same
        // session: not orphaned, so a SIGTSTP with its default action stops it.
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = og.id() as i32;
    let ready =
        || std::fs::read_to_string(t.path().join("stdout")).is_ok_and(|s| s.contains("ready"));
    assert!(
        common::wait_until(Duration::from_secs(20), ready),
        "child ready"
    );
    kill(pid, libc::SIGTSTP);
    let mut status = 0;
    // SAFETY: waitpid on our own child; WUNTRACED reports a stop without reaping.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    let stopped_by = (r == pid && libc::WIFSTOPPED(status)).then(|| libc::WSTOPSIG(status));
    kill(pid, libc::SIGCONT);
    kill(pid, libc::SIGTERM);
    let _ = og.wait();
    assert_eq!(
        stopped_by,
        Some(libc::SIGTSTP),
        "the shell reports 128 + the stop signal: 148 for the user's SIGTSTP (147 would be SIGSTOP)"
    );
}

// ------------------------------------------------------------------------ numbers

#[test]
fn durations_too_large_are_usage_errors_not_panics() {
    let t = tmp();
    for flag in ["--hang-timeout", "--grace", "--wait-timeout"] {
        for value in ["1e20", "1e300", "inf", "-1", "NaN"] {
            for sub in [&[][..], &["plan"][..]] {
                let out = Command::new(OOMGUARD)
                    .args(sub)
                    .args([flag, value, "true"])
                    .current_dir(t.path())
                    .env("OOMGUARD_LOG", "off")
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    out.status.code() == Some(2) && err.contains(flag) && !err.contains("panicked"),
                    "{sub:?} {flag} {value}: expected exit 2 naming {flag}; found {:?}: {err}",
                    out.status
                );
            }
        }
    }
}

// ------------------------------------------------------------------------- output

#[test]
fn stdout_and_stderr_to_one_file_keep_their_order_and_are_still_scanned() {
    let t = tmp();
    let script = child("interleave.py");
    let how = How {
        envs: &[],
        one_file: true,
    };
    let run = og(
        t.path(),
        &["-q", "python3", &script, "400"],
        how,
        Duration::from_secs(60),
    );
    run.check("exit", Some(0), run.code);
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("line "))
        .collect();
    let want: Vec<String> = (0..400).map(|i| format!("line {i}")).collect();
    run.check(
        "the child's lines in the order it wrote them",
        want,
        lines.iter().map(|s| s.to_string()).collect(),
    );

    // The one stream is still scanned: an OOM on stderr relaunches.
    let t = tmp();
    let flag = t.path().join("flag");
    let script = child("traceback_oom.py");
    let mut args = vec!["python3", &script, "torch", "exit", flag.to_str().unwrap()];
    args.extend(KNOB_FLAGS);
    let how = How {
        envs: &[],
        one_file: true,
    };
    let run = og(t.path(), &args, how, Duration::from_secs(60));
    run.check("exit after the relaunch", Some(0), run.code);
    run.check("attempts", 2, attempts(&run));
}

#[test]
fn an_oom_at_the_end_of_a_100_kb_line_is_found() {
    let t = tmp();
    let flag = t.path().join("flag");
    let script = child("traceback_oom.py");
    let mut args = vec!["python3", &script, "torch", "exit", flag.to_str().unwrap()];
    args.extend(KNOB_FLAGS);
    let envs = [("OOMGUARD_TEST_LONG_LINE", "1")];
    let how = How {
        envs: &envs,
        one_file: false,
    };
    let run = og(t.path(), &args, how, Duration::from_secs(60));
    run.check("exit after the relaunch", Some(0), run.code);
    run.check(
        "outcomes",
        vec!["cuda_oom".to_string(), "success".to_string()],
        outcomes(&run),
    );
}

// ------------------------------------------------------- policies and knob values

/// `oomguard ARGS true` in `dir`: (exit code, stderr); a bounded wait.
fn usage(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut c = Command::new(OOMGUARD)
        .args(args)
        .current_dir(dir)
        .env("OOMGUARD_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("usage.err")).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    let done = common::wait_until(Duration::from_secs(20), || {
        status = c.try_wait().unwrap();
        status.is_some()
    });
    if !done {
        let _ = c.kill();
        let _ = c.wait();
    }
    let err = std::fs::read_to_string(dir.join("usage.err")).unwrap_or_default();
    assert!(done, "oomguard {args:?} did not finish within 20 s: {err}");
    (status.and_then(|s| s.code()), err)
}

#[test]
fn policy_env_values_with_nul_and_keys_with_equals_are_usage_errors() {
    let t = tmp();
    let ran = t.path().join("ran");
    let ran_s = ran.to_str().unwrap().to_owned();
    for (name, text, line, key) in [
        (
            "nul.toml",
            "[[step]]\nkind = \"halve_micro_batch\"\n[env]\nPYTORCH_NO_CUDA_MEMORY_CACHING = \"0\\u0000x\"\n",
            4,
            "env.PYTORCH_NO_CUDA_MEMORY_CACHING",
        ),
        (
            "equals.toml",
            "[[step]]\nkind = \"halve_micro_batch\"\n[env]\n\"PYTORCH_A=B\" = \"1\"\n",
            4,
            "env.PYTORCH_A=B",
        ),
    ] {
        let p = t.path().join(name);
        std::fs::write(&p, text).unwrap();
        let (code, err) = usage(
            t.path(),
            &["--policy", p.to_str().unwrap(), "touch", &ran_s],
        );
        let want = format!("{}:{line}: {key}", p.display());
        assert!(
            code == Some(2) && err.contains(&want),
            "{name}: expected exit 2 naming {want:?}; found {code:?}: {err}"
        );
        assert!(!ran.exists(), "{name}: the command ran");
    }
}

#[test]
fn a_policy_that_is_not_a_regular_file_or_too_large_is_refused_without_reading_it() {
    let t = tmp();
    let fifo = t.path().join("policy.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = t.path().join("big.toml");
    let mut text = "[[step]]\nkind = \"halve_micro_batch\"\n".to_string();
    while text.len() < 2 << 20 {
        text.push_str("# padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, text).unwrap();
    for p in ["/dev/zero", fifo.to_str().unwrap(), big.to_str().unwrap()] {
        for sub in [&[][..], &["plan"][..]] {
            let mut args = sub.to_vec();
            args.extend(["--policy", p, "true"]);
            let (code, err) = usage(t.path(), &args);
            assert!(
                code == Some(2) && err.contains(p),
                "--policy {p}: expected exit 2 naming it; found {code:?}: {err}"
            );
        }
    }
}

#[test]
fn a_knob_value_of_zero_and_multiple_of_zero_are_usage_errors() {
    let t = tmp();
    let (code, err) = usage(
        t.path(),
        &[
            "plan",
            "--knob",
            "micro_batch=+data.bs=0",
            "python3",
            "t.py",
        ],
    );
    assert!(
        code == Some(2) && err.contains("micro_batch"),
        "--knob micro_batch=+data.bs=0: expected exit 2; found {code:?}: {err}"
    );
    let p = t.path().join("zero.toml");
    std::fs::write(&p, "[[step]]\nkind = \"shorten_seq\"\nmultiple_of = 0\n").unwrap();
    let (code, err) = usage(t.path(), &["--policy", p.to_str().unwrap(), "true"]);
    let want = format!("{}:3: step[0].multiple_of", p.display());
    assert!(
        code == Some(2) && err.contains(&want),
        "multiple_of = 0: expected exit 2 naming {want}; found {code:?}: {err}"
    );
}

/// `plan --json` in `dir`: the parsed JSON (exit 0 expected).
fn plan_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(OOMGUARD)
        .args(["plan", "--json"])
        .args(args)
        .current_dir(dir)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "plan {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("plan {args:?}: {e}: {text}"))
}

#[test]
fn a_shortened_sequence_keeps_its_floor_and_its_multiple() {
    let t = tmp();
    let policy = |multiple: u64, min: u64| {
        let p = t.path().join(format!("seq-{multiple}-{min}.toml"));
        std::fs::write(
            &p,
            format!("[[step]]\nkind = \"shorten_seq\"\nmultiple_of = {multiple}\nmin = {min}\n"),
        )
        .unwrap();
        p.to_str().unwrap().to_owned()
    };
    let seqs = |multiple: u64, min: u64| -> Vec<u64> {
        let plan = plan_json(
            t.path(),
            &[
                "--policy",
                &policy(multiple, min),
                "python3",
                "train.py",
                "--max_seq_length",
                "1000",
            ],
        );
        plan["ladder"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["settings"]["seq_len"].as_u64().unwrap())
            .collect()
    };
    // 1000 cannot be shortened to a multiple of 4096 that is at least 10: not applicable.
    assert_eq!(seqs(4096, 10), vec![1000]);
    // 1000 × 0.5 = 500 → 256 (a multiple of 256) is below 600: the nearest allowed is 768.
    assert_eq!(seqs(256, 600), vec![1000, 768]);
    assert_eq!(seqs(8, 128), vec![1000, 496, 248, 128]);
}

#[test]
fn integral_floats_in_a_deepspeed_json_are_knob_values_and_keep_their_style() {
    let t = tmp();
    std::fs::write(
        t.path().join("ds.json"),
        "{\n  \"train_micro_batch_size_per_gpu\": 16.0,\n  \"gradient_accumulation_steps\": 2e0,\n  \"zero_optimization\": {\"stage\": 2}\n}\n",
    )
    .unwrap();
    let plan = plan_json(
        t.path(),
        &[
            "python3",
            "train.py",
            "--deepspeed",
            "ds.json",
            "--per_device_train_batch_size",
            "16",
            "--gradient_accumulation_steps",
            "2",
        ],
    );
    let binding = plan["knobs"]["micro_batch"]["binding"]
        .as_str()
        .unwrap_or("");
    assert!(
        binding.contains("train_micro_batch_size_per_gpu"),
        "the JSON's 16.0 is the same knob as the flag: {binding}"
    );
    let halve = plan["ladder"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == "halve_micro_batch")
        .expect("a halving rung");
    let diff = halve["files"][0]["diff"].as_str().unwrap_or("");
    assert!(
        diff.contains("+  \"train_micro_batch_size_per_gpu\": 8.0,")
            && diff.contains("+  \"gradient_accumulation_steps\": 4e0,"),
        "the copy follows the flags, in the file's own number style:\n{diff}"
    );
}
