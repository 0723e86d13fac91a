//! When in the run an OOM happened — loading a checkpoint, saving one,
//! evaluating, or training — read from the attempt's output around the OOM
//! line. (The training phase is told apart further by the step reached, in
//! `evidence::Evidence::when`: the first step, or the steady state.)
//!
//! Theory of operation: the traceback that ends in the OOM names the frames
//! it ran through, outermost first. Scanned from the innermost frame out, the
//! first frame that names a phase decides: loading a checkpoint or weights
//! ([`LOAD_FRAMES`]: `load_state_dict`, the Trainer's `_load_from_checkpoint`
//! and `_load_optimizer_and_scheduler`, `torch.load`'s frames in
//! `torch/serialization.py`, DeepSpeed's `load_checkpoint`, accelerate's
//! `load_state`, Lightning's `restore_training_state`, ...), saving one
//! ([`SAVE_FRAMES`]: `save_model`, `_save_checkpoint`, `consolidate_state_dict`,
//! DeepSpeed's `_zero3_consolidated_16bit_state_dict`, FSDP's
//! `_full_pre_state_dict_hook`, Lightning's `dump_checkpoint`, ...), an
//! evaluation ([`EVAL_FRAMES`]: `prediction_step`, `evaluation_loop`,
//! `validation_step`, `estimate_loss`, ...) or a training step
//! ([`TRAIN_FRAMES`]: `training_step`, `backward`, `optimizer_step`, ...).
//! Innermost first, because the phases nest: evaluation and saving run inside
//! the training loop (`_inner_training_loop` → `_maybe_log_save_evaluate` →
//! `evaluate` or `_save_checkpoint`), and the Trainer loads the optimizer's
//! state from inside its training loop too; `_maybe_log_save_evaluate` names no
//! phase. Only the lines of the process that printed the OOM count (the same
//! launcher prefix, `[rank1]:`), from the last `Traceback (most recent call
//! last):` before the OOM line. Three frame styles are read: Python's
//! (`File "x.py", line 3, in f`), rich's (`x.py:3 in f`) and IPython's
//! (`File x.py:3, in Trainer.f(...)`).
//!
//! When no frame names a phase (no traceback, a trimmed one, frames of user
//! code only), the last progress before the OOM line decides: a load's start
//! (`Restoring states from the checkpoint path`, `Loading model from`,
//! `Loading states from`), a save's start (`Saving model checkpoint to`,
//! DeepSpeed's `is about to be saved!`), an evaluation's start (`*****
//! Running Evaluation *****`, a bar described `Validation`, ...) or a sign of
//! training (the Trainer's `{'loss': ...}` log dict, its `{'eval_loss': ...}`
//! dict that ends an evaluation, a bar described `Epoch`/`train`, a load or a
//! save said to be done). Nothing found is `None`: the decision then is the
//! one any OOM gets.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Where in the run an OOM happened, as its output tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Loading a checkpoint (resuming) or weights: a transient peak that no
    /// smaller batch lowers.
    Loading,
    /// Writing a checkpoint (a full state dict gathered on one rank).
    Saving,
    /// An evaluation inside training.
    Evaluation,
    /// A training step.
    Training,
}

impl Phase {
    /// Its name, as the journal writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Saving => "saving",
            Phase::Evaluation => "evaluation",
            Phase::Training => "training",
        }
    }
}

/// The phase an OOM happened in, and how that was told ("the traceback runs
/// through _load_optimizer_and_scheduler").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub phase: Phase,
    pub how: String,
}

/// What FSDP's warning says when cloning a parameter for a full state dict
/// fails (`Failed to clone() tensor with name ... Error: CUDA out of memory`).
const FSDP_CLONE_WARNING: &str = "this state_dict entry could point to invalid memory";

