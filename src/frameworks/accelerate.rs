//! `accelerate launch`: its config file (`--config_file X`, or the default
//! `$HF_HOME/accelerate/default_config.yaml`), whose DeepSpeed plugin keys
//! are knobs when `distributed_type: DEEPSPEED`, and `num_processes`.

use std::path::{Path, PathBuf};

use super::{AbsentValue, Env, Family, FileKind, KeySpec};
use crate::command::{Command, LauncherKind};
use crate::files::{Doc, Scalar};
use crate::settings::Knob;

fn default_config() -> Option<PathBuf> {
    default_config_in(&|k| std::env::var_os(k))
}

/// accelerate's default config: `$HF_HOME/accelerate/default_config.yaml`
/// (`$XDG_CACHE_HOME/huggingface`, `~/.cache/huggingface` without `HF_HOME`),
/// when it is a file.
pub fn default_config_in(env: Env) -> Option<PathBuf> {
    let base = env("HF_HOME")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("huggingface")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface")))?;
    let p = base.join("accelerate").join("default_config.yaml");
    p.is_file().then_some(p)
}

/// An accelerate config's `num_processes` and `num_machines`, where readable.
pub fn processes_in(path: &Path) -> (Option<u64>, Option<u64>) {
    let Ok(doc) = Doc::load(path) else {
        return (None, None);
    };
    let count = |key: &str| match doc.get(key) {
        Ok(Some(Scalar::Int(n))) if n > 0 => Some(n as u64),
        _ => None,
    };
    (count("num_processes"), count("num_machines"))
}

/// The plugin keys are knobs only when this config runs DeepSpeed itself
/// (a `deepspeed_config_file` holds them instead).
fn runs_deepspeed(doc: &Doc) -> bool {
    let uses_file = matches!(
        doc.get("deepspeed_config.deepspeed_config_file"),
        Ok(Some(_))
    );
    let is_ds = matches!(doc.get("distributed_type"), Ok(Some(Scalar::Str(s))) if s == "DEEPSPEED");
    is_ds && !uses_file
}

/// Its keys are knobs when it runs DeepSpeed itself, or FSDP (whose
/// `fsdp_config.fsdp_state_dict_type` says how a checkpoint is saved).
fn runs_deepspeed_or_fsdp(doc: &Doc) -> bool {
    runs_deepspeed(doc)
        || matches!(doc.get("distributed_type"), Ok(Some(Scalar::Str(s))) if s == "FSDP")
}

fn recognise(cmd: &Command) -> bool {
    cmd.launcher(LauncherKind::Accelerate).is_some()
}

/// accelerate's own FSDP flags, as oomguard adds them before the script
/// (`accelerate launch --help` of accelerate 1.x: `--use_fsdp`, FSDP1's
/// `--fsdp_sharding_strategy` — the default `--fsdp_version 1` — and a
/// transformer-layer wrap, which takes the model's `_no_split_modules`, as the
/// Trainer's `--fsdp "full_shard auto_wrap"` does; without a wrap policy the
/// whole model would be one unit, gathered whole in every forward).
pub const FSDP_FLAGS: &[&str] = &[
    "--use_fsdp",
    "--fsdp_sharding_strategy",
    "FULL_SHARD",
    "--fsdp_auto_wrap_policy",
    "TRANSFORMER_BASED_WRAP",
];

/// FSDP is added where the script goes through accelerate (an `Accelerator`,
/// or a Trainer, which builds one): the flags set its environment.
fn accepts_added(cmd: &Command, flag: &str) -> bool {
    flag != "--use_fsdp"
        || super::script_mentions(
            cmd,
            &["Accelerator", "Trainer(", "SFTTrainer", "TrainingArguments"],
        )
}

/// Whether accelerate's default config (used when the command names none)
/// sets a distributed type that shards or is not plain data parallel.
pub fn default_config_shards(env: Env) -> bool {
    let Some(p) = default_config_in(env) else {
        return false;
    };
    let Ok(doc) = Doc::load(&p) else {
        return false;
    };
    matches!(doc.get("distributed_type"), Ok(Some(Scalar::Str(s))) if matches!(s.as_str(), "FSDP" | "DEEPSPEED" | "MEGATRON_LM"))
}

pub static FAMILY: Family = Family {
    name: "accelerate",
    recognise,
    flags: &[
        (
            Knob::OffloadOptimizer,
            &["--offload_optimizer_device", "--offload-optimizer-device"],
        ),
        (
            Knob::OffloadParam,
            &[
                "--offload_param_device",
                "--offload-param-device",
                // FSDP's CPU offload (parameters, gradients, the optimizer step).
                "--fsdp_offload_params",
                "--fsdp-offload-params",
            ],
        ),
    ],
    // FSDP full-shard through accelerate's own flags, added only on several
    // GPUs with no DeepSpeed or FSDP setting (see `knobs::flags::discover`).
    added_flags: &[(Knob::Fsdp, "--use_fsdp", AbsentValue::Bool(false))],
    accepts_added,
    file_kinds: &[FileKind {
        label: "accelerate config",
        when: recognise,
        flags: &["--config_file", "--config-file"],
        launcher_option_only: true,
        default: Some((default_config, "--config_file")),
        applies: runs_deepspeed_or_fsdp,
        keys: &[
            KeySpec {
                knob: Knob::GradAccum,
                key: "deepspeed_config.gradient_accumulation_steps",
                absent: None,
            },
            KeySpec {
                knob: Knob::ZeroStage,
                key: "deepspeed_config.zero_stage",
                absent: None,
            },
            KeySpec {
                knob: Knob::OffloadOptimizer,
                key: "deepspeed_config.offload_optimizer_device",
                absent: None,
            },
            KeySpec {
                knob: Knob::OffloadParam,
                key: "deepspeed_config.offload_param_device",
                absent: None,
            },
            // FSDP's CPU offload, a bool: parameters, gradients and the
            // optimizer step (there is no optimizer-only offload).
            KeySpec {
                knob: Knob::OffloadParam,
                key: "fsdp_config.fsdp_offload_params",
                absent: None,
            },
            KeySpec {
                knob: Knob::GatherOnSave,
                key: "deepspeed_config.zero3_save_16bit_model",
                absent: None,
            },
            // FSDP: FULL_STATE_DICT gathers the full weights on one rank to save
            // them (gather_on_save true); SHARDED_STATE_DICT saves each rank's shard.
            KeySpec {
                knob: Knob::GatherOnSave,
                key: "fsdp_config.fsdp_state_dict_type",
                absent: None,
            },
        ],
        world_key: Some("num_processes"),
        ..FileKind::NONE
    }],
    ..Family::NONE
};
