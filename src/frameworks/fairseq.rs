//! fairseq's trainer (`fairseq-train DATA --arch A --max-tokens 4096 --update-freq 8`,
//! `python fairseq_cli/train.py`, `python -m fairseq_cli.train`): the micro-batch is a
//! budget per GPU, in tokens (`--max-tokens`) or sentences (`--batch-size`,
//! `--max-sentences`), and accumulation is `--update-freq` (added when absent; fairseq
//! always takes it). Halving the budget and doubling the accumulation keeps the tokens (or
//! sentences) per update. Without a launcher it starts one process per visible GPU
//! itself, unless `--distributed-world-size` says how many.

use super::{AbsentValue, Ctx, Env, Family};
use crate::command::Command;
use crate::settings::{Knob, World};

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
    ..Family::NONE
};
