//! The real LightningCLI program (`tests/real/lightning_cli.py`, lightning from PyPI) with
//! everything in its `--config` YAML: `devices`, `strategy`, `num_nodes`,
//! `accumulate_grad_batches`, and an OOM that lands past the first epoch, where
//! Lightning's bar has started counting again from 0 while the `.ckpt` files and their
//! `step=N` names count on.
//!
//! The run needs OOMGUARD_REAL_PYTHON (tests/run.sh sets it) and is `#[ignore]`d;
//! `oomguard plan` runs nothing, so its test here needs no venv.

mod common;
use common::*;

use serde_json::Value;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(540);

/// Two ranks started by Lightning (`devices: 2`, `strategy: ddp`, `num_nodes: 1`, all in
/// the config), 10 batches of 4 a rank each epoch at accumulation 3: 4 steps an epoch
/// (the epoch's 10th batch steps alone). The OOM comes at global step 10, in epoch 2,
/// after 6 of its batches, with `epoch=2-step=9.ckpt` saved. Truth: 10 steps done,
/// resumed at 9, 1 redone, world 2, global batch 4 × 3 × 2 = 24 kept.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn lightning_oom_in_epoch_2_counts_steps_lost_exactly_from_the_global_step() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (ckpts, run_dir, rep) = (t.join("ckpts"), t.join("run"), t.join("report.jsonl"));
    let cfg = t.join("cfg.yaml");
    std::fs::write(
        &cfg,
        format!(
            "trainer:
  accelerator: cpu
  devices: 2
  num_nodes: 1
  strategy: ddp
  max_epochs: 5
  max_steps: 14
  accumulate_grad_batches: 3
  default_root_dir: {root}
  enable_model_summary: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: {ckpts}
        every_n_train_steps: 3
        save_top_k: -1
data:
  batch_size: 4
  seq_len: 32
  samples: 80
model:
  budget: 100
  oom_at_step: 10
  report: {rep}
",
            root = t.join("root").display(),
            ckpts = ckpts.display(),
            rep = rep.display()
        ),
    )
    .unwrap();
    let python = bin.join("python");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        python.to_str().unwrap(),
        "tests/real/lightning_cli.py",
        "fit",
        "--config",
        cfg.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);

    let start = only_event(&run, &j, "run_start");
    run.check(
        "world size (devices × num_nodes in the config)",
        Some(2),
        start["world_size"].as_u64(),
    );
    run.check("global batch", Some(24), start["global_batch"].as_u64());
    run.check(
        "accumulation from the config",
        Some(3),
        start["settings"]["grad_accum"].as_u64(),
    );

    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let ckpt9 = ckpts.join("epoch=2-step=9.ckpt").display().to_string();
    run.check(
        "attempt 2 resumes from the epoch-2 checkpoint",
        Some(ckpt9.clone()),
        flag_value(&argv_of(starts[1]), "--ckpt_path"),
    );

    let w = only_event(&run, &j, "work_lost");
    run.check("resume step", Some(9), w["resume_from_step"].as_u64());
    run.check(
        "step reached (epoch 2, batch 6 of 10)",
        Some(10),
        w["step_reached"].as_u64(),
    );
    run.check(
        "step reached exact",
        Some(false),
        w["step_reached_at_least"].as_bool(),
    );
    run.check("steps lost", Some(1), w["steps_lost"].as_u64());
    run.check(
        "steps lost exact",
        Some(false),
        w["steps_lost_at_least"].as_bool(),
    );
    run.ensure(
        "the summary says 1 step redone",
        format!("{}{}", run.stdout, run.stderr)
            .contains("work lost to 1 OOM: 1 step of redone training"),
        "'work lost to 1 OOM: 1 step of redone training'",
        tail(&run.stderr, 1500),
    );

    // Lightning's bar after the resume never shows step 10 (it counts restored
    // batches too), but the relaunch finished the training: it got back.
    let out = format!("{}{}", run.stdout, run.stderr);
    run.ensure(
        "the summary says the relaunch got back, at a time not shown",
        out.contains("attempt 2 finished the training, so it got back to step 10")
            && !out.contains("had not got back"),
        "'attempt 2 finished the training, so it got back to step 10', not 'had not got back'",
        tail(&run.stderr, 1500),
    );

    let d = events(&j, "decision");
    run.check("decisions", 1, d.len());
    run.check("decision", Some("halve_micro_batch"), d[0]["step"].as_str());
    run.check(
        "global batch after",
        Some(24),
        d[0]["global_batch_after"].as_u64(),
    );

    // Lightning's own account of the two launches.
    check_last_launch(
        &run,
        &rep,
        LastLaunch {
            world: 2,
            micro: 2,
            accum: 6,
            global_batch: 24,
            resumed_from: &ckpt9,
            global_step: 14,
        },
    );
}

