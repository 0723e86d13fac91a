//! Megatron-LM and Megatron-DeepSpeed (`--save DIR --load DIR`), and any
//! DeepSpeed-engine script that saves with `--save`: the `iter_N` folders of
//! `latest_checkpointed_iteration.txt`, or DeepSpeed's `latest` → `global_stepN`.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Ctx, Family};
use crate::checkpoint::{
    Checkpoint, Format, Kind, Layout, NotComplete, ResumeHow, SkipKind, Skipped, no_temporaries,
    nonempty, numbered_dirs, read_small, zip_complete,
};
use crate::command::Command;
use crate::settings::Knob;

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    let save = cmd.value(&["--save"])?;
    let load = cmd.value(&["--load"]);
    let root = PathBuf::from(save);
    let deepspeed = root.join("latest").exists() || cmd.has_flag(&["--deepspeed"]);
    Some(Layout {
        kind: if deepspeed && !root.join("latest_checkpointed_iteration.txt").exists() {
            Kind::Format(&super::deepspeed::CHECKPOINTS)
        } else {
            Kind::Format(&CHECKPOINTS)
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
        own: None,
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

// ---------------------------------------------------------------- checkpoints

/// Megatron checkpoints: `iter_N` folders, the newest finished one named by
/// `latest_checkpointed_iteration.txt`.
pub static CHECKPOINTS: Format = Format {
    id: "megatron",
    label: "megatron latest_checkpointed_iteration.txt → iter_N",
    candidates,
    complete: |_, p| complete(p),
    stepped: true,
    recorded_step: None,
    unannounced: |_| false,
};

/// Megatron's iter_N (and global_stepN) folders, newest first, and those newer
/// than latest_checkpointed_iteration.txt (not finished).
fn candidates(root: &Path) -> (Vec<Checkpoint>, Vec<Skipped>) {
    let mut pre = Vec::new();
    let mut c = numbered_dirs(root, "iter_", "");
    c.extend(numbered_dirs(root, "global_step", ""));
    c.sort_by_key(|c| std::cmp::Reverse(c.step));
    if let Ok(t) = read_small(&root.join("latest_checkpointed_iteration.txt"))
        && let Ok(it) = t.trim().parse::<u64>()
    {
        let newer: Vec<Checkpoint> = c.iter().filter(|x| x.step > it).cloned().collect();
        c.retain(|x| x.step <= it);
        for n in newer {
            pre.push(Skipped {
                path: n.path,
                kind: SkipKind::Incomplete,
                why: format!("newer than latest_checkpointed_iteration.txt ({it}): not finished"),
            });
        }
    }
    (c, pre)
}

/// Why a Megatron iteration folder is not complete, or Ok: it holds `.pt`
/// files (loose, or the first of each subfolder), loose ones non-empty, a
/// subfolder's ending with a zip directory, and no temporary names.
fn complete(p: &Path) -> Result<(), NotComplete> {
    let mut any = false;
    for e in fs::read_dir(p).into_iter().flatten().flatten() {
        let sub = e.path();
        if sub.is_dir() {
            if let Some(f) = fs::read_dir(&sub)
                .into_iter()
                .flatten()
                .flatten()
                .find(|f| f.path().extension().is_some_and(|x| x == "pt"))
            {
                zip_complete(&f.path()).map_err(|w| format!("{} {w}", f.path().display()))?;
                any = true;
            }
        } else if sub.extension().is_some_and(|x| x == "pt") {
            nonempty(&sub)?;
            any = true;
        }
    }
    if any {
        no_temporaries(p)
    } else {
        Err("holds no .pt files".into())
    }
}
