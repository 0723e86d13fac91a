//! LLaMA-Factory, the real one: `llamafactory-cli train recipe.yaml` (llamafactory 0.9.5
//! from PyPI, in its own venv: see tests/real/requirements-llamafactory.txt) on the CPU,
//! a tiny Llama written here, a tiny dataset in LLaMA-Factory's `dataset_info.json`
//! format, and a PyTorch OOM raised in the Trainer's training step by
//! `tests/real/inject_oom/sitecustomize.py`. The recipe, the launcher, the checkpoints
//! and the resume are LLaMA-Factory's own; the journal's numbers are checked against
//! what LLaMA-Factory itself prints.
//!
//! Needs OOMGUARD_REAL_LLAMAFACTORY (that venv's `llamafactory-cli`, set by
//! tests/run.sh); `#[ignore]`d, and failing when run without it.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(540);

/// LLaMA-Factory's `llamafactory-cli` (`OOMGUARD_REAL_LLAMAFACTORY`); panics saying how
/// to get it when it is not set.
fn llamafactory_cli() -> PathBuf {
    let p = std::env::var_os("OOMGUARD_REAL_LLAMAFACTORY")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "OOMGUARD_REAL_LLAMAFACTORY is not set: needs LLaMA-Factory's venv: run bash tests/run.sh"
            )
        });
    assert!(p.exists(), "OOMGUARD_REAL_LLAMAFACTORY: no {}", p.display());
    p
}

/// A tiny Llama (random weights, 4 layers: enough for checkpointing to save memory), a character tokenizer, and 64 alpaca
/// examples registered in `data/dataset_info.json`, made in `dir` with the venv's own
/// transformers (no downloads).
fn workdir(python: &Path, dir: &Path) {
    let made = Command::new(python)
        .current_dir(dir)
        .env("HF_HUB_OFFLINE", "1")
        .args([
            "-c",
            "import os, json
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, LlamaConfig, LlamaForCausalLM
text = 'the quick brown fox jumps over the lazy dog'
vocab = {'<pad>': 0, '<s>': 1, '</s>': 2, '<unk>': 3}
for c in sorted(set(text + 'say')): vocab.setdefault(c, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))
tok.pre_tokenizer = pre_tokenizers.Split('', 'isolated')
PreTrainedTokenizerFast(tokenizer_object=tok, pad_token='<pad>', bos_token='<s>', eos_token='</s>', unk_token='<unk>').save_pretrained('model')
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LlamaForCausalLM(cfg).save_pretrained('model')
os.makedirs('data', exist_ok=True)
json.dump([{'instruction': 'say the fox', 'input': '', 'output': text}] * 64, open('data/tiny.json', 'w'))
json.dump({'tiny': {'file_name': 'tiny.json'}}, open('data/dataset_info.json', 'w'))",
        ])
        .status()
        .unwrap();
    assert!(made.success(), "making the tiny Llama and dataset failed");
}

/// The recipe: full SFT, micro-batch 4 × accumulation 2 (global batch 8), a checkpoint
/// every 2 steps, 6 steps. No `disable_gradient_checkpointing`: LLaMA-Factory's default
/// (gradient checkpointing on) holds.
const RECIPE: &str = "model_name_or_path: model
stage: sft
do_train: true
finetuning_type: full
dataset: tiny
dataset_dir: data
template: empty
cutoff_len: 64
overwrite_cache: true
preprocessing_num_workers: 1
output_dir: out
logging_steps: 1
save_steps: 2
max_steps: 6
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 1.0e-4
bf16: false
report_to: none
";

