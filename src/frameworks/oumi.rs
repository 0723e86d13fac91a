//! Oumi: `oumi train -c train.yaml --training.per_device_train_batch_size 8`
//! (also under `oumi distributed torchrun -m oumi train ...`). The recipe's
//! nested keys (`training.*`, `model.model_max_length`) may be given as
//! `--KEY V` flags, which win. Its trainers are the Hugging Face ones:
//! `checkpoint-N` folders in `training.output_dir`, resumed with
//! `--training.resume_from_checkpoint PATH`.

use std::path::PathBuf;

use super::{Ctx, Family};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::files::Scalar;
use crate::settings::Knob;

fn recognise(cmd: &Command) -> bool {
    let tool = cmd.tool() == Some("oumi") && cmd.subcommand() == Some("train");
    let module = cmd.module() == Some("oumi")
        && cmd.args.get(cmd.args_start()).map(String::as_str) == Some("train");
    tool || module
}

fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    if !recognise(cmd) {
        return None;
    }
    let out = match cmd.value(&["--training.output_dir"]) {
        Some(v) => v.to_string(),
        None => match (ctx.recipe_value)("training.output_dir") {
            Some(Scalar::Str(s)) => s,
            _ => "output".into(), // TrainingParams.output_dir's default
        },
    };
    Some(Layout {
        kind: Kind::Format(&super::hf::CHECKPOINTS),
        root: PathBuf::from(out),
        how: ResumeHow::Flag {
            flag: "--training.resume_from_checkpoint".into(),
            equals: false,
        },
        user_resume: cmd
            .value(&["--training.resume_from_checkpoint"])
            .map(PathBuf::from),
        own: None,
    })
}

pub static FAMILY: Family = Family {
    name: "oumi",
    recognise,
    own_file_keys: &[
        (Knob::MicroBatch, &["training.per_device_train_batch_size"]),
        (Knob::GradAccum, &["training.gradient_accumulation_steps"]),
        (Knob::SeqLen, &["model.model_max_length"]),
        (
            Knob::GradCheckpointing,
            &["training.enable_gradient_checkpointing"],
        ),
        (
            Knob::DataloaderWorkers,
            &["training.dataloader_num_workers"],
        ),
        (Knob::EvalBatch, &["training.per_device_eval_batch_size"]),
    ],
    config_flags: &["-c", "--config"],
    dotted_flags: true,
    layout,
    output_hint: "--training.output_dir",
    ..Family::NONE
};
