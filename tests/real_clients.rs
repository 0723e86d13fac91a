//! The real-client tier: oomguard on real PyTorch programs (CPU only, no GPU, no downloads).
//!
//! Needs a Python with torch, transformers, accelerate and deepspeed, named by
//! OOMGUARD_REAL_PYTHON (a venv's bin/python). Every test here is `#[ignore]`d, so plain
//! `cargo test` reports them as ignored; `bash tests/run.sh` creates the venv, sets the
//! variable and runs `cargo test --all-targets -- --include-ignored`. Run with
//! `--include-ignored` (or `--ignored`) but without the variable, they fail and say so:
//! a test that cannot run never passes.
//!
//! - `tests/real/ddp_oom.py`: torchrun, 2 ranks on gloo; rank 1 raises a real
//!   `torch.OutOfMemoryError` while rank 0 waits in the all-reduce; also as two
//!   "nodes" (`--nnodes 2 --node_rank 0|1`, c10d rendezvous on localhost), one copy
//!   of oomguard per node, making one decision for the job.
//! - `tests/real/hf_trainer_oom.py`: a real `transformers.Trainer` (tiny GPT-2) that raises
//!   it from the model's forward; real checkpoints, real resume.
//! - `tests/real/accelerate_loop_oom.py`: a script's own loop on a real `Accelerator`
//!   (diffusers' and the `*_no_trainer.py` examples' shape), real `save_state` checkpoints.

mod common;
use common::*;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
const LIMIT: Duration = Duration::from_secs(420);

/// The last line of a test trainer's `--oomguard_report` (what the last launch ran with,
/// resumed from and reached); `Value::Null` when there is none.
fn last_report(report: &Path) -> Value {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default()
}

/// Tests that start torchrun rendezvous and gloo process groups on this host take
/// turns: run side by side under load, their ranks' timeouts fire.
static TORCHRUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn torchrun_turn() -> std::sync::MutexGuard<'static, ()> {
    TORCHRUN.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn torchrun_ddp_oom_on_one_rank_halves_the_micro_batch_and_keeps_the_global_batch() {
    let _turn = torchrun_turn();
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "tests/real/ddp_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--budget",
        "4",
        "--max_steps",
        "4",
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    let fin = run.read_json(&out.join("final.json"));
    run.check("final micro-batch", Some(4), fin["micro"].as_u64());
    run.check(
        "final gradient accumulation",
        Some(2),
        fin["accum"].as_u64(),
    );
    run.check("world size", Some(2), fin["world"].as_u64());
    run.check("global batch kept", Some(16), fin["global_batch"].as_u64());
    let j = run.journal(&run_dir);
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("halve_micro_batch")], steps);
    let ends: Vec<_> = events(&j, "attempt_end")
        .iter()
        .map(|e| e["outcome"].clone())
        .collect();
    run.check(
        "outcomes",
        vec![Value::from("cuda_oom"), Value::from("success")],
        ends,
    );
    // The root cause is rank 1's OOM, not rank 0's "Connection closed by peer" that follows it.
    let oom = events(&j, "oom")
        .first()
        .cloned()
        .cloned()
        .unwrap_or_default();
    let mut devices = Vec::new();
    find_key(&oom, "device", &mut devices);
    run.ensure(
        "the OOM is rank 1's (GPU 1)",
        devices.iter().any(|d| d.as_u64() == Some(1)),
        "device 1",
        &oom,
    );
    let run_start = Value::Array(events(&j, "run_start").into_iter().cloned().collect());
    let mut world = Vec::new();
    find_key(&run_start, "world_size", &mut world);
    run.check(
        "world size read from --nproc_per_node",
        Some(2),
        world.first().and_then(|w| w.as_u64()),
    );
    expect_no_survivors(&run, out.to_str().unwrap());
}

/// Real torchrun, 2 ranks of the simulated trainer under DeepSpeed ZeRO stage 2 at
/// micro-batch 1 with gradient checkpointing on, `policy` given (None: the default).
/// The OOM comes at step 7, after checkpoint-5 was saved in stage 2's files.
/// Stage 2 needs 2.07 GiB a rank of the 1.9; stage 3 1.82, stage 2 with the
/// optimizer's states offloaded 1.32.
fn zero_run(tmp: &Path, policy: Option<&str>) -> (Run, PathBuf, PathBuf) {
    let bin = venv_bin();
    let (out, run_dir) = (tmp.join("out"), tmp.join("run"));
    let ds = tmp.join("ds.json");
    std::fs::write(
        &ds,
        r#"{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}"#,
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sim = sim();
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap()];
    let policy_file = tmp.join("policy.toml");
    if let Some(p) = policy {
        std::fs::write(&policy_file, p).unwrap();
        args.extend(["--policy", policy_file.to_str().unwrap()]);
    }
    args.extend([
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        &sim,
        "--per_device_train_batch_size",
        "1",
        "--gradient_accumulation_steps",
        "4",
        "--gradient_checkpointing",
        "true",
        "--deepspeed",
        ds.to_str().unwrap(),
        "--output_dir",
        out.to_str().unwrap(),
        "--max_steps",
        "12",
        "--save_steps",
        "5",
        // Rank 0 OOMs after its save of checkpoint-5 is done; rank 1 waits for it, as
        // ranks in a collective do (the simulated ranks are not in lockstep otherwise).
        "--oom_rank",
        "0",
    ]);
    let run = spawn_env(
        &repo(),
        &args,
        &[("PATH", &path), ("SIM_CAPACITY_GIB", "1.9")],
    )
    .wait(LIMIT);
    run.check("exit code", Some(0), run.code);
    (run, out, run_dir)
}

