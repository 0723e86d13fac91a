//! The training step an attempt reached, read from its saved output, and the
//! work an OOM cost (the steps redone since the checkpoint resumed from).
//!
//! Theory of operation: the step is read from what the trainer prints, best
//! source first. A tqdm bar (`120/1000 [00:10<01:20, 11.0it/s]`) or a `step N`
//! line names it; a bar that counts something else (`Writing model shards: 1/1`,
//! `Map: 1000/1000 [... examples/s]`) does not. Without either (the Hugging Face
//! Trainer with `--disable_tqdm true`), the Trainer's own log dicts
//! (`{'loss': '2.31', 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}`)
//! are counted: they carry no step, but one is printed every `logging_steps`
//! steps, so with that interval known the n-th dict since the attempt started
//! names its step — exactly at `logging_steps 1`, at least that step above it
//! (the OOM may come up to `logging_steps - 1` steps later). Without the
//! interval the dicts say nothing about the step and are not counted. The
//! supervisor adds the checkpoints the attempt saved (`trainer_state.json`'s
//! `global_step`), again as "at least". A step that cannot be told is unknown,
//! never 0: the work lost after it is "unknown", and a step known only from
//! below makes it "at least".

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use regex::bytes::Regex;
use serde::{Deserialize, Serialize};

/// tqdm bars (`  120/1000 [`), `step 120`, `step=120`, `'step': 120`,
/// `global_step=120`, `iter 120`, `iteration 120`.
static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:(?-u:\b)(?:global_)?step['\x22]?\s*[=: ]\s*(\d{1,12})|(?-u:\b)iter(?:ation)?\s*[=: ]?\s*(\d{1,12})|(?:^|[\s|])(\d{1,12})/\d{1,12} \[)",
    )
    .expect("valid regex")
});

/// A bar's rate: `11.0it/s]`, `?it/s]`, `1.2s/it]`, `12345.67 examples/s]`, `3.2MB/s]`.
static RATE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"([A-Za-z]+)/s(?:,[^\]]*)?\]|s/([A-Za-z]+)(?:,[^\]]*)?\]").expect("valid regex")
});

/// The Hugging Face Trainer's log dict of a training step: `loss` is its first key
/// (`{'eval_loss': ...}` and the end's `{'train_runtime': ...}` are not steps).
/// At most [`MAX_LOG_DICT`] bytes: a bounded repetition in the pattern (`{0,4096}`) made
/// its automaton 14 MiB, built in the middle of a run; the bound is checked on the match.
static LOG_DICT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"\{\s*['"]loss['"]\s*:[^{}\n]*\}"#).expect("valid regex"));

/// The longest log dict counted (a longer brace-delimited line is something else).
const MAX_LOG_DICT: usize = 4096;

/// The log dicts of `text`, in order.
fn log_dicts(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    LOG_DICT
        .find_iter(text)
        .map(|m| m.as_bytes())
        .filter(|m| m.len() <= MAX_LOG_DICT)
}

/// Lightning's bars: tqdm's `Epoch 0:  30%|###  | 3/10 [` and rich's
/// `Epoch 0/-2 ━━━━━ 6/6 0:00:00`: the epoch, the batches of it done, and the
/// epoch's batches (`?` when the loader has no length).
static LIGHTNING_BAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u:\b)Epoch (\d{1,9})(?:/-?\d{1,9})?:?[^\r\n]{0,400}?[ |](\d{1,12})/(-?\d{1,12}|\?)(?: \[| \d)")
        .expect("valid regex")
});

/// What the number a trainer prints counts (a family's convention, see
/// `frameworks`): most print the steps done; some the index of the
/// iteration just done, or the batches of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Counting {
    /// `step N`, a bar's `N/M`: N optimizer steps are done.
    #[default]
    Done,
    /// nanoGPT: `iter N:` is printed after iteration N's update (N + 1 done,
    /// counting from 0), `step N:` (its evaluation) before it (N done).
    IterIndex,
    /// Lightning: its bar counts the epoch's batches, `accum` to a step, and
    /// an epoch ends with a step (its last batches step the optimizer even
    /// short of `accum`): epoch E, batch N of M is E × ⌈M / accum⌉ + ⌊N / accum⌋
    /// steps done. Read only in an attempt that started from step 0 (after a
    /// resume the bar also counts the batches restored, at another
    /// accumulation); past the first epoch only when the bar's total is the
    /// epoch's batches (`epoch_total`: Lightning shows the steps left instead
    /// when they are fewer, with `max_steps` set and `max_epochs` not) and
    /// the bar says it.
    Batches { accum: u64, epoch_total: bool },
    /// fairseq: `num_updates=N` (its simple and tqdm formats), `"num_updates": "N"`
    /// (json): N updates done. Its bars and `epoch 002: 50 / 111` count the epoch's
    /// batches, not updates, and start again each epoch: never read.
    Updates,
}

