//! `accelerate launch`: its config file (`--config_file X`, or the default
//! `$HF_HOME/accelerate/default_config.yaml`), whose DeepSpeed plugin keys
//! are knobs when `distributed_type: DEEPSPEED`, and `num_processes`.

use std::path::PathBuf;

use super::{Family, FileKind, KeySpec};
use crate::command::{Command, LauncherKind};
use crate::files::{Doc, Scalar};
use crate::settings::Knob;

fn default_config() -> Option<PathBuf> {
    let base = std::env::var_os("HF_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("huggingface"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface"))
        })?;
    let p = base.join("accelerate").join("default_config.yaml");
    p.is_file().then_some(p)
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
        ],
        world_key: Some("num_processes"),
        ..FileKind::NONE
    }],
    ..Family::NONE
};
