//! Whether a checkpoint written at one set of settings can be loaded at the next.
//!
//! Most of oomguard's steps leave a checkpoint's format alone (the micro-batch, the
//! accumulation, gradient checkpointing, the sequence length). Two change how the
//! trainer writes and reads its state, and a relaunch told to resume from a checkpoint
//! in the old format dies while loading it, before it trains a step:
//!
//! - **The ZeRO stage.** DeepSpeed (0.19.8, checked by saving and loading a real engine
//!   on CPU) writes `mp_rank_00_model_states.pt` alone at stage 0; that and each
//!   rank's `zero_pp_rank_R_mp_rank_00_optim_states.pt` at stages 1 and 2; each rank's
//!   `zero_pp_rank_R_mp_rank_00_model_states.pt` and optimizer file at stage 3. A
//!   stage reads only its own files: a stage-2 checkpoint loaded at stage 3 fails
//!   (`assert len(self.ckpt_list) > 0`), a stage-0 one at stage 2 too
//!   (`FileNotFoundError: ...zero_pp_rank_0_mp_rank_00_optim_states.pt`), and back.
//!   Stages 1 and 2 read each other's.
//! - **FSDP turned on** in a Hugging Face Trainer: with FSDP the Trainer reads the
//!   optimizer through accelerate's FSDP loader (`optimizer.bin` or `optimizer_0/`),
//!   and a checkpoint written without FSDP holds `optimizer.pt`.
//!
//! Only the names of the files are read (a checkpoint folder and its direct
//! subfolders, DeepSpeed's `global_stepN/` in a Trainer's `checkpoint-N/`), never
//! through a link, and never more than a bounded number of entries.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::settings::{Knob, Settings};

/// At most this many entries of a folder are looked at.
const MAX_ENTRIES: usize = 4096;
/// At most this many subfolders of a checkpoint are looked into.
const MAX_SUBDIRS: usize = 64;

/// How a checkpoint's files say its state was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// DeepSpeed without ZeRO (stage 0): the model states file alone.
    Zero0,
    /// DeepSpeed ZeRO stage 1 or 2: the model states and each rank's optimizer.
    Zero12,
    /// DeepSpeed ZeRO stage 3: each rank's model states and optimizer.
    Zero3,
    /// A Hugging Face Trainer's checkpoint without FSDP or DeepSpeed (`optimizer.pt`).
    Plain,
    /// A Hugging Face Trainer's FSDP checkpoint.
    Fsdp,
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Written::Zero0 => "by DeepSpeed without ZeRO (stage 0)",
            Written::Zero12 => "at ZeRO stage 1 or 2",
            Written::Zero3 => "at ZeRO stage 3",
            Written::Plain => "without FSDP",
            Written::Fsdp => "with FSDP",
        })
    }
}

/// Why a checkpoint cannot be loaded at the next settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unloadable {
    pub path: PathBuf,
    pub written: Written,
    /// The ZeRO stage it was written at, where the settings before the step say.
    pub stage: Option<u64>,
    /// The new setting that cannot read it ("ZeRO stage 3", "FSDP").
    pub at: String,
    /// The files the new setting reads, which the checkpoint lacks.
    pub reads: &'static str,
}

impl fmt::Display for Unloadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} was written ", self.path.display())?;
        match self.stage {
            Some(s) => write!(f, "at ZeRO stage {s}")?,
            None => write!(f, "{}", self.written)?,
        }
        write!(
            f,
            ", and {} cannot load it (it reads {}, which the checkpoint lacks)",
            self.at, self.reads
        )
    }
}

/// How the checkpoint at `path` was written, from its files' names; `None` when
/// they say nothing oomguard knows (a single file, a format of another trainer).
pub fn written(path: &Path) -> Option<Written> {
    let mut names = Vec::new();
    let mut subdirs = Vec::new();
    list(path, &mut names, Some(&mut subdirs));
    for d in subdirs.iter().take(MAX_SUBDIRS) {
        list(d, &mut names, None);
    }
    let any = |f: &dyn Fn(&str) -> bool| names.iter().any(|n| f(n));
    if any(&|n| zero_rank_file(n, "model_states.pt")) {
        return Some(Written::Zero3);
    }
    if any(&|n| zero_rank_file(n, "optim_states.pt")) {
        return Some(Written::Zero12);
    }
    if any(&|n| n.starts_with("mp_rank_") && n.ends_with("_model_states.pt")) {
        return Some(Written::Zero0);
    }
    // (accelerate's own `save_state` writes `optimizer.bin` with or without FSDP:
    // that name alone says nothing.)
    if any(&|n| n.starts_with("pytorch_model_fsdp") || n.starts_with("optimizer_0")) {
        return Some(Written::Fsdp);
    }
    if any(&|n| n == "optimizer.pt") {
        return Some(Written::Plain);
    }
    None
}