/// fairseq's count of optimizer updates, in each of its log formats.
static UPDATES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?-u:\b)num_updates['"]?\s*[=:]\s*['"]?\d{1,12}"#).expect("valid regex")
});

/// The last `num_updates` in `buf`.
fn last_updates(buf: &[u8]) -> Option<u64> {
    let m = UPDATES.find_iter(buf).last()?.as_bytes();
    let digits = m.len() - m.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&m[digits..]).ok()?.parse().ok()
}

impl Counting {
    /// This counting for an attempt whose accumulation is `accum`.
    pub fn at_accum(self, accum: Option<u64>) -> Counting {
        match self {
            Counting::Batches { epoch_total, .. } => Counting::Batches {
                accum: accum.unwrap_or(1).max(1),
                epoch_total,
            },
            c => c,
        }
    }
}

/// The steps done that the last step number in `buf` says, read by the
/// trainer's `counting` in an attempt that started from step `from`.
pub fn last_step_counted(buf: &[u8], counting: Counting, from: u64) -> Option<u64> {
    match counting {
        Counting::Done => last_step(buf),
        Counting::IterIndex => last_match(buf).map(|(n, iter)| if iter { n + 1 } else { n }),
        Counting::Updates => last_updates(buf),
        Counting::Batches { accum, epoch_total } => {
            let m = LIGHTNING_BAR.captures_iter(buf).last();
            let bar = m.and_then(|c| {
                let num = |i: usize| {
                    std::str::from_utf8(c.get(i)?.as_bytes())
                        .ok()?
                        .parse::<u64>()
                        .ok()
                };
                Some((num(1)?, num(2)?, num(3).filter(|m| *m > 0)))
            });
            let accum = accum.max(1);
            match bar {
                Some(_) if from != 0 => None,
                Some((0, batches, _)) => Some(batches / accum),
                Some((epoch, batches, Some(per_epoch))) if epoch_total => {
                    let steps_per_epoch = per_epoch.div_ceil(accum);
                    let this_epoch = if batches >= per_epoch {
                        steps_per_epoch
                    } else {
                        batches / accum
                    };
                    epoch
                        .checked_mul(steps_per_epoch)
                        .and_then(|s| s.checked_add(this_epoch))
                }
                Some(_) => None,
                // No Lightning bar: a `step N` line the program prints.
                None => last_step(buf),
            }
        }
    }
}

/// The last `n` bytes of a regular file.
fn tail(log: &Path, n: u64) -> Option<Vec<u8>> {
    let mut f = File::open(log).ok()?;
    let md = f.metadata().ok()?;
    // Only a regular file: a log path that is a device or a FIFO (/dev/full,
    // a pipe) would read forever.
    if !md.is_file() {
        return None;
    }
    f.seek(SeekFrom::Start(md.len().saturating_sub(n))).ok()?;
    let mut buf = Vec::new();
    f.take(n).read_to_end(&mut buf).ok()?;
    Some(buf)
}

pub fn last_step(buf: &[u8]) -> Option<u64> {
    last_match(buf).map(|(n, _)| n)
}

/// The last step number in `buf`, and whether it was an `iter N` line.
fn last_match(buf: &[u8]) -> Option<(u64, bool)> {
    // Most lines hold no step: say so with the DFA before the slower captures.
    if !STEP.is_match(buf) {
        return None;
    }
    // One set of capture slots per thread, reused: `captures_iter` allocated a `Captures`
    // per match, on every progress line looked at while an OOM is pending (the hot path
    // of a run that survived one; `detect::tests::the_scanner_allocates_nothing_per_line_on_the_hot_path`).
    thread_local! {
        static SLOTS: std::cell::RefCell<regex::bytes::CaptureLocations> =
            std::cell::RefCell::new(STEP.capture_locations());
    }
    SLOTS.with_borrow_mut(|slots| {
        let mut last = None;
        let mut at = 0;
        while let Some(m) = STEP.captures_read_at(slots, buf, at) {
            let found = match slots.get(3) {
                Some((start, _)) => training_bar(buf, start, m.end()).then(|| slots.get(3)),
                None => Some(slots.get(1).or_else(|| slots.get(2))),
            };
            if let Some(Some(span)) = found {
                last = Some((span, slots.get(2).is_some()));
            }
            // A match is never empty (it holds digits): the next one starts after it.
            at = m.end().max(at + 1);
        }
        let ((s, e), iter) = last?;
        Some((std::str::from_utf8(&buf[s..e]).ok()?.parse().ok()?, iter))
    })
}

