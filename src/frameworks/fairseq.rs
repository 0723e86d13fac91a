//! fairseq's trainer (`fairseq-train DATA --arch A --max-tokens 4096 --update-freq 8`,
//! `python fairseq_cli/train.py`, `python -m fairseq_cli.train`): the micro-batch is a
//! budget per GPU, in tokens (`--max-tokens`) or sentences (`--batch-size`,
//! `--max-sentences`), and accumulation is `--update-freq` (added when absent; fairseq
//! always takes it). Halving the budget and doubling the accumulation keeps the tokens (or
//! sentences) per update. Without a launcher it starts one process per visible GPU
//! itself, unless `--distributed-world-size` says how many.
//!
//! Checkpoints: `--save-dir` (default `checkpoints`) holds `checkpoint_last.pt`, a copy
//! of every save, beside `checkpoint_EPOCH_UPDATES.pt` (`--save-interval-updates`) and
//! `checkpointEPOCH.pt`. fairseq loads `checkpoint_last.pt` by itself when it starts
//! (`--restore-file`'s default); another `--restore-file` is the user's resume
//! argument, which oomguard replaces with the run's newest checkpoint.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{AbsentValue, Ctx, Env, Family};
use crate::checkpoint::{Checkpoint, Format, Kind, Layout, ResumeHow, zip_complete};
use crate::command::Command;
use crate::settings::{Knob, World};

/// The file fairseq writes at every save and loads by itself.
const LAST: &str = "checkpoint_last.pt";

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    if !recognise(cmd) {
        return None;
    }
    let root = cmd
        .value(&["--save-dir", "--save_dir"])
        .unwrap_or("checkpoints");
    let restore = cmd
        .value(&["--restore-file", "--restore_file"])
        .filter(|r| *r != LAST);
    Some(Layout {
        kind: Kind::Format(&CHECKPOINTS),
        root: PathBuf::from(root),
        how: match restore {
            None => ResumeHow::Automatic,
            Some(_) => ResumeHow::Flag {
                flag: "--restore-file".into(),
                equals: false,
            },
        },
        user_resume: restore.map(PathBuf::from),
        own: None,
    })
}

/// fairseq's checkpoints: `*.pt` files in `--save-dir`, each whole when it ends with
/// its zip directory.
pub static CHECKPOINTS: Format = Format {
    id: "fairseq",
    label: "fairseq checkpoint_last.pt, checkpoint_E_U.pt",
    candidates: |root| (candidates(root), Vec::new()),
    complete: |_, p| zip_complete(p),
    // checkpointN.pt counts epochs.
    stepped: false,
    recorded_step: None,
    // A copy of the announced save, never announced itself.
    unannounced: |p| p.file_name().is_some_and(|n| n == LAST),
};

/// The updates a `checkpoint_E_U.pt` name says (`checkpoint_3_12000.pt`: 12000); None
/// for any other name (`checkpoint3.pt` counts epochs, `checkpoint_best.pt` nothing).
fn name_updates(name: &str) -> Option<u64> {
    let mid = name.strip_prefix("checkpoint_")?.strip_suffix(".pt")?;
    let (epoch, updates) = mid.split_once('_')?;
    epoch.parse::<u64>().ok()?;
    updates.parse().ok()
}