/// `zero_pp_rank_R_mp_rank_MM_<suffix>`, with DeepSpeed's optional dtype prefix
/// (`bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt`).
fn zero_rank_file(name: &str, suffix: &str) -> bool {
    let name = name.strip_prefix("bf16_").unwrap_or(name);
    name.starts_with("zero_pp_rank_") && name.contains("_mp_rank_") && name.ends_with(suffix)
}

/// The names in `dir` (at most [`MAX_ENTRIES`]), and its subfolders when asked
/// (links are neither followed nor listed as folders).
fn list(dir: &Path, names: &mut Vec<String>, mut subdirs: Option<&mut Vec<PathBuf>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(MAX_ENTRIES) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(s) = subdirs.as_deref_mut()
            && e.file_type().is_ok_and(|t| t.is_dir())
        {
            s.push(e.path());
        }
        names.push(name);
    }
}

/// Whether ZeRO stage `stage` reads what was `written` (stages 1 and 2 read each
/// other's; a checkpoint without DeepSpeed's files is not DeepSpeed's to read).
fn stage_reads(written: Written, stage: u64) -> bool {
    match written {
        Written::Zero0 => stage == 0,
        Written::Zero12 => stage == 1 || stage == 2,
        Written::Zero3 => stage == 3,
        Written::Plain | Written::Fsdp => true,
    }
}

/// Whether settings `after` can load a checkpoint that was `written` so: its ZeRO
/// stage reads it, and FSDP is not on for a checkpoint written without it.
pub fn loads(written: Written, after: &Settings) -> bool {
    after
        .int(Knob::ZeroStage)
        .is_none_or(|s| stage_reads(written, s))
        && !(after.bool(Knob::Fsdp) == Some(true) && written == Written::Plain)
}

