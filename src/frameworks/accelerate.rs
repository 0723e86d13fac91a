//! `accelerate launch`: its config file (`--config_file X`, or the default
//! `$HF_HOME/accelerate/default_config.yaml`), whose DeepSpeed plugin keys
//! are knobs when `distributed_type: DEEPSPEED`, and `num_processes`.

use std::path::{Path, PathBuf};

use super::{Env, Family, FileKind, KeySpec};
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

fn recognise(cmd: &Command) -> bool {
    cmd.launcher(LauncherKind::Accelerate).is_some()
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
            &["--offload_param_device", "--offload-param-device"],
        ),
    ],
    file_kinds: &[FileKind {
        label: "accelerate config",
        when: recognise,
        flags: &["--config_file", "--config-file"],
        launcher_option_only: true,
        default: Some((default_config, "--config_file")),
        applies: runs_deepspeed,
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
            KeySpec {
                knob: Knob::GatherOnSave,
                key: "deepspeed_config.zero3_save_16bit_model",
                absent: None,
            },
        ],
        world_key: Some("num_processes"),
        ..FileKind::NONE
    }],
    ..Family::NONE
};