/// Function names whose frame means the code loads a checkpoint or weights.
pub const LOAD_FRAMES: &[&str] = &[
    // PyTorch modules and optimizers, safetensors
    "load_state_dict",
    "_load_from_state_dict",
    "load_file",
    "safe_load_file",
    // Hugging Face Trainer
    "_load_from_checkpoint",
    "_load_optimizer_and_scheduler",
    "_load_best_model",
    "_load_rng_state",
    "load_sharded_checkpoint",
    "_load_state_dict_into_meta_model",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    // DeepSpeed
    "load_checkpoint",
    "_load_checkpoint",
    "_load_zero_checkpoint",
    "load_module_state_dict",
    "_load_optimizer_state",
    "load_optimizer_state",
    "_restore_from_bit16_weights",
    "_restore_base_optimizer_state",
    // accelerate
    "load_state",
    "load_accelerator_state",
    "load_checkpoint_in_model",
    // Lightning (the checkpoint connector's restore)
    "_restore_modules_and_callbacks",
    "restore_training_state",
    "restore_optimizers_and_schedulers",
    "restore_optimizers",
    "restore_model",
    "resume_start",
    "load_optimizer_state_dict",
    "load_model_state_dict",
    // torch.distributed.checkpoint, torchtune, Megatron, plain scripts
    "load_checkpoint_and_dispatch",
    "set_state_dict",
    "set_optimizer_state_dict",
    "load_from_checkpoint",
    "resume_from_checkpoint",
    "load_ckpt",
    "load_checkpoint_from_path",
];

/// `torch.load`'s own frames (`torch/serialization.py`): loading when the
/// frame's file is that module.
const TORCH_LOAD_FRAMES: &[&str] = &[
    "load",
    "_load",
    "persistent_load",
    "load_tensor",
    "restore_location",
    "default_restore_location",
    "_cuda_deserialize",
];

/// Function names whose frame means the code writes a checkpoint.
pub const SAVE_FRAMES: &[&str] = &[
    // Hugging Face Trainer, PEFT, save_pretrained
    "_save_checkpoint",
    "save_model",
    "_save",
    "_save_optimizer_and_scheduler",
    "save_pretrained",
    "_save_tpu",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "get_peft_model_state_dict",
    // DeepSpeed
    "save_checkpoint",
    "_save_checkpoint_files",
    "_save_zero_checkpoint",
    "save_16bit_model",
    "_zero3_consolidated_16bit_state_dict",
    "_consolidated_16bit_state_dict",
    "gather_16bit_weights_on_model_save",
    // accelerate, FSDP, torch.distributed.checkpoint
    "save_state",
    "get_state_dict",
    "_full_pre_state_dict_hook",
    "_full_post_state_dict_hook",
    "full_optim_state_dict",
    "optim_state_dict",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "consolidate_state_dict",
    "_consolidate_state_dict",
    // Lightning (the checkpoint connector and ModelCheckpoint)
    "dump_checkpoint",
    "_save_topk_checkpoint",
    "_save_last_checkpoint",
    "_save_none_monitor_checkpoint",
    "_save_monitor_checkpoint",
    "on_save_checkpoint",
    // plain scripts
    "save_ckpt",
    "checkpoint_model",
    "save_model_and_optimizer_sharded",
    "fsdp_save_ckpt",
];

/// `torch.save`'s own frames (`torch/serialization.py`).
const TORCH_SAVE_FRAMES: &[&str] = &["save", "_save", "_legacy_save"];

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

/// Function names whose frame means the code runs a training step.
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
];

/// The most lines looked back from the OOM line for its traceback.
const TRACEBACK_LINES: usize = 4000;
/// The most lines looked back from the OOM line for progress.
const PROGRESS_LINES: usize = 20000;
/// The most of the log read: its end.
const TAIL_BYTES: u64 = 4 << 20;

/// A frame, in Python's style (`File "trainer.py", line 2988, in
/// evaluation_loop`), rich's (`trainer.py:2830 in save_model`) or IPython's
/// (`File ~/trainer.py:1633, in Trainer.train(self, ...)`): the file and the
/// function (its last dotted part).
static FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:File "(?P<f1>[^"]*)", line \d+, in (?P<n1>[A-Za-z_][A-Za-z0-9_]*))|(?:(?P<f2>[^\s│|"]+\.py):\d+,? in (?:[A-Za-z_][A-Za-z0-9_]*\.)*(?P<n2>[A-Za-z_<][A-Za-z0-9_>]*))"#,
    )
    .expect("frame pattern")
});