/// Whether the tqdm bar whose count starts at `at` (its `[` ends at `end`)
/// counts training steps: no description or one that names training (HF's
/// training bar has none), and a rate in iterations, not examples or bytes.
/// `Writing model shards: 100%|█| 1/1 [...]` is a save, not step 1.
fn training_bar(buf: &[u8], at: usize, end: usize) -> bool {
    let line_start = buf[..at]
        .iter()
        .rposition(|b| *b == b'\n' || *b == b'\r')
        .map_or(0, |p| p + 1);
    // The description: what stands before the percentage (`Map: 100%|`).
    let before = &buf[line_start..at];
    let desc = match memchr::memmem::find(before, b"%|") {
        Some(p) => before[..p]
            .iter()
            .rposition(|b| !b.is_ascii_digit() && *b != b' ' && *b != b'.')
            .map_or(&before[..0], |q| &before[..=q]),
        None => before,
    };
    let desc = String::from_utf8_lossy(desc).to_ascii_lowercase();
    let desc = desc.trim_matches(|c: char| c.is_whitespace() || c == ':' || c == '|');
    let named_training = ["train", "step", "iter", "epoch"]
        .iter()
        .any(|w| desc.contains(w));
    if !desc.is_empty() && !named_training {
        return false;
    }
    // The rate, within the bar's brackets (a bar cut at the buffer's end has none).
    let rest = &buf[end..buf.len().min(end + 160)];
    let rest = &rest[..rest
        .iter()
        .position(|b| *b == b'\n' || *b == b'\r')
        .unwrap_or(rest.len())];
    match RATE.captures(rest) {
        Some(c) => {
            let unit = c.get(1).or_else(|| c.get(2)).map(|m| m.as_bytes());
            unit == Some(b"it")
        }
        None => true,
    }
}

/// How often the Hugging Face Trainer prints its log dict: every `every`
/// optimizer steps, and at step 1 too with `first_step` (`--logging_first_step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logging {
    pub every: u64,
    pub first_step: bool,
}

impl Logging {
    /// The step of the `n`-th log dict (n ≥ 1) of an attempt that started at step `from`.
    pub fn nth_step(self, n: u64, from: u64) -> u64 {
        let every = self.every.max(1);
        if self.first_step && from == 0 && every > 1 {
            return if n == 1 { 1 } else { (n - 1) * every };
        }
        (from / every + n) * every
    }
}

/// The step an attempt reached: exact, or only a lower bound (`at_least`: the
/// last log dict of a Trainer logging every L > 1 steps, a checkpoint it saved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reached {
    pub step: u64,
    pub at_least: bool,
}

impl Reached {
    /// The better of two readings: the higher step; at the same step an exact one.
    pub fn max(self, other: Reached) -> Reached {
        match self.step.cmp(&other.step) {
            std::cmp::Ordering::Greater => self,
            std::cmp::Ordering::Less => other,
            std::cmp::Ordering::Equal => Reached {
                step: self.step,
                at_least: self.at_least && other.at_least,
            },
        }
    }
}

/// The step an attempt that started at step `from` reached, from its whole
/// log: the last bar or step line, or, with the Trainer's `logging` interval
/// known, its log dicts counted — whichever names the later step.
pub fn read(
    log: &Path,
    logging: Option<Logging>,
    from: u64,
    counting: Counting,
) -> Option<Reached> {
    // A step line at or before the start (`resuming from checkpoint-5 at step 5`,
    // `Continuing training from global step 5`) shows no step of this attempt:
    // only that it got there.
    let printed = tail(log, 256 * 1024)
        .and_then(|t| last_step_counted(&t, counting, from))
        .map(|step| Reached {
            step,
            at_least: step <= from,
        });
    let logged = logging.and_then(|l| {
        // The whole log: oomguard keeps at most its first 8 MiB and last 4 MiB.
        let text = tail(log, 64 << 20)?;
        logged_step(&text, l, from)
    });
    match (printed, logged) {
        (Some(p), Some(l)) => Some(p.max(l)),
        (p, l) => p.or(l),
    }
}

