//! OpenRLHF (`deepspeed --module openrlhf.cli.train_sft ...`, `python -m
//! openrlhf.cli.train_dpo ...`): argparse flags, spelled `--micro_train_batch_size`,
//! `--max_len`, `--zero_stage` until 2026 and `--train.micro_batch_size`,
//! `--data.max_len`, `--ds.zero_stage` since (its "dotted config hierarchy").
//! Accumulation follows from the global batch (`--train_batch_size` /
//! `--train.batch_size` over micro-batch × world size), so halving the micro-batch
//! keeps it and writes no accumulation flag. The SFT, DPO and reward-model trainers
//! save DeepSpeed checkpoints (`global_stepN/` and `latest`) into `--ckpt_path` /
//! `--ckpt.path` (default `./ckpt/checkpoints_{sft,dpo,rm}`) and load the newest
//! with the switch `--load_checkpoint` / `--ckpt.load_enable`.

use std::path::PathBuf;

use super::{AbsentValue, Ctx, Family};
use crate::checkpoint::{Kind, Layout, ResumeHow};
use crate::command::Command;
use crate::settings::Knob;

fn recognise(cmd: &Command) -> bool {
    cmd.module().is_some_and(|m| m.starts_with("openrlhf."))
        || cmd
            .script()
            .is_some_and(|s| s.replace('\\', "/").contains("openrlhf/cli/"))
}

/// The trainer: `sft` of `openrlhf.cli.train_sft` (or `.../openrlhf/cli/train_sft.py`).
fn task(cmd: &Command) -> Option<&str> {
    let name = match (cmd.module(), cmd.script()) {
        (Some(m), _) => m.rsplit('.').next()?,
        (None, Some(s)) => s.rsplit(['/', '\\']).next()?.strip_suffix(".py")?,
        _ => return None,
    };
    name.strip_prefix("train_")
}

/// Whether the command spells its flags the dotted way (`--train.micro_batch_size`).
fn dotted(cmd: &Command) -> bool {
    const GROUPS: &[&str] = &[
        "--train.",
        "--data.",
        "--model.",
        "--ds.",
        "--ckpt.",
        "--eval.",
        "--logger.",
        "--adam.",
    ];
    cmd.flags
        .iter()
        .any(|f| GROUPS.iter().any(|g| f.name.starts_with(g)))
}

/// A flag is added only in the command's own spelling (a dotted one to a dotted command).
fn accepts_added(cmd: &Command, flag: &str) -> bool {
    flag.contains('.') == dotted(cmd)
}

/// The trainers that save and load one DeepSpeed checkpoint folder: SFT, DPO and the
/// reward model (PPO runs its actors under Ray, with a checkpoint folder per model).
fn resumable_task(cmd: &Command) -> Option<&str> {
    task(cmd).filter(|t| recognise(cmd) && matches!(*t, "sft" | "dpo" | "rm"))
}

fn layout(cmd: &Command, _: &Ctx) -> Option<Layout> {
    let task = resumable_task(cmd)?;
    let (path_flag, switch) = if dotted(cmd) {
        ("--ckpt.path", "--ckpt.load_enable")
    } else {
        ("--ckpt_path", "--load_checkpoint")
    };
    let root = cmd
        .value(&[path_flag])
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("./ckpt/checkpoints_{task}")));
    Some(Layout {
        kind: Kind::Format(&super::deepspeed::CHECKPOINTS),
        how: if cmd.has_flag(&[switch]) {
            ResumeHow::Automatic
        } else {
            ResumeHow::Switch {
                flag: switch.into(),
            }
        },
        root,
        user_resume: None,
        own: None,
    })
}

/// OpenRLHF saves a checkpoint every `--ckpt.save_steps` steps, none at its default (-1).
fn saves_none(cmd: &Command, _: &Ctx) -> Option<String> {
    resumable_task(cmd)?;
    let flag = if dotted(cmd) {
        "--ckpt.save_steps"
    } else {
        "--save_steps"
    };
    let every = cmd
        .value(&[flag])
        .and_then(|v| v.trim().parse::<i64>().ok());
    if every.is_some_and(|n| n > 0) {
        return None;
    }
    let said = match every {
        Some(n) => format!("{flag} {n}"),
        None => format!("{flag} left at its default, -1"),
    };
    Some(format!(
        "OpenRLHF saves no checkpoint while it trains ({said}): after an OOM each relaunch starts from the beginning; give {flag} N to resume from the last multiple of N"
    ))
}

