//! The real binary: nothing of the command outlives oomguard, even when oomguard is killed
//! with SIGKILL (no cleanup code of its own runs), and signals sent to oomguard reach the
//! command. Uses the purpose-built children in tests/children/.

mod common;
use common::{OOMGUARD, alive_of};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn children() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children")
}

/// Starts `oomguard --run-dir <tmp> ARGS...` with stdout captured into a file.
struct Oomguard {
    child: Child,
    cmd: String,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Oomguard {
    fn start(args: &[&str]) -> Oomguard {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("stdout");
        let run_dir = dir.path().join("run");
        let mut cmd = Command::new(OOMGUARD);
        cmd.arg("--run-dir").arg(&run_dir).args(args);
        let shown = format!("{cmd:?}");
        let child = cmd
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
        Oomguard {
            child,
            cmd: shown,
            out,
            _dir: dir,
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Fails the test with the command, the expectation and what was found.
    fn fail(&self, expected: &str) -> ! {
        panic!(
            "command: {}\nexpected: {expected}\nstdout so far:\n{}",
            self.cmd,
            self.stdout()
        )
    }
}

impl Drop for Oomguard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn sigkill_leaves_nothing(mode: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let pids_file = tmp.path().join("pids");
    let tree = children().join("spawn_tree.py");
    let g = Oomguard::start(&[
        "python3",
        tree.to_str().unwrap(),
        pids_file.to_str().unwrap(),
        mode,
    ]);
    if !common::wait_until(Duration::from_secs(20), || read_pids(&pids_file).len() == 5) {
        g.fail("spawn_tree.py to start 5 processes");
    }
    let pids = read_pids(&pids_file);
    assert_eq!(alive_of(&pids).len(), 5, "{pids:?}");
    g.signal(libc::SIGKILL);
    if !common::wait_until(Duration::from_secs(5), || alive_of(&pids).is_empty()) {
        g.fail(&format!(
            "every process of the tree gone within 5 s of SIGKILL to oomguard; alive: {:?}",
            alive_of(&pids)
        ));
    }
}

#[test]
fn sigkill_of_oomguard_kills_the_process_group() {
    sigkill_leaves_nothing("group");
}

#[test]
fn sigkill_of_oomguard_kills_workers_in_their_own_session() {
    // torchrun starts its workers with start_new_session=True.
    sigkill_leaves_nothing("setsid");
}

#[test]
fn signals_sent_to_oomguard_reach_the_command() {
    let script = children().join("print_signals.py");
    let mut g = Oomguard::start(&["python3", script.to_str().unwrap()]);
    if !common::wait_until(Duration::from_secs(20), || {
        g.stdout().contains("ready (pid:")
    }) {
        g.fail("`ready (pid: N)` from print_signals.py");
    }
    g.signal(libc::SIGUSR1);
    if !common::wait_until(Duration::from_secs(5), || {
        g.stdout().contains("received SIGUSR1")
    }) {
        g.fail("SIGUSR1 forwarded to the command");
    }
    g.signal(libc::SIGTERM);
    let mut status = None;
    if !common::wait_until(Duration::from_secs(10), || {
        status = g.child.try_wait().unwrap();
        status.is_some()
    }) {
        g.fail("oomguard to exit after SIGTERM");
    }
    if !g.stdout().contains("received SIGTERM") {
        g.fail("SIGTERM forwarded to the command");
    }
    assert_ne!(
        status.unwrap().code(),
        Some(0),
        "an interrupted run is not a success"
    );
}
