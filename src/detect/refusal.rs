//! A program's parser refusing an argument oomguard added (a flag such as
//! `--gradient_accumulation_steps 2`, an override such as
//! `++trainer.accumulate_grad_batches=2`): oomguard's own doing, not the run's
//! failure. Read from the last output of an attempt that failed without an OOM.
//!
//! A refusal is a line in one of the parsers' wordings that names what was
//! added, as a whole token:
//!
//! - argparse (and jsonargparse): `error: unrecognized arguments: --x 2`,
//!   `error: argument --x: expected one argument`, `error: ambiguous option: --x`
//! - Hugging Face `HfArgumentParser`: `Some specified arguments are not used by the
//!   HfArgumentParser: ['--x', '2']`
//! - click: `Error: No such option: --x`, `Error: No such option '--x'.`
//! - Hydra: `Could not override 'a.x'.`, `Could not append to config. An item is
//!   already at 'a.x'.`, `Error merging override ++a.x=2`
//! - OmegaConf: `Key 'x' is not in struct`, `Key 'x' not in 'Config'`
//!   (`ConfigAttributeError`, `ConfigKeyError`)
//! - a config node built from the keys (Hydra's `instantiate`, `Cls(**cfg)`):
//!   `got an unexpected keyword argument 'x'`
//! - Lightning, for a module with manual optimization, which accumulates itself:
//!   `Automatic gradient accumulation is not supported for manual optimization.
//!   Remove `Trainer(accumulate_grad_batches=2)` or switch to automatic optimization.`

/// Phrases of a parser refusing an argument; a line must hold one of them.
const WORDINGS: &[&str] = &[
    "unrecognized arguments:",
    "Unrecognized arguments:",
    "error: argument ",
    "ambiguous option: ",
    "not used by the HfArgumentParser",
    "No such option",
    "Could not override '",
    "Could not append to config",
    "Error merging override",
    "is not in struct",
    "not in '",
    "got an unexpected keyword argument '",
    "is not supported for manual optimization",
];

/// A refusal found: which of the added arguments, and the parser's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Index into the `added` slice given to [`refused`].
    pub index: usize,
    pub line: String,
}

/// The first line of `output` (the last bytes of an attempt's output) in which a
/// parser refuses one of `added`: each the name as oomguard put it in argv, a flag
/// (`--gradient_accumulation_steps`) or an override's `PREFIX KEY` without its value
/// (`++trainer.accumulate_grad_batches`). An override's key is also found without
/// its prefix, and its last segment when quoted (`'accumulate_grad_batches'`), as
/// OmegaConf and Python name it.
pub fn refused(output: &[u8], added: &[String]) -> Option<Refusal> {
    let text = String::from_utf8_lossy(output);
    for line in text.split(['\n', '\r']) {
        if !WORDINGS.iter().any(|w| line.contains(w)) {
            continue;
        }
        for (index, a) in added.iter().enumerate() {
            if names(line, a) {
                return Some(Refusal {
                    index,
                    line: line.trim().chars().take(400).collect(),
                });
            }
        }
    }
    None
}

/// Whether `line` names the added argument `a`: as it was added, or by its last
/// name (a flag's without its dashes, an override's key's last segment) as Python
/// names an argument: quoted (`'accumulate_grad_batches'`), or given to a class
/// (`Trainer(accumulate_grad_batches=2)`, Lightning's wording).
fn names(line: &str, a: &str) -> bool {
    let key = a.trim_start_matches(['-', '+']);
    if key.is_empty() {
        return false;
    }
    let last = key.rsplit('.').next().unwrap_or(key);
    let called = line.contains(&format!("({last}="));
    if a.starts_with('-') {
        return has_token(line, a) || called;
    }
    if has_token(line, a) || has_token(line, key) || called {
        return true;
    }
    line.contains(&format!("'{last}'")) || line.contains(&format!("\"{last}\""))
}

