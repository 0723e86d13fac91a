//! Hugging Face `Trainer` and TRL scripts, and plain argparse scripts that
//! follow their spellings: `--per_device_train_batch_size 8 --output_dir out`,
//! resumed with `--resume_from_checkpoint out/checkpoint-N`.
//!
//! The same layout holds the checkpoints of scripts that write their own loop on
//! accelerate and save with `accelerator.save_state` (diffusers' training examples:
//! `out/checkpoint-N`; transformers' `*_no_trainer.py` examples and open-instruct:
//! `out/step_N`), resumed with the same flag.

use std::fs;
use std::path::{Path, PathBuf};

use super::{AbsentValue, Ctx, Family};
use crate::checkpoint::{
    Format, Kind, Layout, NotComplete, OwnSearch, ResumeHow, index_complete, no_temporaries,
    numbered_dirs, plain_name, read_in, read_small, recorded_step, weights_complete,
};
use crate::command::Command;
use crate::files::Scalar;
use crate::progress::Logging;
use crate::settings::Knob;

/// Only the Trainer's own spelling says "Hugging Face": adding a flag that the
/// script's argparse does not know would break the relaunch.
fn recognise(cmd: &Command) -> bool {
    cmd.has_flag(&[
        "--per_device_train_batch_size",
        "--per-device-train-batch-size",
    ]) || trl(cmd)
}

/// A TRL trainer script (its `sft.py`, `dpo.py`, ... recipes, or one of
/// yours built on its configs): `TrlParser` parses every `TrainingArguments`
/// flag, and TRL's configs (`SFTConfig`, `DPOConfig`, `GRPOConfig`, ...)
/// default to gradient checkpointing on, `logging_steps` 10 and bf16 on.
pub(crate) fn trl(cmd: &Command) -> bool {
    cmd.tool() == Some("trl")
        || cmd
            .module()
            .is_some_and(|m| m == "trl" || m.starts_with("trl."))
        || super::script_mentions(
            cmd,
            &[
                "TrlParser",
                "SFTConfig",
                "DPOConfig",
                "GRPOConfig",
                "KTOConfig",
                "RLOOConfig",
                "RewardConfig",
            ],
        )
}

/// TRL's configs turn gradient checkpointing on unless told otherwise
/// (`SFTConfig`, `DPOConfig`, `GRPOConfig`, ... `gradient_checkpointing = True`
/// in TRL 1.x): absent, it is on.
fn absent_default(cmd: &Command, k: Knob) -> Option<AbsentValue> {
    (k == Knob::GradCheckpointing && trl(cmd)).then_some(AbsentValue::Bool(true))
}

fn layout(cmd: &Command, _: &super::Ctx) -> Option<Layout> {
    // Left out, the script's own default (diffusers' examples: `default="sd-model-finetuned"`).
    let out = cmd
        .value(&["--output_dir", "--output-dir"])
        .map(str::to_string)
        .or_else(|| {
            let src = crate::knobs::accepts::source(Path::new(cmd.script()?))?;
            crate::knobs::accepts::text_default_of(&src, "--output_dir")
        })?;
    Some(Layout {
        kind: Kind::Format(&CHECKPOINTS),
        root: PathBuf::from(out),
        how: ResumeHow::Flag {
            flag: "--resume_from_checkpoint".into(),
            equals: false,
        },
        user_resume: cmd
            .value(&["--resume_from_checkpoint", "--resume-from-checkpoint"])
            .map(PathBuf::from),
        own: None,
    })
}

/// The flag that turns the Hugging Face examples' own folder search and their refusal of
/// a folder that is not empty off.
const OVERWRITE: &str = "--overwrite_output_dir";