/// The ZeRO 3 step cannot load the stage-2 checkpoint the run saved (DeepSpeed reads
/// each rank's `zero_pp_rank_R_mp_rank_00_model_states.pt` at stage 3), and offloading
/// the optimizer's states at stage 2 can: that step is taken instead, the relaunch
/// resumes from checkpoint-5, and the decision says why ZeRO 3 was passed over.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_step_that_can_load_the_runs_checkpoint_comes_before_a_zero_stage_that_cannot() {
    let _turn = torchrun_turn();
    let tmp = tempfile::tempdir().unwrap();
    let (run, out, run_dir) = zero_run(tmp.path(), None);
    let j = run.journal(&run_dir);
    let decisions = events(&j, "decision");
    let steps: Vec<_> = decisions.iter().map(|d| d["step"].clone()).collect();
    run.check("decisions", vec![Value::from("offload_optimizer")], steps);
    let said = "(raise_zero_stage was passed over: its settings could not load the checkpoint the relaunch resumes from, written at ZeRO stage 1 or 2)";
    run.ensure(
        "the decision says why ZeRO 3 was passed over",
        run.stderr.contains(said),
        said,
        &run.stderr,
    );
    let fin = run.read_json(&out.join("final.json"));
    let attempts = fin["attempts"].as_array().cloned().unwrap_or_default();
    let seen: Vec<_> = attempts
        .iter()
        .map(|a| {
            (
                a["start_step"].as_u64(),
                a["zero_stage"].as_u64(),
                a["offload_optimizer"].as_bool(),
            )
        })
        .collect();
    run.check(
        "attempt 2 resumed at step 5, stage 2 with the optimizer offloaded",
        vec![
            (Some(0), Some(2), Some(false)),
            (Some(5), Some(2), Some(true)),
        ],
        seen,
    );
    run.check("global batch kept", Some(8), fin["global_batch"].as_u64());
    expect_no_survivors(&run, out.to_str().unwrap());
}