/// The phase of the OOM whose line is `oom_line` (as the scanner found it),
/// read from the end of the attempt's output `log`. `None`: it cannot be told
/// (nothing names a phase, or the line is not in the log: another copy's OOM,
/// a per-task file).
pub fn from_log(log: &Path, oom_line: &str) -> Option<Seen> {
    let mut f = File::open(log).ok()?;
    let md = f.metadata().ok()?;
    if !md.is_file() {
        return None;
    }
    f.seek(SeekFrom::Start(md.len().saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf).ok()?;
    classify(
        &String::from_utf8_lossy(crate::run_folder::after_omitted(&buf)),
        oom_line,
    )
}

/// [`from_log`] on the output's text.
pub fn classify(text: &str, oom_line: &str) -> Option<Seen> {
    let key = key_of(oom_line)?;
    let lines: Vec<&str> = text.split(['\n', '\r']).collect();
    let (at, prefix) = lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| l.find(key).map(|p| (i, &l[..p])))?;
    let before = &lines[..at];
    // FSDP's own warning while it gathers a full state dict (its
    // `_full_post_state_dict_hook` clones each parameter) carries the OOM.
    if lines[at].contains(FSDP_CLONE_WARNING) {
        return Some(Seen {
            phase: Phase::Saving,
            how: "FSDP's full state dict ran out while cloning a parameter (Failed to clone() tensor)"
                .to_string(),
        });
    }
    if let Some((phase, name)) =
        from_frames(before, prefix).or_else(|| from_frames_after(&lines[at + 1..], prefix))
    {
        return Some(Seen {
            phase,
            how: format!("the traceback runs through {name}"),
        });
    }
    // A load's or a save's OOM shows its frames (`load_state_dict`, `torch.save`,
    // `_save_checkpoint`, ...): a traceback of the OOM's process that names none
    // of them is no load's or save's, whatever a start line printed before it
    // says (a script that prints "Saving model checkpoint to" after its save).
    let traceback = traceback_seen(before, prefix);
    from_progress(before)
        .filter(|(phase, _)| !(traceback && matches!(phase, Phase::Loading | Phase::Saving)))
        .map(|(phase, line)| Seen {
            phase,
            how: format!("the last progress before it: {line}"),
        })
}

/// Whether a traceback of the OOM's process (its header and at least one frame)
/// ends at the OOM line.
fn traceback_seen(before: &[&str], prefix: &str) -> bool {
    let mut frames = 0;
    for line in before.iter().rev().take(TRACEBACK_LINES) {
        let Some(line) = same_process(line, prefix) else {
            continue;
        };
        if FRAME.is_match(line) {
            frames += 1;
        }
        if line.contains("Traceback (most recent call last)") {
            return frames > 0;
        }
    }
    false
}

/// Whether the OOM happened during evaluation, and how that was told.
#[cfg(test)]
pub fn during_evaluation(text: &str, oom_line: &str) -> Option<String> {
    classify(text, oom_line)
        .filter(|s| s.phase == Phase::Evaluation)
        .map(|s| s.how)
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

/// The phase a frame (its file and function name) names, if any.
fn frame_phase(file: &str, name: &str) -> Option<Phase> {
    let torch_io = file.replace('\\', "/").ends_with("torch/serialization.py");
    if torch_io && TORCH_LOAD_FRAMES.contains(&name) {
        Some(Phase::Loading)
    } else if torch_io && TORCH_SAVE_FRAMES.contains(&name) {
        Some(Phase::Saving)
    } else if LOAD_FRAMES.contains(&name) {
        Some(Phase::Loading)
    } else if SAVE_FRAMES.contains(&name) {
        Some(Phase::Saving)
    } else if EVAL_FRAMES.contains(&name) {
        Some(Phase::Evaluation)
    } else if TRAIN_FRAMES.contains(&name) {
        Some(Phase::Training)
    } else {
        None
    }
}

/// The phase the innermost deciding frame of the traceback before the OOM
/// names, and its function name.
fn from_frames<'a>(before: &[&'a str], prefix: &str) -> Option<(Phase, &'a str)> {
    let mut frames: Vec<(&'a str, &'a str)> = Vec::new();
    let mut header = false;
    for line in before.iter().rev().take(TRACEBACK_LINES) {
        let Some(line) = same_process(line, prefix) else {
            continue;
        };
        if let Some(c) = FRAME.captures(line) {
            let file = c.name("f1").or(c.name("f2")).map_or("", |m| m.as_str());
            let name = c.name("n1").or(c.name("n2")).map_or("", |m| m.as_str());
            frames.push((file, name));
        }
        // Python's header, IPython's and rich's (`Traceback (most recent call last)`
        // in a box).
        if line.contains("Traceback (most recent call last)") {
            header = true;
            break;
        }
    }
    // A paste or a log tail that starts inside the traceback: its frames run
    // up to the first line, with no other output between them.
    let trimmed = !header
        && before.len() <= TRACEBACK_LINES
        && !frames.is_empty()
        && before.iter().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with("File ") || l.starts_with('^') || !l.contains(": ")
        });
    if !header && !trimmed {
        return None;
    }
    // Collected innermost first.
    frames
        .into_iter()
        .find_map(|(file, name)| frame_phase(file, name).map(|p| (p, name)))
}

