//! PyTorch Lightning: LightningCLI (`python cli.py fit --ckpt_path X`,
//! `--trainer.accumulate_grad_batches N`) and lightning-hydra-template
//! (`ckpt_path=X`); checkpoints are `*.ckpt` files under the root dir.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{Ctx, Family};
use crate::checkpoint::{Checkpoint, Format, Kind, Layout, ResumeHow, zip_complete};
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
        kind: Kind::Format(&CHECKPOINTS),
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

// ---------------------------------------------------------------- checkpoints

/// Lightning checkpoints: `*.ckpt` files, each whole when it ends with its zip directory.
pub static CHECKPOINTS: Format = Format {
    id: "lightning",
    label: "lightning *.ckpt",
    candidates: |root| (candidates(root), Vec::new()),
    complete: |_, p| zip_complete(p),
    stepped: false,
    recorded_step: None,
    unannounced: |p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("last"))
    },
};

/// Every `*.ckpt` under `root` (depth ≤ 5), newest first, `last.ckpt` before its peers.
fn candidates(root: &Path) -> Vec<Checkpoint> {
    let mut files: Vec<(SystemTime, bool, PathBuf)> = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() && depth < 5 {
                stack.push((p, depth + 1));
            } else if md.is_file() && p.extension().is_some_and(|x| x == "ckpt") {
                let last = p
                    .file_stem()
                    .is_some_and(|s| s.to_string_lossy().starts_with("last"));
                files.push((md.modified().unwrap_or(SystemTime::UNIX_EPOCH), last, p));
            }
        }
    }
    files.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    files
        .into_iter()
        .map(|(t, _, p)| Checkpoint {
            step: t
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            path: p,
        })
        .collect()
}
