//! When in the run an OOM happened decides the fix: an OOM while loading a checkpoint is
//! retried once at the same settings with the allocator set against fragmentation, then
//! stopped with advice (never a smaller batch); an OOM while saving gets the family's saving
//! setting (DeepSpeed's 16-bit gather off), else a retry, then a stop. The real binary over a
//! real Hugging Face Trainer resuming with its optimizer state (the real-client tier, see
//! `tests/real_clients.rs`), over a DeepSpeed-style script with a real Python traceback, and
//! `plan`'s account of each phase.

mod common;
use common::*;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(420);

/// A first run of the real Trainer (without oomguard) that leaves `out/checkpoint-2` with
/// the optimizer's state (`optimizer.pt`), for a run that resumes from it.
fn first_run(bin: &Path, out: &Path) {
    let st = std::process::Command::new(bin.join("python"))
        .current_dir(repo())
        .args([
            "tests/real/hf_trainer_phase_oom.py",
            "--per_device_train_batch_size",
            "4",
            "--max_steps",
            "2",
            "--save_steps",
            "2",
            "--output_dir",
        ])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        st.status.success() && out.join("checkpoint-2/optimizer.pt").is_file(),
        "the first run left no checkpoint-2: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

fn resume_args<'a>(run_dir: &'a str, out: &'a str, ckpt: &'a str, times: &'a str) -> Vec<&'a str> {
    vec![
        "--run-dir",
        run_dir,
        "python",
        "tests/real/hf_trainer_phase_oom.py",
        "--oom_in",
        "load",
        "--oom_times",
        times,
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--resume_from_checkpoint",
        ckpt,
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--output_dir",
        out,
    ]
}

/// The `oom` events' phases.
fn phases(j: &[Value]) -> Vec<Value> {
    events(j, "oom")
        .iter()
        .map(|e| e["phase"].clone())
        .collect()
}

/// A real `transformers.Trainer` resumes from checkpoint-2 and its optimizer's
/// `load_state_dict` raises a real `torch.OutOfMemoryError` (PyTorch's message) once:
/// oomguard tells the load from the traceback (`_load_optimizer_and_scheduler` →
/// `load_state_dict`), journals `phase: loading`, and relaunches at the same settings (no
/// smaller batch) with the allocator set against fragmentation; the second launch resumes
/// and finishes.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_while_loading_the_optimizer_state_retries_the_same_settings_once() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    first_run(&bin, &out);
    let ckpt = out.join("checkpoint-2").display().to_string();
    let (o, r) = (out.display().to_string(), run_dir.display().to_string());
    let run = oomguard(&repo(), &resume_args(&r, &o, &ckpt, "1"), Some(&bin), LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    run.check("the OOM's phase", vec![Value::from("loading")], phases(&j));
    let how = events(&j, "oom")[0]["phase_how"]
        .as_str()
        .unwrap_or("")
        .to_string();
    run.ensure(
        "how the phase was told",
        how.contains("load_state_dict") || how.contains("_load_optimizer_and_scheduler"),
        "the traceback runs through a load frame",
        &how,
    );
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("retry_same_settings")], steps);
    let second = argv_of(starts[1]);
    run.check(
        "attempt 2's micro-batch is the user's",
        Some("4".to_string()),
        flag_value(&second, "--per_device_train_batch_size"),
    );
    run.check(
        "attempt 2's accumulation is the user's",
        Some("2".to_string()),
        flag_value(&second, "--gradient_accumulation_steps"),
    );
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(ckpt),
        resume_arg(&second),
    );
    for said in [
        "OOM while loading a checkpoint (tried to allocate 4.00 GiB on GPU 0, 1.19 GiB free): retrying the same settings once (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); a smaller batch does not lower a load's peak",
        "attempt 1: OOM while loading a checkpoint (tried to allocate 4.00 GiB on GPU 0, 1.19 GiB free) → the same settings again, the allocator set against fragmentation",
    ] {
        run.ensure(
            "stderr says",
            run.stderr.contains(said),
            said,
            tail(&run.stderr, 3000),
        );
    }
    run.ensure(
        "no smaller batch",
        !run.stderr.contains("halve_micro_batch"),
        "no halve_micro_batch",
        tail(&run.stderr, 2000),
    );
}

/// The same, the load failing every time: one retry, then oomguard stops (exit 75) with
/// what lowers a load's peak, and never halves the batch.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_while_loading_again_stops_with_advice_and_never_shrinks_the_batch() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    first_run(&bin, &out);
    let ckpt = out.join("checkpoint-2").display().to_string();
    let (o, r) = (out.display().to_string(), run_dir.display().to_string());
    let run = oomguard(&repo(), &resume_args(&r, &o, &ckpt, "0"), Some(&bin), LIMIT);

    run.check("exit code", Some(75), run.code);
    let j = run.journal(&run_dir);
    run.check(
        "the OOMs' phases",
        vec![Value::from("loading"), Value::from("loading")],
        phases(&j),
    );
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    for s in &starts {
        run.check(
            "every attempt's micro-batch is the user's",
            Some("4".to_string()),
            flag_value(&argv_of(s), "--per_device_train_batch_size"),
        );
    }
    for said in [
        "again after a retry at the same settings, and the command has no optimizer offload setting: a smaller batch does not lower a load's peak; oomguard stops here",
        "oomguard:   Hugging Face Trainer: transformers 4.27 or newer loads the optimizer's state on the CPU first",
        "attempt 2: OOM while loading a checkpoint (tried to allocate 4.00 GiB on GPU 0, 1.19 GiB free) → stopped",
    ] {
        run.ensure(
            "stderr says",
            run.stderr.contains(said),
            said,
            tail(&run.stderr, 3000),
        );
    }
}