/// What a Hugging Face script does with its `output_dir` by itself as it starts (see
/// [`OwnSearch`]), read from its source; `None` when it does nothing there, or its
/// source cannot be read. A warning comes back where the script stops on a folder that
/// is not empty and oomguard cannot turn that off: its parser may not take
/// `--overwrite_output_dir` (transformers 5's `TrainingArguments` has no such field),
/// or the script deletes files (`rmtree`), where that flag could delete checkpoints.
///
/// `transformers_major`: the version installed where the command runs, when known.
pub fn own_search(
    cmd: &Command,
    root: &Path,
    options: Option<&crate::knobs::accepts::ScriptOptions>,
    transformers_major: Option<u32>,
) -> (Option<OwnSearch>, Option<String>) {
    let Some(script) = cmd.script() else {
        return (None, None);
    };
    let Some(src) = crate::knobs::accepts::source(Path::new(script)) else {
        return (None, None);
    };
    let searches = src.contains("get_last_checkpoint(");
    let refuses = src.contains("overwrite_output_dir") && (searches || src.contains("os.listdir("));
    if !searches && !refuses {
        return (None, None);
    }
    let off_given = cmd.flags.iter().any(|f| {
        f.name == OVERWRITE
            && !f
                .value
                .as_deref()
                .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no"))
    });
    if off_given {
        return (None, None);
    }
    let user_resume = cmd.has_flag(&["--resume_from_checkpoint", "--resume-from-checkpoint"]);
    let picked = (searches && !user_resume)
        .then(|| numbered_dirs(root, "checkpoint-", "").into_iter().next())
        .flatten()
        .map(|c| c.path);
    let name = Path::new(script)
        .file_name()
        .map_or_else(|| script.to_string(), |n| n.to_string_lossy().into_owned());
    let mut warning = None;
    let off = if !refuses {
        None
    } else if src.contains("rmtree(") {
        warning = Some(format!(
            "{name} stops on an --output_dir that holds files unless given {OVERWRITE}, and it deletes files (rmtree): oomguard does not add {OVERWRITE}, so a relaunch may stop with \"already exists and is not empty\"; give it yourself if it only turns that check off"
        ));
        None
    } else {
        let declared = options.is_some_and(|o| o.accepts(OVERWRITE))
            || declares_field(&src, "overwrite_output_dir")
            || (transformers_major.is_some_and(|v| v < 5) && src.contains("TrainingArguments"));
        if declared {
            Some(OVERWRITE.to_string())
        } else {
            warning = Some(format!(
                "{name} stops on an --output_dir that holds files unless given {OVERWRITE}, and oomguard cannot tell that its parser takes that flag ({}): a relaunch may stop with \"already exists and is not empty\"; give {OVERWRITE} yourself where your transformers has it (oomguard then names the checkpoint to resume from)",
                match transformers_major {
                    Some(v) => format!("transformers {v} has no such field in TrainingArguments, and the script declares none"),
                    None => "no transformers found where the command runs, and the script declares no such field".into(),
                }
            ));
            None
        }
    };
    (Some(OwnSearch { picked, off }), warning)
}

/// Why `--resume_from_checkpoint` would be parsed and ignored: the script builds its own
/// Trainer and calls `trainer.train()` with no argument, and never names
/// `resume_from_checkpoint` (TRL's example scripts, stanford_alpaca's `train.py`). The
/// Trainer does not read that field of its arguments itself ("not directly used by
/// Trainer, it's intended to be used by your training/evaluation scripts"), so a
/// relaunch told to resume would start from step 0. `None` where the script passes it,
/// or its source does not show (a helper module trains).
pub fn resume_ignored(cmd: &Command) -> Option<String> {
    let script = cmd.script()?;
    let src = crate::knobs::accepts::source(Path::new(script))?;
    // The code without comments (`trainer.train(\n    # model_path=...\n)` is bare too).
    let (code, _) = crate::knobs::accepts::split_code(&src);
    let calls: Vec<&str> = code
        .match_indices("trainer.train(")
        .map(|(at, m)| code[at + m.len()..].trim_start())
        .collect();
    let bare = !calls.is_empty() && calls.iter().all(|rest| rest.starts_with(')'));
    if !bare || code.contains("resume_from_checkpoint") {
        return None;
    }
    let name = Path::new(script)
        .file_name()
        .map_or_else(|| script.to_string(), |n| n.to_string_lossy().into_owned());
    Some(format!(
        "{name} calls trainer.train() without resume_from_checkpoint, and the Trainer does not read --resume_from_checkpoint by itself (passing it, as trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint), makes the script resumable)"
    ))
}

/// Whether `src` declares a dataclass field `name` (`    name: bool = False`): a line
/// that starts with it and a colon, as an `if ... name:` line does not.
fn declares_field(src: &str, name: &str) -> bool {
    src.lines().any(|l| {
        l.trim_start()
            .strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
    })
}

