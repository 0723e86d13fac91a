//! nanoGPT: `train.py config/x.py --key=value`. The config module is exec'd
//! over train.py's globals; `batch_size` is the per-GPU micro-batch and
//! `gradient_accumulation_steps` counts all ranks (train.py divides it by the
//! world size). `out_dir/ckpt.pt`, resumed with `--init_from=resume`.

use std::path::{Path, PathBuf};

use super::{Ctx, Family};
use crate::checkpoint::{Checkpoint, Format, Kind, Layout, ResumeHow, zip_complete};
use crate::command::Command;
use crate::settings::Knob;

fn recognise(cmd: &Command) -> bool {
    cmd.script().is_some()
        && (cmd.python_config_module().is_some() || cmd.has_flag(&["--init_from", "--out_dir"]))
}

/// A config module's `out_dir = '...'`.
fn python_assignment(file: &Path, name: &str) -> Option<String> {
    let text = crate::untrusted::read_config(file).ok()?;
    text.lines().rev().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        if k.trim() != name {
            return None;
        }
        let v = v.split('#').next()?.trim();
        let q = v.chars().next()?;
        (q == '\'' || q == '"').then(|| v.trim_matches(q).to_string())
    })
}

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    if !recognise(cmd) {
        return None;
    }
    let out = cmd
        .value(&["--out_dir"])
        .map(str::to_string)
        .or_else(|| {
            cmd.python_config_module()
                .and_then(|(_, m)| python_assignment(Path::new(m), "out_dir"))
        })
        .unwrap_or_else(|| "out".into());
    Some(Layout {
        kind: Kind::Format(&CHECKPOINTS),
        root: PathBuf::from(out),
        how: ResumeHow::Const {
            flag: "--init_from".into(),
            value: "resume".into(),
            equals: true,
        },
        user_resume: None,
        own: None,
    })
}

pub static FAMILY: Family = Family {
    name: "nanogpt",
    recognise,
    flags: &[(Knob::SeqLen, &["--block_size", "--block-size"])],
    own_flags: &[(Knob::MicroBatch, &["--batch_size"])],
    own_file_keys: &[(Knob::MicroBatch, &["batch_size"])],
    layout,
    output_hint: "--out_dir",
    accum_covers_world: recognise,
    counting: Some(crate::progress::Counting::IterIndex),
    ..Family::NONE
};

// ---------------------------------------------------------------- checkpoints

/// nanoGPT's checkpoint: one `out_dir/ckpt.pt`, whole when it ends with its zip directory.
pub static CHECKPOINTS: Format = Format {
    id: "nano_gpt",
    label: "nanogpt out_dir/ckpt.pt",
    candidates: |root| (candidates(root), Vec::new()),
    complete: |_, p| zip_complete(p),
    stepped: false,
    recorded_step: None,
    unannounced: |_| false,
};

/// nanoGPT's single `ckpt.pt`, if there is one.
fn candidates(root: &Path) -> Vec<Checkpoint> {
    let ckpt = root.join("ckpt.pt");
    if ckpt.exists() {
        // train.py saves at the top of iteration `iter_num`: that many are done.
        let step = crate::torch_save::top_level_int(&ckpt, "iter_num").unwrap_or(0);
        vec![Checkpoint { path: ckpt, step }]
    } else {
        Vec::new()
    }
}