/// A real Trainer's save of checkpoint-4 raises a real `torch.OutOfMemoryError` from the
/// model's `state_dict` (`_save_checkpoint` → `save_model` → `save_pretrained`) on every
/// launch: the command has no saving setting oomguard can change, so the same settings are
/// retried once from checkpoint-2 (never the half-written checkpoint-4), then oomguard stops
/// with the saving advice (exit 75); the batch is never shrunk.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_while_saving_is_retried_once_then_stops_without_a_smaller_batch() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let (o, r) = (out.display().to_string(), run_dir.display().to_string());
    let args = [
        "--run-dir",
        &r,
        "python",
        "tests/real/hf_trainer_phase_oom.py",
        "--oom_in",
        "save",
        "--oom_times",
        "0",
        "--per_device_train_batch_size",
        "4",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--output_dir",
        &o,
    ];
    let run = oomguard(&repo(), &args, Some(&bin), LIMIT);

    run.check("exit code", Some(75), run.code);
    let j = run.journal(&run_dir);
    run.check(
        "the OOMs' phases",
        vec![Value::from("saving"), Value::from("saving")],
        phases(&j),
    );
    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let second = argv_of(starts[1]);
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(out.join("checkpoint-2").display().to_string()),
        resume_arg(&second),
    );
    run.check(
        "attempt 2's micro-batch is the user's",
        Some("4".to_string()),
        flag_value(&second, "--per_device_train_batch_size"),
    );
    for said in [
        "OOM while saving a checkpoint (tried to allocate 4.00 GiB on GPU 0, 1.19 GiB free): retrying the same settings once",
        "a smaller batch does not lower a save's peak; oomguard stops here",
        "oomguard:   Hugging Face Trainer: --save_only_model",
    ] {
        run.ensure(
            "stderr says",
            run.stderr.contains(said),
            said,
            tail(&run.stderr, 3000),
        );
    }
}

fn ds_config(dir: &Path, gather: bool) -> PathBuf {
    let p = dir.join("ds.json");
    let text = format!(
        "{{\n  \"train_micro_batch_size_per_gpu\": 4,\n  \"gradient_accumulation_steps\": 2,\n  \"zero_optimization\": {{\n    \"stage\": 3,\n    \"stage3_gather_16bit_weights_on_model_save\": {gather}\n  }}\n}}\n"
    );
    std::fs::write(&p, text).unwrap();
    p
}

/// A ZeRO-3 run whose save gathers the full 16-bit weights on one rank and runs out of
/// memory there (a real Python traceback through `_save_checkpoint` → `save_16bit_model`
/// → `_zero3_consolidated_16bit_state_dict`): oomguard relaunches with
/// `stage3_gather_16bit_weights_on_model_save: false` in its copy of ds.json, the
/// micro-batch and accumulation as written, and the run finishes.
#[test]
fn deepspeed_zero3_oom_while_saving_turns_the_16bit_gather_off() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let ds = ds_config(tmp.path(), true);
    let child = repo().join("tests/children/phase_oom.py");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python3",
        child.to_str().unwrap(),
        "--deepspeed",
        ds.to_str().unwrap(),
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let run = oomguard(tmp.path(), &args, None, LIMIT);

    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    run.check("the OOM's phase", vec![Value::from("saving")], phases(&j));
    let decisions = events(&j, "decision");
    let steps: Vec<_> = decisions.iter().map(|d| d["step"].clone()).collect();
    run.check("decisions", vec![Value::from("no_gather_on_save")], steps);
    let d = decisions[0];
    run.check(
        "gather_on_save before and after",
        (Some(true), Some(false)),
        (
            d["before"]["gather_on_save"].as_bool(),
            d["after"]["gather_on_save"].as_bool(),
        ),
    );
    run.check(
        "micro-batch untouched",
        (Some(4), Some(4)),
        (
            d["before"]["micro_batch"].as_u64(),
            d["after"]["micro_batch"].as_u64(),
        ),
    );
    run.ensure(
        "the relaunch ran with the gather off",
        run.stdout.contains("gather=False micro=4") && run.stdout.contains("training finished"),
        "gather=False micro=4, then training finished",
        tail(&run.stdout, 2000),
    );
    run.ensure(
        "the user's ds.json is untouched",
        std::fs::read_to_string(&ds)
            .unwrap()
            .contains("\"stage3_gather_16bit_weights_on_model_save\": true"),
        "true",
        std::fs::read_to_string(&ds).unwrap(),
    );
    for said in [
        "decision: no_gather_on_save — OOM while saving a checkpoint (tried to allocate 12.50 GiB on GPU 0, 9.81 GiB free) (the traceback runs through _zero3_consolidated_16bit_state_dict): gather_on_save true → false",
        "gather_on_save  true    false  no_gather_on_save after the OOM while saving a checkpoint in attempt 1",
    ] {
        run.ensure(
            "stderr says",
            run.stderr.contains(said),
            said,
            tail(&run.stderr, 3000),
        );
    }
}

