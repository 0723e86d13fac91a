//! Hugging Face `Trainer` and TRL scripts, and plain argparse scripts that
//! follow their spellings: `--per_device_train_batch_size 8 --output_dir out`,
//! resumed with `--resume_from_checkpoint out/checkpoint-N`.

use std::path::PathBuf;

use super::{AbsentValue, Family};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::Knob;

/// Only the Trainer's own spelling says "Hugging Face": adding a flag that the
/// script's argparse does not know would break the relaunch.
fn recognise(cmd: &Command) -> bool {
    cmd.has_flag(&[
        "--per_device_train_batch_size",
        "--per-device-train-batch-size",
    ])
}

fn layout(cmd: &Command, _: &super::Ctx) -> Option<Layout> {
    let out = cmd.value(&["--output_dir", "--output-dir"])?;
    Some(Layout {
        kind: Kind::HuggingFace,
        root: PathBuf::from(out),
        how: ResumeHow::Flag {
            flag: "--resume_from_checkpoint".into(),
            equals: false,
        },
        user_resume: cmd
            .value(&["--resume_from_checkpoint", "--resume-from-checkpoint"])
            .map(PathBuf::from),
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
    ],
    layout,
    output_hint: "--output_dir",
    ..Family::NONE
};