/// `--trainer.num_nodes 2 --trainer.devices 2`, and `num_nodes` in the config: Lightning
/// starts 2 ranks on each of 2 nodes. Only `oomguard plan` (one machine cannot be two
/// nodes): world 4, global batch 4 × 3 × 4 = 48.
#[test]
fn lightning_plan_counts_num_nodes_times_devices_from_flags_and_config() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let script = repo().join("tests/real/lightning_cli.py");
    let plan = |cfg_body: &str, extra: &[&str]| -> Value {
        let cfg = t.join("cfg.yaml");
        std::fs::write(&cfg, cfg_body).unwrap();
        let mut args = vec![
            "plan",
            "--json",
            "python",
            script.to_str().unwrap(),
            "fit",
            "--config",
            cfg.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let run = oomguard(t, &args, None, Duration::from_secs(60));
        run.check("plan exit code", Some(0), run.code);
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
            panic!(
                "plan --json printed no JSON ({e}): {}",
                tail(&run.stdout, 800)
            )
        })
    };
    let base = "trainer:
  accelerator: gpu
  strategy: ddp
  accumulate_grad_batches: 3
data:
  batch_size: 4
";
    let p = plan(
        base,
        &["--trainer.num_nodes", "2", "--trainer.devices", "2"],
    );
    assert_eq!(p["world_size"].as_u64(), Some(4), "{}", p["world_source"]);
    assert_eq!(p["world_uncertain"].as_bool(), Some(false));
    assert_eq!(p["global_batch"].as_u64(), Some(48));
    let p = plan(base, &["--trainer.num_nodes=2", "--trainer.devices=2"]);
    assert_eq!(p["world_size"].as_u64(), Some(4), "{}", p["world_source"]);
    let in_config = "trainer:
  accelerator: gpu
  devices: 2
  num_nodes: 2
  strategy: ddp
  accumulate_grad_batches: 3
data:
  batch_size: 4
";
    let p = plan(in_config, &[]);
    assert_eq!(p["world_size"].as_u64(), Some(4), "{}", p["world_source"]);
    assert_eq!(p["global_batch"].as_u64(), Some(48));
}

