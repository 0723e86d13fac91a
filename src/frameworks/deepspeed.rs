//! DeepSpeed: its JSON config (named by `--deepspeed`, `--deepspeed_config`,
//! an accelerate config's `deepspeed_config_file` or a recipe's `deepspeed:`
//! key), the `--zero_stage` flags of scripts built on it, and ZeRO settings
//! written inline in a GPT-NeoX training YAML.

use std::fs;
use std::path::Path;

use super::{AbsentValue, Family, FileKind, KeySpec};
use crate::checkpoint::{
    Checkpoint, Format, NotComplete, SkipKind, Skipped, is_temporary, numbered_dirs, read_small,
};
use crate::settings::Knob;

const STAGE: &str = "zero_optimization.stage";
const OFFLOAD_OPT: &str = "zero_optimization.offload_optimizer.device";
const OFFLOAD_PARAM: &str = "zero_optimization.offload_param.device";
/// A ZeRO-3 save gathers the full 16-bit weights on rank 0 (`false`: only
/// the sharded checkpoint is written, `zero_to_fp32.py` recovers the weights).
const GATHER_ON_SAVE: &str = "zero_optimization.stage3_gather_16bit_weights_on_model_save";

const ZERO_KEYS: &[KeySpec] = &[
    KeySpec {
        knob: Knob::ZeroStage,
        key: STAGE,
        absent: None,
    },
    KeySpec {
        knob: Knob::OffloadOptimizer,
        key: OFFLOAD_OPT,
        absent: Some(AbsentValue::NoOffload),
    },
    KeySpec {
        knob: Knob::OffloadParam,
        key: OFFLOAD_PARAM,
        absent: Some(AbsentValue::NoOffload),
    },
];

pub static FAMILY: Family = Family {
    name: "deepspeed",
    flags: &[(
        Knob::ZeroStage,
        &["--zero_stage", "--zero-stage", "--ds.zero_stage"],
    )],
    file_kinds: &[FileKind {
        label: "deepspeed json",
        flags: &[
            "--deepspeed",
            "--deepspeed_config",
            "--deepspeed-config",
            "--deepspeed_config_file",
        ],
        accepts: |p| p.ends_with(".json") || p.ends_with(".conf"),
        keys: &[
            KeySpec {
                knob: Knob::MicroBatch,
                key: "train_micro_batch_size_per_gpu",
                absent: None,
            },
            KeySpec {
                knob: Knob::GradAccum,
                key: "gradient_accumulation_steps",
                absent: None,
            },
            KeySpec {
                knob: Knob::ZeroStage,
                key: STAGE,
                absent: Some(AbsentValue::Int(0)),
            },
            KeySpec {
                knob: Knob::OffloadOptimizer,
                key: OFFLOAD_OPT,
                absent: Some(AbsentValue::NoOffload),
            },
            KeySpec {
                knob: Knob::OffloadParam,
                key: OFFLOAD_PARAM,
                absent: Some(AbsentValue::NoOffload),
            },
            KeySpec {
                knob: Knob::GatherOnSave,
                key: GATHER_ON_SAVE,
                absent: None,
            },
        ],
        global_batch_key: Some("train_batch_size"),
        named_in: &["deepspeed_config.deepspeed_config_file", "deepspeed"],
        ..FileKind::NONE
    }],
    inline_keys: ZERO_KEYS,
    inline_when: Some(STAGE),
    ..Family::NONE
};

// ---------------------------------------------------------------- checkpoints

/// DeepSpeed checkpoints: `global_stepN` folders, the newest finished one named by `latest`.
pub static CHECKPOINTS: Format = Format {
    id: "deep_speed",
    label: "deepspeed latest → global_stepN",
    candidates,
    complete: |_, p| tag_complete(p),
    stepped: true,
    recorded_step: None,
    unannounced: |_| false,
};

/// DeepSpeed's global_stepN folders, newest first, and those newer than the
/// tag `latest` names (not finished).
fn candidates(root: &Path) -> (Vec<Checkpoint>, Vec<Skipped>) {
    let mut pre = Vec::new();
    // `latest` names the newest tag; older global_stepN folders are fallbacks.
    let mut c = numbered_dirs(root, "global_step", "");
    if let Ok(tag) = read_small(&root.join("latest")) {
        let tag = tag.trim().to_string();
        if let Some(pos) = c
            .iter()
            .position(|x| x.path.file_name().is_some_and(|n| n == tag.as_str()))
        {
            let newer: Vec<Checkpoint> = c.drain(..pos).collect();
            for n in newer {
                pre.push(Skipped {
                    path: n.path,
                    kind: SkipKind::Incomplete,
                    why: format!("newer than `latest` ({tag}): not finished"),
                });
            }
        }
    }
    (c, pre)
}

/// Why the tag folder `sub` (`global_stepN`) is not complete, or Ok: it exists, holds
/// files, none of them empty or temporary.
pub fn tag_complete(sub: &Path) -> Result<(), NotComplete> {
    let tag = sub.file_name().unwrap_or_default().to_string_lossy();
    let entries: Vec<_> = match fs::read_dir(sub) {
        Ok(rd) => rd.flatten().collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("`latest` names {tag}, which does not exist").into());
        }
        Err(e) => return Err(NotComplete::unreadable(tag, &e)),
    };
    if entries.is_empty() {
        return Err(format!("{tag} is empty").into());
    }
    for e in &entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_temporary(&name) {
            return Err(format!("{tag} holds a temporary file {name}").into());
        }
        if e.metadata()
            .map(|m| m.is_file() && m.len() == 0)
            .unwrap_or(false)
        {
            return Err(format!("{tag}/{name} is empty").into());
        }
    }
    Ok(())
}
