//! Training recipes in YAML or TOML: alignment-handbook / TRL (`--config
//! recipe.yaml`), axolotl (`axolotl train config.yml`), LLaMA-Factory
//! (`llamafactory-cli train sft.yaml`). Their keys are Hugging Face
//! `TrainingArguments` names or close to them; the checkpoints are the
//! Trainer's `checkpoint-N` folders in the recipe's `output_dir`.

use std::path::PathBuf;

use super::{Ctx, Env, Family, launchers};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::{Knob, World};

fn axolotl(cmd: &Command) -> bool {
    cmd.tool() == Some("axolotl") || cmd.module().is_some_and(|m| m.starts_with("axolotl.cli"))
}

fn llamafactory(cmd: &Command) -> bool {
    matches!(cmd.tool(), Some("llamafactory-cli" | "lmf"))
}

fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    if cmd.value(&["--output_dir", "--output-dir"]).is_some() {
        return None; // the flag wins: the Trainer's own layout
    }
    let out = ctx.recipe_output_dir?;
    let how = if axolotl(cmd) {
        ResumeHow::Flag {
            flag: "--resume-from-checkpoint".into(),
            equals: false,
        }
    } else if llamafactory(cmd) {
        ResumeHow::Override {
            key: "resume_from_checkpoint".into(),
            value: None,
        }
    } else {
        ResumeHow::Flag {
            flag: "--resume_from_checkpoint".into(),
            equals: false,
        }
    };
    let user = cmd
        .value(&["--resume-from-checkpoint", "--resume_from_checkpoint"])
        .or_else(|| cmd.override_value(&["resume_from_checkpoint"]));
    Some(Layout {
        kind: Kind::Format(&super::hf::CHECKPOINTS),
        root: PathBuf::from(out),
        how,
        user_resume: user.map(PathBuf::from),
    })
}

/// The processes the tool starts itself: axolotl through `accelerate launch`
/// (or torchrun), LLaMA-Factory through torchrun (see `launchers`).
fn world(cmd: &Command, env: Env, _: &Ctx) -> Option<World> {
    if axolotl(cmd) && cmd.tool().is_some() {
        launchers::axolotl(cmd, env)
    } else if llamafactory(cmd) {
        launchers::llamafactory(cmd, env)
    } else {
        None
    }
}

pub static FAMILY: Family = Family {
    name: "recipes",
    recognise: |cmd| axolotl(cmd) || llamafactory(cmd),
    flags: &[(
        Knob::SeqLen,
        &["--cutoff_len", "--sequence_len", "--sequence-len"],
    )],
    file_keys: &[
        (
            Knob::MicroBatch,
            &[
                "per_device_train_batch_size",
                "micro_batch_size",
                "train_micro_batch_size_per_gpu",
                "device_train_microbatch_size",
            ],
        ),
        (Knob::GradAccum, &["gradient_accumulation_steps"]),
        (
            Knob::SeqLen,
            &[
                "max_seq_length",
                "max_length",
                "sequence_len",
                "cutoff_len",
                "max_seq_len",
                "model_max_length",
                "block_size",
            ],
        ),
        (
            Knob::GradCheckpointing,
            &[
                "gradient_checkpointing",
                "enable_activation_checkpointing",
                "activation_checkpointing",
                "fsdp_config.activation_checkpointing",
                "model.enable_gradient_checkpointing",
                "checkpoint_activations",
            ],
        ),
        (
            Knob::DataloaderWorkers,
            &["dataloader_num_workers", "num_workers"],
        ),
        (
            Knob::EvalBatch,
            &["per_device_eval_batch_size", "eval_batch_size"],
        ),
    ],
    config_flags: &["--config"],
    layout,
    world,
    output_hint: "a recipe's output_dir:",
    ..Family::NONE
};
