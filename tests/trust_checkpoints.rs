//! Trust: a relaunch continues this run. It resumes only from a checkpoint this
//! run wrote — never from an older experiment's or another run's in the same
//! output folder — and when there is none it starts the way the first attempt
//! did. These drive the real binary on `examples/sim_trainer.py` (see
//! `tests/sim_trainer.rs`) and on `tests/children/make_checkpoints.sh`, a
//! trainer that leaves checkpoint folders behind and dies of an OOM.

mod common;
use common::*;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn make_checkpoints() -> String {
    repo()
        .join("tests/children/make_checkpoints.sh")
        .display()
        .to_string()
}

/// The README demo (fast steps): OOMs at micro-batch 16 and 8 at step 7, after
/// checkpoint-5 is saved; fits at 4.
fn demo(out: &Path) -> Vec<String> {
    demo_args(out)
}

fn with_run_dir(run_dir: &Path, cmd: Vec<String>) -> Vec<String> {
    let mut v = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    v.extend(cmd);
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A real-shaped safetensors file: 8-byte header length, JSON header, tensor bytes.
fn safetensors(floats: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt"}},"w":{{"dtype":"F32","shape":[{floats}],"data_offsets":[0,{}]}}}}"#,
        floats * 4
    );
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, floats * 4));
    v
}

