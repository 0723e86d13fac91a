//! fairseq-train as a user runs it: `oomguard fairseq-train DATA --max-tokens 4096
//! --update-freq 2 --save-dir ck`. The stand-in (`tests/children/fairseq/fairseq-train`,
//! on PATH) has fairseq's options, saves `checkpoint_1_N.pt` with its copy
//! `checkpoint_last.pt`, loads `checkpoint_last.pt` by itself at start, and OOMs above a
//! token budget.

mod common;
use common::*;

use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `oomguard ARGS` in `dir` with the stand-in first on PATH, its launches reported to
/// `report`, and `env` besides.
fn fairseq_train(
    dir: &std::path::Path,
    report: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Run {
    let bin = repo().join("tests/children/fairseq");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut all = vec![
        ("PATH", path.as_str()),
        ("REPORT", report.to_str().unwrap()),
    ];
    all.extend_from_slice(env);
    spawn_env(dir, args, &all).wait(LIMIT)
}

/// The OOM at update 3 (checkpoint_1_2.pt saved): the budget is halved and update-freq
/// doubled (8192 tokens per update kept), nothing is added to tell fairseq where to
/// resume, and the relaunch loads checkpoint_last.pt by itself and goes on from update 2.
/// oomguard says so: before, it said each attempt started from the beginning.
#[test]
fn fairseq_goes_on_from_its_own_checkpoint_last_at_half_the_token_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let rep = t.join("report.jsonl");
    let run = fairseq_train(
        t,
        &rep,
        &[
            "--run-dir",
            "run",
            "fairseq-train",
            "data-bin",
            "--arch",
            "transformer_lm",
            "--max-tokens",
            "4096",
            "--update-freq",
            "2",
            "--save-dir",
            "ck",
        ],
        &[("OOM_BUDGET_TOKENS", "3000")],
    );
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&t.join("run"));
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let argv = argv_of(starts[1]);
    run.check(
        "attempt 2's budget",
        Some("2048".to_string()),
        flag_value(&argv, "--max-tokens"),
    );
    run.check(
        "attempt 2's update-freq",
        Some("4".to_string()),
        flag_value(&argv, "--update-freq"),
    );
    run.check(
        "no resume argument added",
        None,
        flag_value(&argv, "--restore-file"),
    );
    run.check(
        "the checkpoint attempt 2 resumes from",
        Some("ck/checkpoint_last.pt"),
        starts[1]["resume"].as_str(),
    );
    run.ensure(
        "the terminal says fairseq resumes by itself, and adds nothing",
        run.stderr.contains(
            "ck/checkpoint_last.pt is the newest complete checkpoint this run wrote; the command resumes from its folder by itself",
        ) && run.stderr.contains(
            "it resumes from ck/checkpoint_last.pt, which the command loads from its folder by itself",
        ) && !run.stderr.contains("added by oomguard"),
        "'the command resumes from its folder by itself', and no 'added by oomguard'",
        tail(&run.stderr, 2000),
    );
    let w = only_event(&run, &j, "work_lost");
    run.check("resume step", Some(2), w["resume_from_step"].as_u64());
    // fairseq's own account: attempt 2 loaded update 2 and finished at 6.
    let r = report(&rep);
    let last = r.last().cloned().unwrap_or_default();
    run.check("final budget", Some(2048), last["max_tokens"].as_u64());
    run.check("final update-freq", Some(4), last["update_freq"].as_u64());
    run.check(
        "restored",
        Some("ck/checkpoint_last.pt"),
        last["restored"].as_str(),
    );
    run.check("started from update", Some(2), last["start"].as_u64());
    run.check("finished at update", Some(6), last["end"].as_u64());
}

/// fairseq's tqdm bar (its format on a terminal) counts the epoch's updates and starts
/// again each epoch; `num_updates=N` counts the run's. With 2 updates an epoch, the OOM
/// at update 5 comes when the bar shows 2/2 of epoch 2 and num_updates is 4: the step
/// reached is 4, and no update is redone (read from the bar, the step was 2, raised to
/// "at least 4" by the checkpoint saved: the work lost was unknown).
#[test]
fn fairseqs_step_is_its_num_updates_not_its_epoch_bar() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let rep = t.join("report.jsonl");
    let run = fairseq_train(
        t,
        &rep,
        &[
            "--run-dir",
            "run",
            "fairseq-train",
            "data-bin",
            "--max-tokens",
            "4096",
            "--update-freq",
            "2",
            "--save-dir",
            "ck",
            "--log-format",
            "tqdm",
        ],
        &[
            ("OOM_BUDGET_TOKENS", "3000"),
            ("OOM_AT", "5"),
            ("EPOCH_UPDATES", "2"),
        ],
    );
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&t.join("run"));
    let w = only_event(&run, &j, "work_lost");
    run.check("step reached", Some(4), w["step_reached"].as_u64());
    run.check("resume step", Some(4), w["resume_from_step"].as_u64());
    run.check("steps redone", Some(0), w["steps_lost"].as_u64());
    let last = report(&rep).last().cloned().unwrap_or_default();
    run.check("started from update", Some(4), last["start"].as_u64());
    run.check("finished at update", Some(6), last["end"].as_u64());
}
