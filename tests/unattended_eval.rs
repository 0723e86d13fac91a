//! An OOM during evaluation halves the evaluation batch, not the training batch: the
//! real binary over a real Hugging Face Trainer evaluation (the real-client tier, see
//! `tests/real_clients.rs`), over plain argparse scripts whose `evaluate()` runs out of
//! memory (a real Python traceback, no torch needed), and `plan`'s account of it.

mod common;
use common::*;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(420);

/// A real `transformers.Trainer` evaluates every 4 steps with the Trainer's default
/// evaluation batch (8, no flag in the command); the evaluation's forward raises a real
/// `torch.OutOfMemoryError` (PyTorch's message: the allocation that failed, the memory in
/// use) while eval batch × seq > 256, at step 4, after checkpoint-2 was saved. oomguard
/// tells evaluation from the traceback (prediction_step, evaluation_loop, evaluate) and
/// relaunches from checkpoint-2 with `--per_device_eval_batch_size 4` added; the training
/// batch (4), the accumulation (2) and the global batch (8) are those the user wrote.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn hf_trainer_oom_during_evaluation_halves_the_eval_batch_and_keeps_the_training_batch() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = tmp.path().join("report.jsonl");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_trainer_eval_oom.py",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "64",
        "--eval_budget",
        "256",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "4",
        "--save_steps",
        "2",
        "--max_steps",
        "6",
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
    let decisions = events(&j, "decision");
    let steps: Vec<_> = decisions.iter().map(|d| d["step"].clone()).collect();
    run.check("decisions", vec![Value::from("halve_eval_batch")], steps);
    let d = decisions[0];
    for (knob, before, after) in [
        ("eval_batch", 8, 4),
        ("micro_batch", 4, 4),
        ("grad_accum", 2, 2),
    ] {
        run.check(
            &format!("decision's {knob}"),
            (Some(before), Some(after)),
            (d["before"][knob].as_u64(), d["after"][knob].as_u64()),
        );
    }
    run.check(
        "global batch before and after",
        (Some(8), Some(8)),
        (
            d["global_batch_before"].as_u64(),
            d["global_batch_after"].as_u64(),
        ),
    );

    let second = argv_of(starts[1]);
    run.check(
        "attempt 2 adds the evaluation batch, halved from the Trainer's default 8",
        Some("4".to_string()),
        flag_value(&second, "--per_device_eval_batch_size"),
    );
    run.check(
        "attempt 2's training batch",
        Some("4".to_string()),
        flag_value(&second, "--per_device_train_batch_size"),
    );
    run.check(
        "attempt 2's accumulation",
        Some("2".to_string()),
        flag_value(&second, "--gradient_accumulation_steps"),
    );
    let ckpt2 = out.join("checkpoint-2").display().to_string();
    run.check(
        "attempt 2 resumes from checkpoint-2",
        Some(ckpt2.clone()),
        resume_arg(&second),
    );
    run.ensure(
        "the trainer said it resumed",
        run.stdout.contains(&format!("resuming from {ckpt2}")),
        &format!("'resuming from {ckpt2}' in the output"),
        tail(&run.stdout, 600),
    );
    for said in [
        "OOM during evaluation (tried to allocate 4.00 GiB on GPU 0, 1.19 GiB free) (the traceback runs through prediction_step): evaluation batch 8 → 4; the training batch and the global batch (8) are unchanged",
        "halve_eval_batch after the OOM during evaluation in attempt 1",
    ] {
        run.ensure(
            "oomguard says what it did and why",
            run.stderr.contains(said),
            said,
            tail(&run.stderr, 3000),
        );
    }

    // What the trainer itself ran with, launch by launch.
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let last: Value = text
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    run.check("launches that finished", 1, text.lines().count());
    run.check("final eval batch", Some(4), last["eval_batch"].as_u64());
    run.check("final micro-batch", Some(4), last["micro"].as_u64());
    run.check("final accumulation", Some(2), last["accum"].as_u64());
    run.check("global batch kept", Some(8), last["global_batch"].as_u64());
    run.check("reached max_steps", Some(6), last["global_step"].as_u64());
    run.ensure(
        "evaluations ran",
        last["evaluations"].as_u64().is_some_and(|n| n >= 1),
        "at least one",
        &last,
    );
    // The Trainer's own record: the evaluation at step 4 finished on the relaunch.
    let state = run.read_json(&out.join("checkpoint-6/trainer_state.json"));
    let evaluated: Vec<u64> = state["log_history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|e| e.get("eval_loss").is_some())
                .filter_map(|e| e["step"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    run.ensure(
        "the evaluation at step 4 is in log_history",
        evaluated.contains(&4),
        "an eval_loss at step 4",
        &evaluated,
    );
}

/// A plain argparse script (no torch) whose `evaluate()` raises what PyTorch raises on a
/// CUDA OOM (`torch.OutOfMemoryError`, its message) while its evaluation batch is above
/// `--fits`, and whose training step raises it while the micro-batch is above
/// `--train_fits`. Each launch appends its settings to `launches` in the working directory.
const EVAL_SCRIPT: &str = r#"
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--per_device_train_batch_size", type=int, required=True)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
p.add_argument("--eval_batch_size", type=int, default=8)
p.add_argument("--fits", type=int, default=2)
p.add_argument("--train_fits", type=int, default=64)
a = p.parse_args()
with open("launches", "a") as f:
    f.write(json.dumps({"micro": a.per_device_train_batch_size, "accum": a.gradient_accumulation_steps,
                        "eval": a.eval_batch_size}) + "\n")

class OutOfMemoryError(RuntimeError):
    pass
OutOfMemoryError.__module__ = "torch"

def forward(batch, fits):
    if batch > fits:
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch * 64}.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 100.00 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use.")

def train_step():
    print("step 1: loss 2.0", flush=True)
    forward(a.per_device_train_batch_size, a.train_fits)

def evaluate():
    print("Evaluating: 1/4 [00:00<00:01, 3.0it/s]", flush=True)
    forward(a.eval_batch_size, a.fits)

train_step()
evaluate()
print("done", flush=True)
"#;

/// oomguard `opts` python3 train.py --per_device_train_batch_size 8
/// --gradient_accumulation_steps 2 `extra`, in a fresh folder.
fn eval_script_run(opts: &[&str], extra: &[&str]) -> (Run, Vec<Value>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("train.py"), EVAL_SCRIPT).unwrap();
    let run_dir = tmp.path().join("run");
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap()];
    args.extend_from_slice(opts);
    args.extend_from_slice(&[
        "python3",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
    ]);
    args.extend_from_slice(extra);
    let run = oomguard(tmp.path(), &args, None, Duration::from_secs(60));
    let launches = std::fs::read_to_string(tmp.path().join("launches"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (run, launches, tmp)
}

fn settings(v: &Value) -> (u64, u64, u64) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    (n("micro"), n("accum"), n("eval"))
}