/// How often the Trainer prints its log dict (`{'loss': ..., 'epoch': ...}`):
/// `--logging_steps N` or a recipe's `logging_steps: N` (the flag wins), with
/// `--logging_first_step`. `None` when the interval is not given (its default
/// differs by script: 500 in `TrainingArguments`, 10 in TRL's configs), is a
/// ratio of the run (`0.01`), or the strategy is not `steps`.
fn logging(cmd: &Command, ctx: &super::Ctx) -> Option<Logging> {
    use crate::files::Scalar;
    let text = |flags: &[&str], key: &str| {
        cmd.value(flags)
            .map(str::to_string)
            .or_else(|| (ctx.recipe_value)(key).map(|s| s.to_string()))
    };
    let strategy = text(
        &["--logging_strategy", "--logging-strategy"],
        "logging_strategy",
    );
    if strategy.is_some_and(|s| !s.trim_matches(['"', '\'']).eq_ignore_ascii_case("steps")) {
        return None;
    }
    // TRL's configs log every 10 steps, TrainingArguments every 500.
    let every: f64 = text(&["--logging_steps", "--logging-steps"], "logging_steps")
        .or_else(|| trl(cmd).then(|| "10".to_string()))?
        .trim_matches(['"', '\''])
        .parse()
        .ok()?;
    if !(every >= 1.0 && every.fract() == 0.0 && every < 1e12) {
        return None;
    }
    let first = &["--logging_first_step", "--logging-first-step"];
    let first_step = match cmd.value(first) {
        Some(v) => !matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no"),
        None if cmd.has_flag(first) => true,
        None => matches!(
            (ctx.recipe_value)("logging_first_step"),
            Some(Scalar::Bool(true))
        ),
    };
    Some(Logging {
        every: every as u64,
        first_step,
    })
}

/// Whether the program takes `flag` when oomguard adds it. The evaluation
/// batch is added only to a script that parses all of `TrainingArguments`
/// (`HfArgumentParser`, TRL's `TrlParser`) or names the flag itself: a plain
/// argparse script that spells the Trainer's training batch would refuse it.
fn accepts_added(cmd: &Command, flag: &str) -> bool {
    if flag == "--fsdp" {
        // The Trainer's FSDP: only where the script parses its arguments, and
        // not under `accelerate launch`, whose own FSDP flags are added instead.
        return cmd
            .launcher(crate::command::LauncherKind::Accelerate)
            .is_none()
            && super::script_mentions(
                cmd,
                &[
                    "HfArgumentParser",
                    "TrlParser",
                    "TrainingArguments",
                    "SFTConfig",
                ],
            );
    }
    if flag != "--per_device_eval_batch_size" {
        return true;
    }
    super::script_mentions(
        cmd,
        &[
            "HfArgumentParser",
            "TrlParser",
            "--per_device_eval_batch_size",
        ],
    )
}

/// The Trainer saves nothing while it trains under `--save_strategy no`.
pub(crate) fn saves_none(cmd: &Command, ctx: &Ctx) -> Option<String> {
    // The command line wins over the recipe (`save_strategy: "no"` in a TRL or
    // alignment-handbook recipe, an axolotl or LLaMA-Factory config).
    let (said, v) = match cmd.value(&["--save_strategy", "--save-strategy"]) {
        Some(v) => (format!("--save_strategy {v}"), v.to_string()),
        None => match (ctx.recipe_value)("save_strategy")? {
            Scalar::Str(s) => (format!("save_strategy: {s} in its recipe"), s),
            // YAML 1.1 reads a bare `no` as false.
            Scalar::Bool(false) => ("save_strategy: no in its recipe".into(), "no".into()),
            _ => return None,
        },
    };
    v.trim().eq_ignore_ascii_case("no").then(|| {
        format!(
            "the Trainer saves no checkpoint while it trains ({said}): after an OOM each relaunch starts from the beginning; give save_strategy steps and save_steps N to resume from the last multiple of N"
        )
    })
}

