//! LitGPT: `litgpt finetune|finetune_full|pretrain MODEL --config X.yaml
//! --train.micro_batch_size N --train.global_batch_size G --devices D`.
//! Accumulation follows from the global batch (G / (N × D × nodes)), so
//! halving the micro-batch keeps G and writes no accumulation key.
//! `pretrain` and `finetune_full` save `out_dir/step-N/lit_model.pth` and
//! resume with `--resume auto`; LoRA finetuning cannot resume.

use std::path::PathBuf;

use super::{Ctx, Env, Family};
use crate::checkpoint::{CustomSpec, Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::files::Scalar;
use crate::settings::{Knob, World};

fn recognise(cmd: &Command) -> bool {
    cmd.tool() == Some("litgpt")
}

/// `finetune_full`, `finetune full`, `pretrain`: the subcommands with `--resume`.
fn resumes(cmd: &Command) -> bool {
    let sub = cmd.subcommand().unwrap_or("");
    let next = cmd.args.get(cmd.args_start() + 1).map(String::as_str);
    sub == "pretrain" || sub == "finetune_full" || (sub == "finetune" && next == Some("full"))
}

fn number(cmd: &Command, ctx: &Ctx, key: &str) -> Option<u64> {
    match cmd.value(&[&format!("--{key}")]) {
        Some(v) => v.parse().ok(),
        None => match (ctx.recipe_value)(key) {
            Some(Scalar::Int(n)) => u64::try_from(n).ok(),
            _ => None,
        },
    }
}

fn world(cmd: &Command, _: Env, ctx: &Ctx) -> Option<World> {
    if !recognise(cmd) {
        return None;
    }
    let devices = number(cmd, ctx, "devices").unwrap_or(1);
    let nodes = number(cmd, ctx, "num_nodes").unwrap_or(1);
    Some(World {
        size: devices.saturating_mul(nodes),
        source: format!("litgpt --devices {devices} × --num_nodes {nodes}"),
        uncertain: false,
    })
}

fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    if !recognise(cmd) || !resumes(cmd) {
        return None;
    }
    let out = match cmd.value(&["--out_dir"]) {
        Some(v) => v.to_string(),
        None => match (ctx.recipe_value)("out_dir") {
            Some(Scalar::Str(s)) => s,
            _ => return None,
        },
    };
    Some(Layout {
        kind: Kind::Custom(CustomSpec {
            flag: "--resume".into(),
            dir: Some(PathBuf::from(&out)),
            dir_flag: None,
            pattern: "step-{step}".into(),
            complete_when: vec!["lit_model.pth".into()],
            label: Some("litgpt out_dir/step-N/lit_model.pth".into()),
        }),
        root: PathBuf::from(out),
        how: ResumeHow::Const {
            flag: "--resume".into(),
            value: "auto".into(),
            equals: false,
        },
        user_resume: None,
        own: None,
    })
}

pub static FAMILY: Family = Family {
    name: "litgpt",
    recognise,
    own_file_keys: &[
        (Knob::MicroBatch, &["train.micro_batch_size"]),
        (Knob::SeqLen, &["train.max_seq_length"]),
    ],
    config_flags: &["--config"],
    global_batch_keys: &["train.global_batch_size"],
    dotted_flags: true,
    layout,
    output_hint: "--out_dir",
    world,
    ..Family::NONE
};