/// With no offload step in the policy, ZeRO 3 is the only step left, and it cannot
/// load the stage-2 checkpoint: oomguard does not resume from it, says why at the
/// default verbosity, the relaunch starts from the beginning at stage 3 and
/// finishes, and the journal names the checkpoint passed over. Resumed, the
/// relaunch would die loading it, as the simulated trainer's loader (DeepSpeed's
/// checks) does: exit 1, the night lost.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_zero_stage_change_does_not_resume_from_a_checkpoint_the_new_stage_cannot_load() {
    let _turn = torchrun_turn();
    let tmp = tempfile::tempdir().unwrap();
    let policy = "description = \"no offload\"\n[[step]]\nkind = \"halve_micro_batch\"\nmin = 1\n[[step]]\nkind = \"enable_grad_checkpointing\"\n[[step]]\nkind = \"raise_zero_stage\"\nmax = 3\n";
    let (run, out, run_dir) = zero_run(tmp.path(), Some(policy));
    let ckpt5 = out.join("checkpoint-5");
    let said = format!(
        "oomguard: {} was written at ZeRO stage 2, and ZeRO stage 3 cannot load it (it reads each rank's zero_pp_rank_R_mp_rank_00_model_states.pt, which the checkpoint lacks): the next attempt starts from the beginning, and the steps this run made are trained again\n",
        ckpt5.display()
    );
    run.ensure(
        "why the relaunch starts over, at the default verbosity",
        run.stderr.contains(&said),
        &said,
        &run.stderr,
    );
    let fin = run.read_json(&out.join("final.json"));
    run.check("global batch kept", Some(8), fin["global_batch"].as_u64());
    let attempts = fin["attempts"].as_array().cloned().unwrap_or_default();
    run.check("one segment: trained from step 0", 1, attempts.len());
    run.check(
        "the relaunch trained at stage 3 from the start, resuming nothing",
        (Some(0), Some(12), Some(3), true),
        (
            attempts[0]["start_step"].as_u64(),
            attempts[0]["end_step"].as_u64(),
            attempts[0]["zero_stage"].as_u64(),
            attempts[0]["resumed_from"].is_null(),
        ),
    );
    let j = run.journal(&run_dir);
    let skipped = events(&j, "checkpoint_skipped");
    run.ensure(
        "the journal names the checkpoint and why",
        skipped.iter().any(|e| {
            e["path"].as_str() == ckpt5.to_str()
                && e["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("ZeRO stage 3 cannot load it"))
        }),
        "checkpoint_skipped for checkpoint-5",
        &skipped,
    );
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("raise_zero_stage")], steps);
    let lost: Vec<_> = events(&j, "work_lost")
        .iter()
        .map(|e| (e["resume_from_step"].clone(), e["steps_lost"].clone()))
        .collect();
    run.check(
        "the steps redone are counted from the beginning",
        vec![(Value::Null, Value::from(6))],
        lost,
    );
    expect_no_survivors(&run, out.to_str().unwrap());
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_resumes_from_its_real_checkpoint_and_finishes() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = out.join("report.jsonl");
    // micro 8 x seq 64 = 512 tokens > budget 256: OOM at step 3, after checkpoint-2 is saved.
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_trainer_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--oom_at_step",
        "3",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--output_dir",
        out.to_str().unwrap(),
        "--oomguard_report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let ckpt2 = out.join("checkpoint-2").display().to_string();
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(ckpt2.clone()),
        resume_arg(&argv_of(starts[1])),
    );
    run.ensure(
        "the trainer said it resumed",
        run.stdout.contains(&format!("resuming from {ckpt2}")),
        &format!("'resuming from {ckpt2}' in the output"),
        tail(&run.stdout, 600),
    );
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("halve_micro_batch")], steps);

    // The Trainer's own record of the finished run.
    let state = run.read_json(&out.join("checkpoint-6/trainer_state.json"));
    run.check("global_step", Some(6), state["global_step"].as_u64());
    run.check("max_steps", Some(6), state["max_steps"].as_u64());
    // Steps 1-2 come from attempt 1 (restored from checkpoint-2), 3-6 from attempt 2: each once.
    let logged: Vec<u64> = state["log_history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|e| e.get("loss").is_some())
                .filter_map(|e| e["step"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    run.check("steps in log_history", vec![1, 2, 3, 4, 5, 6], logged);
    // Note: trainer_state.json's train_batch_size is restored from the resumed checkpoint
    // (transformers 5.x keeps the first run's value), so the settings come from the report.
    let last = last_report(&report);
    run.check("final micro-batch", Some(4), last["micro"].as_u64());
    run.check(
        "final gradient accumulation",
        Some(2),
        last["accum"].as_u64(),
    );
    run.check("global batch kept", Some(8), last["global_batch"].as_u64());
    run.check("reached max_steps", Some(6), last["global_step"].as_u64());
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_while_saving_resumes_from_the_previous_complete_checkpoint() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    // micro 8 x seq 64 > budget: the real Trainer dies of an OOM half-way through
    // saving checkpoint-4 (weights written, optimizer and trainer_state.json not).
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_trainer_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--oom_at_step",
        "1000",
        "--oom_while_saving_at",
        "4",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    // An OOM while saving is not the batch's: the same settings once more (from
    // checkpoint-2), then a stop with advice (the save fails again here).
    run.check("exit code", Some(75), run.code);
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    run.check(
        "attempt 2 resumes from checkpoint-2, not the half-written checkpoint-4",
        Some(out.join("checkpoint-2").display().to_string()),
        resume_arg(&argv_of(starts[1])),
    );
    let skipped = events(&j, "checkpoint_skipped");
    run.ensure(
        "the journal says why checkpoint-4 was skipped",
        skipped.iter().any(|e| {
            e["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("checkpoint-4"))
        }),
        "a checkpoint_skipped event for checkpoint-4",
        &skipped,
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
}

/// A script that calls `trainer.train()` bare (TRL's example scripts, stanford_alpaca)
/// never reads `--resume_from_checkpoint`: the relaunch is not given it, and the run says
/// it starts over and counts the steps trained again, where before it claimed a resume
/// from checkpoint-2 that the Trainer ignored.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_script_that_calls_trainer_train_bare_is_not_told_to_resume_and_says_it_starts_over() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = out.join("report.jsonl");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_bare_train_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--oom_at_step",
        "3",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--output_dir",
        out.to_str().unwrap(),
        "--oomguard_report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    run.check(
        "the relaunch is not told to resume",
        None,
        resume_arg(&argv_of(starts[1])),
    );
    let why = "hf_bare_train_oom.py calls trainer.train() without resume_from_checkpoint";
    run.ensure(
        "the run says why",
        run.stderr.contains(why),
        why,
        &run.stderr,
    );
    let lost = events(&j, "work_lost");
    run.ensure(
        "the steps before the OOM are counted as trained again, from step 0",
        lost.first()
            .and_then(|l| l["steps_lost"].as_u64())
            .is_some_and(|n| n >= 2),
        "steps_lost >= 2",
        &lost,
    );
    let last = last_report(&report);
    run.check("reached max_steps", Some(6), last["global_step"].as_u64());
    run.check("global batch kept", Some(8), last["global_batch"].as_u64());
}

/// transformers 4.x's older examples stop on an `--output_dir` that holds any file
/// unless given `--overwrite_output_dir`: the relaunch after an OOM at step 3 (with
/// checkpoint-2 in the folder) carries it, resumes from checkpoint-2 and finishes.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_script_that_stops_on_a_non_empty_output_dir_is_relaunched_with_overwrite_output_dir() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = out.join("report.jsonl");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_example_oom.py",
        "--example_start",
        "listdir",
        "--per_device_train_batch_size",
        "8",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--oom_at_step",
        "3",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--output_dir",
        out.to_str().unwrap(),
        "--oomguard_report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let first = argv_of(starts[0]);
    run.ensure(
        "the first attempt runs the command as written",
        !first.iter().any(|a| a == "--overwrite_output_dir"),
        "no --overwrite_output_dir",
        &first,
    );
    let second = argv_of(starts[1]);
    run.ensure(
        "the relaunch carries --overwrite_output_dir",
        second.iter().any(|a| a == "--overwrite_output_dir"),
        "--overwrite_output_dir in attempt 2's argv",
        &second,
    );
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(out.join("checkpoint-2").display().to_string()),
        resume_arg(&second),
    );
    let last = last_report(&report);
    run.check(
        "resumed from checkpoint-2",
        Some(out.join("checkpoint-2").display().to_string()),
        last["resumed_from"].as_str().map(str::to_string),
    );
    run.check("reached max_steps", Some(6), last["global_step"].as_u64());
    run.check("global batch kept", Some(8), last["global_batch"].as_u64());
}