/// The step the Trainer's log dicts in `text` name (see [`Logging`]); `None`
/// without one, or when the log lost its middle (the count would be short).
pub fn logged_step(text: &[u8], logging: Logging, from: u64) -> Option<Reached> {
    if crate::run_folder::may_hold_omitted(text) {
        return None;
    }
    // Every local rank 0 of a multi-node run prints the same dict for a step
    // (one oomguard around srun sees them all): each distinct dict counts once.
    let dicts: HashSet<&[u8]> = log_dicts(text).collect();
    let n = dicts.len() as u64;
    (n > 0).then(|| Reached {
        step: logging.nth_step(n, from),
        at_least: logging.every > 1,
    })
}

/// While a relaunch runs: the first moment its output shows it back at `step`
/// (the step an earlier attempt died at), read as [`read`] reads a log — a bar
/// or a step line at or past it, or with the Trainer's `logging` interval the
/// log dicts counted since `from`. Fed the output as it comes, on any stream.
#[derive(Debug, Clone)]
pub struct StepWatch {
    step: u64,
    from: u64,
    logging: Option<Logging>,
    counting: Counting,
    /// The unfinished last line of each stream.
    carry: [Vec<u8>; 3],
    dicts: HashSet<Vec<u8>>,
    back: bool,
}

/// A line longer than this is cut from the front before it is read for a step.
const WATCH_CARRY: usize = 64 * 1024;

impl StepWatch {
    /// Watch for `step` in an attempt that starts at step `from`. A step at or
    /// before `from` (nothing to redo) is back at the first step past `from`.
    pub fn new(step: u64, from: u64, logging: Option<Logging>, counting: Counting) -> StepWatch {
        StepWatch {
            step: step.max(from + 1),
            from,
            logging,
            counting,
            carry: Default::default(),
            dicts: HashSet::new(),
            back: false,
        }
    }

    /// Feed output of stream `stream` (0..3); true the first time it is back.
    pub fn feed(&mut self, stream: usize, chunk: &[u8]) -> bool {
        if self.back {
            return false;
        }
        let carry = &mut self.carry[stream.min(2)];
        let Some(end) = memchr::memrchr2(b'\n', b'\r', chunk) else {
            carry.extend_from_slice(chunk);
            if carry.len() > WATCH_CARRY {
                carry.drain(..carry.len() - WATCH_CARRY);
            }
            return false;
        };
        let mut text = std::mem::take(carry);
        text.extend_from_slice(&chunk[..=end]);
        carry.extend_from_slice(&chunk[end + 1..]);
        if last_step_counted(&text, self.counting, self.from).is_some_and(|s| s >= self.step) {
            self.back = true;
        } else if let Some(l) = self.logging {
            for m in log_dicts(&text) {
                if self.dicts.len() < 1 << 20 {
                    self.dicts.insert(m.to_vec());
                }
            }
            let n = self.dicts.len() as u64;
            self.back = n > 0 && l.nth_step(n, self.from) >= self.step;
        }
        self.back
    }
}

/// The work one OOM cost: steps redone and the seconds they took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loss {
    /// `None`: unknown (the step reached was not seen, or only a lower bound
    /// at or below the checkpoint resumed from).
    pub steps: Option<u64>,
    /// `steps` is a lower bound: the step reached is known only from below.
    pub at_least: bool,
    pub seconds: f64,
}

impl Loss {
    /// `reached`: the step the attempt reached; `from`: the step it started
    /// from; `back_to`: the step the next attempt resumes from.
    pub fn measure(
        reached: Option<Reached>,
        from: Option<u64>,
        back_to: Option<u64>,
        ckpt_written: Option<SystemTime>,
        attempt_started: SystemTime,
        oom_after: Duration,
    ) -> Loss {
        let base = back_to.or(from).unwrap_or(0);
        let (steps, at_least) = match reached {
            // The run got to `base` at least (it resumes from there): a step
            // read below it, or a lower bound not above it, says nothing.
            Some(r) if r.step < base || (r.at_least && r.step == base) => (None, false),
            Some(r) => (Some(r.step - base), r.at_least),
            None => (None, false),
        };
        // Seconds: from the checkpoint resumed from (if this attempt wrote it)
        // to the OOM; otherwise the whole attempt up to the OOM.
        let oom_time = attempt_started + oom_after;
        let seconds = match ckpt_written {
            Some(w) if w > attempt_started => {
                oom_time.duration_since(w).unwrap_or_default().as_secs_f64()
            }
            _ => oom_after.as_secs_f64(),
        };
        Loss {
            steps,
            at_least,
            seconds,
        }
    }
}