pub static FAMILY: Family = Family {
    name: "hf",
    recognise,
    flags: &[
        (
            Knob::MicroBatch,
            &[
                "--per_device_train_batch_size",
                "--per-device-train-batch-size",
                "--micro_batch_size",
                "--micro-batch-size",
                "--micro_batch_size_per_gpu",
                "--micro_train_batch_size",
                "--per_device_training_batch_size",
                "--per_gpu_train_batch_size",
            ],
        ),
        (
            Knob::GradAccum,
            &[
                "--gradient_accumulation_steps",
                "--gradient-accumulation-steps",
                "--grad_accum_steps",
                "--grad_accum",
            ],
        ),
        (
            Knob::SeqLen,
            &[
                "--max_seq_length",
                "--max-seq-length",
                "--max_seq_len",
                "--max-seq-len",
                "--max_length",
                "--max-length",
                "--model_max_length",
                "--seq_len",
                "--max_len",
            ],
        ),
        (
            Knob::GradCheckpointing,
            &[
                "--gradient_checkpointing",
                "--gradient-checkpointing",
                "--grad_checkpointing",
                "--grad-checkpointing",
                "--activation_checkpointing",
            ],
        ),
        (
            Knob::DataloaderWorkers,
            &[
                "--dataloader_num_workers",
                "--dataloader-num-workers",
                // Plain argparse scripts name the DataLoader's workers so.
                "--num_workers",
                "--num-workers",
            ],
        ),
        (
            Knob::EvalBatch,
            &[
                "--per_device_eval_batch_size",
                "--per-device-eval-batch-size",
                "--per_gpu_eval_batch_size",
                "--eval_batch_size",
                "--eval-batch-size",
                "--val_batch_size",
                "--val-batch-size",
                "--valid_batch_size",
                "--validation_batch_size",
            ],
        ),
        // FSDP's CPU offload: the `offload` word among `--fsdp`'s sharding
        // words (`full_shard auto_wrap offload`); bound only to those words.
        (Knob::OffloadParam, &["--fsdp"]),
    ],
    added_flags: &[
        (
            Knob::GradAccum,
            "--gradient_accumulation_steps",
            AbsentValue::Int(1),
        ),
        (
            Knob::GradCheckpointing,
            "--gradient_checkpointing",
            AbsentValue::Bool(false),
        ),
        // `TrainingArguments`' default; added only where the script parses
        // the Trainer's arguments (see `accepts_added`).
        (
            Knob::EvalBatch,
            "--per_device_eval_batch_size",
            AbsentValue::Int(8),
        ),
        // FSDP full-shard, added only on several GPUs with no DeepSpeed or
        // FSDP setting (see `knobs::flags::discover`).
        (Knob::Fsdp, "--fsdp", AbsentValue::Bool(false)),
    ],
    accepts_added,
    absent_default,
    layout,
    logging,
    output_hint: "--output_dir",
    saves_none,
    ..Family::NONE
};

// ---------------------------------------------------------------- checkpoints

/// Hugging Face Trainer checkpoints: `output_dir/checkpoint-N` folders; and
/// accelerate's `save_state` folders that scripts name `checkpoint-N` (diffusers) or
/// `step_N` (transformers' `*_no_trainer.py` examples), N the optimizer step.
pub static CHECKPOINTS: Format = Format {
    id: "hugging_face",
    label: "hugging-face output_dir/checkpoint-N (or accelerate's save_state step_N)",
    candidates: |root| (candidates(root), Vec::new()),
    complete: |_, p| complete(p),
    stepped: true,
    recorded_step: Some(recorded_step),
    unannounced: |_| false,
};

/// `checkpoint-N` and `step_N` folders, newest first. (A script's `epoch_N` folders are
/// not taken: their number is no step to order them by.)
fn candidates(root: &Path) -> Vec<crate::checkpoint::Checkpoint> {
    let mut all = numbered_dirs(root, "checkpoint-", "");
    all.extend(numbered_dirs(root, "step_", ""));
    all.sort_by_key(|c| std::cmp::Reverse(c.step));
    all
}

/// The file accelerate's `save_state` writes last, rank 0's (`torch.save`, after the
/// weights, optimizer, scheduler, sampler and scaler).
const ACCELERATE_LAST: &str = "random_states_0.pkl";

/// The model weights a Hugging Face checkpoint may hold: sharded by an index,
/// or single files.
const HF_INDEXES: &[&str] = &[
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors.index.json",
];
const HF_WEIGHTS: &[&str] = &[
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
];

/// Every weights file (or index) present is whole; `Ok(false)` when none is present.
fn weights(dir: &Path) -> Result<bool, NotComplete> {
    let mut any = false;
    for index in HF_INDEXES {
        if fs::symlink_metadata(dir.join(index)).is_ok() {
            index_complete(dir, index)?;
            any = true;
        }
    }
    for w in HF_WEIGHTS {
        if fs::symlink_metadata(dir.join(w)).is_ok() {
            weights_complete(&dir.join(w))?;
            any = true;
        }
    }
    Ok(any)
}