pub static FAMILY: Family = Family {
    name: "openrlhf",
    recognise,
    own_flags: &[
        (
            Knob::MicroBatch,
            &["--train.micro_batch_size", "--micro_train_batch_size"],
        ),
        (Knob::SeqLen, &["--data.max_len", "--max_len"]),
        (
            Knob::GradCheckpointing,
            &[
                "--model.gradient_checkpointing_enable",
                "--gradient_checkpointing",
            ],
        ),
        (Knob::ZeroStage, &["--ds.zero_stage", "--zero_stage"]),
        // Its switch for DeepSpeed's optimizer offload to the CPU.
        (
            Knob::OffloadOptimizer,
            &["--ds.adam_offload", "--adam_offload"],
        ),
    ],
    global_batch_keys: &["train.batch_size", "train_batch_size"],
    added_flags: &[
        (
            Knob::GradCheckpointing,
            "--model.gradient_checkpointing_enable",
            AbsentValue::Bool(false),
        ),
        (
            Knob::GradCheckpointing,
            "--gradient_checkpointing",
            AbsentValue::Bool(false),
        ),
        (Knob::ZeroStage, "--ds.zero_stage", AbsentValue::Int(2)),
        (Knob::ZeroStage, "--zero_stage", AbsentValue::Int(2)),
        (Knob::SeqLen, "--data.max_len", AbsentValue::Int(2048)),
        (Knob::SeqLen, "--max_len", AbsentValue::Int(2048)),
        (
            Knob::OffloadOptimizer,
            "--ds.adam_offload",
            AbsentValue::NoOffload,
        ),
        (
            Knob::OffloadOptimizer,
            "--adam_offload",
            AbsentValue::NoOffload,
        ),
    ],
    accepts_added,
    layout,
    output_hint: "--ckpt.path",
    saves_none,
    ..Family::NONE
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn cmd(s: &str) -> Command {
        Command::parse(&s.split_whitespace().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn both_spellings_are_recognised_with_their_own_checkpoint_switch() {
        let legacy = cmd(
            "deepspeed --module openrlhf.cli.train_sft --micro_train_batch_size 2 --train_batch_size 256",
        );
        assert!(recognise(&legacy) && !dotted(&legacy));
        let l = layout(&legacy, &no_ctx()).unwrap();
        assert_eq!(l.root, PathBuf::from("./ckpt/checkpoints_sft"));
        assert_eq!(
            l.how,
            ResumeHow::Switch {
                flag: "--load_checkpoint".into()
            }
        );
        let new = cmd(
            "python -m openrlhf.cli.train_dpo --train.micro_batch_size 2 --ckpt.path /c --ckpt.load_enable",
        );
        assert!(dotted(&new));
        let l = layout(&new, &no_ctx()).unwrap();
        assert_eq!(l.root, PathBuf::from("/c"));
        assert_eq!(l.how, ResumeHow::Automatic, "the command loads by itself");
        assert!(accepts_added(&new, "--ds.zero_stage") && !accepts_added(&new, "--zero_stage"));
        assert!(
            !accepts_added(&legacy, "--ds.zero_stage") && accepts_added(&legacy, "--zero_stage")
        );
        // PPO's actors run under Ray: no layout; another tool's command: not OpenRLHF.
        assert!(
            layout(
                &cmd("python -m openrlhf.cli.train_ppo_ray --ckpt_path c"),
                &no_ctx()
            )
            .is_none()
        );
        assert!(!recognise(&cmd("deepspeed train.py --zero_stage 2")));
    }

    #[test]
    fn a_run_that_saves_no_checkpoint_is_said_to_start_over_after_an_oom() {
        let no_recipe = |_: &str| None;
        let ctx = Ctx {
            recipe_output_dir: None,
            recipe_value: &no_recipe,
        };
        let none = |s: &str| saves_none(&cmd(s), &ctx);
        let w =
            none("deepspeed --module openrlhf.cli.train_sft --train.micro_batch_size 2").unwrap();
        assert!(
            w.contains("--ckpt.save_steps left at its default, -1"),
            "{w}"
        );
        let w = none(
            "deepspeed --module openrlhf.cli.train_sft --micro_train_batch_size 2 --save_steps -1",
        )
        .unwrap();
        assert!(
            w.contains("(--save_steps -1)") && w.contains("give --save_steps N"),
            "{w}"
        );
        assert_eq!(
            none("deepspeed --module openrlhf.cli.train_sft --ckpt.save_steps 100"),
            None
        );
        // PPO is not resumed at all: nothing to say of its saves here.
        assert_eq!(none("python -m openrlhf.cli.train_ppo_ray"), None);
    }

    fn no_ctx() -> Ctx<'static> {
        Ctx {
            recipe_output_dir: None,
            recipe_value: &|_| None,
        }
    }
}