/// A complete Hugging Face checkpoint of another experiment at `step`.
fn old_checkpoint(out: &Path, step: u64) -> PathBuf {
    let d = out.join(format!("checkpoint-{step}"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("model.safetensors"), safetensors(16)).unwrap();
    std::fs::write(
        d.join("trainer_state.json"),
        format!(r#"{{"global_step": {step}, "log_history": [], "max_steps": {step}}}"#),
    )
    .unwrap();
    d
}

/// The `attempt_start` events' resume arguments, attempt by attempt.
fn resumes(j: &[Value]) -> Vec<Option<String>> {
    events(j, "attempt_start")
        .iter()
        .map(|e| resume_arg(&argv_of(e)))
        .collect()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn a_relaunch_never_resumes_from_an_older_experiments_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    // An older experiment's complete checkpoint, far ahead of this run.
    let stale = old_checkpoint(&out, 500);
    let stale_state = std::fs::read(stale.join("trainer_state.json")).unwrap();
    let run = oomguard(
        tmp.path(),
        &strs(&with_run_dir(&run_dir, demo(&out))),
        None,
        LIMIT,
    );

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let own = path_str(&out.join("checkpoint-5"));
    run.check(
        "attempt 1 as written, then each relaunch from this run's checkpoint-5",
        vec![None, Some(own.clone()), Some(own)],
        resumes(&j),
    );
    // The trainer itself trained all 30 steps (it did not "finish" at 500).
    let fin = run.read_json(&out.join("final.json"));
    let trained: u64 = fin["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| s["end_step"].as_u64().unwrap_or(0) - s["start_step"].as_u64().unwrap_or(0))
        .sum();
    run.ensure(
        "every step up to 30 trained",
        trained >= 30,
        "at least 30 steps trained across the attempts",
        &fin["attempts"],
    );
    // The journal says what was ignored, and why.
    let ignored = events(&j, "checkpoints_ignored");
    run.ensure(
        "a checkpoints_ignored event names checkpoint-500",
        ignored.iter().any(|e| {
            e["newest"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p == &path_str(&stale)))
                && e["count"].as_u64() >= Some(1)
                && e["reasons"]["present_at_start"].as_u64() >= Some(1)
        }),
        "checkpoints_ignored with checkpoint-500, count and reasons",
        &ignored,
    );
    run.ensure(
        "stderr says it was ignored",
        run.stderr.contains("ignored") && run.stderr.contains("checkpoint-500"),
        "a line naming checkpoint-500 as ignored",
        tail(&run.stderr, 2000),
    );
    run.check(
        "the older experiment's checkpoint is untouched",
        stale_state,
        std::fs::read(stale.join("trainer_state.json")).unwrap(),
    );
}

#[test]
fn a_shared_output_dir_resumes_only_from_this_runs_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    // Another run in the same output_dir got to step 20 (checkpoint-5 … 20).
    let other = std::process::Command::new("python3")
        .args([
            &sim(),
            "--per_device_train_batch_size",
            "4",
            "--max_seq_length",
            "1024",
            "--max_steps",
            "20",
            "--save_steps",
            "5",
            "--step_seconds",
            "0.001",
            "--output_dir",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(other.success(), "the other run: {other}");
    assert!(out.join("checkpoint-20/trainer_state.json").exists());

    // This run writes its own checkpoint-5 over the other's, then OOMs at step 7.
    let run = oomguard(
        tmp.path(),
        &strs(&with_run_dir(&run_dir, demo(&out))),
        None,
        LIMIT,
    );
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let own = path_str(&out.join("checkpoint-5"));
    run.check(
        "each relaunch resumes from the checkpoint-5 this run rewrote, not the other run's checkpoint-20",
        vec![None, Some(own.clone()), Some(own)],
        resumes(&j),
    );
    let ignored: Vec<String> = events(&j, "checkpoints_ignored")
        .iter()
        .flat_map(|e| e["newest"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p.as_str().map(String::from))
        .collect();
    run.ensure(
        "the other run's checkpoint-20 is named as ignored",
        ignored.contains(&path_str(&out.join("checkpoint-20"))),
        "checkpoint-20 in checkpoints_ignored",
        &ignored,
    );
}

#[test]
fn without_a_checkpoint_of_its_own_a_relaunch_starts_as_the_first_attempt_did() {
    // The OOM comes at step 2, before this run saves anything.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    old_checkpoint(&out, 500);
    let mut cmd = demo(&out);
    cmd.extend(["--oom_at_step", "2"].map(String::from));

    // No resume argument of the user's: every attempt starts fresh.
    let run_dir = tmp.path().join("run-fresh");
    let run = oomguard(
        tmp.path(),
        &strs(&with_run_dir(&run_dir, cmd.clone())),
        None,
        LIMIT,
    );
    run.check("exit code", Some(0), run.code);
    run.check(
        "no attempt resumes from the older checkpoint-500",
        vec![None, None, None],
        resumes(&run.journal(&run_dir)),
    );

    // The user's own resume argument is kept by every relaunch.
    let theirs = old_checkpoint(&tmp.path().join("from"), 1);
    cmd.extend(["--resume_from_checkpoint".to_string(), path_str(&theirs)]);
    let run_dir = tmp.path().join("run-theirs");
    let run = oomguard(tmp.path(), &strs(&with_run_dir(&run_dir, cmd)), None, LIMIT);
    run.check("exit code", Some(0), run.code);
    run.check(
        "every attempt resumes from the user's checkpoint, as the first did",
        vec![Some(path_str(&theirs)); 3],
        resumes(&run.journal(&run_dir)),
    );
}

#[test]
fn plan_says_which_checkpoints_a_relaunch_would_ignore() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let stale = old_checkpoint(&out, 500);
    let mut args = vec!["plan".to_string(), "--json".to_string()];
    args.extend(demo(&out));
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let v: Value = serde_json::from_str(&run.stdout).unwrap_or(Value::Null);
    run.check(
        "no checkpoint to resume from",
        &Value::Null,
        &v["resume"]["checkpoint"],
    );
    run.ensure(
        "checkpoint-500 is listed as ignored, with why",
        v["resume"]["ignored"].as_array().is_some_and(|a| {
            a.iter().any(|s| {
                s["path"] == path_str(&stale)
                    && s["kind"] == "present_at_start"
                    && s["why"]
                        .as_str()
                        .is_some_and(|w| w.contains("present when this run started"))
            })
        }),
        "resume.ignored naming checkpoint-500",
        &v["resume"],
    );
    let rung2 = v["ladder"][1]["argv"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    run.ensure(
        "the relaunch in the plan does not resume from checkpoint-500",
        !rung2
            .iter()
            .any(|a| a.as_str().is_some_and(|s| s.contains("checkpoint-500"))),
        "no checkpoint-500 in rung 2's argv",
        &rung2,
    );

    args.remove(1); // the text form
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
    run.ensure(
        "plan's text names it as ignored",
        run.stdout.contains("ignored") && run.stdout.contains("checkpoint-500"),
        "a line naming checkpoint-500 as ignored",
        &run.stdout,
    );
}

#[test]
fn ten_thousand_incomplete_checkpoints_are_summarised_in_the_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let cmd = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--max-attempts",
        "3",
        "sh",
        &make_checkpoints(),
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--incomplete",
        "10000",
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let run = oomguard(tmp.path(), &cmd, None, LIMIT);
    run.check("exit code (out of attempts)", Some(75), run.code);
    let j = run.journal(&run_dir);
    let decisions = events(&j, "decision").len();
    run.check("two relaunches decided", 2, decisions);
    let one_by_one = events(&j, "checkpoint_skipped").len();
    run.ensure(
        "a few checkpoints named one by one per relaunch",
        one_by_one <= 5 * decisions && one_by_one > 0,
        "at most 5 checkpoint_skipped events per relaunch",
        one_by_one,
    );
    let rest = events(&j, "checkpoints_skipped");
    run.check("one summary per relaunch", decisions, rest.len());
    for e in &rest {
        run.check("the rest counted", Some(10000 - 5), e["count"].as_u64());
        run.check(
            "their reasons counted",
            Some(10000 - 5),
            e["reasons"]["incomplete"].as_u64(),
        );
    }
    let size = std::fs::metadata(run_dir.join("journal.jsonl"))
        .map(|m| m.len())
        .unwrap_or(0);
    run.ensure(
        "the journal stays small",
        size < 64 * 1024,
        "under 64 KiB",
        size,
    );
    run.ensure(
        "stderr stays short",
        run.stderr.lines().filter(|l| l.contains("skipped")).count() <= 6 * decisions,
        "a few `skipped` lines per relaunch",
        run.stderr.lines().filter(|l| l.contains("skipped")).count(),
    );
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
        // Sticky, as /tmp is: a world-writable folder without it is refused for run folders.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
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

/// A script that resumes by itself from its folder's newest `checkpoint-N`, whole or
/// not (`tests/children/self_resuming.py`: `get_last_checkpoint`, transformers 5's
/// examples, with no flag that turns the search off), dies of an OOM while saving
/// `checkpoint-2`, its first save. The relaunch (the same settings: a save's OOM is
/// retried once) would load that half-written folder and die on it ("Can't find a valid
/// checkpoint", the end of the night before): it is moved aside first, renamed beside
/// it, never deleted, said and journaled, and the run finishes, its own checkpoints
/// whole.
#[test]
fn a_half_written_checkpoint_is_moved_out_of_a_self_resuming_scripts_way() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run_dir = dir.path().join("run");
    let marker = dir.path().join("save-oomed");
    let script = repo().join("tests/children/self_resuming.py");
    let r = oomguard(
        dir.path(),
        &[
            "--run-dir",
            run_dir.to_str().unwrap(),
            "python3",
            script.to_str().unwrap(),
            "--output_dir",
            out.to_str().unwrap(),
            "--per_device_train_batch_size",
            "4",
            "--save_oom_once",
            marker.to_str().unwrap(),
        ],
        None,
        LIMIT,
    );
    r.check("exit code", Some(0), r.code);
    r.ensure(
        "no attempt loaded the half-written checkpoint",
        !r.stdout.contains("Can't find a valid checkpoint") && r.stdout.contains("training done"),
        "the run finished",
        &r.stdout,
    );
    let j = r.journal(&run_dir);
    let moved: Vec<(String, String)> = events(&j, "checkpoint_moved_aside")
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["to"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let to = out.join("oomguard-incomplete-checkpoint-2");
    r.check(
        "the half-written checkpoint-2, moved once",
        vec![(path_str(&out.join("checkpoint-2")), path_str(&to))],
        moved,
    );
    assert!(to.join("model.safetensors").exists(), "kept, not deleted");
    for step in [2, 4] {
        let c = out.join(format!("checkpoint-{step}"));
        assert!(
            c.join("trainer_state.json").exists(),
            "{} whole",
            c.display()
        );
    }
    r.ensure(
        "the terminal says what was moved and why",
        r.stderr.contains("moved ") && r.stderr.contains("oomguard-incomplete-checkpoint-2"),
        "a moved line",
        &r.stderr,
    );
    r.check(
        "attempts (the save's OOM retried once at the same settings)",
        2,
        events(&j, "attempt_start").len(),
    );
}