/// `plan` shows what each phase's OOM gets: for loading, the retry, then the optimizer
/// offload where the command has it, then the stop; for saving, the gather turned off,
/// then the retry, then the stop; the first step and steady state get the ladder.
#[test]
fn plan_shows_what_each_phase_gets() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("ds.json");
    std::fs::write(
        &p,
        "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"none\"}, \"stage3_gather_16bit_weights_on_model_save\": true}}\n",
    )
    .unwrap();
    let cmd = [
        "plan",
        "python3",
        "train.py",
        "--deepspeed",
        p.to_str().unwrap(),
        "--output_dir",
        "out",
    ];
    std::fs::write(tmp.path().join("train.py"), "print('x')\n").unwrap();
    let run = oomguard(tmp.path(), &cmd, None, LIMIT);
    run.check("exit code", Some(0), run.code);
    for said in [
        "after an OOM while loading a checkpoint (its traceback or progress shows it; no smaller batch, the memory model not calibrated):\n  1. the same settings once more, relaunched from the last checkpoint, with PYTORCH_CUDA_ALLOC_CONF expandable_segments:True (a key you set is kept)\n  2. offload_optimizer: ",
        "after an OOM while saving a checkpoint (its traceback or progress shows it; no smaller batch, the memory model not calibrated):\n  1. no_gather_on_save: ",
        "  2. the same settings once more, relaunched from the last complete checkpoint",
        "  3. stop (exit 75), with advice: ",
        "after an OOM at the first step or in training: the ladder above; in the steady state (10 or more good steps before it) the memory model takes it for a spike",
    ] {
        run.ensure(
            "plan says",
            run.stdout.contains(said),
            said,
            tail(&run.stdout, 4000),
        );
    }
    let mut json = cmd.to_vec();
    json.insert(1, "--json");
    let run = oomguard(tmp.path(), &json, None, LIMIT);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    run.check(
        "phase_fixes",
        serde_json::json!({
            "loading": ["retry_same_settings", "offload_optimizer", "stop"],
            "saving": ["no_gather_on_save", "retry_same_settings", "stop"],
        }),
        v["phase_fixes"].clone(),
    );
}

/// An accelerate config with FSDP that saves a full state dict (the user's file).
fn fsdp_config(dir: &Path) -> PathBuf {
    let p = dir.join("fsdp.yaml");
    std::fs::write(
        &p,
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_offload_params: false\nmixed_precision: bf16\nnum_machines: 1\nnum_processes: 1\n",
    )
    .unwrap();
    p
}

/// An OOM while FSDP gathers a full state dict to save (`accelerate launch` with
/// `fsdp_state_dict_type: FULL_STATE_DICT`): oomguard's copy of the accelerate
/// config says SHARDED_STATE_DICT, the user's file is untouched, and the run
/// finishes; `plan` shows the change after an OOM while saving.
#[test]
fn accelerate_fsdp_oom_while_saving_switches_to_a_sharded_state_dict() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let cfg = fsdp_config(tmp.path());
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(
        repo().join("tests/children/fake_accelerate"),
        bin.join("accelerate"),
    )
    .unwrap();
    let child = repo().join("tests/children/phase_fsdp_oom.py");
    let cmd = [
        "accelerate",
        "launch",
        "--config_file",
        cfg.to_str().unwrap(),
        child.to_str().unwrap(),
        "--output_dir",
        out.to_str().unwrap(),
    ];
    let plan: Vec<&str> = ["plan"].into_iter().chain(cmd).collect();
    let p = oomguard(tmp.path(), &plan, Some(&bin), LIMIT);
    p.ensure(
        "plan shows the sharded state dict after an OOM while saving",
        p.stdout.contains("while saving") && p.stdout.contains("gather_on_save"),
        "while saving ... gather_on_save",
        tail(&p.stdout, 4000),
    );
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap()];
    args.extend(cmd);
    let run = oomguard(tmp.path(), &args, Some(&bin), LIMIT);
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);
    run.check("the OOM's phase", vec![Value::from("saving")], phases(&j));
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("no_gather_on_save")], steps);
    run.ensure(
        "the relaunch read SHARDED_STATE_DICT from oomguard's copy",
        run.stdout.contains("state_dict_type=SHARDED_STATE_DICT")
            && run.stdout.contains("training finished"),
        "state_dict_type=SHARDED_STATE_DICT, then training finished",
        tail(&run.stdout, 2000),
    );
    run.ensure(
        "the user's config is untouched",
        std::fs::read_to_string(&cfg)
            .unwrap()
            .contains("fsdp_state_dict_type: FULL_STATE_DICT"),
        "FULL_STATE_DICT",
        std::fs::read_to_string(&cfg).unwrap(),
    );
}
