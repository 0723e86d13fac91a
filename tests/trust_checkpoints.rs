//! Trust: a relaunch continues this run, and nothing that names files in a
//! checkpoint folder reaches out of it. These drive the real binary.

mod common;
use common::*;

use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn make_checkpoints() -> String {
    repo()
        .join("tests/children/make_checkpoints.sh")
        .display()
        .to_string()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn an_unreadable_checkpoint_is_skipped_as_permission_denied() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--max-attempts",
        "2",
        "sh",
        &make_checkpoints(),
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--unreadable",
        "--output_dir",
        out.to_str().unwrap(),
    ];
    // Root reads every folder: run as nobody then (the folders must let it in).
    let root = unsafe { libc::geteuid() } == 0;
    let mut c = if root {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
            OOMGUARD,
        ]);
        c
    } else {
        std::process::Command::new(OOMGUARD)
    };
    let o = c
        .args(args)
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let ckpt = out.join("checkpoint-100");
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&ckpt, std::fs::Permissions::from_mode(0o755));
    }
    let text = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap_or_default();
    let skipped: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "checkpoint_skipped")
        .collect();
    assert!(
        skipped
            .iter()
            .any(|e| e["path"] == path_str(&ckpt) && e["why"] == "cannot read: permission denied"),
        "expected checkpoint_skipped for {} with why \"cannot read: permission denied\"\nfound: {skipped:?}\nexit: {:?}\nstderr:\n{}",
        ckpt.display(),
        o.status.code(),
        tail(&stderr, 3000)
    );
}

#[test]
fn a_resume_table_cannot_reach_outside_the_checkpoint_or_drop_its_flag() {
    let tmp = tempfile::tempdir().unwrap();
    for (body, line, key) in [
        (
            "[resume]\nflag = \"--resume_from\"\ndir = \"out\"\npattern = \"step_{step}\"\ncomplete_when = [\"model.pt\", \"../../etc/passwd\"]\n",
            5,
            "resume.complete_when",
        ),
        (
            "[resume]\nflag = \"--resume_from\"\ndir = \"out\"\npattern = \"step_{step}\"\ncomplete_when = [\"/etc/passwd\"]\n",
            5,
            "resume.complete_when",
        ),
        (
            "[resume]\ndir_flag = \"--output_dir\"\nflag = \"\"\npattern = \"step_{step}\"\n",
            3,
            "resume.flag",
        ),
    ] {
        let p = tmp.path().join("p.toml");
        std::fs::write(
            &p,
            format!("[[step]]\nkind = \"halve_micro_batch\"\n\n{body}"),
        )
        .unwrap();
        let run = oomguard(
            tmp.path(),
            &["--policy", p.to_str().unwrap(), "true"],
            None,
            LIMIT,
        );
        run.check("exit code", Some(2), run.code);
        let want = format!("{}:{}: {key}:", p.display(), line + 3);
        run.ensure(
            "the error names file:line:key",
            run.stderr.contains(&want),
            &want,
            &run.stderr,
        );
    }
}
