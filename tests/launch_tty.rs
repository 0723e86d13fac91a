//! The real binary on a terminal: the command gets a terminal of the same size, and resizes
//! reach it; `diagnose` at a terminal says what it waits for. The terminal is made by
//! script(1) (util-linux): both tests fail without it, saying so.

mod common;
use common::OOMGUARD;

use std::path::Path;
use std::process::Command;

fn have_script() -> bool {
    Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_command_gets_our_terminal_size_and_its_changes() {
    assert!(
        have_script(),
        "script(1) not found: install util-linux (bsdutils) to run the terminal tests"
    );
    let dir = tempfile::tempdir().unwrap();
    let child = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/print_winsize.py");
    // Inside script's terminal: set a size, start oomguard in the background of the same
    // process group (no job control), wait until the child is ready, resize (one
    // dimension: `stty cols C rows R` may apply them as two changes, two SIGWINCHes,
    // and the child reports the first).
    let ready = dir.path().join("ready");
    let inner = format!(
        "stty cols 100 rows 30; '{bin}' -q --run-dir '{rd}' python3 '{child}' '{ready}' & \
         for i in $(seq 200); do [ -e '{ready}' ] && break; sleep 0.05; done; \
         stty cols 77; wait",
        bin = OOMGUARD,
        rd = dir.path().join("run").display(),
        child = child.display(),
        ready = ready.display(),
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "script {inner:?} failed; output: {text}"
    );
    assert!(
        text.contains("ready isatty=True size=100x30"),
        "no terminal of our size: {text}"
    );
    assert!(
        text.contains("winch size=77x30"),
        "resize not forwarded: {text}"
    );
}

/// `oomguard diagnose` with no file, at a terminal, says it is reading standard input
/// (instead of waiting in silence); from a pipe it says nothing of the kind.
#[test]
fn diagnose_at_a_terminal_says_it_reads_standard_input() {
    use std::io::Write;
    use std::process::Stdio;
    const HINT: &str = "oomguard: reading a log from standard input (paste it, then Ctrl-D); \
                        or give a file: oomguard diagnose FILE";
    assert!(
        have_script(),
        "this test needs script(1) (util-linux) to give oomguard a terminal"
    );
    let bin = OOMGUARD;
    for args in ["diagnose", "diagnose -"] {
        // script's stdin is forwarded to the terminal: a log line, then Ctrl-D (end of input).
        // timeout(1): a missed end of input fails the test instead of hanging it.
        let inner = format!("'{bin}' {args}");
        let mut child = Command::new("timeout")
            .args(["60", "script", "-qec", &inner, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"epoch 1 loss 0.4\n\x04")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "script {inner:?} failed; output: {text}"
        );
        assert!(
            text.contains(HINT),
            "oomguard {args}: no hint; output: {text}"
        );
        assert!(
            text.contains("kind: no_failure"),
            "oomguard {args}: the log was not read after the hint; output: {text}"
        );
    }
    // Not a terminal: the log comes from a pipe, and stderr stays clean.
    let mut child = Command::new(bin)
        .arg("diagnose")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"epoch 1 loss 0.4\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.stderr.is_empty(),
        "oomguard diagnose from a pipe printed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