/// `needle` in `hay`, not as part of a longer name (`--x` is not in `--x_y`).
fn has_token(hay: &str, needle: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '+');
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let at = from + i;
        let end = at + needle.len();
        let before = hay[..at].chars().next_back();
        let after = hay[end..].chars().next();
        // A trailing `.` ends a sentence ("Could not override 'a.x'.").
        let after_ok = match after {
            None => true,
            Some('.') => !hay[end + 1..].starts_with(|c: char| part(c) && c != '.'),
            Some(c) => !part(c),
        };
        if !before.is_some_and(part) && after_ok {
            return true;
        }
        from = end;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Each parser's own wording, as the real library prints it, names what was added.
    #[test]
    fn each_parsers_refusal_of_an_added_argument_is_found() {
        let flags = added(&["--gradient_accumulation_steps", "--gradient_checkpointing"]);
        for (out, want) in [
            (
                "usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --gradient_accumulation_steps 2\n",
                0,
            ),
            (
                "train.py: error: unrecognized arguments: --gradient_accumulation_steps=2",
                0,
            ),
            (
                "[rank1]: train.py: error: argument --gradient_checkpointing: expected one argument",
                1,
            ),
            (
                "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--gradient_accumulation_steps', '2']",
                0,
            ),
            (
                "Error: No such option '--gradient_accumulation_steps'. Did you mean '--gradient_checkpointing'?",
                0,
            ),
            ("Error: No such option: --gradient_checkpointing", 1),
            (
                "tip: For details of accepted options run: x.py --help\nerror: unrecognized arguments: --gradient_checkpointing",
                1,
            ),
        ] {
            let r = refused(out.as_bytes(), &flags);
            assert_eq!(r.map(|r| r.index), Some(want), "{out}");
        }
        let overrides = added(&["++trainer.accumulate_grad_batches", "++data.batch_size"]);
        for (out, want) in [
            (
                "Could not override 'trainer.accumulate_grad_batches'.\nTo append to your config use +trainer.accumulate_grad_batches=2",
                0,
            ),
            ("Key 'accumulate_grad_batches' not in 'Trainer'", 0),
            (
                "omegaconf.errors.ConfigKeyError: Key '++trainer.accumulate_grad_batches' not in 'Config'",
                0,
            ),
            (
                "omegaconf.errors.ConfigAttributeError: Key 'batch_size' is not in struct",
                1,
            ),
            (
                "TypeError(\"Trainer.__init__() got an unexpected keyword argument 'accumulate_grad_batches'\")",
                0,
            ),
            (
                "Could not append to config. An item is already at 'data.batch_size'.",
                1,
            ),
            (
                "lightning.fabric.utilities.exceptions.MisconfigurationException: Automatic gradient accumulation is not supported for manual optimization. Remove `Trainer(accumulate_grad_batches=2)` or switch to automatic optimization.",
                0,
            ),
        ] {
            let r = refused(out.as_bytes(), &overrides);
            assert_eq!(r.map(|r| r.index), Some(want), "{out}");
        }
    }

    /// A refusal of something else (the user's own flag, a longer name), or an added
    /// name outside a refusal, is not oomguard's doing.
    #[test]
    fn a_refusal_of_something_else_is_not_oomguards() {
        let flags = added(&["--gradient_accumulation_steps"]);
        for out in [
            "train.py: error: unrecognized arguments: --lr_sched cosine",
            "train.py: error: unrecognized arguments: --gradient_accumulation_steps_x 2",
            "train.py: error: argument --gradient_accumulation_steps_total: invalid int value",
            "using --gradient_accumulation_steps 2",
            "RuntimeError: something failed at --gradient_accumulation_steps",
        ] {
            assert_eq!(refused(out.as_bytes(), &flags), None, "{out}");
        }
        let overrides = added(&["++trainer.accumulate_grad_batches"]);
        assert_eq!(
            refused(b"Key 'max_steps' not in 'Trainer'", &overrides),
            None
        );
        // Lightning's refusal of the user's own clipping, not of what was added.
        let cli = added(&["--trainer.accumulate_grad_batches"]);
        assert_eq!(
            refused(
                b"MisconfigurationException: Automatic gradient clipping is not supported for manual optimization. Remove `Trainer(gradient_clip_val=1.0)` or switch to automatic optimization.",
                &cli
            ),
            None
        );
    }

    /// Lightning refuses the accumulation oomguard added, as a LightningCLI flag or a
    /// plain script's, for a module that optimizes by hand.
    #[test]
    fn lightnings_refusal_of_accumulation_for_manual_optimization_is_found() {
        let line = b"lightning.fabric.utilities.exceptions.MisconfigurationException: Automatic gradient accumulation is not supported for manual optimization. Remove `Trainer(accumulate_grad_batches=2)` or switch to automatic optimization.\n";
        for a in [
            "--trainer.accumulate_grad_batches",
            "--accumulate_grad_batches",
            "++trainer.accumulate_grad_batches",
        ] {
            let r = refused(line, &added(&["--batch_size", a]));
            assert_eq!(r.map(|r| r.index), Some(1), "{a}");
        }
    }
}
