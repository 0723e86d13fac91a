//! Integration tests that drive the real `oomguard` binary on `examples/sim_trainer.py`,
//! a simulated Hugging Face-style trainer in plain Python 3 (no GPU, no venv: `python3`
//! on PATH is enough). The simulator OOMs at micro-batch 16 and 8 with sequence 1024 and
//! fits at 4; it saves `checkpoint-N/trainer_state.json` every --save_steps and OOMs at
//! step 7 (--oom_at_step), so checkpoint-5 exists when it dies and resume is visible.

mod common;
use common::*;

use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
const LIMIT: Duration = Duration::from_secs(120);

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn recovers_from_oom_resuming_from_checkpoint_and_keeping_global_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(demo_args(&out));
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(0), run.code);
    // What the trainer itself recorded: the steps each launch contributed and its settings.
    let fin = run.read_json(&out.join("final.json"));
    run.check("final global_step", Some(30), fin["global_step"].as_u64());
    run.check("final micro-batch", Some(4), fin["micro"].as_u64());
    run.check(
        "final gradient accumulation",
        Some(8),
        fin["accum"].as_u64(),
    );
    run.check("final global batch", Some(32), fin["global_batch"].as_u64());
    let segments = fin["attempts"].as_array().cloned().unwrap_or_default();
    for s in &segments {
        run.check(
            "global batch of every launch",
            Some(32),
            s["global_batch"].as_u64(),
        );
    }
    let last = segments.last().cloned().unwrap_or_default();
    run.ensure(
        "the last launch resumed from checkpoint-5",
        last["resumed_from"]
            .as_str()
            .is_some_and(|p| p.ends_with("checkpoint-5")),
        "resumed_from ending in checkpoint-5",
        &last,
    );
    run.ensure(
        "the trainer printed its resume",
        run.stdout.contains("resuming from checkpoint-5 at step 5"),
        "'resuming from checkpoint-5 at step 5' in the output",
        tail(&run.stdout, 400),
    );

    // What oomguard recorded.
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 3, starts.len());
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "decisions",
        vec![Value::from("halve_micro_batch"); 2],
        steps,
    );
    run.check(
        "attempt 1 resumes from nothing",
        None,
        resume_arg(&argv_of(starts[0])),
    );
    for (n, start) in starts.iter().enumerate().skip(1) {
        let resume = resume_arg(&argv_of(start));
        run.ensure(
            &format!("attempt {} resumes from checkpoint-5", n + 1),
            resume.as_deref() == Some(out.join("checkpoint-5").to_str().unwrap()),
            &format!(
                "--resume_from_checkpoint {}",
                out.join("checkpoint-5").display()
            ),
            argv_of(start),
        );
    }
    run.check("an oom event per OOM", 2, events(&j, "oom").len());
    run.check("one run_end", 1, events(&j, "run_end").len());
    let log1 = std::fs::read_to_string(run_dir.join("attempt-1/output.log")).unwrap_or_default();
    run.ensure(
        "attempt-1/output.log holds the attempt's output",
        log1.contains("torch.OutOfMemoryError: CUDA out of memory")
            && log1.contains("global batch: 32"),
        "the OOM line and the settings line",
        tail(&log1, 600),
    );
}

#[test]
fn a_failure_that_is_not_an_oom_stops_at_once_with_the_childs_code() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(demo_args(&out));
    args.extend(["--fail_with".to_string(), "3".to_string()]);
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(3), run.code);
    let j = run.journal(&run_dir);
    run.check("attempts", 1, events(&j, "attempt_start").len());
    run.check("decisions", 0, events(&j, "decision").len());
    let end = events(&j, "attempt_end");
    run.check(
        "outcome",
        Some("other_failure"),
        end.first().and_then(|e| e["outcome"].as_str()),
    );
}

