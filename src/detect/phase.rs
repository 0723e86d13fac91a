//! Whether an OOM happened during evaluation rather than training, read from
//! the attempt's output around the OOM line.
//!
//! Theory of operation: the traceback that ends in the OOM names the frames
//! it ran through, outermost first. Scanned from the innermost frame out, the
//! first frame that names a phase decides: an evaluation frame
//! ([`EVAL_FRAMES`]: the Hugging Face Trainer's `prediction_step`,
//! `evaluation_loop`, `evaluate`; Lightning's `validation_step`,
//! `_evaluation_step`; `eval_step`, `validate`, nanoGPT's `estimate_loss`, ...)
//! or a training or saving frame ([`TRAIN_FRAMES`]: `training_step`,
//! `backward`, `optimizer_step`, `_save_checkpoint`, ...). Innermost first,
//! because evaluation runs inside the training loop (`_inner_training_loop` →
//! `_maybe_log_save_evaluate` → `evaluate`), and the Trainer's
//! `_maybe_log_save_evaluate` also saves checkpoints, so it names no phase.
//! Only the lines of the process that printed the OOM count (the same
//! launcher prefix, `[rank1]:`), from the last `Traceback (most recent call
//! last):` before the OOM line.
//!
//! When no frame names a phase (no traceback, a trimmed one, frames of user
//! code only), the last progress before the OOM line decides: an evaluation's
//! start (`***** Running Evaluation *****`, a bar described `Validation`,
//! `Evaluating`, `Sanity Checking`, ...) or a sign of training (the Trainer's
//! `{'loss': ...}` log dict, its `{'eval_loss': ...}` dict that ends an
//! evaluation, a bar described `Epoch`/`train`). Nothing found is training:
//! the decision then is the one any OOM gets.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;

/// Function names whose frame means the code runs an evaluation.
/// (`_maybe_log_save_evaluate` is not one: it saves checkpoints too.)
pub const EVAL_FRAMES: &[&str] = &[
    // Hugging Face Trainer (and Seq2SeqTrainer, TRL)
    "evaluate",
    "_evaluate",
    "evaluation_loop",
    "prediction_loop",
    "prediction_step",
    "predict",
    // Lightning
    "validation_step",
    "test_step",
    "predict_step",
    "_evaluation_step",
    "_evaluation_loop",
    "_run_sanity_check",
    // accelerate loops, plain scripts and other trainers
    "eval_step",
    "evaluation_step",
    "val_step",
    "valid_step",
    "eval_batch",
    "eval_loop",
    "evaluate_loop",
    "eval_epoch",
    "val_epoch",
    "validate",
    "_validate",
    "validate_epoch",
    "validation_loop",
    "run_validation",
    "_run_validation",
    "run_evaluation",
    "run_eval",
    "evaluate_and_print_results",
    "estimate_loss",
];

/// Function names whose frame means the code trains (or saves), not evaluates.
pub const TRAIN_FRAMES: &[&str] = &[
    "training_step",
    "train_step",
    "train_batch",
    "training_step_and_backward",
    "backward",
    "optimizer_step",
    "_optimizer_step",
    "_backward_and_opt",
    "fwbw",
    "_save_checkpoint",
    "save_checkpoint",
    "save_model",
    "_save_optimizer_and_scheduler",
];

/// The most lines looked back from the OOM line for its traceback.
const TRACEBACK_LINES: usize = 4000;
/// The most lines looked back from the OOM line for progress.
const PROGRESS_LINES: usize = 20000;
/// The most of the log read: its end.
const TAIL_BYTES: u64 = 4 << 20;

/// `File "trainer.py", line 2988, in evaluation_loop`
static FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"File "[^"]*", line \d+, in ([A-Za-z_][A-Za-z0-9_]*)"#).expect("frame pattern")
});

/// How a line marks the phase the run is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Eval,
    Train,
}