/// A module that optimizes by hand (`automatic_optimization = False`, as GAN and vocoder
/// modules do; `model.manual: true` here) OOMs at batch 8. The halving adds
/// `--trainer.accumulate_grad_batches 2`, which Lightning refuses for such a module before
/// any step ("Automatic gradient accumulation is not supported for manual
/// optimization"). That refusal is oomguard's doing, not the run's failure: the knob is
/// dropped and the OOM decided again without it. Under `default` nothing else keeps the
/// global batch (no checkpointing flag, the sequence is below the shortening floor), so
/// the run stops with exit 75 and says what to do; under `--policy smaller-batch`, which
/// that advice names, attempt 3 runs at batch 4 and finishes.
fn manual_optimization_run(policy: Option<&str>) -> (Run, Vec<Value>, Vec<Value>) {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (ckpts, run_dir, rep) = (t.join("ckpts"), t.join("run"), t.join("report.jsonl"));
    let cfg = t.join("cfg.yaml");
    std::fs::write(
        &cfg,
        format!(
            "trainer:
  accelerator: cpu
  devices: 1
  max_steps: 6
  enable_model_summary: false
  default_root_dir: {root}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: {ckpts}
        every_n_train_steps: 2
        save_top_k: -1
data:
  batch_size: 8
  seq_len: 32
  samples: 80
model:
  budget: 200
  oom_at_step: 3
  manual: true
  report: {rep}
",
            root = t.join("root").display(),
            ckpts = ckpts.display(),
            rep = rep.display()
        ),
    )
    .unwrap();
    let python = bin.join("python");
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap()];
    if let Some(p) = policy {
        args.extend(["--policy", p]);
    }
    args.extend([
        python.to_str().unwrap(),
        "tests/real/lightning_cli.py",
        "fit",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let run = oomguard(&repo(), &args, None, LIMIT);
    let j = run.journal(&run_dir);
    let r = report(&rep);
    (run, j, r)
}

/// Checks what both policies show of the refusal: attempt 2 added the accumulation, and
/// the journal and the terminal name Lightning's refusal as oomguard's doing.
fn check_manual_optimization_refusal(run: &Run, j: &[Value]) {
    let starts = events(j, "attempt_start");
    run.check(
        "attempt 2 adds the accumulation",
        Some("2".to_string()),
        flag_value(&argv_of(starts[1]), "--trainer.accumulate_grad_batches"),
    );
    let refused = only_event(run, j, "refused");
    run.check("refused knob", Some("grad_accum"), refused["knob"].as_str());
    run.check(
        "refused argument",
        Some("--trainer.accumulate_grad_batches"),
        refused["added"].as_str(),
    );
    run.ensure(
        "the refusal is Lightning's manual-optimization line",
        refused["line"]
            .as_str()
            .is_some_and(|l| l.contains("not supported for manual optimization")),
        "Lightning's MisconfigurationException line",
        &refused["line"],
    );
    run.ensure(
        "the terminal says the refusal is oomguard's doing",
        run.stderr.contains(
            "the command refused --trainer.accumulate_grad_batches, which oomguard added for grad_accum",
        ) && !run.stderr.contains("not an out-of-memory"),
        "'the command refused --trainer.accumulate_grad_batches, which oomguard added', and no 'not an out-of-memory'",
        tail(&run.stderr, 2000),
    );
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn lightnings_refusal_of_accumulation_for_manual_optimization_stops_with_advice() {
    let (run, j, r) = manual_optimization_run(None);
    run.check("exit code (gave up)", Some(75), run.code);
    check_manual_optimization_refusal(&run, &j);
    run.check("attempts", 2, events(&j, "attempt_start").len());
    run.ensure(
        "the stop names the way on",
        run.stderr.contains("rerun with --policy smaller-batch")
            && run
                .stderr
                .contains("without grad_accum, the policy 'default' has no other step"),
        "'without grad_accum, the policy 'default' has no other step' and 'rerun with --policy smaller-batch'",
        tail(&run.stderr, 2000),
    );
    run.check(
        "Lightning started once (attempt 2 was refused before fit)",
        1,
        r.iter().filter(|l| l["when"] == "start").count(),
    );
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn lightnings_refusal_of_accumulation_under_smaller_batch_goes_on_at_a_smaller_batch() {
    let (run, j, r) = manual_optimization_run(Some("smaller-batch"));
    run.check("exit code", Some(0), run.code);
    check_manual_optimization_refusal(&run, &j);
    let starts = events(&j, "attempt_start");
    run.check("attempts", 3, starts.len());
    run.check(
        "attempt 3 adds no accumulation",
        None,
        flag_value(&argv_of(starts[2]), "--trainer.accumulate_grad_batches"),
    );
    let last = r.last().cloned().unwrap_or_default();
    run.check("final micro-batch", Some(4), last["micro"].as_u64());
    run.check("final accumulation", Some(1), last["accum"].as_u64());
    run.check("reached max_steps", Some(6), last["global_step"].as_u64());
    run.ensure(
        "the decision says the global batch shrinks",
        run.stderr
            .contains("micro-batch 8 → 4, no accumulation to double: the global batch shrinks"),
        "'micro-batch 8 → 4, no accumulation to double: the global batch shrinks'",
        tail(&run.stderr, 2000),
    );
}