/// `checkpoint_last.pt` first (what fairseq loads by itself, the newest save), its
/// updates those of the `checkpoint_E_U.pt` it is a copy of (the same size, the
/// most updates); then the `checkpoint_E_U.pt` files, most updates first; then the
/// epoch files `checkpointN.pt`, newest first (their updates cannot be told).
fn candidates(root: &Path) -> Vec<Checkpoint> {
    let mut last: Option<(PathBuf, u64)> = None;
    let mut stepped: Vec<(u64, u64, PathBuf)> = Vec::new();
    let mut epochs: Vec<(SystemTime, PathBuf)> = Vec::new();
    for e in fs::read_dir(root).into_iter().flatten().flatten() {
        let Ok(md) = e.metadata() else { continue };
        if !md.is_file() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let p = e.path();
        if name == LAST {
            last = Some((p, md.len()));
        } else if let Some(u) = name_updates(&name) {
            stepped.push((u, md.len(), p));
        } else if name
            .strip_prefix("checkpoint")
            .and_then(|r| r.strip_suffix(".pt"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            epochs.push((md.modified().unwrap_or(SystemTime::UNIX_EPOCH), p));
        }
    }
    stepped.sort_by_key(|s| std::cmp::Reverse(s.0));
    epochs.sort_by_key(|e| std::cmp::Reverse(e.0));
    let last = last.map(|(path, len)| Checkpoint {
        step: stepped.iter().find(|s| s.1 == len).map_or(0, |s| s.0),
        path,
    });
    last.into_iter()
        .chain(
            stepped
                .into_iter()
                .map(|(step, _, path)| Checkpoint { path, step }),
        )
        .chain(
            epochs
                .into_iter()
                .map(|(_, path)| Checkpoint { path, step: 0 }),
        )
        .collect()
}

fn recognise(cmd: &Command) -> bool {
    cmd.tool() == Some("fairseq-train")
        || cmd.module() == Some("fairseq_cli.train")
        || cmd
            .script()
            .is_some_and(|s| s.ends_with("fairseq_cli/train.py"))
}

/// The ranks fairseq starts itself when no launcher stands before it.
fn world(cmd: &Command, env: Env, _: &Ctx) -> Option<World> {
    // Under a launcher, fairseq joins its ranks: the launcher says the world.
    if !recognise(cmd) || super::rank_launcher(cmd) {
        return None;
    }
    let given = ["--distributed-world-size", "--distributed_world_size"];
    if let Some(n) = cmd
        .value(&given)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n >= 1)
    {
        return Some(World {
            size: n,
            source: format!("fairseq starts its ranks: --distributed-world-size {n}"),
            uncertain: false,
        });
    }
    Some(match super::launchers::visible_gpus(env) {
        Some((n, why)) => World {
            size: n,
            source: format!("fairseq starts one rank per visible GPU: {why}"),
            uncertain: false,
        },
        None => World {
            size: 1,
            source: "fairseq starts one rank per visible GPU; their count is unknown here (set CUDA_VISIBLE_DEVICES, or give --distributed-world-size); assuming 1".into(),
            uncertain: true,
        },
    })
}

/// The lengths a fairseq sample is cut or filtered to, by task: a language model's
/// blocks (`--tokens-per-sample`), a translation's sentences (`--max-source-positions`,
/// `--max-target-positions`), `--max-positions`, wav2vec's crops (`--max-sample-size`).
const SAMPLE_LENGTHS: &[&str] = &[
    "--tokens-per-sample",
    "--max-positions",
    "--max-source-positions",
    "--max-target-positions",
    "--max-sample-size",
];

/// fairseq's default for the language-model and translation tasks' lengths, when the
/// command gives none.
const DEFAULT_SAMPLE_LENGTH: u64 = 1024;

/// A token budget (`--max-tokens`) is never halved below the longest sample: fairseq
/// batches whole samples and stops at an assertion ("exceeds max_tokens limit") when
/// one is longer than the budget. The longest is the largest length the command sets
/// (see [`SAMPLE_LENGTHS`]), else fairseq's default, 1024. A budget in sentences
/// (`--batch-size`) has no such floor.
fn micro_floor(cmd: &Command) -> Option<(u64, String)> {
    if !recognise(cmd) {
        return None;
    }
    cmd.value(&["--max-tokens", "--max_tokens"])?;
    let given = SAMPLE_LENGTHS
        .iter()
        .filter_map(|f| Some((*f, cmd.value(&[f])?.trim().parse::<u64>().ok()?)))
        .max_by_key(|(_, n)| *n);
    Some(match given {
        Some((flag, n)) => (
            n,
            format!(
                "--max-tokens is a budget of whole samples, and fairseq refuses one below its longest sample ({flag} {n})"
            ),
        ),
        None => (
            DEFAULT_SAMPLE_LENGTH,
            format!(
                "--max-tokens is a budget of whole samples, and fairseq refuses one below its longest sample; the command sets no sample length (--tokens-per-sample, --max-source-positions), so fairseq's default, {DEFAULT_SAMPLE_LENGTH}, is assumed"
            ),
        ),
    })
}