#[test]
fn a_run_that_hangs_after_its_oom_is_killed_and_relaunched() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args: Vec<String> = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--hang-timeout",
        "1",
        "--grace",
        "1",
    ]
    .map(String::from)
    .to_vec();
    args.extend(demo_args(&out));
    args.push("--hang_after_oom".to_string());
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(0), run.code);
    run.ensure(
        "finished promptly",
        run.elapsed < Duration::from_secs(60),
        "under 60 s",
        run.elapsed,
    );
    let j = run.journal(&run_dir);
    let outcomes: Vec<_> = events(&j, "attempt_end")
        .iter()
        .map(|e| e["outcome"].clone())
        .collect();
    run.check(
        "outcomes",
        vec![
            Value::from("hung_after_oom"),
            Value::from("hung_after_oom"),
            Value::from("success"),
        ],
        outcomes,
    );
    let fin = run.read_json(&out.join("final.json"));
    run.check("final global batch", Some(32), fin["global_batch"].as_u64());
    expect_no_survivors(&run, out.to_str().unwrap());
}

#[test]
fn the_users_files_are_left_as_they_were() {
    // A project folder with the script and a config file; oomguard runs there with its
    // default run folder. Afterwards only out/ and .oomguard/ are new.
    let tmp = tempfile::tempdir().unwrap();
    let proj = tmp.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let script = std::fs::read(repo().join("examples/sim_trainer.py")).unwrap();
    std::fs::write(proj.join("train.py"), &script).unwrap();
    let config = b"{\"per_device_train_batch_size\": 16}\n";
    std::fs::write(proj.join("config.json"), config).unwrap();
    let user_argv = [
        "python3",
        "train.py",
        "--per_device_train_batch_size=16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "1024",
        "--output_dir",
        "out",
        "--max_steps",
        "12",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.005",
    ];
    let run = oomguard(&proj, &user_argv, None, LIMIT);

    run.check("exit code", Some(0), run.code);
    run.check(
        "train.py unchanged",
        true,
        std::fs::read(proj.join("train.py")).unwrap() == script,
    );
    run.check(
        "config.json unchanged",
        config.to_vec(),
        std::fs::read(proj.join("config.json")).unwrap(),
    );
    let mut names: Vec<String> = std::fs::read_dir(&proj)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    run.check(
        "files in the project",
        vec![".oomguard", "config.json", "out", "train.py"],
        strs(&names),
    );
    let runs: Vec<PathBuf> = std::fs::read_dir(proj.join(".oomguard/runs"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    run.check("run folders under .oomguard/runs", 1, runs.len());
    let j = run.journal(&runs[0]);
    let first = events(&j, "attempt_start")
        .first()
        .map(|e| argv_of(e))
        .unwrap_or_default();
    run.check(
        "attempt 1 runs the user's argv byte for byte",
        strs(&first),
        user_argv.to_vec(),
    );
}

#[test]
fn resume_skips_a_checkpoint_that_was_never_finished() {
    // A newer checkpoint-10 without trainer_state.json, as a crash half-way through saving leaves it.
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    std::fs::create_dir_all(out.join("checkpoint-10")).unwrap();
    std::fs::write(out.join("checkpoint-10/model.safetensors"), b"half").unwrap();
    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(demo_args(&out));
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let second = events(&j, "attempt_start")
        .get(1)
        .map(|e| argv_of(e))
        .unwrap_or_default();
    run.check(
        "attempt 2 resumes from the newest complete checkpoint",
        Some(out.join("checkpoint-5").display().to_string()),
        resume_arg(&second),
    );
}

#[test]
fn the_policy_running_out_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args: Vec<String> = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--max-attempts",
        "3",
    ]
    .map(String::from)
    .to_vec();
    args.extend(demo_args(&out));
    args.extend(["--capacity_gib", "1"].map(String::from)); // smaller than the model: nothing fits
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(75), run.code);
    let j = run.journal(&run_dir);
    run.check("attempts", 3, events(&j, "attempt_start").len());
}