/// Why `dir` is not a complete Hugging Face checkpoint, or Ok.
pub fn complete(dir: &Path) -> Result<(), NotComplete> {
    let trainer_state = fs::symlink_metadata(dir.join("trainer_state.json")).is_ok();
    if !trainer_state && fs::symlink_metadata(dir.join(ACCELERATE_LAST)).is_ok() {
        return saved_state_complete(dir);
    }
    let text = read_in(
        dir,
        "trainer_state.json",
        "no trainer_state.json (the Trainer writes it last) nor random_states_0.pkl (accelerate's save_state writes it last)",
    )?;
    if text.is_empty() {
        return Err("trainer_state.json is empty".into());
    }
    let Ok(state) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Err("trainer_state.json is not valid JSON (cut off mid-write?)".into());
    };
    if !state.get("global_step").is_some_and(|g| g.is_u64()) {
        return Err(format!(
            "trainer_state.json has no numeric global_step (it is {})",
            match &state {
                serde_json::Value::Object(_) => "an object without one",
                serde_json::Value::Null => "null",
                serde_json::Value::Array(_) => "a list",
                _ => "not an object",
            }
        )
        .into());
    }
    no_temporaries(dir)?;
    let weights = weights(dir)?;
    // With DeepSpeed the weights live in the global_stepN folder `latest` names.
    match read_small(&dir.join("latest")) {
        Ok(tag) => {
            let tag = tag.trim();
            if !plain_name(tag) {
                return Err(format!(
                    "`latest` names {tag:?}, which is not a folder name inside the checkpoint: not followed"
                ).into());
            }
            super::deepspeed::tag_complete(&dir.join(tag))
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(NotComplete::unreadable("latest", &e))
        }
        Err(_) if weights => Ok(()),
        Err(_) => {
            Err("no model weights (model.safetensors, pytorch_model.bin, adapter_model.*)".into())
        }
    }
}