pub static FAMILY: Family = Family {
    name: "fairseq",
    recognise,
    own_flags: &[
        (
            Knob::MicroBatch,
            &["--max-tokens", "--batch-size", "--max-sentences"],
        ),
        (Knob::GradAccum, &["--update-freq"]),
        (Knob::GradCheckpointing, &["--checkpoint-activations"]),
        (Knob::DataloaderWorkers, &["--num-workers"]),
    ],
    added_flags: &[
        (Knob::GradAccum, "--update-freq", AbsentValue::Int(1)),
        (
            Knob::GradCheckpointing,
            "--checkpoint-activations",
            AbsentValue::Bool(false),
        ),
    ],
    world,
    micro_floor,
    layout,
    output_hint: "--save-dir",
    counting: Some(crate::progress::Counting::Updates),
    ..Family::NONE
};

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    fn ctx_layout(cmd: &str) -> Layout {
        let none = |_: &str| None;
        let ctx = Ctx {
            recipe_output_dir: None,
            recipe_value: &none,
        };
        layout(&argv(cmd), &ctx).expect("a fairseq layout")
    }

    /// fairseq finds `checkpoint_last.pt` in `--save-dir` (default `checkpoints`) by
    /// itself; another `--restore-file` is the user's resume argument, replaced by the
    /// run's newest checkpoint.
    #[test]
    fn fairseq_resumes_from_its_save_dir_by_itself_unless_given_another_restore_file() {
        let l = ctx_layout("fairseq-train data --arch transformer_lm --max-tokens 4096");
        assert_eq!(l.root, PathBuf::from("checkpoints"));
        assert_eq!(l.how, ResumeHow::Automatic);
        assert_eq!(l.user_resume, None);
        let l = ctx_layout(
            "fairseq-train data --max-tokens 4096 --save-dir ck/lm --restore-file checkpoint_last.pt",
        );
        assert_eq!(
            (l.root, l.how),
            (PathBuf::from("ck/lm"), ResumeHow::Automatic)
        );
        let l = ctx_layout(
            "python fairseq_cli/train.py data --max-tokens 4096 --save-dir ck --restore-file pre/model.pt",
        );
        assert_eq!(
            l.how,
            ResumeHow::Flag {
                flag: "--restore-file".into(),
                equals: false
            }
        );
        assert_eq!(l.user_resume, Some(PathBuf::from("pre/model.pt")));
    }

    /// `checkpoint_last.pt` comes first, at the updates of the save it is a copy of;
    /// then the `checkpoint_E_U.pt` files by updates, then the epoch files;
    /// `checkpoint_best.pt` and other files are not candidates.
    #[test]
    fn checkpoint_last_is_first_at_the_updates_of_the_save_it_copies() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let write = |name: &str, len: usize| {
            let mut b = vec![b'x'; len];
            b.extend_from_slice(b"PK\x05\x06");
            fs::write(d.join(name), b).unwrap();
        };
        write("checkpoint_1_500.pt", 10);
        write("checkpoint_1_1000.pt", 20);
        write("checkpoint1.pt", 30);
        write("checkpoint_best.pt", 20);
        write("checkpoint_last.pt", 20);
        write("notes.txt", 20);
        let c = candidates(d);
        let got: Vec<(String, u64)> = c
            .iter()
            .map(|c| {
                (
                    c.path.file_name().unwrap().to_string_lossy().into_owned(),
                    c.step,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("checkpoint_last.pt".to_string(), 1000),
                ("checkpoint_1_1000.pt".to_string(), 1000),
                ("checkpoint_1_500.pt".to_string(), 500),
                ("checkpoint1.pt".to_string(), 0),
            ]
        );
        // Epoch saves only: the updates of checkpoint_last.pt cannot be told.
        fs::remove_file(d.join("checkpoint_1_500.pt")).unwrap();
        fs::remove_file(d.join("checkpoint_1_1000.pt")).unwrap();
        assert_eq!(candidates(d)[0].step, 0);
        assert!((CHECKPOINTS.unannounced)(&d.join("checkpoint_last.pt")));
        assert!(!(CHECKPOINTS.unannounced)(&d.join("checkpoint_1_500.pt")));
    }
}