/// A logger that prints the exception's message before its traceback (mmf's
/// `ERROR: CUDA out of memory ...` then `Traceback (most recent call last):`):
/// the traceback that starts on the next line of the same process, read up to
/// the first line that is not part of it. Innermost deciding frame first, as
/// before the OOM line.
fn from_frames_after<'a>(after: &[&'a str], prefix: &str) -> Option<(Phase, &'a str)> {
    let mut it = after
        .iter()
        .filter_map(|l| same_process(l, prefix))
        .skip_while(|l| l.trim().is_empty());
    if !it.next()?.contains("Traceback (most recent call last)") {
        return None;
    }
    let mut frames: Vec<(&'a str, &'a str)> = Vec::new();
    for line in it.take(TRACEBACK_LINES) {
        if let Some(c) = FRAME.captures(line) {
            let file = c.name("f1").or(c.name("f2")).map_or("", |m| m.as_str());
            let name = c.name("n1").or(c.name("n2")).map_or("", |m| m.as_str());
            frames.push((file, name));
        } else if !line.starts_with(' ') && !line.trim().is_empty() {
            // The exception line ends the traceback.
            break;
        }
    }
    frames
        .into_iter()
        .rev()
        .find_map(|(file, name)| frame_phase(file, name).map(|p| (p, name)))
}

/// The phase the last progress line before the OOM marks, and the line.
fn from_progress(before: &[&str]) -> Option<(Phase, String)> {
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

/// The phase a line of output marks, if any. A load or a save is marked only
/// by the lines a framework prints as it starts one, and ends by the lines it
/// prints when it is done (a training mark): a script's own "resuming from"
/// or "loading model" lines come before training too, and would take a first
/// step's OOM for a load's.
fn mark(line: &str) -> Option<Phase> {
    static HF_LOAD: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"loading model from \S*checkpoint-\d+").expect("load pattern")
    });
    let l = line.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| l.contains(w));
    // A load or a save said to be done, and the Trainer's log dicts: a
    // training step's, and the one that ends an evaluation.
    if has(&[
        "{'loss':",
        "{\"loss\":",
        "{'eval_",
        "{\"eval_",
        "***** running training *****",
        "continuing training from checkpoint",
        "restored all states from the checkpoint",
        "is ready now!",
        "loaded successfully",
        "saved in ",
        "deleting older checkpoint",
    ]) {
        return Some(Phase::Training);
    }
    if HF_LOAD.is_match(&l)
        || has(&[
            "restoring states from the checkpoint",
            "loading states from ",
        ])
    {
        return Some(Phase::Loading);
    }
    if has(&[
        "saving model checkpoint to",
        "is about to be saved!",
        "saving model checkpoint:",
        "saving model to ",
    ]) {
        return Some(Phase::Saving);
    }
    if has(&[
        "***** running evaluation",
        "***** running prediction",
        "running evaluation",
        "sanity checking",
        "validation dataloader",
        "testing dataloader",
    ]) {
        return Some(Phase::Evaluation);
    }
    bar_mark(&l)
}