#[test]
fn an_interrupt_stops_the_child_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args = vec![
        "--run-dir".to_string(),
        run_dir.display().to_string(),
        "--grace".into(),
        "5".into(),
    ];
    args.extend(demo_args(&out));
    args.extend(
        [
            "--print_signals",
            "--save_steps",
            "1",
            "--step_seconds",
            "0.2",
            "--oom_at_step",
            "1000",
        ]
        .map(String::from),
    );
    let running = spawn(tmp.path(), &strs(&args), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.join("checkpoint-1/trainer_state.json").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(running.child.id() as i32, libc::SIGINT) };
    let run = running.wait(LIMIT);

    run.check("exit code", Some(130), run.code);
    run.ensure(
        "the child was told",
        run.stdout.contains("received signal SIGINT")
            || run.stdout.contains("received signal SIGTERM"),
        "'received signal SIGINT' (or SIGTERM) from the trainer",
        tail(&run.stdout, 400),
    );
    let j = run.journal(&run_dir);
    run.check("attempts", 1, events(&j, "attempt_start").len());
    expect_no_survivors(&run, out.to_str().unwrap());
}

#[test]
fn plan_json_shows_the_knobs_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut args = vec!["plan".to_string(), "--json".to_string()];
    args.extend(demo_args(&out));
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(0), run.code);
    let plan: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| run.fail("plan --json prints one JSON value", "JSON", &e.to_string()));
    for (knob, value) in [("micro_batch", 16), ("grad_accum", 2), ("seq_len", 1024)] {
        let mut found = Vec::new();
        find_key(&plan, knob, &mut found);
        let hit = found
            .iter()
            .any(|v| v.as_u64() == Some(value) || v["value"].as_u64() == Some(value));
        run.ensure(
            &format!("plan shows {knob} = {value}"),
            hit,
            &format!("{knob}: {value}"),
            &found,
        );
    }
    let mut ladder = Vec::new();
    find_key(&plan, "step", &mut ladder);
    run.ensure(
        "plan shows the halving step",
        ladder.iter().any(|s| *s == "halve_micro_batch"),
        "a step halve_micro_batch",
        &ladder,
    );
    run.check("nothing ran: no output_dir", false, out.exists());
    run.check(
        "nothing ran: no run folder",
        false,
        tmp.path().join(".oomguard").exists(),
    );
}

#[test]
fn gradient_checkpointing_is_switched_on_by_a_flag_the_trainer_accepts() {
    // keep-micro-batch tries gradient checkpointing before halving: the flag is added bare.
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args: Vec<String> = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--policy",
        "keep-micro-batch",
    ]
    .map(String::from)
    .to_vec();
    args.extend(demo_args(&out));
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "decisions",
        vec![
            Value::from("enable_grad_checkpointing"),
            Value::from("halve_micro_batch"),
        ],
        steps,
    );
    let fin = run.read_json(&out.join("final.json"));
    run.check(
        "gradient checkpointing on at the end",
        Some(true),
        fin["gradient_checkpointing"].as_bool(),
    );
    run.check("final micro-batch", Some(8), fin["micro"].as_u64());
    run.check("final global batch", Some(32), fin["global_batch"].as_u64());
}

#[test]
fn an_oom_while_saving_resumes_from_the_checkpoint_before() {
    // The trainer OOMs half-way through writing checkpoint-10 (weights written,
    // trainer_state.json not): that folder must never be resumed from. An OOM
    // while saving is not the batch's: the same settings are retried once, then
    // oomguard stops (the sim's save fails at any batch here).
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(demo_args(&out));
    for a in ["--oom_at_step", "1000", "--oom_while_saving_at", "10"] {
        args.push(a.to_string());
    }
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);

    run.check("exit code", Some(75), run.code);
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    for (n, start) in starts.iter().enumerate().skip(1) {
        run.check(
            &format!(
                "attempt {} resumes from checkpoint-5, not the half-written checkpoint-10",
                n + 1
            ),
            Some(out.join("checkpoint-5").display().to_string()),
            resume_arg(&argv_of(start)),
        );
    }
    let skipped = events(&j, "checkpoint_skipped");
    run.ensure(
        "the journal says why checkpoint-10 was skipped",
        skipped.iter().any(|e| {
            e["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("checkpoint-10"))
                && e["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("trainer_state.json"))
        }),
        "a checkpoint_skipped event for checkpoint-10",
        &skipped,
    );
    let phases: Vec<_> = events(&j, "oom")
        .iter()
        .map(|e| e["phase"].clone())
        .collect();
    run.check(
        "both OOMs happened while saving",
        vec![serde_json::Value::from("saving"); 2],
        phases,
    );
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "the same settings once, never a smaller batch",
        vec![serde_json::Value::from("retry_same_settings")],
        steps,
    );
    // The half-written folder is still there: oomguard never deletes a checkpoint.
    run.ensure(
        "checkpoint folders are never deleted",
        out.join("checkpoint-10").is_dir(),
        "checkpoint-10 exists",
        std::fs::read_dir(&out).map(|d| d.count()).ok(),
    );
}