/// Issue 23's LLaMA-Factory run: the OOM comes once 3 steps are done (after
/// checkpoint-2), while the micro-batch is above 2. Truth: 3 steps done, resumed at 2,
/// 1 redone, one process, global batch 8 kept; gradient checkpointing on by
/// LLaMA-Factory's default (it says "Gradient checkpointing enabled."), seen as on and
/// never offered.
#[test]
#[ignore = "needs LLaMA-Factory's venv: run bash tests/run.sh"]
fn llamafactory_recipe_resumes_from_its_checkpoint_with_the_global_batch_kept_and_checkpointing_seen_on()
 {
    let cli = llamafactory_cli();
    let python = cli.with_file_name("python");
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    workdir(&python, t);
    std::fs::write(t.join("recipe.yaml"), RECIPE).unwrap();
    let run_dir = t.join("run");
    let inject = repo().join("tests/real/inject_oom");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        cli.to_str().unwrap(),
        "train",
        "recipe.yaml",
    ];
    let run = spawn_env(
        t,
        &args,
        &[
            ("PYTHONPATH", inject.to_str().unwrap()),
            ("HF_HUB_OFFLINE", "1"),
            ("HF_DATASETS_OFFLINE", "1"),
            // One process, as LLaMA-Factory starts it with no GPU visible.
            ("CUDA_VISIBLE_DEVICES", ""),
            ("OOMGUARD_TEST_OOM_AT_STEP", "3"),
            ("OOMGUARD_TEST_BUDGET", "2"),
        ],
    )
    .wait(LIMIT);
    run.check("exit code", Some(0), run.code);
    let j = run.journal(&run_dir);

    let start = only_event(&run, &j, "run_start");
    run.check("world size", Some(1), start["world_size"].as_u64());
    run.check("global batch", Some(8), start["global_batch"].as_u64());
    run.check(
        "micro-batch from the recipe",
        Some(4),
        start["settings"]["micro_batch"].as_u64(),
    );
    run.check(
        "grad_checkpointing on (LLaMA-Factory's default)",
        Some(true),
        start["settings"]["grad_checkpointing"].as_bool(),
    );
    let notes = start["notes"].to_string();
    run.ensure(
        "the run says checkpointing is on by the program's default and counted",
        notes.contains("grad_checkpointing: on by the program's own default")
            && notes.contains("counted in the memory estimate"),
        "a note: grad_checkpointing on by the program's own default, counted in the memory estimate",
        &notes,
    );

    let starts = events(&j, "attempt_start");
    run.check("attempts", 2, starts.len());
    let argv2 = argv_of(starts[1]);
    run.check(
        "attempt 2 resumes from checkpoint-2 (LLaMA-Factory's override)",
        true,
        argv2
            .iter()
            .any(|a| a == "resume_from_checkpoint=out/checkpoint-2"),
    );

    let w = only_event(&run, &j, "work_lost");
    run.check("resume step", Some(2), w["resume_from_step"].as_u64());
    run.check("step reached", Some(3), w["step_reached"].as_u64());
    run.check("steps lost", Some(1), w["steps_lost"].as_u64());
    run.check(
        "steps lost exact",
        Some(false),
        w["steps_lost_at_least"].as_bool(),
    );

    let d = events(&j, "decision");
    run.check("decisions", 1, d.len());
    run.check("decision", Some("halve_micro_batch"), d[0]["step"].as_str());
    run.check("resume_step", Some(2), d[0]["resume_step"].as_u64());
    run.check(
        "global batch before",
        Some(8),
        d[0]["global_batch_before"].as_u64(),
    );
    run.check(
        "global batch after",
        Some(8),
        d[0]["global_batch_after"].as_u64(),
    );
    let after = &d[0]["after"];
    let (micro, accum) = (
        after["micro_batch"].as_u64().unwrap_or(0),
        after["grad_accum"].as_u64().unwrap_or(0),
    );
    run.ensure(
        "micro-batch down to what fits, accumulation up to keep 8",
        (1..=2).contains(&micro) && micro * accum == 8,
        "micro-batch 1 or 2, micro-batch × accumulation = 8",
        (micro, accum),
    );
    run.check(
        "checkpointing stays on after the decision",
        Some(true),
        after["grad_checkpointing"].as_bool(),
    );
    // Nothing "enables" what LLaMA-Factory already runs with.
    let copy = std::fs::read_to_string(run_dir.join("attempt-2/recipe.yaml")).unwrap_or_default();
    run.ensure(
        "no gradient checkpointing switch added",
        !copy.contains("gradient_checkpointing")
            && !argv2.iter().any(|a| a.contains("gradient_checkpointing")),
        "no gradient_checkpointing in attempt 2's recipe copy or argv",
        (&argv2, &copy),
    );

    // The memory model counts checkpointed activations: `plan` on the same recipe
    // estimates fewer bytes of activations than with LLaMA-Factory's switch turned off.
    let activations = |extra: &[&str]| -> (Option<bool>, f64) {
        let mut args = vec![
            "plan",
            "--json",
            cli.to_str().unwrap(),
            "train",
            "recipe.yaml",
        ];
        args.extend_from_slice(extra);
        let p = oomguard(t, &args, None, Duration::from_secs(60));
        p.check("plan exit code", Some(0), p.code);
        let v: serde_json::Value = serde_json::from_str(&p.stdout).unwrap_or_default();
        let given = &v["estimate"]["given"];
        (
            given["settings"]["knobs"]["grad_checkpointing"].as_bool(),
            given["estimate"]["activations"].as_f64().unwrap_or(0.0),
        )
    };
    let (on, with) = activations(&[]);
    let (off, without) = activations(&["disable_gradient_checkpointing=true"]);
    run.check("plan: checkpointing on by default", Some(true), on);
    run.ensure(
        "plan: not on when the recipe disables it",
        off != Some(true),
        "grad_checkpointing not true",
        off,
    );
    run.ensure(
        "activations estimated as checkpointed",
        with > 0.0 && with < without,
        "fewer activation bytes with LLaMA-Factory's default than with checkpointing disabled",
        (with, without),
    );

    // LLaMA-Factory's own account of the two launches.
    // Its logging goes to stderr, its bars and log dicts to either: read both.
    let out = &format!("{}\n{}", run.stdout, run.stderr);
    let says = |s: &str| out.contains(s);
    run.ensure(
        "LLaMA-Factory turned checkpointing on itself, in both attempts",
        out.matches("Gradient checkpointing enabled.").count() == 2,
        "'Gradient checkpointing enabled.' twice",
        tail(out, 800),
    );
    run.ensure(
        "LLaMA-Factory resumed at global step 2 with the global batch 8",
        says("Resuming training from checkpoint with epoch 0 and global step 2")
            && says(&format!("Instantaneous batch size per device = {micro}"))
            && out
                .matches("Total train batch size (w. parallel, distributed & accumulation) = 8")
                .count()
                == 2,
        "its resume line at global step 2, the new micro-batch, total train batch size 8 twice",
        tail(out, 1500),
    );
    let state = std::fs::read_to_string(t.join("out/trainer_state.json")).unwrap_or_default();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap_or_default();
    run.check("reached max_steps", Some(6), state["global_step"].as_u64());
}