/// Whether the OOM whose line is `oom_line` (as the scanner found it) happened
/// during evaluation, read from the end of the attempt's output `log`; the
/// words saying how it was told. `None`: training, or it cannot be told (the
/// line is not in the log: another copy's OOM, a per-task file).
pub fn from_log(log: &Path, oom_line: &str) -> Option<String> {
    let mut f = File::open(log).ok()?;
    let md = f.metadata().ok()?;
    if !md.is_file() {
        return None;
    }
    f.seek(SeekFrom::Start(md.len().saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf).ok()?;
    during_evaluation(&String::from_utf8_lossy(&buf), oom_line)
}

/// [`from_log`] on the output's text.
pub fn during_evaluation(text: &str, oom_line: &str) -> Option<String> {
    let key = key_of(oom_line)?;
    let lines: Vec<&str> = text.split(['\n', '\r']).collect();
    let (at, prefix) = lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| l.find(key).map(|p| (i, &l[..p])))?;
    let before = &lines[..at];
    match from_frames(before, prefix) {
        Some((Mark::Eval, name)) => Some(format!("the traceback runs through {name}")),
        Some((Mark::Train, _)) => None,
        None => match from_progress(before) {
            Some((Mark::Eval, line)) => Some(format!("the last progress before it: {line}")),
            _ => None,
        },
    }
}

/// What of the OOM line is looked for in the log: its start, trimmed, at most
/// 120 bytes (the scanner may have joined a hard-wrapped message).
fn key_of(oom_line: &str) -> Option<&str> {
    let t = oom_line.trim();
    let mut end = t.len().min(120);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    let key = &t[..end];
    (key.len() >= 8).then_some(key)
}

/// The lines of the process with this launcher prefix (all lines without one).
fn same_process<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let p = prefix.trim();
    if p.is_empty() || p.len() > 40 {
        return Some(line);
    }
    let at = line.find(p)?;
    Some(&line[at + p.len()..])
}

/// The phase the innermost deciding frame of the traceback before the OOM
/// names, and its function name.
fn from_frames<'a>(before: &[&'a str], prefix: &str) -> Option<(Mark, &'a str)> {
    let mut frames: Vec<&'a str> = Vec::new();
    let mut header = false;
    for line in before.iter().rev().take(TRACEBACK_LINES) {
        let Some(line) = same_process(line, prefix) else {
            continue;
        };
        if let Some(c) = FRAME.captures(line) {
            frames.push(c.get(1).map_or("", |m| m.as_str()));
        }
        if line.contains("Traceback (most recent call last)") {
            header = true;
            break;
        }
    }
    if !header {
        return None;
    }
    // Collected innermost first.
    frames.into_iter().find_map(|name| {
        if EVAL_FRAMES.contains(&name) {
            Some((Mark::Eval, name))
        } else if TRAIN_FRAMES.contains(&name) {
            Some((Mark::Train, name))
        } else {
            None
        }
    })
}

/// The phase the last progress line before the OOM marks, and the line.
fn from_progress(before: &[&str]) -> Option<(Mark, String)> {
    before
        .iter()
        .rev()
        .take(PROGRESS_LINES)
        .find_map(|l| mark(l).map(|m| (m, shown(l))))
}

/// The line as a message quotes it: trimmed, at most 80 characters.
fn shown(line: &str) -> String {
    let t = line.trim();
    match t.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_string(),
    }
}

/// The phase a line of output marks, if any.
fn mark(line: &str) -> Option<Mark> {
    let l = line.to_ascii_lowercase();
    // The Trainer's log dicts: a training step's, and the one that ends an evaluation.
    if l.contains("{'loss':")
        || l.contains("{\"loss\":")
        || l.contains("{'eval_")
        || l.contains("{\"eval_")
        || l.contains("***** running training *****")
    {
        return Some(Mark::Train);
    }
    if [
        "***** running evaluation",
        "***** running prediction",
        "running evaluation",
        "sanity checking",
        "validation dataloader",
        "testing dataloader",
    ]
    .iter()
    .any(|w| l.contains(w))
    {
        return Some(Mark::Eval);
    }
    bar_mark(&l)
}

