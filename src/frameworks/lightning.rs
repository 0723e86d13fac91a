//! PyTorch Lightning: LightningCLI (`python cli.py fit --ckpt_path X`,
//! `--trainer.accumulate_grad_batches N`) and lightning-hydra-template
//! (`ckpt_path=X`); checkpoints are `*.ckpt` files under the root dir.

use std::path::PathBuf;

use super::{Ctx, Family};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::Knob;

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    let cli = cmd.positionals().any(|(_, a)| a == "fit") || cmd.has_flag(&["--ckpt_path"]);
    let hydra_ckpt = cmd.override_value(&["ckpt_path"]);
    if !cli && hydra_ckpt.is_none() {
        return None;
    }
    let root = cmd
        .value(&["--trainer.default_root_dir"])
        .or_else(|| cmd.override_value(&["trainer.default_root_dir", "paths.log_dir"]))
        .unwrap_or(if cli { "lightning_logs" } else { "logs" });
    let (how, user) = if cli {
        (
            ResumeHow::Flag {
                flag: "--ckpt_path".into(),
                equals: true,
            },
            cmd.value(&["--ckpt_path"]),
        )
    } else {
        (
            ResumeHow::Override {
                key: "ckpt_path".into(),
                value: None,
            },
            hydra_ckpt,
        )
    };
    Some(Layout {
        kind: Kind::Lightning,
        root: PathBuf::from(root),
        how,
        user_resume: user.map(PathBuf::from),
    })
}

pub static FAMILY: Family = Family {
    name: "lightning",
    flags: &[
        (
            Knob::GradAccum,
            &[
                "--accumulate_grad_batches",
                "--trainer.accumulate_grad_batches",
            ],
        ),
        // A LightningDataModule's (and LitGPT's data modules') workers.
        (
            Knob::DataloaderWorkers,
            &["--data.num_workers", "--data.init_args.num_workers"],
        ),
        // A LightningDataModule's validation batch.
        (
            Knob::EvalBatch,
            &[
                "--data.val_batch_size",
                "--data.eval_batch_size",
                "--data.init_args.val_batch_size",
                "--data.init_args.eval_batch_size",
            ],
        ),
    ],
    file_keys: &[
        (Knob::GradAccum, &["accumulate_grad_batches"]),
        (
            Knob::DataloaderWorkers,
            &["data.num_workers", "data.init_args.num_workers"],
        ),
        (
            Knob::EvalBatch,
            &["data.val_batch_size", "data.eval_batch_size"],
        ),
    ],
    layout,
    output_hint: "--ckpt_path, ckpt_path=",
    ..Family::NONE
};
