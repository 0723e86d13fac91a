//! The real binary on a terminal: the command gets a terminal of the same size, and resizes
//! reach it. The terminal is made by script(1) (util-linux); the tests are skipped without it.

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
    if !have_script() {
        eprintln!("skipped: script(1) not found");
        return;
    }
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
        bin = env!("CARGO_BIN_EXE_oomguard"),
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