/// A progress bar's description (`Validation DataLoader 0:  40%|`,
/// `Epoch 1:  20%|`, `Evaluating: 3/10 [`): the phase it names. A bar
/// without one (the Trainer's own) names none.
fn bar_mark(l: &str) -> Option<Phase> {
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
        Some(Phase::Evaluation)
    } else if ["train", "epoch", "step", "iter"]
        .iter()
        .any(|w| desc.contains(w))
    {
        Some(Phase::Training)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_line_before_a_traceback_without_load_or_save_frames_is_no_save() {
        // A script that prints its save line after saving, then OOMs in the next
        // step's forward: the traceback runs through no save frame.
        let log = "step 2/6 micro=8 loss=0.1\nSaving model checkpoint to out/checkpoint-2\n\
                   Traceback (most recent call last):\n  File \"/w/ddp_oom.py\", line 130, in main\n    \
                   loss = model(x)\n  File \"/w/ddp_oom.py\", line 63, in forward\n    raise oom\n\
                   torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n";
        let seen = classify(
            log,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        );
        assert!(
            seen.as_ref().is_none_or(|s| s.phase != Phase::Saving),
            "{seen:?}"
        );
        // Without a traceback the start line still tells a save.
        let log = "Saving model checkpoint to out/checkpoint-2\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n";
        let seen = classify(
            log,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        );
        assert_eq!(seen.map(|s| s.phase), Some(Phase::Saving));
    }

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

    /// The phase of each real Trainer log (`tests/fixtures/phase/`): loading the
    /// optimizer's state on resume, saving (a state-dict hook and the optimizer's
    /// save), evaluation, a training step.
    #[test]
    fn the_phase_of_real_trainer_logs() {
        let cases: &[(&str, Phase, &str)] = &[
            (
                include_str!("../../tests/fixtures/phase/hf5_trainer_load_oom.log"),
                Phase::Loading,
                "load_state_dict",
            ),
            (
                include_str!("../../tests/fixtures/phase/hf5_trainer_save_state_dict_oom.log"),
                Phase::Saving,
                "save_pretrained",
            ),
            (
                include_str!("../../tests/fixtures/phase/hf5_trainer_save_oom.log"),
                Phase::Saving,
                "_save_checkpoint",
            ),
            (
                include_str!("../../tests/fixtures/phase/hf5_trainer_eval_oom.log"),
                Phase::Evaluation,
                "prediction_step",
            ),
            (
                include_str!("../../tests/fixtures/phase/hf5_trainer_train_oom.log"),
                Phase::Training,
                "training_step",
            ),
        ];
        for (log, phase, frame) in cases {
            let got = classify(log, &oom_line(log)).expect("a phase");
            assert_eq!(
                (got.phase, got.how.as_str()),
                (
                    *phase,
                    format!("the traceback runs through {frame}").as_str()
                )
            );
        }
    }

    /// Each family's load and save frames, nested in its training loop; the
    /// innermost frame that names a phase decides; torch.load's and
    /// torch.save's own frames count only in torch/serialization.py.
    #[test]
    fn load_and_save_frames_across_families() {
        let ser = "/venv/lib/python3.11/site-packages/torch/serialization.py";
        type Frames<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Frames, Option<Phase>)] = &[
            // HF Trainer resuming: the optimizer's state.
            (
                &[
                    ("t.py", "train"),
                    ("t.py", "_inner_training_loop"),
                    ("t.py", "_load_optimizer_and_scheduler"),
                    ("o.py", "load_state_dict"),
                    ("o.py", "_process_value_according_to_param_policy"),
                ],
                Some(Phase::Loading),
            ),
            // torch.load itself, under a user's resume().
            (
                &[
                    ("train.py", "main"),
                    ("train.py", "resume"),
                    (ser, "load"),
                    (ser, "_load"),
                    (ser, "persistent_load"),
                    (ser, "restore_location"),
                ],
                Some(Phase::Loading),
            ),
            // A user function named load outside torch/serialization.py tells nothing.
            (
                &[
                    ("train.py", "main"),
                    ("data.py", "load"),
                    ("m.py", "forward"),
                ],
                None,
            ),
            // DeepSpeed and accelerate, Lightning's restore.
            (
                &[
                    ("e.py", "load_checkpoint"),
                    ("e.py", "_load_zero_checkpoint"),
                    ("z.py", "load_state_dict"),
                ],
                Some(Phase::Loading),
            ),
            (
                &[("a.py", "load_state"), ("c.py", "load_accelerator_state")],
                Some(Phase::Loading),
            ),
            (
                &[
                    ("t.py", "fit"),
                    ("t.py", "_run"),
                    ("c.py", "restore_training_state"),
                    ("c.py", "restore_optimizers_and_schedulers"),
                ],
                Some(Phase::Loading),
            ),
            // Saving: the Trainer under DeepSpeed ZeRO-3, FSDP's full state dict, Lightning.
            (
                &[
                    ("t.py", "_maybe_log_save_evaluate"),
                    ("t.py", "_save_checkpoint"),
                    ("t.py", "save_model"),
                    ("e.py", "_zero3_consolidated_16bit_state_dict"),
                ],
                Some(Phase::Saving),
            ),
            (
                &[
                    ("u.py", "main"),
                    ("f.py", "state_dict"),
                    ("s.py", "_pre_state_dict_hook"),
                    ("s.py", "_full_pre_state_dict_hook"),
                    ("s.py", "_common_unshard_pre_state_dict_hook"),
                ],
                Some(Phase::Saving),
            ),
            (
                &[
                    ("t.py", "fit"),
                    ("m.py", "on_train_epoch_end"),
                    ("m.py", "_save_topk_checkpoint"),
                    ("c.py", "dump_checkpoint"),
                ],
                Some(Phase::Saving),
            ),
            (
                &[("train.py", "main"), (ser, "save"), (ser, "_save")],
                Some(Phase::Saving),
            ),
            // A training step after a resume: training, however the run started.
            (
                &[
                    ("t.py", "train"),
                    ("t.py", "training_step"),
                    ("m.py", "forward"),
                ],
                Some(Phase::Training),
            ),
            // An evaluation's frames under the save's caller: evaluation.
            (
                &[
                    ("t.py", "_maybe_log_save_evaluate"),
                    ("t.py", "evaluate"),
                    ("t.py", "prediction_step"),
                ],
                Some(Phase::Evaluation),
            ),
        ];
        for (frames, want) in cases {
            let mut log = "Traceback (most recent call last):\n".to_string();
            for (f, n) in frames.iter() {
                log.push_str(&format!("  File \"{f}\", line 7, in {n}\n    x()\n"));
            }
            log.push_str(&format!("{OOM}\n"));
            assert_eq!(classify(&log, OOM).map(|s| s.phase), *want, "{frames:?}");
        }
    }

    /// rich's and IPython's frame styles are read too.
    #[test]
    fn rich_and_ipython_frames_are_read() {
        let rich = format!(
            "╭───── Traceback (most recent call last) ─────╮\n│ /x/trainer.py:1633 in train                 │\n│ /x/trainer.py:2830 in save_model            │\n╰─────────────────────────────────────────────╯\n{OOM}\n"
        );
        assert_eq!(classify(&rich, OOM).map(|s| s.phase), Some(Phase::Saving));
        let ipython = format!(
            "OutOfMemoryError                          Traceback (most recent call last)\nFile ~/t/trainer.py:1633, in Trainer.train(self, resume_from_checkpoint)\nFile ~/t/trainer.py:2010, in Trainer._load_from_checkpoint(self, resume_from_checkpoint)\n{OOM}\n"
        );
        assert_eq!(
            classify(&ipython, OOM).map(|s| s.phase),
            Some(Phase::Loading)
        );
    }

    /// Without frames, a framework's own lines mark a load or a save only until
    /// it says it is done; a script's own "resuming" line marks nothing.
    #[test]
    fn load_and_save_progress_marks_end_when_the_framework_says_done() {
        let tail = format!("{OOM}\n");
        let cases: &[(&str, Option<Phase>)] = &[
            (
                "Restoring states from the checkpoint path at /c/last.ckpt\n",
                Some(Phase::Loading),
            ),
            (
                "Restoring states from the checkpoint path at /c/last.ckpt\nRestored all states from the checkpoint at /c/last.ckpt\n",
                Some(Phase::Training),
            ),
            (
                "Loading model from out/checkpoint-500.\n",
                Some(Phase::Loading),
            ),
            (
                "Loading model from out/checkpoint-500.\n***** Running training *****\n",
                Some(Phase::Training),
            ),
            (
                "[Torch] Checkpoint global_step10 is about to be saved!\n",
                Some(Phase::Saving),
            ),
            (
                "[Torch] Checkpoint global_step10 is about to be saved!\n[Torch] Checkpoint global_step10 is ready now!\n",
                Some(Phase::Training),
            ),
            (
                "Saving model checkpoint to out/checkpoint-500\n",
                Some(Phase::Saving),
            ),
            (
                "Saving model checkpoint to out/checkpoint-500\nModel weights saved in out/checkpoint-500/model.safetensors\n",
                Some(Phase::Training),
            ),
            ("resuming from out/checkpoint-2\n", None),
            ("Loading model from /models/llama\n", None),
        ];
        for (progress, want) in cases {
            let log = format!("{progress}{tail}");
            assert_eq!(classify(&log, OOM).map(|s| s.phase), *want, "{progress:?}");
        }
    }

    /// The body of a labelled corpus log (after its `# ---` line) and its
    /// `# phase:` header, if any.
    fn corpus_log(name: &str) -> (String, Option<String>) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/corpus/logs")
            .join(name);
        let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
        let at = text.find("# ---\n").expect("a '# ---' line") + "# ---\n".len();
        let phase = text[..at]
            .lines()
            .find_map(|l| l.strip_prefix("# phase:"))
            .map(|v| v.trim().to_string());
        (text[at..].to_string(), phase)
    }

    /// Public threads' logs of an OOM while resuming from a checkpoint and while
    /// saving one (tests/fixtures/corpus/logs, each with its `# source:`): the
    /// phase each is told as, and how. Covers a logger that prints the OOM line
    /// before its traceback (mmf), pastes that start inside the traceback
    /// (torch.load's frames), and FSDP's full-state-dict warning that carries
    /// the OOM. Every corpus log with a `# phase:` header is in the table.
    #[test]
    fn the_phase_of_public_threads_load_and_save_logs() {
        let cases: &[(&str, Phase, &str)] = &[
            // mmf: ERROR line first, then the traceback through the optimizer's load.
            (
                "cuda_oom-91.txt",
                Phase::Loading,
                "the traceback runs through load_state_dict",
            ),
            // transformer-lm: optimizer.load_state_dict(torch.load(...)), paste starts mid-traceback.
            (
                "cuda_oom-92.txt",
                Phase::Loading,
                "the traceback runs through _cuda_deserialize",
            ),
            // SPIN: torch.load onto the GPU, the older 'CUDA error: out of memory'.
            (
                "cuda_oom-93.txt",
                Phase::Loading,
                "the traceback runs through _cuda_deserialize",
            ),
            // HF Trainer + FSDP: the full state dict for the save (three threads).
            ("cuda_oom-94.txt", Phase::Saving, "FSDP's full state dict"),
            ("cuda_oom-95.txt", Phase::Saving, "FSDP's full state dict"),
            ("cuda_oom-96.txt", Phase::Saving, "FSDP's full state dict"),
        ];
        for (name, phase, how) in cases {
            let (body, header) = corpus_log(name);
            let f = crate::detect::classify_log(body.as_bytes());
            assert_eq!(f.kind.as_str(), "cuda_oom", "{name}");
            let got = classify(&body, &f.line).unwrap_or_else(|| panic!("{name}: no phase"));
            assert_eq!(got.phase, *phase, "{name}: {}", got.how);
            assert!(got.how.starts_with(how), "{name}: {}", got.how);
            let want = serde_json::to_value(phase).unwrap();
            assert_eq!(
                header.as_deref(),
                want.as_str(),
                "{name}: its # phase: header"
            );
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus/logs");
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".txt") && corpus_log(&name).1.is_some() {
                assert!(
                    cases.iter().any(|c| c.0 == name),
                    "{name} has a phase header but no row"
                );
            }
        }
    }

    /// A traceback after the OOM line is read only when it starts on the next
    /// line of the same process; one of another rank, or one after other output,
    /// is not.
    #[test]
    fn a_traceback_after_the_oom_line_counts_only_right_after_it() {
        let tb = "Traceback (most recent call last):\n  File \"t.py\", line 3, in load_state_dict\n    deepcopy(s)\nRuntimeError: boom\n";
        let got = classify(&format!("{OOM}\n{tb}"), OOM).expect("a phase");
        assert_eq!(got.phase, Phase::Loading);
        assert_eq!(classify(&format!("{OOM}\nstep 3 done\n{tb}"), OOM), None);
        let other = tb
            .lines()
            .map(|l| format!("[rank1]: {l}\n"))
            .collect::<String>();
        assert_eq!(classify(&format!("[rank0]: {OOM}\n{other}"), OOM), None);
        // A frame that names no phase, then the exception: nothing is told.
        let plain = "Traceback (most recent call last):\n  File \"t.py\", line 3, in main\n    f()\nRuntimeError: boom\n  File \"u.py\", line 1, in load_state_dict\n";
        assert_eq!(classify(&format!("{OOM}\n{plain}"), OOM), None);
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
