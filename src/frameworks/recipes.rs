//! Training recipes in YAML or TOML: alignment-handbook / TRL (`--config
//! recipe.yaml`), axolotl (`axolotl train config.yml`), LLaMA-Factory
//! (`llamafactory-cli train sft.yaml`). Their keys are Hugging Face
//! `TrainingArguments` names or close to them; the checkpoints are the
//! Trainer's `checkpoint-N` folders in the recipe's `output_dir`.

use std::path::PathBuf;

use super::{AbsentValue, Ctx, Env, Family, launchers};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::{Knob, World};

fn axolotl(cmd: &Command) -> bool {
    cmd.tool() == Some("axolotl") || cmd.module().is_some_and(|m| m.starts_with("axolotl.cli"))
}

fn llamafactory(cmd: &Command) -> bool {
    matches!(cmd.tool(), Some("llamafactory-cli" | "lmf"))
}

/// LLaMA-Factory turns gradient checkpointing on unless its recipe (or a
/// `key=value` override) says `disable_gradient_checkpointing: true`.
fn llamafactory_checkpointing_off(cmd: &Command) -> bool {
    let yes = |v: &str| {
        matches!(
            v.trim()
                .trim_matches(['"', '\''])
                .to_ascii_lowercase()
                .as_str(),
            "true" | "1" | "yes"
        )
    };
    if let Some(v) = cmd.override_value(&["disable_gradient_checkpointing"]) {
        return yes(v);
    }
    cmd.positionals()
        .filter(|(_, a)| a.ends_with(".yaml") || a.ends_with(".yml") || a.ends_with(".json"))
        .filter_map(|(_, a)| crate::untrusted::read_config(std::path::Path::new(a)).ok())
        .any(|text| {
            text.lines().any(|l| {
                let l = l
                    .split('#')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(['"', ',']);
                l.strip_prefix("disable_gradient_checkpointing")
                    .map(|r| r.trim_start_matches(['"', ' ']))
                    .and_then(|r| r.strip_prefix(':'))
                    .is_some_and(yes)
            })
        })
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
        own: None,
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
        // FSDP's CPU offload, a bool: axolotl's `fsdp_config` (both
        // versions' spellings), torchtune's `fsdp_cpu_offload`.
        (
            Knob::OffloadParam,
            &[
                "fsdp_config.offload_params",
                "fsdp_config.fsdp_offload_params",
                "fsdp_cpu_offload",
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
    // LLaMA-Factory's gradient checkpointing is on by default (its switch is
    // `disable_gradient_checkpointing`): bound as on, so that it is never
    // offered as a fix and the memory model counts it. Nothing is ever added
    // for it (a step only turns checkpointing on).
    added_flags: &[(
        Knob::GradCheckpointing,
        "gradient_checkpointing",
        AbsentValue::Bool(true),
    )],
    accepts_added: |cmd, flag| {
        flag != "gradient_checkpointing"
            || (llamafactory(cmd) && !llamafactory_checkpointing_off(cmd))
    },
    layout,
    world,
    output_hint: "a recipe's output_dir:",
    // axolotl's and LLaMA-Factory's configs take the Trainer's `save_strategy`.
    saves_none: super::hf::saves_none,
    ..Family::NONE
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Value;

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    fn checkpointing(cmd: &Command) -> Option<Value> {
        crate::frameworks::added_flags(cmd)
            .into_iter()
            .find(|(k, _, _)| *k == Knob::GradCheckpointing)
            .map(|(_, _, v)| v)
    }

    #[test]
    fn llamafactory_checkpoints_by_default_unless_its_recipe_disables_it() {
        let t = tempfile::tempdir().unwrap();
        let on = t.path().join("sft.yaml");
        std::fs::write(&on, "per_device_train_batch_size: 8\noutput_dir: out\n").unwrap();
        let off = t.path().join("off.yaml");
        std::fs::write(
            &off,
            "per_device_train_batch_size: 8\ndisable_gradient_checkpointing: true  # speed\n",
        )
        .unwrap();
        let cmd = |f: &std::path::Path| argv(&format!("llamafactory-cli train {}", f.display()));
        assert_eq!(checkpointing(&cmd(&on)), Some(Value::Bool(true)));
        assert_eq!(checkpointing(&cmd(&off)), None);
        let overridden = argv(&format!(
            "llamafactory-cli train {} disable_gradient_checkpointing=true",
            on.display()
        ));
        assert_eq!(checkpointing(&overridden), None);
        // Not LLaMA-Factory's: nothing is assumed.
        assert_eq!(checkpointing(&argv("axolotl train cfg.yml")), None);
    }
}