/// A host (CPU) OOM with a DataLoader worker knob: the workers are halved (8 → 4 → 2)
/// and each relaunch resumes from the last checkpoint; `plan` shows the halvings first.
#[test]
fn a_host_oom_halves_the_dataloader_workers_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let trainer = [
        "python3".to_string(),
        sim(),
        "--per_device_train_batch_size".into(),
        "4".into(),
        "--max_seq_length".into(),
        "1024".into(),
        "--max_steps".into(),
        "12".into(),
        "--save_steps".into(),
        "5".into(),
        "--step_seconds".into(),
        "0.005".into(),
        "--dataloader_num_workers".into(),
        "8".into(),
        "--host_workers".into(),
        "2".into(),
        "--output_dir".into(),
        out.display().to_string(),
    ];
    let mut plan = vec!["plan".to_string()];
    plan.extend(trainer.iter().cloned());
    let p = oomguard(tmp.path(), &strs(&plan), None, LIMIT);
    p.check("plan exit code", Some(0), p.code);
    p.ensure(
        "plan shows the worker knob and its halvings after a host OOM",
        p.stdout
            .contains("dataloader_workers  8       flag --dataloader_num_workers")
            && p.stdout
                .contains("dataloader_workers 8 → 4 → 2 → 1 → 0, one halving per host OOM"),
        "the knob's line and 'dataloader_workers 8 → 4 → 2 → 1 → 0, one halving per host OOM'",
        &p.stdout,
    );
    // A prefetch factor needs a worker: not below 1.
    plan.extend(["--dataloader_prefetch_factor".to_string(), "2".to_string()]);
    let p = oomguard(tmp.path(), &strs(&plan), None, LIMIT);
    p.ensure(
        "with a prefetch factor the halvings stop at 1",
        p.stdout
            .contains("dataloader_workers 8 → 4 → 2 → 1, one halving per host OOM")
            && p.stdout.contains("not below 1"),
        "'dataloader_workers 8 → 4 → 2 → 1, one halving per host OOM' and 'not below 1'",
        &p.stdout,
    );

    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(trainer.iter().cloned());
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let fin = run.read_json(&out.join("final.json"));
    run.check("final global_step", Some(12), fin["global_step"].as_u64());
    let segments = fin["attempts"].as_array().cloned().unwrap_or_default();
    // Each launch says how many workers it runs (the second saved no checkpoint, so
    // final.json keeps the first and the last launch only).
    let workers: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("dataloader workers: "))
        .collect();
    run.check("workers of each launch", vec!["8", "4", "2"], workers);
    run.check("launches in final.json", 2, segments.len());
    for s in &segments[1..] {
        run.ensure(
            "each relaunch resumed from checkpoint-5",
            s["resumed_from"]
                .as_str()
                .is_some_and(|p| p.ends_with("checkpoint-5")),
            "resumed_from ending in checkpoint-5",
            s,
        );
    }
    let j = run.journal(&run_dir);
    let resumes: Vec<Option<String>> = events(&j, "attempt_start")
        .iter()
        .map(|s| resume_arg(&argv_of(s)))
        .collect();
    let ckpt5 = Some(out.join("checkpoint-5").display().to_string());
    run.check(
        "attempts 2 and 3 resume from checkpoint-5",
        vec![None, ckpt5.clone(), ckpt5],
        resumes,
    );
    let outcomes: Vec<_> = events(&j, "attempt_end")
        .iter()
        .map(|e| e["outcome"].clone())
        .collect();
    run.check(
        "outcomes",
        vec![
            Value::from("host_oom"),
            Value::from("host_oom"),
            Value::from("success"),
        ],
        outcomes,
    );
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "decisions",
        vec![Value::from("halve_dataloader_workers"); 2],
        steps,
    );
    run.ensure(
        "the summary names the knob, before and after, and why",
        run.stderr.contains(
            "dataloader_workers  8       2      halve_dataloader_workers after the host OOM in attempts 1, 2",
        ) && run
            .stderr
            .contains("host OOM: DataLoader workers 8 → 4 (each holds its own copy"),
        "the table row and the decision's reason",
        tail(&run.stderr, 3000),
    );
}

