//! DeepSpeed: its JSON config (named by `--deepspeed`, `--deepspeed_config`,
//! an accelerate config's `deepspeed_config_file` or a recipe's `deepspeed:`
//! key), the `--zero_stage` flags of scripts built on it, and ZeRO settings
//! written inline in a GPT-NeoX training YAML.

use super::{AbsentValue, Family, FileKind, KeySpec};
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
