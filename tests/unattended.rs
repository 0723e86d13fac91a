//! Unattended means unattended: what oomguard itself does must never end a night's run.
//! Each test drives the real binary the way a user does.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{OOMGUARD, alive, wait_until};

/// `nohup oomguard … &` in a terminal, then the terminal goes away (script(1), which holds
/// the pseudo-terminal's master, is killed: the kernel hangs the terminal up and SIGHUPs the
/// shell and the terminal's process group). oomguard and its command keep SIGHUP ignored, as
/// they would be without oomguard, and the run finishes: the command's output and oomguard's
/// summary land in nohup.out, and the journal records a success.
#[test]
fn nohup_keeps_the_run_going_after_the_terminal_hangs_up() {
    let dir = tempfile::tempdir().unwrap();
    let child = common::repo().join("tests/children/outlive_hangup.py");
    let inner = format!(
        "cd '{dir}' && nohup '{OOMGUARD}' --run-dir '{dir}/run' python3 '{child}' '{dir}' & \
         sleep 600",
        dir = dir.path().display(),
        child = child.display(),
    );
    let mut script = Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .stdin(Stdio::piped()) // keeps the terminal's input open until the hangup
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("script(1) (util-linux) runs the terminal of this test");
    let ready = dir.path().join("ready");
    assert!(
        wait_until(Duration::from_secs(60), || ready.exists()),
        "the command never started under nohup oomguard"
    );
    let oomguard: i32 = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The hangup: the terminal's master closes with script.
    script.kill().unwrap();
    script.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        alive(oomguard),
        "oomguard (pid {oomguard}) died when the terminal hung up; nohup.out: {}",
        read(&dir.path().join("nohup.out"))
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || !alive(oomguard)),
        "oomguard did not finish"
    );
    let out = read(&dir.path().join("nohup.out"));
    assert!(
        out.contains("dispositions: SIGHUP=ignored"),
        "the command did not inherit nohup's ignored SIGHUP: {out}"
    );
    assert!(
        out.contains("training finished after the hangup"),
        "the command did not outlive the hangup: {out}"
    );
    assert!(
        out.contains("oomguard: finished after 1 attempt") && !out.contains("interrupted"),
        "oomguard's summary is not a plain finish: {out}"
    );
    let journal = read(&dir.path().join("run/journal.jsonl"));
    assert!(
        journal.contains("\"success\""),
        "the journal does not record a success: {journal}"
    );
}

/// Without nohup, a hangup still ends the run as before (the command gets SIGHUP at its
/// default disposition, and oomguard reports the interruption).
#[test]
fn without_nohup_the_command_gets_sighup_at_its_default() {
    let dir = tempfile::tempdir().unwrap();
    let child = common::repo().join("tests/children/outlive_hangup.py");
    // A background job of a non-interactive shell: SIGINT and SIGQUIT are ignored by the
    // shell's `&` (and stay so), SIGHUP is not.
    let inner = format!(
        "'{OOMGUARD}' --run-dir '{dir}/run' python3 '{child}' '{dir}' >'{dir}/out' 2>&1 & wait",
        dir = dir.path().display(),
        child = child.display(),
    );
    let mut sh = Command::new("sh").args(["-c", &inner]).spawn().unwrap();
    let ready = dir.path().join("ready");
    assert!(wait_until(Duration::from_secs(60), || ready.exists()));
    std::fs::write(dir.path().join("go"), "").unwrap();
    sh.wait().unwrap();
    let out = read(&dir.path().join("out"));
    assert!(
        out.contains("dispositions: SIGHUP=default SIGINT=ignored SIGQUIT=ignored"),
        "{out}"
    );
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("({}: {e})", p.display()))
}

/// A mistyped option before the command (`--max-attemps`) is a usage error naming the nearest
/// option, not a command to run: exit 2, and nothing is created in the working folder.
#[test]
fn a_mistyped_option_is_a_usage_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (args, nearest) in [
        (
            vec!["--max-attemps", "3", "python3", "train.py"],
            "--max-attempts",
        ),
        (
            vec!["--grace=5", "--hang-timout", "5", "python3", "t.py"],
            "--hang-timeout",
        ),
        (
            vec!["plan", "--polcy", "default", "python3", "t.py"],
            "--policy",
        ),
    ] {
        let run = common::oomguard(dir.path(), &args, None, Duration::from_secs(30));
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!("did you mean '{nearest}'?")),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stderr.contains("Nothing was run."), "{}", run.stderr);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    // After `--` the user said where the command starts: it runs (and is not found).
    let run = common::oomguard(
        dir.path(),
        &["--run-dir", "r", "--", "--no-such-program"],
        None,
        Duration::from_secs(30),
    );
    assert_eq!(run.code, Some(127), "{}", run.stderr);
}

/// `oomguard plan … | head -1`: the report ends quietly when its reader goes away (no
/// panic on the broken pipe), as other Unix tools do. The reader here is gone before
/// oomguard writes its first line.
#[test]
fn a_report_whose_reader_went_away_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    // The reader is gone before oomguard starts: its first write meets a closed pipe,
    // however the two are scheduled.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(OOMGUARD)
        .args([
            "plan",
            "python3",
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--output_dir",
            "out",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "ended by SIGPIPE as `cat` would be: {:?}; {err}",
        out.status
    );
}

/// The guide's `setsid -f oomguard … >log 2>&1`: the run goes on in a session of its own,
/// with no terminal, and finishes; its output and oomguard's summary are in the log.
#[test]
fn setsid_leaves_a_run_going_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let child = common::repo().join("tests/children/outlive_hangup.py");
    let inner = format!(
        "cd '{dir}' && setsid -f '{OOMGUARD}' --run-dir '{dir}/run' python3 '{child}' '{dir}' >'{dir}/log' 2>&1",
        dir = dir.path().display(),
        child = child.display(),
    );
    let status = Command::new("sh").args(["-c", &inner]).status().unwrap();
    assert!(status.success(), "setsid -f returns at once");
    let ready = dir.path().join("ready");
    assert!(wait_until(Duration::from_secs(60), || ready.exists()));
    let oomguard: i32 = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: getsid only reads another process's session id.
    let (sid, ours) = unsafe { (libc::getsid(oomguard), libc::getsid(0)) };
    assert!(
        sid > 0 && sid != ours,
        "oomguard runs in a session of its own"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(wait_until(Duration::from_secs(60), || !alive(oomguard)));
    let log = read(&dir.path().join("log"));
    assert!(log.contains("training finished after the hangup"), "{log}");
    assert!(log.contains("oomguard: finished after 1 attempt"), "{log}");
}