/// A host OOM without a worker knob (or with none left to halve) stops with the
/// command's status and says what to do.
#[test]
fn a_host_oom_without_workers_to_halve_stops_with_advice() {
    for (workers, advice) in [
        (
            None,
            "no DataLoader worker setting was found in the command",
        ),
        (
            Some("0"),
            "the DataLoader already loads in the main process (0 workers)",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut args: Vec<String> = vec![
            "python3".into(),
            sim(),
            "--per_device_train_batch_size".into(),
            "4".into(),
            "--max_steps".into(),
            "8".into(),
            "--step_seconds".into(),
            "0.005".into(),
            "--host_workers".into(),
            "-1".into(),
            "--output_dir".into(),
            out.display().to_string(),
        ];
        if let Some(w) = workers {
            args.extend(["--dataloader_num_workers".to_string(), w.to_string()]);
        }
        let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
        run.check("exit code: the command's", Some(1), run.code);
        run.ensure(
            "one attempt, and the advice",
            run.stderr.contains("host (CPU) memory ran out")
                && run.stderr.contains(advice)
                && run.stderr.contains("stopped (exit 1) after 1 attempt;"),
            advice,
            tail(&run.stderr, 2000),
        );
    }
}

/// Without a progress bar (the Trainer's `--disable_tqdm true`), the steps redone are
/// read from its log dicts, which carry no step: counted with `--logging_steps`,
/// exact at 1, "at least" above it, and "unknown" — never 0 — without it.
#[test]
fn the_steps_redone_are_read_from_the_trainers_log_dicts_or_said_unknown() {
    for (logging, summary, lost, status) in [
        (
            Some("1"),
            "work lost to 2 OOMs: 2 steps of redone training",
            Some(1),
            "(2 steps redone)",
        ),
        (
            Some("2"),
            "work lost to 2 OOMs: at least 2 steps (after 2 of them only a lower bound of the step reached is known) of redone training",
            Some(1),
            "(at least 2 steps redone; the exact count after 2 OOMs is unknown)",
        ),
        (
            None,
            "work lost to 2 OOMs: an unknown number of steps of redone training",
            None,
            "(steps redone: unknown)",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
        let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
        args.extend(demo_args(&out));
        args.push("--disable_tqdm".into());
        if let Some(l) = logging {
            args.extend(["--logging_steps".to_string(), l.to_string()]);
        }
        let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
        run.check("exit code", Some(0), run.code);
        run.ensure(
            "no progress line: the trainer printed its log dicts",
            !run.stdout.contains("step 6/30") && run.stdout.contains("{'loss': "),
            "log dicts and no 'step N/M' lines",
            tail(&run.stdout, 600),
        );
        run.ensure(
            "the summary says the work lost as it can be told",
            run.stderr.contains(summary),
            summary,
            tail(&run.stderr, 1500),
        );
        let j = run.journal(&run_dir);
        let losses: Vec<Option<u64>> = events(&j, "work_lost")
            .iter()
            .map(|w| w["steps_lost"].as_u64())
            .collect();
        // Each OOM came in step 7, after checkpoint-5: step 6 redone.
        run.check("steps lost per OOM in the journal", vec![lost; 2], losses);
        let st = oomguard(
            tmp.path(),
            &["status", run_dir.to_str().unwrap()],
            None,
            LIMIT,
        );
        st.ensure(
            "status says the steps redone as they can be told",
            st.stdout.contains(status),
            status,
            &st.stdout,
        );
    }
}