/// Whether the checkpoint at `path`, written at `before`, can be loaded at
/// `after`; `Err` says why not. Only what the step changed is checked: a
/// checkpoint the settings could load before, they load after.
pub fn check(path: &Path, before: &Settings, after: &Settings) -> Result<(), Unloadable> {
    let stage = |s: &Settings| s.int(Knob::ZeroStage);
    let stage_changed = stage(after).is_some() && stage(before) != stage(after);
    let fsdp_on = after.bool(Knob::Fsdp) == Some(true) && before.bool(Knob::Fsdp) != Some(true);
    if !stage_changed && !fsdp_on {
        return Ok(());
    }
    let Some(written) = written(path) else {
        return Ok(());
    };
    // The stage before the step, when the files agree with it.
    let deepspeed = !matches!(written, Written::Plain | Written::Fsdp);
    let was = stage(before).filter(|&s| deepspeed && stage_reads(written, s));
    let unloadable = |at: String, reads| {
        Err(Unloadable {
            path: path.to_path_buf(),
            written,
            stage: was,
            at,
            reads,
        })
    };
    if let Some(s) = stage(after).filter(|&s| stage_changed && !stage_reads(written, s)) {
        let reads = match s {
            0 => "mp_rank_00_model_states.pt with the optimizer in it",
            3 => "each rank's zero_pp_rank_R_mp_rank_00_model_states.pt",
            _ => {
                "mp_rank_00_model_states.pt and each rank's zero_pp_rank_R_mp_rank_00_optim_states.pt"
            }
        };
        return unloadable(format!("ZeRO stage {s}"), reads);
    }
    if fsdp_on && written == Written::Plain {
        return unloadable(
            "the Trainer with FSDP".into(),
            "optimizer.bin or optimizer_0/ through accelerate's FSDP loader",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Value;

    /// Files as real DeepSpeed 0.19.8 and the Hugging Face Trainer write them.
    fn ckpt(files: &[&str]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for f in files {
            let p = t.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        t
    }

    const STAGE0: &[&str] = &[
        "trainer_state.json",
        "latest",
        "global_step5/mp_rank_00_model_states.pt",
    ];
    const STAGE2: &[&str] = &[
        "trainer_state.json",
        "latest",
        "global_step5/mp_rank_00_model_states.pt",
        "global_step5/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "global_step5/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ];
    const STAGE3: &[&str] = &[
        "trainer_state.json",
        "latest",
        "global_step5/zero_pp_rank_0_mp_rank_00_model_states.pt",
        "global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "global_step5/zero_pp_rank_1_mp_rank_00_model_states.pt",
        "global_step5/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ];
    const PLAIN: &[&str] = &[
        "trainer_state.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
    ];
    const FSDP: &[&str] = &[
        "trainer_state.json",
        "pytorch_model_fsdp_0/__0_0.distcp",
        "optimizer_0/__0_0.distcp",
        "scheduler.pt",
    ];

    fn with(pairs: &[(Knob, Value)]) -> Settings {
        let mut s = Settings {
            knobs: Default::default(),
            world_size: 2,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        };
        for (k, v) in pairs {
            s.knobs.insert(*k, v.clone());
        }
        s
    }

    fn stage(n: u64) -> Settings {
        with(&[
            (Knob::MicroBatch, Value::Int(1)),
            (Knob::ZeroStage, Value::Int(n)),
        ])
    }

    #[test]
    fn each_format_is_told_by_its_files() {
        for (files, want) in [
            (STAGE0, Some(Written::Zero0)),
            (STAGE2, Some(Written::Zero12)),
            (STAGE3, Some(Written::Zero3)),
            (PLAIN, Some(Written::Plain)),
            (FSDP, Some(Written::Fsdp)),
            (&["trainer_state.json", "model.safetensors"][..], None),
            // accelerate's save_state: `optimizer.bin` with or without FSDP.
            (
                &[
                    "model.safetensors",
                    "optimizer.bin",
                    "scheduler.bin",
                    "random_states_0.pkl",
                ][..],
                None,
            ),
        ] {
            let t = ckpt(files);
            assert_eq!(written(t.path()), want, "{files:?}");
        }
        assert_eq!(written(Path::new("/nonexistent/checkpoint-5")), None);
    }

    /// Each ZeRO stage change against each format, as DeepSpeed loads them.
    #[test]
    fn a_zero_stage_change_loads_only_what_the_new_stage_reads() {
        let rows = [
            (STAGE2, 2, 3, false),
            (STAGE2, 1, 2, true),
            (STAGE0, 0, 2, false),
            (STAGE3, 3, 2, false),
            (STAGE2, 2, 2, true),
            // A stage that did not change is never in question.
            (STAGE0, 2, 2, true),
            (PLAIN, 2, 3, true),
        ];
        for (files, from, to, loads) in rows {
            let t = ckpt(files);
            let r = check(t.path(), &stage(from), &stage(to));
            assert_eq!(r.is_ok(), loads, "{files:?} {from} → {to}: {r:?}");
        }
        let t = ckpt(STAGE2);
        let why = check(t.path(), &stage(2), &stage(3))
            .unwrap_err()
            .to_string();
        assert!(why.contains("was written at ZeRO stage 2, and ZeRO stage 3 cannot load it (it reads each rank's zero_pp_rank_R_mp_rank_00_model_states.pt"), "{why}");
    }

    #[test]
    fn turning_fsdp_on_cannot_load_a_plain_trainer_checkpoint() {
        let off = with(&[(Knob::Fsdp, Value::Bool(false))]);
        let on = with(&[(Knob::Fsdp, Value::Bool(true))]);
        let t = ckpt(PLAIN);
        let why = check(t.path(), &off, &on).unwrap_err().to_string();
        assert!(
            why.contains("was written without FSDP, and the Trainer with FSDP cannot load it"),
            "{why}"
        );
        let f = ckpt(FSDP);
        assert!(check(f.path(), &off, &on).is_ok());
        assert!(check(t.path(), &off, &off).is_ok());
    }

    #[test]
    fn a_link_is_not_followed() {
        let real = ckpt(STAGE3);
        let t = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            real.path().join("global_step5"),
            t.path().join("global_step5"),
        )
        .unwrap();
        assert_eq!(written(t.path()), None);
    }
}
