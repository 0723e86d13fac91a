//! Megatron-LM and Megatron-DeepSpeed (`--save DIR --load DIR`), and any
//! DeepSpeed-engine script that saves with `--save`: the `iter_N` folders of
//! `latest_checkpointed_iteration.txt`, or DeepSpeed's `latest` → `global_stepN`.

use std::path::PathBuf;

use super::{Ctx, Family};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::Knob;

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    let save = cmd.value(&["--save"])?;
    let load = cmd.value(&["--load"]);
    let root = PathBuf::from(save);
    let deepspeed = root.join("latest").exists() || cmd.has_flag(&["--deepspeed"]);
    Some(Layout {
        kind: if deepspeed && !root.join("latest_checkpointed_iteration.txt").exists() {
            Kind::DeepSpeed
        } else {
            Kind::Megatron
        },
        how: if load == Some(save) {
            ResumeHow::Automatic
        } else {
            ResumeHow::Flag {
                flag: "--load".into(),
                equals: false,
            }
        },
        root,
        user_resume: load.map(PathBuf::from),
    })
}

pub static FAMILY: Family = Family {
    name: "megatron",
    flags: &[
        (Knob::SeqLen, &["--seq_length", "--seq-length"]),
        (Knob::DataloaderWorkers, &["--num-workers", "--num_workers"]),
    ],
    file_keys: &[(Knob::SeqLen, &["seq_length"])],
    layout,
    output_hint: "--save",
    ..Family::NONE
};