/// A plain script's `--eval_batch_size 8` (an evaluation that fits at 2): two OOMs in
/// `evaluate()`, two halvings of the evaluation batch, the training batch as written.
#[test]
fn a_plain_scripts_eval_batch_is_halved_after_an_oom_in_evaluate() {
    let (run, launches, _tmp) = eval_script_run(&[], &["--eval_batch_size", "8"]);
    run.check("exit code", Some(0), run.code);
    let got: Vec<_> = launches.iter().map(settings).collect();
    run.check(
        "micro, accum, eval batch of each launch",
        vec![(8, 2, 8), (8, 2, 4), (8, 2, 2)],
        got,
    );
    run.ensure(
        "the reason names the frame",
        run.stderr
            .contains("(the traceback runs through evaluate): evaluation batch 8 → 4; the training batch and the global batch (16) are unchanged"),
        "the decision's reason",
        tail(&run.stderr, 3000),
    );
}

/// At 1 the evaluation batch cannot shrink: the training settings change, and oomguard
/// says why. An OOM in training is never met by the evaluation batch.
#[test]
fn an_eval_oom_at_eval_batch_1_falls_back_to_the_training_decision_and_says_why() {
    // Training at micro 8 does not fit (4 does); evaluation at 1 does.
    let (run, launches, _tmp) = eval_script_run(
        &[],
        &["--eval_batch_size", "1", "--fits", "1", "--train_fits", "4"],
    );
    run.check("exit code", Some(0), run.code);
    let got: Vec<_> = launches.iter().map(settings).collect();
    run.check(
        "an OOM in training halves the micro-batch, the eval batch as written",
        vec![(8, 2, 1), (4, 4, 1)],
        got,
    );
    run.ensure(
        "no word of evaluation",
        !run.stderr.contains("during evaluation"),
        "nothing about evaluation",
        tail(&run.stderr, 3000),
    );

    // Evaluation at batch 1 that still does not fit: the policy's step, and why.
    let (run, launches, _tmp) = eval_script_run(
        &["--max-attempts", "2"],
        &["--eval_batch_size", "1", "--fits", "0"],
    );
    let said = "the OOM happened during evaluation (the traceback runs through evaluate), but the evaluation batch is already 1: the training settings change instead";
    run.ensure(
        "oomguard says why the training settings change",
        run.stderr.contains(said),
        said,
        tail(&run.stderr, 3000),
    );
    let got: Vec<_> = launches.iter().map(settings).collect();
    run.check(
        "the policy's step after it",
        vec![(8, 2, 1), (4, 4, 1)],
        got,
    );
    let j = run.journal(&run.cwd.join("run"));
    let steps: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check("decisions", vec![Value::from("halve_micro_batch")], steps);
}