/// A progress bar's description (`Validation DataLoader 0:  40%|`,
/// `Epoch 1:  20%|`, `Evaluating: 3/10 [`): the phase it names. A bar
/// without one (the Trainer's own) names none.
fn bar_mark(l: &str) -> Option<Mark> {
    let end = l.find("%|").or_else(|| {
        static COUNT: LazyLock<Regex> =
            LazyLock::new(|| Regex::new(r"\d+/\d+ \[").expect("count pattern"));
        COUNT.find(l).map(|m| m.start())
    })?;
    let desc = l[..end].trim_end_matches(|c: char| c.is_ascii_digit() || c == ' ' || c == '.');
    let desc = desc.trim_matches(|c: char| c.is_whitespace() || c == ':' || c == '|');
    if desc.is_empty() {
        return None;
    }
    if ["eval", "valid", "test", "predict", "sanity"]
        .iter()
        .any(|w| desc.contains(w))
    {
        Some(Mark::Eval)
    } else if ["train", "epoch", "step", "iter"]
        .iter()
        .any(|w| desc.contains(w))
    {
        Some(Mark::Train)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free.";

    /// The line the scanner takes for the OOM in a log.
    fn oom_line(log: &str) -> String {
        crate::detect::classify_log(log.as_bytes()).line
    }

    fn phase(log: &str) -> Option<String> {
        during_evaluation(log, &oom_line(log))
    }

    /// Real output of a `transformers.Trainer` (5.23, `tests/real/`): the OOM in
    /// its evaluation, in a training step, and while saving a checkpoint from
    /// `_maybe_log_save_evaluate` (the frame that also evaluates).
    #[test]
    fn a_real_trainers_evaluation_is_told_from_its_traceback() {
        let eval = include_str!("../../tests/fixtures/phase/hf5_trainer_eval_oom.log");
        assert_eq!(
            phase(eval).as_deref(),
            Some("the traceback runs through prediction_step")
        );
        let train = include_str!("../../tests/fixtures/phase/hf5_trainer_train_oom.log");
        assert_eq!(phase(train), None);
        let save = include_str!("../../tests/fixtures/phase/hf5_trainer_save_oom.log");
        assert!(save.contains("in _maybe_log_save_evaluate"));
        assert_eq!(phase(save), None);
    }

    fn traceback(prefix: &str, frames: &[&str]) -> String {
        let mut s = format!("{prefix}Traceback (most recent call last):\n");
        for (i, f) in frames.iter().enumerate() {
            s.push_str(&format!(
                "{prefix}  File \"/x/mod{i}.py\", line {}, in {f}\n{prefix}    call()\n",
                10 + i
            ));
        }
        s.push_str(&format!("{prefix}{OOM}\n"));
        s
    }

    /// Each family's evaluation frames, nested in its training loop, decide;
    /// the innermost frame that names a phase wins.
    #[test]
    fn the_innermost_frame_that_names_a_phase_decides_across_families() {
        let cases: &[(&[&str], Option<&str>)] = &[
            // Lightning: validation inside fit, and the sanity check before it.
            (
                &[
                    "fit",
                    "_run_stage",
                    "run",
                    "on_advance_end",
                    "run",
                    "_evaluation_step",
                    "_call_strategy_hook",
                    "validation_step",
                    "forward",
                ],
                Some("validation_step"),
            ),
            (
                &["fit", "_run_sanity_check", "run", "forward"],
                Some("_run_sanity_check"),
            ),
            (&["fit", "run", "advance", "training_step", "forward"], None),
            // An accelerate loop with the user's own evaluate().
            (
                &["main", "train", "evaluate", "__call__", "forward"],
                Some("evaluate"),
            ),
            (&["main", "train", "backward", "_engine_run_backward"], None),
            // nanoGPT.
            (
                &["<module>", "estimate_loss", "forward"],
                Some("estimate_loss"),
            ),
            (&["<module>", "forward", "_call_impl"], None),
            // Training inside an outer evaluate-named frame is training.
            (&["evaluate", "training_step", "forward"], None),
        ];
        for (frames, want) in cases {
            let log = traceback("", frames);
            let got = phase(&log);
            assert_eq!(
                got,
                want.map(|w| format!("the traceback runs through {w}")),
                "{frames:?}"
            );
        }
    }

    /// Under torchrun every rank prints; only the lines of the rank whose OOM
    /// decided count.
    #[test]
    fn only_the_ranks_own_traceback_counts() {
        let mut log = String::new();
        log.push_str("[rank0]:Traceback (most recent call last):\n");
        log.push_str("[rank1]:Traceback (most recent call last):\n");
        log.push_str("[rank0]:  File \"t.py\", line 1, in evaluation_loop\n");
        log.push_str("[rank1]:  File \"t.py\", line 1, in training_step\n");
        log.push_str(&format!("[rank1]:{OOM}\n"));
        assert_eq!(during_evaluation(&log, OOM), None);
        let log = log.replace("[rank1]:Traceback", "[rank9]:Traceback");
        // rank1's header is gone: no traceback of its own, no progress either.
        assert_eq!(during_evaluation(&log, OOM), None);
        let log = traceback("[rank1]: ", &["train", "evaluate", "forward"]);
        assert_eq!(
            during_evaluation(&log, OOM).as_deref(),
            Some("the traceback runs through evaluate")
        );
    }

    /// Without a traceback that names a phase, the last progress decides.
    #[test]
    fn without_telling_frames_the_last_progress_decides() {
        let tail = format!(
            "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n{OOM}\n"
        );
        let cases: &[(&str, bool)] = &[
            (
                "***** Running Evaluation *****\n  Num examples = 32\n",
                true,
            ),
            (
                "Epoch 0:  50%|█████     | 5/10 [00:01<00:01]\rValidation DataLoader 0:  40%|████      | 2/5 [00:00<00:00]\r",
                true,
            ),
            (
                "Sanity Checking DataLoader 0:   0%|          | 0/2 [00:00<?, ?it/s]\r",
                true,
            ),
            ("Evaluating: 3/10 [00:02<00:05, 1.2it/s]\r", true),
            // The evaluation's result dict ends it: training goes on.
            (
                "***** Running Evaluation *****\n{'eval_loss': '4.7', 'epoch': '0.1'}\n",
                false,
            ),
            (
                "{'loss': '4.784', 'grad_norm': '0.56', 'epoch': '0.03'}\n",
                false,
            ),
            ("Epoch 1:  20%|██        | 2/10 [00:01<00:04]\r", false),
            // The Trainer's bars have no description: they tell nothing.
            (" 67%|██████▋   | 4/6 [00:02<00:01,  1.23it/s]\r", false),
            ("", false),
        ];
        for (progress, eval) in cases {
            let log = format!("{progress}{tail}");
            let got = during_evaluation(&log, OOM);
            assert_eq!(got.is_some(), *eval, "{progress:?}: {got:?}");
            if let Some(why) = got {
                assert!(why.starts_with("the last progress before it: "), "{why}");
            }
        }
    }

    /// An OOM line that is not in the log (another copy's, a task file's) says nothing.
    #[test]
    fn an_oom_not_in_the_log_is_not_taken_for_evaluation() {
        let log = traceback("", &["evaluate", "forward"]);
        assert_eq!(
            during_evaluation(&log, "RuntimeError: CUDA error: out of memory"),
            None
        );
    }

    /// None of the labelled real failure logs (every family, every wording) is
    /// an OOM during evaluation: their tracebacks and progress are training's.
    #[test]
    fn no_labelled_failure_log_is_taken_for_evaluation() {
        let dirs = ["tests/fixtures/corpus/logs", "tests/fixtures/logs"];
        let mut seen = 0;
        for dir in dirs {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_none_or(|x| x != "txt" && x != "log") {
                    continue;
                }
                let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
                let f = crate::detect::classify_log(text.as_bytes());
                seen += 1;
                assert_eq!(during_evaluation(&text, &f.line), None, "{}", p.display());
            }
        }
        assert!(seen > 100, "{seen}");
    }
}