/// "3 steps", "at least 3 steps (the step reached after 1 of them is
/// unknown)", "an unknown number of steps": the steps redone after `losses`,
/// unknown where it cannot be told — never 0 for an unknown.
pub fn steps_text(losses: &[Loss]) -> String {
    let steps: u64 = losses.iter().filter_map(|l| l.steps).sum();
    let unknown = losses.iter().filter(|l| l.steps.is_none()).count();
    let below = losses.iter().filter(|l| l.at_least).count();
    let word = |n: u64| if n == 1 { "step" } else { "steps" };
    if unknown == losses.len() {
        return "an unknown number of steps".into();
    }
    match (unknown, below) {
        (0, 0) => format!("{steps} {}", word(steps)),
        (0, b) => format!(
            "at least {steps} {} (after {b} of them only a lower bound of the step reached is known)",
            word(steps)
        ),
        (u, _) => format!(
            "at least {steps} {} (the step reached after {u} of them is unknown)",
            word(steps)
        ),
    }
}

/// Say when the save interval costs more than the OOMs themselves, and what
/// interval would bound the loss.
pub fn save_interval_advice(
    losses: &[Loss],
    layout: Option<&crate::checkpoint::Layout>,
    total_lost: Duration,
) -> Option<String> {
    if losses.is_empty() {
        return None;
    }
    let steps: u64 = losses.iter().filter_map(|l| l.steps).sum();
    let secs: f64 = losses.iter().map(|l| l.seconds).sum();
    // The work lost itself is in the summary's one line (`journal::End`).
    let mut out = String::new();
    if layout.is_none() {
        out.push_str("oomguard: no checkpoints: every OOM restarted training from the beginning\n");
    }
    let relaunch = total_lost.as_secs_f64() - secs;
    let known = losses.iter().filter(|l| l.steps.is_some()).count().max(1);
    let per_oom = steps.div_ceil(known as u64);
    if secs > relaunch.max(0.0) && per_oom >= 4 {
        let bound = (per_oom / 4).max(1);
        out.push_str(&format!(
            "oomguard: the save interval costs more than the OOMs: each lost about {per_oom} steps; saving every {bound} steps would bound each loss to {bound} steps\n"
        ));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real transformers 5 Trainer with `--disable_tqdm true --logging_steps 1`:
    /// steps 1-3 logged, checkpoint-2 saved, an OOM in step 4.
    const HF5_NO_BAR: &[u8] =
        include_bytes!("../tests/fixtures/progress/hf5_disable_tqdm_logging_steps_1.log");
    /// The same run with its progress bar and `--logging_steps 2`.
    const HF5_BAR: &[u8] =
        include_bytes!("../tests/fixtures/progress/hf5_tqdm_logging_steps_2.log");

    fn every(n: u64) -> Logging {
        Logging {
            every: n,
            first_step: false,
        }
    }

    #[test]
    fn an_oom_whose_step_was_not_seen_is_unknown_not_zero() {
        let l = |steps, at_least| Loss {
            steps,
            at_least,
            seconds: 1.0,
        };
        let both = steps_text(&[l(Some(3), false), l(None, false)]);
        assert_eq!(
            both,
            "at least 3 steps (the step reached after 1 of them is unknown)"
        );
        assert_eq!(steps_text(&[l(None, false)]), "an unknown number of steps");
        assert_eq!(steps_text(&[l(Some(0), false)]), "0 steps");
        assert_eq!(steps_text(&[l(Some(1), false)]), "1 step");
        assert!(
            steps_text(&[l(Some(4), true)])
                .starts_with("at least 4 steps (after 1 of them only a lower bound"),
        );
        // Without checkpoints the advice says every OOM started over.
        let lost = std::time::Duration::from_secs(2);
        let none = save_interval_advice(&[l(None, false)], None, lost).unwrap();
        assert!(none.contains("no checkpoints"), "{none}");
    }

    #[test]
    fn a_relaunch_is_back_when_its_output_shows_the_step_it_died_at() {
        // Resumed from step 5, back at step 6: a bar split over chunks, on stderr.
        let mut w = StepWatch::new(6, 5, None, Counting::Done);
        assert!(!w.feed(0, b"resuming from checkpoint-5 at step 5\n"));
        assert!(!w.feed(1, b"\r 17%|##  | 5/30 [00:01<00:05, 4.0it/s]\r 20%|## | 6/"));
        assert!(w.feed(1, b"30 [00:01<00:05, 4.0it/s]\r"));
        assert!(!w.feed(1, b"step 7\n"), "once");
        // A save's bar is not a step.
        let mut w = StepWatch::new(6, 5, None, Counting::Done);
        assert!(!w.feed(
            1,
            b"Writing model shards: 100%|#| 9/9 [00:00<00:00, 9.0it/s]\n"
        ));
        // Log dicts counted with the interval; nothing to redo: the first step past 5.
        let mut w = StepWatch::new(3, 5, Some(every(1)), Counting::Done);
        assert!(w.feed(0, b"{'loss': '2.5', 'epoch': '0.2'}\n"));
    }

    /// The case of the issue: no bar, the Trainer's log dicts only. Before, the
    /// save's `Writing model shards: 1/1` bar was read as step 1, and resuming from
    /// checkpoint-2 made it "0 steps of redone training" where one was redone.
    #[test]
    fn the_trainers_log_dicts_tell_the_step_without_a_bar() {
        // The save's bar is not a step, and a dict names none.
        assert_eq!(last_step(HF5_NO_BAR), None);
        let r = logged_step(HF5_NO_BAR, every(1), 0);
        assert_eq!(
            r,
            Some(Reached {
                step: 3,
                at_least: false
            })
        );
        // Resumed from checkpoint-2: one step (3) redone, exactly.
        let now = SystemTime::now();
        let loss = Loss::measure(r, None, Some(2), None, now, Duration::from_secs(1));
        assert_eq!((loss.steps, loss.at_least), (Some(1), false));
        assert_eq!(steps_text(&[loss]), "1 step");
        // Without the logging interval the dicts say nothing: unknown, not 0.
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("output.log");
        std::fs::write(&log, HF5_NO_BAR).unwrap();
        assert_eq!(read(&log, None, 0, Counting::Done), None);
        let loss = Loss::measure(None, None, Some(2), None, now, Duration::from_secs(1));
        assert_eq!(steps_text(&[loss]), "an unknown number of steps");
        assert_eq!(
            read(&log, Some(every(1)), 0, Counting::Done).map(|r| r.step),
            Some(3)
        );
        // Resumed from step 2 with one more dict: step 3.
        let resumed = b"resuming\n{'loss': '4.775', 'grad_norm': '1.045', 'learning_rate': '3.333e-05', 'epoch': '0.02344'}\n";
        assert_eq!(logged_step(resumed, every(1), 2).map(|r| r.step), Some(3));
    }

    #[test]
    fn the_bar_wins_and_a_save_bar_is_not_a_step() {
        assert_eq!(last_step(HF5_BAR), Some(3));
        // Logging every 2 steps: the one dict (step 2) is a lower bound below the bar.
        let d = logged_step(HF5_BAR, every(2), 0).unwrap();
        assert_eq!((d.step, d.at_least), (2, true));
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("output.log");
        std::fs::write(&log, HF5_BAR).unwrap();
        assert_eq!(
            read(&log, Some(every(2)), 0, Counting::Done),
            Some(Reached {
                step: 3,
                at_least: false
            })
        );
        // Bars that count something else.
        for other in [
            &b"Writing model shards: 100%|##########| 1/1 [00:00<00:00, 535.88it/s]"[..],
            b"Loading checkpoint shards: 100%|##########| 2/2 [00:03<00:00,  1.52s/it]",
            b"Map: 100%|##########| 1000/1000 [00:00<00:00, 12345.67 examples/s]",
            b"Tokenizing train dataset: 100%|#####| 500/500 [00:01<00:00, 480.2 examples/s]",
            b"model.safetensors:  45%|####5     | 2.25G/5.00G [00:30<00:36, 75.1MB/s]",
        ] {
            assert_eq!(last_step(other), None, "{}", String::from_utf8_lossy(other));
        }
        // Training bars: HF's (no description), Lightning's, a custom one.
        assert_eq!(
            last_step(b" 40%|####      | 40/100 [00:10<00:15,  3.98it/s, loss=2.1]"),
            Some(40)
        );
        assert_eq!(
            last_step(b"Epoch 0:  30%|###       | 3/10 [00:01<00:03,  2.10it/s, v_num=0]"),
            Some(3)
        );
        assert_eq!(
            last_step(b"Training: 12/50 [00:30<01:35, 2.5s/it]"),
            Some(12)
        );
    }

    /// transformers 4 printed the floats as they are; TRL adds keys; several local
    /// ranks 0 (one oomguard around srun) print the same dict once each; an
    /// evaluation's dict and the end's summary are not steps.
    #[test]
    fn a_brace_line_longer_than_a_log_dict_is_not_one() {
        let every = Logging {
            every: 1,
            first_step: false,
        };
        let long = format!("{{'loss': 1.0, 'x': '{}'}}\n", "y".repeat(MAX_LOG_DICT));
        let text = format!("{{'loss': 2.0, 'epoch': 0.1}}\n{long}{{'loss': 1.9, 'epoch': 0.2}}\n");
        assert_eq!(
            logged_step(text.as_bytes(), every, 0).map(|r| r.step),
            Some(2)
        );
    }

    #[test]
    fn log_dicts_of_other_versions_ranks_and_intervals() {
        let v4 = b"{'loss': 2.3125, 'grad_norm': 1.0441, 'learning_rate': 4.9e-05, 'epoch': 0.02}\n\
                   {'eval_loss': 2.2, 'eval_runtime': 1.0, 'epoch': 0.02}\n\
                   {'loss': 2.2812, 'grad_norm': 0.98, 'learning_rate': 4.8e-05, 'entropy': 1.9, 'num_tokens': 4096.0, 'mean_token_accuracy': 0.41, 'epoch': 0.04}\n\
                   [rank8]: {'loss': 2.2812, 'grad_norm': 0.98, 'learning_rate': 4.8e-05, 'entropy': 1.9, 'num_tokens': 4096.0, 'mean_token_accuracy': 0.41, 'epoch': 0.04}\n\
                   {'train_runtime': 12.5, 'train_samples_per_second': 3.2, 'train_steps_per_second': 0.4, 'train_loss': 2.29, 'epoch': 0.04}\n";
        assert_eq!(logged_step(v4, every(1), 0).map(|r| r.step), Some(2));
        assert_eq!(logged_step(v4, every(10), 0).map(|r| r.step), Some(20));
        // From a checkpoint at step 15, logging every 10: the first dict is step 20.
        assert_eq!(logged_step(v4, every(10), 15).map(|r| r.step), Some(30));
        // --logging_first_step: a dict at step 1, then every 10.
        let first = Logging {
            every: 10,
            first_step: true,
        };
        assert_eq!(first.nth_step(1, 0), 1);
        assert_eq!(first.nth_step(3, 0), 20);
        // A log that lost its middle cannot be counted.
        let cut = b"{'loss': 1.0, 'epoch': 0.1}\n[oomguard: 1234 bytes omitted]\n{'loss': 0.9, 'epoch': 0.9}\n";
        assert_eq!(logged_step(cut, every(1), 0), None);
    }

    #[test]
    fn common_progress_formats() {
        assert_eq!(
            last_step(b"step 6/30 loss=2.5\nstep 7/30 loss=2.3\n"),
            Some(7)
        );
        assert_eq!(
            last_step(
                b" 12%|\xe2\x96\x88   | 120/1000 [00:10<01:20, 11.0it/s]\r 13%| 130/1000 [00:11"
            ),
            Some(130)
        );
        assert_eq!(last_step(b"{'loss': 2.1, 'step': 40}\n"), Some(40));
        assert_eq!(last_step(b"iter 1500: loss 2.3, time 120ms\n"), Some(1500));
        assert_eq!(last_step(b"global_step=77 lr=1e-4"), Some(77));
        assert_eq!(last_step(b"no progress here\n"), None);
    }

    #[test]
    fn each_trainer_counts_its_own_way() {
        // nanoGPT: `iter 4` is printed once iteration 4 (the fifth) is done;
        // its `step 4:` evaluation line before iteration 4 runs.
        let nano = b"step 4: train loss 3.1, val loss 3.2\nsaving checkpoint to out\niter 4: loss 3.0, time 12.00ms, mfu -100.00%\n";
        assert_eq!(last_step_counted(nano, Counting::IterIndex, 0), Some(5));
        // fairseq, its tqdm format in the second epoch (the bar counts this epoch's
        // batches, 50), its simple format (`50 / 111` the same) and json: the updates.
        let fairseq: &[&[u8]] = &[
            b"epoch 002:  45%|####5     | 50/111 [00:10<00:12,  4.90it/s, loss=4.21, ppl=18.5, wps=9512.3, ups=4.9, wpb=1942.1, bsz=64, num_updates=161, lr=0.0005, gnorm=1.1, train_wall=0, gb_free=10.2, wall=33]\n",
            b"2026-11-28 10:00:01 | INFO | train_inner | epoch 002:     50 / 111 loss=4.21, ppl=18.5, wps=9512.3, ups=4.9, wpb=1942.1, bsz=64, num_updates=161, lr=0.0005\n",
            b"{\"epoch\": 2, \"update\": 1.45, \"loss\": \"4.21\", \"num_updates\": \"161\", \"lr\": \"0.0005\"}\n",
        ];
        for line in fairseq {
            assert_eq!(
                last_step_counted(line, Counting::Updates, 0),
                Some(161),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(last_step(fairseq[0]), Some(50), "a bar read as steps done");
        assert_eq!(
            last_step_counted(b"epoch 001: 3 / 111 loss=9.1\n", Counting::Updates, 0),
            None
        );
        assert_eq!(
            last_step_counted(
                b"step 4: train loss 3.1, val loss 3.2\n",
                Counting::IterIndex,
                0
            ),
            Some(4)
        );
        // Lightning: the bar counts batches; two make a step at accumulation 2.
        let rich = "Epoch 0/-2 \u{2501}\u{2501}\u{2501} 6/6 0:00:00 \u{2022} 0:00:00 8.51it/s v_num: 0.000\n";
        let b = Counting::Batches {
            accum: 1,
            epoch_total: true,
        }
        .at_accum(Some(2));
        assert_eq!(last_step_counted(rich.as_bytes(), b, 0), Some(3));
        let tqdm = b"\rEpoch 0:  30%|###       | 3/10 [00:01<00:03,  2.10it/s, v_num=0]\rEpoch 0:  40%|####      | 4/10 [00:01<00:03,  2.10it/s, v_num=0]";
        assert_eq!(last_step_counted(tqdm, b, 0), Some(2));
        // After a resume the bar does not say the step.
        assert_eq!(last_step_counted(tqdm, b, 2), None);
        // Past the first epoch: each epoch of 10 batches at accumulation 2 is 5
        // steps; at accumulation 3 it is 4 (its last batch steps alone).
        let epoch3 = b"Epoch 3:  40%|####      | 4/10 [00:01<00:03]";
        assert_eq!(last_step_counted(epoch3, b, 0), Some(3 * 5 + 2));
        let b3 = Counting::Batches {
            accum: 1,
            epoch_total: true,
        }
        .at_accum(Some(3));
        assert_eq!(last_step_counted(epoch3, b3, 0), Some(3 * 4 + 1));
        let done = b"Epoch 1: 100%|##########| 10/10 [00:01<00:00]";
        assert_eq!(last_step_counted(done, b3, 0), Some(8));
        let rich2 = "Epoch 2/-2 \u{2501}\u{2501}\u{2501} 6/10 0:00:00 \u{2022} 0:00:00 8.51it/s\n";
        assert_eq!(last_step_counted(rich2.as_bytes(), b3, 0), Some(10));
        // A total that may be the steps left (max_steps without max_epochs):
        // 6/6 in epoch 2 is 6 batches of an epoch of 6 or more.
        let capped = Counting::Batches {
            accum: 3,
            epoch_total: false,
        };
        assert_eq!(last_step_counted(rich2.as_bytes(), capped, 0), None);
        assert_eq!(last_step_counted(tqdm, capped, 0), Some(1));
        // A loader without a length: past the first epoch the step is unknown.
        assert_eq!(
            last_step_counted(b"Epoch 3: | 4/? [00:01<00:03]", b, 0),
            None
        );
    }
}