fn plan(dir: &Path, args: &[&str]) -> Run {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    oomguard(dir, &all, None, Duration::from_secs(60))
}

/// `plan` says what an OOM during evaluation would do: halve the evaluation batch where
/// the command has one, or adds one where the program takes it (a script that parses the
/// Trainer's arguments with HfArgumentParser), else the ladder, and says how to bind one.
#[test]
fn plan_says_what_an_oom_during_evaluation_would_do() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf.py");
    std::fs::write(
        &hf,
        "from transformers import HfArgumentParser, TrainingArguments\n",
    )
    .unwrap();
    let plain = tmp.path().join("plain.py");
    std::fs::write(&plain, "import argparse\n").unwrap();
    let common = [
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
        "--output_dir",
        "out",
    ];
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "hf.py",
            &[],
            "  eval_batch 8 → 4 → 2 → 1 (absent; would add --per_device_eval_batch_size), one halving per such OOM, each relaunched from the last checkpoint; the training batch and the global batch (16) stay; then the ladder above",
        ),
        (
            "plain.py",
            &["--val_batch_size", "4"],
            "  eval_batch 4 → 2 → 1 (flag --val_batch_size)",
        ),
        (
            "plain.py",
            &["--eval_batch_size=1"],
            "  eval_batch is 1, none to halve: the ladder above applies",
        ),
        (
            "plain.py",
            &[],
            "  the ladder above applies: no evaluation batch setting in the command (looked for ",
        ),
    ];
    for (script, extra, want) in cases {
        let mut args = vec!["python", script];
        args.extend_from_slice(&common);
        args.extend_from_slice(extra);
        let run = plan(tmp.path(), &args);
        run.check("exit code", Some(0), run.code);
        let all = format!("{}{}", run.stdout, run.stderr);
        if script == &"plain.py" && extra.is_empty() {
            let rule = "--per_device_eval_batch_size, ";
            run.ensure("the spellings looked for", all.contains(rule), rule, &all);
            let rule = "oomguard adds --per_device_eval_batch_size only to a script that parses the Trainer's arguments (HfArgumentParser, TrlParser) or names the flag; bind yours with --knob eval_batch=FLAG";
            run.ensure("the rule for adding it", all.contains(rule), rule, &all);
        }
        run.ensure(
            "plan's section on an OOM during evaluation",
            all.contains(
                "after an OOM during evaluation (its traceback or progress shows evaluation):",
            ) && all.contains(want),
            want,
            &all,
        );
    }
    // --json: the evaluation batches, in turn.
    let run = plan(
        tmp.path(),
        &[
            "--json",
            "python",
            "hf.py",
            "--per_device_train_batch_size",
            "8",
            "--output_dir",
            "out",
        ],
    );
    let v: Value = serde_json::from_str(&run.stdout).unwrap_or_default();
    run.check(
        "eval_oom_eval_batch",
        Some(vec![4, 2, 1]),
        v["eval_oom_eval_batch"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect::<Vec<_>>()),
    );
}
