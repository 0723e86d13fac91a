//! Sharding as a remedy (issue 21, item 5): a Hugging Face Trainer on several
//! GPUs whose command sets no DeepSpeed or FSDP gets FSDP full-shard in its
//! own spelling (`--fsdp "full_shard auto_wrap"`) where the memory model says
//! the model's states do not fit one GPU and sharding does; `plan` says so.
//! One GPU, or a command that shards already, never gets it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Run, spawn_env};

const LIMIT: Duration = Duration::from_secs(60);

/// A 6.7B Llama: its weights, gradients and Adam states (about 100 GiB) do not
/// fit one 80 GiB GPU; sharded over 8 they are about 13 GiB.
const LLAMA_7B: &str = r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000}"#;

fn setup(dir: &Path) {
    std::fs::create_dir_all(dir.join("m")).unwrap();
    std::fs::write(dir.join("m/config.json"), LLAMA_7B).unwrap();
    std::fs::write(
        dir.join("train.py"),
        "from transformers import HfArgumentParser, TrainingArguments, Trainer\n",
    )
    .unwrap();
}

fn plan(dir: &Path, launcher: &[&str], extra: &[&str]) -> Run {
    let mut args = vec!["plan", "--gpu-memory", "80", "--"];
    args.extend_from_slice(launcher);
    args.extend_from_slice(&[
        "train.py",
        "--model_name_or_path",
        "m",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--output_dir",
        "out",
    ]);
    args.extend_from_slice(extra);
    let r = spawn_env(dir, &args, &[]).wait(LIMIT);
    r.ensure("plan exits 0", r.code == Some(0), "0", r.code);
    r
}

#[test]
fn torchrun_hf_trainer_whose_states_overflow_one_gpu_is_planned_with_fsdp_full_shard() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path());
    let r = plan(t.path(), &["torchrun", "--nproc_per_node", "8"], &[]);
    let out = &r.stdout;
    r.ensure(
        "the knob, in the program's own spelling",
        out.contains(
            "fsdp                false   absent; would add --fsdp \"full_shard auto_wrap\"",
        ),
        "fsdp false absent; would add --fsdp \"full_shard auto_wrap\"",
        out,
    );
    r.ensure(
        "the note says when and that the results are unchanged",
        out.contains("8 GPUs and no DeepSpeed or FSDP setting")
            && out.contains("the updates are the same"),
        "a note: 8 GPUs and no DeepSpeed or FSDP setting ... the updates are the same",
        out,
    );
    r.ensure(
        "the first rung after an OOM shards, and its argv carries the flag",
        out.contains("fsdp false → true") && out.contains("--fsdp 'full_shard auto_wrap'"),
        "fsdp false → true and argv ... --fsdp 'full_shard auto_wrap'",
        out,
    );
    r.ensure(
        "--fit's start line offers it",
        out.lines()
            .any(|l| l.starts_with("start:") && l.contains("fsdp false → true")),
        "start: ... fsdp false → true",
        out,
    );
    r.ensure(
        "the resume section says a relaunch that adds FSDP cannot load the run's checkpoints",
        out.contains("  checkpoint format: FSDP switched on cannot load a checkpoint written without it (the Trainer then reads optimizer.bin or optimizer_0/); once this run has saved one, a relaunch that adds FSDP starts from the beginning\n"),
        "checkpoint format: FSDP switched on cannot load ...",
        out,
    );
}

/// A command with a ZeRO stage and a checkpoint folder: `plan` says how the steps
/// that change the stage treat the run's checkpoints, in text and in JSON; without
/// a ZeRO or FSDP knob it says nothing of the kind.
#[test]
fn plan_says_how_a_zero_stage_change_treats_the_runs_checkpoints() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("ds.json"),
        r#"{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}"#,
    )
    .unwrap();
    let sim = common::sim();
    let argv = |json: bool| {
        let mut a = vec!["plan"];
        if json {
            a.push("--json");
        }
        a.extend([
            "--",
            "torchrun",
            "--nproc_per_node=2",
            sim.as_str(),
            "--per_device_train_batch_size",
            "1",
            "--deepspeed",
            "ds.json",
            "--output_dir",
            "out",
        ]);
        a
    };
    let rule = "checkpoint format: a ZeRO stage loads only checkpoints written at its own stage (1 and 2 load each other's); once this run has saved one, a step that can load it comes before one that cannot (at ZeRO 2, the optimizer's offload before ZeRO 3), and a relaunch after a step that cannot starts from the beginning";
    let text = spawn_env(t.path(), &argv(false), &[]).wait(LIMIT);
    text.ensure(
        "said in the resume section",
        text.stdout.contains(&format!("\n  {rule}\n")),
        rule,
        &text.stdout,
    );
    let json = spawn_env(t.path(), &argv(true), &[]).wait(LIMIT);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap_or_default();
    json.check(
        "the JSON's resume.format",
        Some(rule),
        v["resume"]["format"].as_str(),
    );
    let plain = spawn_env(
        t.path(),
        &[
            "plan",
            "--",
            "python3",
            sim.as_str(),
            "--per_device_train_batch_size",
            "1",
            "--output_dir",
            "out",
        ],
        &[],
    )
    .wait(LIMIT);
    plain.ensure(
        "nothing of the kind without a ZeRO or FSDP knob",
        plain.code == Some(0) && !plain.stdout.contains("checkpoint format:"),
        "no checkpoint format line",
        &plain.stdout,
    );
}

#[test]
fn one_gpu_or_a_command_that_shards_already_never_gets_fsdp() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path());
    let one = plan(t.path(), &["python"], &[]);
    one.ensure(
        "one GPU: no fsdp knob, the step said not applicable",
        !one.stdout.contains("--fsdp")
            && one
                .stdout
                .contains("fsdp_full_shard: FSDP is added only to a Hugging Face Trainer script on several GPUs"),
        "no --fsdp; fsdp_full_shard not applicable",
        &one.stdout,
    );
    let sharded = plan(
        t.path(),
        &["torchrun", "--nproc_per_node", "8"],
        &["--fsdp", "shard_grad_op"],
    );
    sharded.ensure(
        "the user's own --fsdp is kept, nothing added",
        !sharded.stdout.contains("full_shard auto_wrap")
            && !sharded.stdout.contains("fsdp false → true"),
        "no full_shard auto_wrap added",
        &sharded.stdout,
    );
}