/// Why `dir`, written by accelerate's `save_state`, is not complete, or Ok: rank 0's
/// random states (written last) whole, and every other rank's there, every weights
/// file and accelerate's own `.bin` states whole, and a DeepSpeed engine's checkpoint complete where `latest`
/// names one. The weights may be elsewhere in it (a script's save hook writes
/// `unet/`, `pytorch_lora_weights.safetensors`): they need not be at the top.
fn saved_state_complete(dir: &Path) -> Result<(), NotComplete> {
    no_temporaries(dir)?;
    weights_complete(&dir.join(ACCELERATE_LAST))?;
    weights(dir)?;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Every rank writes its own random states: each one there is whole.
        let state = ["optimizer", "scheduler", "sampler"]
            .iter()
            .any(|s| name.starts_with(s) && name.ends_with(".bin"))
            || name
                .strip_prefix("random_states_")
                .and_then(|n| n.strip_suffix(".pkl"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if state && e.file_type().is_ok_and(|t| t.is_file()) {
            weights_complete(&e.path())?;
        }
    }
    match read_small(&dir.join("latest")) {
        Ok(tag) if plain_name(tag.trim()) => super::deepspeed::tag_complete(&dir.join(tag.trim())),
        Ok(tag) => Err(format!(
            "`latest` names {:?}, which is not a folder name inside the checkpoint: not followed",
            tag.trim()
        )
        .into()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(NotComplete::unreadable("latest", &e))
        }
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Value;

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    /// diffusers' examples default `--output_dir` in their parser: left out of the
    /// command, that folder is where the checkpoints are looked for.
    #[test]
    fn a_scripts_own_output_dir_default_is_the_checkpoint_folder() {
        let t = tempfile::tempdir().unwrap();
        let script = t.path().join("train_text_to_image.py");
        fs::write(
            &script,
            "import argparse\np = argparse.ArgumentParser()\np.add_argument(\n    \"--output_dir\",\n    type=str,\n    default=\"sd-model-finetuned\",\n)\n",
        )
        .unwrap();
        let ctx = super::super::Ctx {
            recipe_output_dir: None,
            recipe_value: &|_| None,
        };
        let cmd = argv(&format!(
            "accelerate launch {} --train_batch_size 1",
            script.display()
        ));
        let l = layout(&cmd, &ctx).expect("the parser's default");
        assert_eq!(l.root, PathBuf::from("sd-model-finetuned"));
        let given = argv(&format!("python {} --output_dir out", script.display()));
        assert_eq!(layout(&given, &ctx).unwrap().root, PathBuf::from("out"));
        assert!(layout(&argv("python missing.py"), &ctx).is_none());
    }

    /// transformers 4.x's examples' start: the folder's newest checkpoint-N resumed by
    /// itself, a folder with files but no checkpoint refused (the older ones: any file).
    const EXAMPLE_START: &str = "from transformers import HfArgumentParser, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint
last_checkpoint = None
if os.path.isdir(training_args.output_dir) and training_args.do_train and not training_args.overwrite_output_dir:
    last_checkpoint = get_last_checkpoint(training_args.output_dir)
    if last_checkpoint is None and len(os.listdir(training_args.output_dir)) > 0:
        raise ValueError(\"Output directory already exists and is not empty. Use --overwrite_output_dir to overcome.\")
";

    #[test]
    fn a_script_that_searches_its_folder_is_told_what_it_picked_and_turned_off() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        for d in ["checkpoint-2", "checkpoint-10", "checkpoint-9x", "runs"] {
            fs::create_dir_all(out.join(d)).unwrap();
        }
        let script = |name: &str, body: &str| {
            let p = t.path().join(name);
            fs::write(&p, body).unwrap();
            p.display().to_string()
        };
        let run_clm = script("run_clm.py", EXAMPLE_START);
        let cmd = |s: &str, rest: &str| {
            argv(&format!("python {s} --output_dir {} {rest}", out.display()))
        };
        let own = |c: &Command, major: Option<u32>| own_search(c, &out, None, major);

        // transformers 4: TrainingArguments has the flag; the newest checkpoint-N by number.
        let (o, w) = own(&cmd(&run_clm, "--do_train"), Some(4));
        let o = o.expect("run_clm.py searches its folder");
        assert_eq!(o.picked, Some(out.join("checkpoint-10")));
        assert_eq!(o.off.as_deref(), Some("--overwrite_output_dir"));
        assert_eq!(w, None);
        // transformers 5 dropped the field; unknown: not added, and the plan says why.
        for major in [Some(5), None] {
            let (o, w) = own(&cmd(&run_clm, ""), major);
            assert_eq!(o.unwrap().off, None);
            assert!(w.unwrap().contains("give --overwrite_output_dir yourself"));
        }
        // The script declares the field itself (kept working on 5).
        let declared = script(
            "declared.py",
            &format!(
                "{EXAMPLE_START}\n@dataclass\nclass A:\n    overwrite_output_dir: bool = False\n"
            ),
        );
        assert_eq!(
            own(&cmd(&declared, ""), Some(5)).0.unwrap().off.as_deref(),
            Some("--overwrite_output_dir")
        );
        // The user's own resume argument or flag: nothing to name, nothing to add.
        let o = own(
            &cmd(&run_clm, "--resume_from_checkpoint out/checkpoint-2"),
            Some(4),
        )
        .0;
        assert_eq!(o.unwrap().picked, None);
        assert_eq!(
            own(&cmd(&run_clm, "--overwrite_output_dir"), Some(4)).0,
            None
        );
        assert_eq!(
            own(&cmd(&run_clm, "--overwrite_output_dir True"), Some(4)).0,
            None
        );
        assert!(
            own(&cmd(&run_clm, "--overwrite_output_dir false"), Some(4))
                .0
                .is_some()
        );
        // A script that deletes files: the flag could delete checkpoints.
        let rm = script(
            "rm.py",
            &format!("{EXAMPLE_START}shutil.rmtree(training_args.output_dir)\n"),
        );
        let (o, w) = own(&cmd(&rm, ""), Some(4));
        assert_eq!(o.unwrap().off, None);
        assert!(w.unwrap().contains("rmtree"));
        // A script that only resumes by itself (open-r1, alignment-handbook): named, nothing to turn off.
        let recipe = script(
            "sft.py",
            "last_checkpoint = get_last_checkpoint(training_args.output_dir)\n",
        );
        let o = own(&cmd(&recipe, ""), Some(5)).0.unwrap();
        assert_eq!((o.picked, o.off), (Some(out.join("checkpoint-10")), None));
        // A script that does neither.
        let plain = script(
            "train.py",
            "trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)\n",
        );
        assert_eq!(own(&cmd(&plain, ""), Some(4)), (None, None));
    }

    #[test]
    fn a_script_that_never_hands_the_trainer_its_resume_argument_is_not_told_to_resume() {
        let t = tempfile::tempdir().unwrap();
        let ignored = |body: &str| {
            let p = t.path().join("train.py");
            fs::write(
                &p,
                format!("from transformers import Trainer\ntrainer = Trainer(model)\n{body}\n"),
            )
            .unwrap();
            resume_ignored(&argv(&format!("python {} --output_dir out", p.display())))
        };
        // TRL's example scripts, stanford_alpaca: bare, also with a commented-out argument.
        let why = ignored("trainer.train()").expect("trainer.train() bare");
        assert!(
            why.starts_with("train.py calls trainer.train() without resume_from_checkpoint"),
            "{why}"
        );
        assert!(ignored("trainer.train(\n    # model_path=args.model\n)").is_some());
        // Passed on, by keyword or by a name that carries it.
        assert_eq!(
            ignored("trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)"),
            None
        );
        assert_eq!(
            ignored("ckpt = training_args.resume_from_checkpoint\ntrainer.train(ckpt)"),
            None
        );
        assert_eq!(ignored("trainer.train(ckpt)"), None);
        // No Trainer call in the script (a helper module trains): cannot be told.
        assert_eq!(ignored("from mylib import run\nrun()"), None);
    }

    #[test]
    fn a_trainer_told_to_save_nothing_is_said_to_start_over_after_an_oom() {
        let with = |recipe: Option<Scalar>, cmd: &str| {
            let value = move |k: &str| (k == "save_strategy").then(|| recipe.clone()).flatten();
            let ctx = Ctx {
                recipe_output_dir: None,
                recipe_value: &value,
            };
            saves_none(&argv(cmd), &ctx)
        };
        let w = with(
            None,
            "python train.py --per_device_train_batch_size 8 --output_dir o --save_strategy no",
        )
        .unwrap();
        assert!(w.contains("(--save_strategy no)"), "{w}");
        assert_eq!(
            with(None, "python train.py --output_dir o --save_strategy steps"),
            None
        );
        assert_eq!(with(None, "python train.py --output_dir o"), None);
        // A recipe's key, quoted or YAML 1.1's bare `no` (false); the command line wins.
        for v in [Scalar::Str("no".into()), Scalar::Bool(false)] {
            let w = with(Some(v), "python sft.py --config recipe.yaml").unwrap();
            assert!(w.contains("(save_strategy: no in its recipe)"), "{w}");
        }
        assert_eq!(
            with(
                Some(Scalar::Str("no".into())),
                "python sft.py --config recipe.yaml --save_strategy steps"
            ),
            None
        );
        assert_eq!(
            with(
                Some(Scalar::Str("steps".into())),
                "python sft.py --config r.yaml"
            ),
            None
        );
    }

    #[test]
    fn trl_scripts_checkpoint_and_log_every_10_steps_by_default() {
        let t = tempfile::tempdir().unwrap();
        let sft = t.path().join("sft.py");
        std::fs::write(&sft, "from trl import SFTConfig, SFTTrainer, TrlParser\n").unwrap();
        let plain = t.path().join("train.py");
        std::fs::write(&plain, "from transformers import TrainingArguments\n").unwrap();
        let gc = |script: &std::path::Path| {
            let cmd = argv(&format!(
                "python {} --per_device_train_batch_size 8 --output_dir o",
                script.display()
            ));
            crate::frameworks::added_flags(&cmd)
                .into_iter()
                .find(|(k, _, _)| *k == Knob::GradCheckpointing)
                .map(|(_, _, v)| v)
        };
        assert_eq!(gc(&sft), Some(Value::Bool(true)));
        assert_eq!(gc(&plain), Some(Value::Bool(false)));
        // TRL's recipe form, no Trainer flag on the command line: still TRL's.
        let recipe = argv(&format!("python {} --config r.yaml", sft.display()));
        assert!(recognise(&recipe));
        let ctx = super::super::Ctx {
            recipe_output_dir: None,
            recipe_value: &|_| None,
        };
        assert_eq!(logging(&recipe, &ctx).map(|l| l.every), Some(10));
        let hf = argv(&format!(
            "python {} --per_device_train_batch_size 8",
            plain.display()
        ));
        assert_eq!(logging(&hf, &ctx), None);
    }
}