/// transformers 4.x's examples resume by themselves from their folder's newest
/// `checkpoint-N`, whole or not. A run started over last night's checkpoint-2 dies
/// of an OOM half-way through saving checkpoint-4: the relaunch names checkpoint-2
/// (and turns the script's own search off), where the script alone would load the
/// half-written checkpoint-4 and fail.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_script_that_resumes_by_itself_is_told_the_checkpoint_it_picked_not_a_half_written_one() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let script_args = |micro: &str, steps: &str| {
        vec![
            "tests/real/hf_example_oom.py".to_string(),
            "--per_device_train_batch_size".into(),
            micro.into(),
            "--max_seq_length".into(),
            "64".into(),
            "--budget".into(),
            "256".into(),
            "--oom_at_step".into(),
            "1000".into(),
            "--oom_while_saving_at".into(),
            "4".into(),
            "--max_steps".into(),
            steps.into(),
            "--save_steps".into(),
            "2".into(),
            "--output_dir".into(),
            out.display().to_string(),
        ]
    };
    // Last night's run, without oomguard: checkpoint-2 at a micro-batch that fits.
    let before = Command::new(bin.join("python"))
        .current_dir(repo())
        .args(script_args("4", "2"))
        .output()
        .unwrap();
    assert!(
        out.join("checkpoint-2/trainer_state.json").is_file(),
        "the run before oomguard left no checkpoint-2: {}",
        String::from_utf8_lossy(&before.stderr)
    );
    let mut args = vec![
        "--run-dir".to_string(),
        run_dir.display().to_string(),
        "python".into(),
    ];
    args.extend(script_args("8", "6"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let second = argv_of(starts[1]);
    run.check(
        "attempt 2 names checkpoint-2, which the script picked itself at attempt 1",
        Some(out.join("checkpoint-2").display().to_string()),
        resume_arg(&second),
    );
    run.ensure(
        "attempt 2 turns the script's own search off",
        second.iter().any(|a| a == "--overwrite_output_dir"),
        "--overwrite_output_dir in attempt 2's argv",
        &second,
    );
    // Attempt 2 loads checkpoint-2 and trains on to the same save, where it runs out
    // of memory again: an OOM, not a failure to load checkpoint-4.
    let ends: Vec<_> = events(&j, "attempt_end")
        .iter()
        .map(|e| e["outcome"].clone())
        .collect();
    run.check(
        "outcomes",
        vec![Value::from("cuda_oom"), Value::from("cuda_oom")],
        ends,
    );
    run.check("exit code", Some(75), run.code);
}

/// A host (CPU) OOM raised in a real DataLoader worker process of a real Trainer
/// (`--dataloader_num_workers 4`, the host holds 2): the workers are halved and the
/// relaunch resumes from the Trainer's checkpoint-2 and finishes.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_host_oom_in_a_dataloader_worker_halves_the_workers() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = out.join("report.jsonl");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_trainer_oom.py",
        "--per_device_train_batch_size",
        "2",
        "--max_seq_length",
        "64",
        "--budget",
        "100000",
        "--dataloader_num_workers",
        "4",
        "--host_workers",
        "2",
        "--oom_at_step",
        "3",
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--output_dir",
        out.to_str().unwrap(),
        "--oomguard_report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    run.ensure(
        "the host OOM came from a DataLoader worker process",
        run.stdout
            .contains("Caught RuntimeError in DataLoader worker process")
            || run
                .stderr
                .contains("Caught RuntimeError in DataLoader worker process"),
        "'Caught RuntimeError in DataLoader worker process' in the output",
        tail(&run.stdout, 2000),
    );
    let j = run.journal(&run_dir);
    let outcomes: Vec<_> = events(&j, "attempt_end")
        .iter()
        .map(|e| e["outcome"].clone())
        .collect();
    run.check(
        "outcomes",
        vec![Value::from("host_oom"), Value::from("success")],
        outcomes,
    );
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "decisions",
        vec![Value::from("halve_dataloader_workers")],
        steps,
    );
    let starts = events(&j, "attempt_start");
    let argv2 = argv_of(starts[1]);
    let workers = argv2
        .iter()
        .position(|a| a == "--dataloader_num_workers")
        .and_then(|i| argv2.get(i + 1))
        .cloned();
    run.check("attempt 2's workers", Some("2".to_string()), workers);
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(out.join("checkpoint-2").display().to_string()),
        resume_arg(&argv2),
    );
    // The Trainer's own record: every step once.
    let state = run.read_json(&out.join("checkpoint-4/trainer_state.json"));
    let logged: Vec<u64> = state["log_history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|e| e.get("loss").is_some())
                .filter_map(|e| e["step"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    run.check("steps in log_history", vec![1, 2, 3, 4], logged);
    let last = last_report(&report);
    run.check(
        "the finishing launch's workers",
        Some(2),
        last["workers"].as_u64(),
    );
    run.ensure(
        "the summary's table names the knob",
        run.stderr.contains(
            "dataloader_workers  4       2      halve_dataloader_workers after the host OOM in attempt 1",
        ),
        "the dataloader_workers row",
        tail(&run.stderr, 2000),
    );
}

/// The issue's case: a real Trainer under torchrun with `--disable_tqdm true` prints
/// no bar, only its log dicts (no step in them) and the save's `Writing model shards
/// 1/1` bar. One step is redone after the OOM (steps 1-3 done, checkpoint-2 saved, an
/// OOM in step 4), and oomguard says 1, not 0.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_without_a_bar_under_torchrun_reports_the_steps_redone() {
    let _turn = torchrun_turn();
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "tests/real/hf_trainer_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--oom_at_step",
        "4",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    // The dicts go to stdout; tqdm (the save's bar) writes to stderr.
    let output = format!("{}{}", run.stdout, run.stderr);
    run.ensure(
        "no training bar, the Trainer's log dicts and the save's bar",
        run.stdout.contains("{'loss': ")
            && output.contains("Writing model shards")
            && !output.contains("/6 ["),
        "log dicts, 'Writing model shards', no bar counting the 6 steps",
        tail(&output, 3000),
    );
    let j = run.journal(&run_dir);
    let lost = events(&j, "work_lost");
    run.check("one OOM", 1, lost.len());
    run.check("step reached", Some(3), lost[0]["step_reached"].as_u64());
    run.check(
        "resumed from checkpoint-2",
        Some(2),
        lost[0]["resume_from_step"].as_u64(),
    );
    run.check("steps redone", Some(1), lost[0]["steps_lost"].as_u64());
    run.ensure(
        "the summary says one step was redone",
        run.stderr
            .contains("work lost to 1 OOM: 1 step of redone training"),
        "'work lost to 1 OOM: 1 step of redone training'",
        tail(&run.stderr, 2000),
    );
    let state = run.read_json(&out.join("checkpoint-6/trainer_state.json"));
    run.check("global_step", Some(6), state["global_step"].as_u64());
}

/// The real DeepSpeed and accelerate parsers read every derived config.
fn check_configs(bin: &Path, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(bin.join("python"))
        .arg(repo().join("tests/real/check_configs.py"))
        .args(files)
        .output()
        .expect("run check_configs.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn derived(run_dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(name))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn every_derived_deepspeed_json_is_accepted_by_deepspeed() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds.json");
    let original = "{\n  \"train_batch_size\": 8,\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"gradient_accumulation_steps\": 1,\n  \"zero_optimization\": {\n    \"stage\": 1\n  }\n}\n";
    std::fs::write(&ds, original).unwrap();
    let run_dir = tmp.path().join("run");
    // A command that always OOMs walks the whole default ladder: micro-batch,
    // checkpointing, optimizer and parameter offload (each raising the ZeRO stage
    // it needs: at world size 1 the ZeRO step itself saves nothing and is skipped).
    let oom = "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free.', file=sys.stderr); sys.exit(1)";
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--max-attempts",
        "12",
        "python",
        "-c",
        oom,
        "--deepspeed",
        ds.to_str().unwrap(),
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
    ];
    let run = oomguard(tmp.path(), &args, Some(&bin), LIMIT);
    run.check("exit code (policy exhausted)", Some(75), run.code);
    let files = derived(&run_dir, "ds.json");
    run.ensure(
        "derived DeepSpeed configs were written",
        files.len() >= 6,
        "one per changed rung",
        &files,
    );
    let (ok, text) = check_configs(&bin, &files);
    run.ensure(
        "DeepSpeedConfig accepts every derived JSON",
        ok,
        "all ok",
        &text,
    );
    for needle in [
        "micro=1 accum=8 train_batch_size=8",
        "stage=3",
        "offload_optimizer=cpu",
        "offload_param=cpu",
    ] {
        run.ensure(
            "the ladder reached this setting",
            text.contains(needle),
            needle,
            &text,
        );
    }
    run.check(
        "the user's file is unchanged",
        original.to_string(),
        std::fs::read_to_string(&ds).unwrap(),
    );
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn accelerate_launch_recovers_with_accumulation_from_the_derived_config() {
    let _turn = torchrun_turn();
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let acc = tmp.path().join("acc.yaml");
    let original = "compute_environment: LOCAL_MACHINE\ndeepspeed_config:\n  gradient_accumulation_steps: 1  # per optimizer step\n  offload_optimizer_device: none\n  offload_param_device: none\n  zero3_init_flag: false\n  zero_stage: 1\ndistributed_type: DEEPSPEED\nmachine_rank: 0\nmain_training_function: main\nmixed_precision: 'no'\nnum_machines: 1\nnum_processes: 1\nrdzv_backend: static\nsame_network: true\nuse_cpu: true\n";
    std::fs::write(&acc, original).unwrap();
    let (run_dir, report) = (tmp.path().join("run"), tmp.path().join("report.jsonl"));
    let script = repo().join("tests/real/accelerate_oom.py");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "accelerate",
        "launch",
        "--config_file",
        acc.to_str().unwrap(),
        "--num_cpu_threads_per_process",
        "1",
        script.to_str().unwrap(),
        "--per_device_train_batch_size",
        "8",
        "--budget",
        "2",
        "--report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(tmp.path(), &args, Some(&bin), LIMIT);
    run.check("exit code", Some(0), run.code);
    let lines: Vec<Value> = std::fs::read_to_string(&report)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let seen: Vec<(u64, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["micro"].as_u64().unwrap_or(0),
                l["accum"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    // Accumulation reaches the script only through the accelerate config copy.
    run.check(
        "micro-batch and accumulation seen by the script per attempt",
        vec![(8, 1), (4, 2), (2, 4)],
        seen,
    );
    let copies = derived(&run_dir, "acc.yaml");
    run.check("derived accelerate configs", 2, copies.len());
    let (ok, text) = check_configs(&bin, &copies);
    run.ensure(
        "accelerate's loader accepts every derived YAML",
        ok,
        "all ok",
        &text,
    );
    let copy = std::fs::read_to_string(&copies[1]).unwrap();
    run.check(
        "the copy differs only in the accumulation value (comment kept)",
        original.replace(
            "gradient_accumulation_steps: 1  # per",
            "gradient_accumulation_steps: 4  # per",
        ),
        copy,
    );
    run.check(
        "the user's file is unchanged",
        original.to_string(),
        std::fs::read_to_string(&acc).unwrap(),
    );
}

/// A script's own accelerate loop (diffusers' examples: `--train_batch_size`, "per device" in
/// its help; `accelerator.save_state` into `checkpoint-N`, or `step_N` as transformers'
/// `*_no_trainer.py` examples): the micro-batch is halved with accumulation doubled, and
/// the relaunch resumes from the folder save_state finished. Without
/// `--gradient_accumulation_steps` on the command, it is added: the script's parser has
/// it, with default 1.
fn accelerate_loop(prefix: &str, accum_given: bool) {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = tmp.path().join("report.jsonl");
    let script = repo().join("tests/real/accelerate_loop_oom.py");
    // micro 8 > budget 4: OOM in step 3, after the step-2 checkpoint is saved.
    let mut args = vec![
        "--run-dir",
        run_dir.to_str().unwrap(),
        "accelerate",
        "launch",
        "--num_processes",
        "1",
        "--cpu",
        "--num_cpu_threads_per_process",
        "1",
        script.to_str().unwrap(),
        "--train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--budget",
        "4",
        "--checkpoint_prefix",
        prefix,
        "--output_dir",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    if !accum_given {
        let at = args
            .iter()
            .position(|a| *a == "--gradient_accumulation_steps")
            .unwrap();
        args.drain(at..at + 2);
    }
    let run = oomguard(tmp.path(), &args, Some(&bin), LIMIT);
    run.check("exit code", Some(0), run.code);
    let seen: Vec<(u64, u64, Option<u64>)> = std::fs::read_to_string(&report)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|l| {
            (
                l["micro"].as_u64().unwrap_or(0),
                l["accum"].as_u64().unwrap_or(0),
                l["resumed"].as_u64(),
            )
        })
        .collect();
    run.check(
        "micro-batch, accumulation and the step resumed from, per launch",
        vec![(8, 1, None), (4, 2, Some(2))],
        seen,
    );
    let j = run.journal(&run_dir);
    let starts = events(&j, "attempt_start");
    run.check(
        "attempt 2 is told the checkpoint",
        Some(out.join(format!("{prefix}2")).display().to_string()),
        starts.get(1).and_then(|s| resume_arg(&argv_of(s))),
    );
    let fin = run.read_json(&out.join("final.json"));
    run.check("reached max steps", Some(6), fin["global_step"].as_u64());
    run.check(
        "global batch kept",
        Some(8),
        fin["samples_per_step"].as_u64(),
    );
    run.ensure(
        "the summary says the flag is per device from the script's help",
        !run.stderr.contains("may be the global batch"),
        "no 'may be the global batch' note",
        tail(&run.stderr, 800),
    );
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_diffusers_style_accelerate_loop_resumes_its_save_state_checkpoint_at_a_halved_batch() {
    accelerate_loop("checkpoint-", true);
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_no_trainer_style_accelerate_loop_resumes_its_step_folder_at_a_halved_batch_with_accumulation_added()
 {
    accelerate_loop("step_", false);
}

/// The Hydra advice in docs/knobs.md (`--knob micro_batch=+data.batch_size=64` for a batch size
/// that lives only in the config) relaunches with an override real hydra-core accepts.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hydra_added_override_is_accepted_by_real_hydra_on_the_relaunch() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let python = bin.join("python");
    let hydra_dir = format!("hydra.run.dir={}", tmp.path().join("hydra").display());
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--knob",
        "micro_batch=+data.batch_size=64",
        "--knob",
        "grad_accum=+trainer.accumulate_grad_batches=1",
        python.to_str().unwrap(),
        "tests/real/hydra_app.py",
        &hydra_dir,
    ];
    let r = oomguard(&repo(), &args, Some(&bin), LIMIT);
    r.check("exit code", Some(0), r.code);
    // 64 → 32 with accumulation 1 → 2: the global batch stays 64.
    assert!(
        r.stdout.contains("batch_size=32 accumulate_grad_batches=2"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("(global batch 64)"), "{}", r.stdout);
    let journal = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap();
    assert!(
        journal.contains("++data.batch_size=32"),
        "the relaunch adds ++data.batch_size=32: {journal}"
    );
}

/// torchtune's packaged configs, as the real package installs them: `tune run RECIPE
/// --config NAME` reads the config's batch_size and gradient_accumulation_steps (8) and
/// its output_dir, and relaunches with overrides that keep the global batch.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn torchtune_packaged_config_is_read_from_the_installed_torchtune() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(OOMGUARD)
        .current_dir(tmp.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .args([
            "plan",
            "--json",
            "tune",
            "run",
            "lora_finetune_single_device",
            "--config",
            "llama3_2/1B_lora_single_device",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(v["knobs"]["micro_batch"]["value"], 4, "{text}");
    assert_eq!(v["knobs"]["grad_accum"]["value"], 8, "{text}");
    assert!(
        v["knobs"]["grad_accum"]["binding"]
            .as_str()
            .unwrap_or("")
            .contains("site-packages/recipes/configs/llama3_2/1B_lora_single_device.yaml"),
        "{text}"
    );
    let argv: Vec<&str> = v["ladder"][1]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        argv.contains(&"batch_size=2") && argv.contains(&"gradient_accumulation_steps=16"),
        "{argv:?}"
    );
    assert_eq!(
        v["resume"]["dir"], "/tmp/torchtune/llama3_2_1B/lora_single_device",
        "{text}"
    );
}

/// Two "nodes" on one host: a copy of oomguard around each `torchrun --nnodes 2
/// --node_rank R --rdzv_backend c10d`, real torch on gloo. Global rank 1 (node 1)
/// raises a real `torch.OutOfMemoryError` at step 3, after checkpoint-2; node 0
/// dies of its peer's failure. Copy 0 decides for both (through
/// `out/.oomguard-job/`), and both relaunch with the same settings from the same
/// checkpoint.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn two_node_torchrun_one_decision_per_job() {
    two_node(TwoNode {
        oom_node: 1,
        hang: false,
    });
}

/// As above, but the OOM is node 0's (copy 0's), and it hangs after it (a rank stuck in
/// NCCL's teardown); node 1's rank, blocked in the all-reduce and then failing,
/// hangs silently (NCCL without async error handling; the process group's
/// timeout is 600 s). Copy 0's hang timer ends its rank; copy 1 hears copy 0's
/// end (or its decision) while its rank still hangs, stops it, and relaunches
/// with copy 0's decision.
/// With torchrun's static rendezvous (`--master_addr`, `--master_port`): node 1's
/// torchrun does not watch a store, so nothing but copy 1 ends its hung rank (with
/// c10d, a store on node 0 going away ends node 1's torchrun at once, and copy 1
/// waits for the decision as after any peer's failure).
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn two_node_torchrun_follows_copy_0_while_its_rank_hangs() {
    two_node(TwoNode {
        oom_node: 0,
        hang: true,
    });
}

struct TwoNode {
    /// The copy whose node's rank runs out of memory.
    oom_node: u32,
    /// It hangs after its OOM, and the other node's rank hangs once its all-reduce fails.
    hang: bool,
}

fn two_node(case: TwoNode) {
    let _turn = torchrun_turn();
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("localhost:{port}");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let rdzv_id = format!("two-node-test-{}-{}", std::process::id(), case.oom_node);
    let port_s = port.to_string();
    let copies: Vec<(Running, PathBuf)> = (0..2)
        .map(|r| {
            let run_dir = tmp.path().join(format!("run{r}"));
            let rank = r.to_string();
            let mut args = vec![
                "--hang-timeout",
                "5",
                "--grace",
                "3",
                "--run-dir",
                run_dir.to_str().unwrap(),
                "torchrun",
                "--nnodes",
                "2",
                "--node_rank",
                &rank,
                "--nproc_per_node",
                "1",
            ];
            if case.hang {
                args.extend(["--master_addr", "127.0.0.1", "--master_port", &port_s]);
            } else {
                args.extend([
                    "--rdzv_backend",
                    "c10d",
                    "--rdzv_endpoint",
                    &endpoint,
                    "--rdzv_id",
                    &rdzv_id,
                ]);
            }
            args.extend([
                "tests/real/ddp_oom.py",
                "--per_device_train_batch_size",
                "8",
                "--gradient_accumulation_steps",
                "1",
                "--budget",
                "4",
                "--max_steps",
                "6",
                "--save_steps",
                "2",
                "--oom_at_step",
                "3",
                "--oom_env",
                "DDP_OOM",
                "--output_dir",
                out.to_str().unwrap(),
            ]);
            if case.hang {
                args.extend(["--hang_after_oom", "--peer_hangs"]);
            }
            // The node that runs out is picked by its environment: c10d numbers the
            // ranks by arrival at the rendezvous.
            let oom = if r == case.oom_node { "1" } else { "0" };
            let env = [
                ("PATH", path.as_str()),
                ("OOMGUARD_JOB_TIMEOUT", "180"),
                ("DDP_OOM", oom),
            ];
            (spawn_env(&repo(), &args, &env), run_dir)
        })
        .collect();
    let runs: Vec<(Run, PathBuf)> = copies
        .into_iter()
        .map(|(c, d)| (c.wait(LIMIT), d))
        .collect();
    if runs.iter().any(|(r, _)| r.code != Some(0)) {
        eprintln!(
            "copy 1's stderr (a copy failed):\n{}",
            tail(&runs[1].0.stderr, 8000)
        );
    }
    for (run, _) in &runs {
        run.check("exit code", Some(0), run.code);
        run.ensure(
            "no copy stops on its peer's failure",
            !run.stderr.contains("not an out-of-memory error"),
            "no 'not an out-of-memory error'",
            tail(&run.stderr, 2000),
        );
    }
    let (leader, follower) = (&runs[0].0, &runs[1].0);
    let fin = leader.read_json(&out.join("final.json"));
    let fin1 = leader.read_json(&out.join("final-rank1.json"));
    leader.check("final micro-batch", Some(4), fin["micro"].as_u64());
    leader.check(
        "rank 1's final micro-batch",
        Some(4),
        fin1["micro"].as_u64(),
    );
    leader.check("world size", Some(2), fin["world"].as_u64());
    leader.check("global batch kept", Some(16), fin["global_batch"].as_u64());
    let resumed = |f: &Value| {
        f["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .map(|s| s["resumed_from"].clone())
    };
    leader.check(
        "both ranks' last launch resumed from the same checkpoint",
        resumed(&fin),
        resumed(&fin1),
    );
    leader.ensure(
        "resumed from checkpoint-2",
        resumed(&fin).is_some_and(|p| p.as_str().is_some_and(|p| p.ends_with("checkpoint-2"))),
        "checkpoint-2",
        resumed(&fin),
    );
    let j = leader.journal(&runs[0].1);
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    leader.check(
        "copy 0 decided",
        vec![Value::from("halve_micro_batch")],
        steps,
    );
    follower.ensure(
        "copy 1 followed copy 0",
        follower.stderr.contains("copy 0 of the job decided"),
        "'copy 0 of the job decided' in its stderr",
        tail(&follower.stderr, 2000),
    );
    let fj = follower.journal(&runs[1].1);
    let argvs: Vec<Vec<String>> = events(&fj, "attempt_start")
        .iter()
        .map(|e| argv_of(e))
        .collect();
    follower.check("copy 1's attempts", 2, argvs.len());
    follower.ensure(
        "copy 1 relaunched with the halved micro-batch",
        argvs[1]
            .windows(2)
            .any(|w| w == ["--per_device_train_batch_size", "4"]),
        "--per_device_train_batch_size 4",
        &argvs[1],
    );
    if case.hang {
        leader.ensure(
            "copy 0's rank hung after its OOM",
            leader.stderr.contains("attempt 1: hung after OOM"),
            "'attempt 1: hung after OOM'",
            tail(&leader.stderr, 2000),
        );
        // Copy 0 writes its end before it decides: either ends copy 1's attempt.
        follower.ensure(
            "copy 1 stopped its hung rank when copy 0's attempt ended",
            follower.stderr.contains(
                "copy 0 of the job ended attempt 1 (hung_after_oom) while this copy's ranks still ran; stopped them",
            ) || follower.stderr.contains(
                "copy 0 of the job decided to relaunch after attempt 1 while this copy's ranks still ran; stopped them",
            ),
            "'copy 0 of the job ended attempt 1 (...)' or '... decided ...' '... while this copy's ranks still ran; stopped them'",
            tail(&follower.stderr, 2000),
        );
        follower.ensure(
            "far from the process group's 600 s",
            follower.elapsed < Duration::from_secs(200),
            "< 200 s",
            follower.elapsed,
        );
    }
}
