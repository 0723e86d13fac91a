//! The run's record: a folder with `journal.jsonl` (one typed [`Event`] a line)
//! and one folder per attempt; in memory, one [`AttemptRecord`] per attempt,
//! from which the end-of-run summary ([`End`]) is told.
//!
//! Every line the journal has is a variant of [`Event`]: adding one is a
//! variant here and a `record` call where it happens. Users and tests read
//! these keys, so a field's name and JSON type are an interface.
//!
//! Writing the journal must never stop a healthy training: every write error
//! becomes one warning on stderr and supervision goes on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::evidence::{Evidence, OutcomeKind, When};
use crate::knobs::{Knob, Settings};
use crate::policy::{Decision, StepKind};
use crate::progress::Loss;
use crate::report::story::Story;

pub use crate::events::{SetbackState, knob_values, lossy};
pub use crate::report::journal::Journal;
pub use crate::run_folder::{create_private_dir, write_private};

/// "4.2 s", "3m 05s", "2h 03m", "1d 04h".
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let t = s as u64;
    match t {
        ..3600 => format!("{}m {:02}s", t / 60, t % 60),
        3600..86400 => format!("{}h {:02}m", t / 3600, t % 3600 / 60),
        _ => format!("{}d {:02}h", t / 86400, t % 86400 / 3600),
    }
}

/// One stretch of time lost to OOMs, in memory (see [`Event::TimeLost`]).
#[derive(Debug, Clone)]
pub struct Setback {
    pub ooms: Vec<u32>,
    pub step: Option<u64>,
    pub since: std::time::SystemTime,
    pub state: SetbackState,
    /// The attempt that ended it (got back, or was the last).
    pub ended_in: Option<u32>,
    pub seconds: Option<f64>,
    /// Still `behind` in the journal, but the running (or killed) attempt's log
    /// already shows the step: back, at a time only its end would journal.
    pub seen_back: bool,
}

impl Setback {
    /// The seconds counted into the one figure (back, or a lower bound).
    pub fn counted(&self) -> f64 {
        match self.state {
            SetbackState::Back | SetbackState::NotBack => self.seconds.unwrap_or(0.0),
            _ => 0.0,
        }
    }
}

/// The one figure of time lost to OOMs: "0.8 s from each OOM back to the step it
/// died at (restart and redone steps)", "at least …" with what was not seen
/// said, "unknown …" without a number. `None` without an OOM that was relaunched.
/// `going`: the run still runs (an open stretch is "not back yet", not "had not").
pub fn time_lost_text(setbacks: &[Setback], going: bool) -> Option<String> {
    if setbacks.is_empty() {
        return None;
    }
    let total: f64 = setbacks
        .iter()
        .map(|s| match s.state {
            SetbackState::Behind if s.seen_back => 0.0,
            SetbackState::Behind => s.seconds.unwrap_or(0.0),
            _ => s.counted(),
        })
        .sum();
    let measured = setbacks.iter().any(|s| {
        matches!(s.state, SetbackState::Back | SetbackState::NotBack)
            || (s.state == SetbackState::Behind && s.seconds.is_some() && !s.seen_back)
    });
    let exact = setbacks.iter().all(|s| s.state == SetbackState::Back);
    let each = if setbacks.iter().map(|s| s.ooms.len()).sum::<usize>() == 1 {
        "the OOM back to the step it died at"
    } else {
        "each OOM back to the step it died at"
    };
    let mut out = if !measured {
        format!("the time from {each} is unknown")
    } else {
        format!(
            "{}{} from {each} (restart and redone steps)",
            if exact { "" } else { "at least " },
            duration(total)
        )
    };
    let who = |ooms: &[u32]| {
        let n: Vec<String> = ooms.iter().map(u32::to_string).collect();
        format!(
            "attempt{} {}",
            if ooms.len() == 1 { "" } else { "s" },
            n.join(", ")
        )
    };
    let mut unknown: Vec<u32> = Vec::new();
    for s in setbacks {
        match s.state {
            SetbackState::Back => {}
            SetbackState::Unknown => unknown.extend(&s.ooms),
            SetbackState::Behind if s.seen_back => {
                out += &format!(
                    "; {} is back at step {}, at a time {}",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    if going {
                        "journaled when it ends"
                    } else {
                        "not journaled (oomguard was killed first)"
                    }
                )
            }
            SetbackState::Behind if going => {
                out += &format!(
                    "; {} is not back at step {} yet ({} since the OOM in {})",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    duration(s.seconds.unwrap_or(0.0)),
                    who(&s.ooms)
                )
            }
            SetbackState::NotBack | SetbackState::Behind => {
                out += &format!(
                    "; {} had not got back to step {} when the run ended ({} after the OOM in {})",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    duration(s.seconds.unwrap_or(0.0)),
                    who(&s.ooms)
                )
            }
        }
    }
    if !unknown.is_empty() {
        out += &format!(
            "; the step {} died at {} not seen exactly, so the time back after {} cannot be told",
            who(&unknown),
            if unknown.len() == 1 { "was" } else { "were" },
            if unknown.len() == 1 { "it" } else { "them" },
        );
    }
    Some(out)
}

/// One row of the summary table.
pub struct Row {
    pub knob: String,
    pub before: String,
    pub after: String,
    pub why: String,
}

/// Render the summary table (knob, before, after, why) as aligned text.
pub fn table(rows: &[Row]) -> String {
    let w0 = rows.iter().map(|r| r.knob.len()).max().unwrap_or(0).max(4);
    let w1 = rows
        .iter()
        .map(|r| r.before.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let w2 = rows.iter().map(|r| r.after.len()).max().unwrap_or(0).max(5);
    let mut out = format!("  {:w0$}  {:w1$}  {:w2$}  why\n", "knob", "before", "after");
    for r in rows {
        out.push_str(&format!(
            "  {:w0$}  {:w1$}  {:w2$}  {}\n",
            r.knob, r.before, r.after, r.why
        ));
    }
    out
}

/// What followed an attempt.
pub enum Next {
    /// Nothing: the run ended with it.
    Stop,
    /// Another tenant's memory came back: the same settings again.
    Retry,
    /// The policy's step (the work the OOM cost is its `work_lost` event).
    Decided { decision: Decision },
}

/// One attempt that ran (was launched), and what followed it: the run's
/// record in memory, from which the end of the run is told.
pub struct AttemptRecord {
    pub n: u32,
    pub pid: u32,
    pub outcome: OutcomeKind,
    pub duration: Duration,
    /// What its OOM showed (GPU OOMs only).
    pub evidence: Option<Evidence>,
    /// Whose memory caused the OOM, when another tenant's did.
    pub foreign: Option<String>,
    pub next: Next,
}

/// Time lost to attempts that did not succeed.
pub fn lost(attempts: &[AttemptRecord]) -> Duration {
    attempts
        .iter()
        .filter(|a| a.outcome != OutcomeKind::Success)
        .map(|a| a.duration)
        .sum()
}

/// How the run ended, for the summary.
pub struct End<'a> {
    /// The settings of the first attempt and of the last.
    pub first: &'a Settings,
    pub last: &'a Settings,
    pub attempts: &'a [AttemptRecord],
    /// The run's events, folded: how it ended, its duration, the work and
    /// the time the OOMs cost (told as `oomguard status` tells them).
    pub story: &'a Story,
    pub journal: Option<&'a Path>,
    /// Who decided the changes, when this copy of a job followed another
    /// (`copy 0 of the job`): the table's "why" for them.
    pub decided_by: Option<&'a str>,
    /// The last attempt's command line, and what to know about it, when it is
    /// not the command as the user wrote it.
    pub last_command: Option<&'a LastCommand>,
}

/// The command line the last attempt ran, for the summary.
#[derive(Debug, Clone, Default)]
pub struct LastCommand {
    /// Shell-quoted, with the environment variables the knobs set in front.
    pub line: String,
    /// Config copies it reads: (the user's file, oomguard's copy).
    pub copies: Vec<(PathBuf, PathBuf)>,
    /// Files it read edited in place (put back at the end).
    pub in_place: Vec<PathBuf>,
    /// The checkpoint oomguard told it to resume from.
    pub resume: Option<String>,
    /// It differs from the user's command.
    pub changed: bool,
}

impl End<'_> {
    /// (attempt, what its OOM showed, the policy's step after it).
    fn decisions(&self) -> Vec<(u32, &Evidence, &Decision)> {
        self.attempts
            .iter()
            .filter_map(|a| match (&a.evidence, &a.next) {
                (Some(ev), Next::Decided { decision, .. }) => Some((a.n, ev, decision)),
                _ => None,
            })
            .collect()
    }

    /// The work each OOM that led to a decision cost.
    pub fn losses(&self) -> Vec<Loss> {
        self.story.losses()
    }

    /// The end-of-run summary for stderr: how the run ended, the table of
    /// changed knobs (knob, before, after, why), each decision's cause, the
    /// journal, and the OOMs other tenants caused.
    pub fn summary(&self) -> String {
        let code = self.story.end.as_ref().map_or(0, |e| e.exit_code);
        let decisions = self.decisions();
        let rows = self.rows(&decisions);
        let mut out = self.story.ending().unwrap_or_default();
        if rows.is_empty() {
            out.push_str("oomguard: no setting was changed\n");
        } else {
            out.push_str(&table(&rows));
        }
        // Each OOM with when in the run it happened, and what followed it.
        for a in self.attempts {
            let (n, Some(cause)) = (a.n, &a.evidence) else {
                continue;
            };
            match &a.next {
                Next::Decided { decision, .. } => {
                    out.push_str(&format!("  attempt {n}: {cause} → {}\n", decision.step));
                }
                Next::Retry if a.foreign.is_none() => {
                    out.push_str(&format!(
                        "  attempt {n}: {cause} → the same settings again, the allocator set against fragmentation\n"
                    ));
                }
                Next::Stop if matches!(cause.when(), Some(When::Loading | When::Saving)) => {
                    out.push_str(&format!(
                        "  attempt {n}: {cause} → stopped: no setting oomguard can change lowers that peak\n"
                    ));
                }
                _ => {}
            }
        }
        for a in &self.story.attempts {
            if let Some(what) = &a.refused {
                out.push_str(&format!(
                    "  attempt {}: the command refused {what}, which oomguard added → dropped, not counted as the run's failure\n",
                    a.start.attempt
                ));
            }
        }
        if let Some(p) = self.journal {
            out.push_str(&format!("oomguard: journal: {}\n", p.display()));
        }
        if let Some(c) = self.last_command.filter(|c| c.changed) {
            out += &if code == 0 {
                format!("oomguard: to rerun at the settings that fit: {}\n", c.line)
            } else {
                format!("oomguard: the last attempt ran: {}\n", c.line)
            };
            for (orig, copy) in &c.copies {
                out += &format!(
                    "oomguard:   {} is oomguard's copy of {} with the changed settings (kept in the run folder)\n",
                    copy.display(),
                    orig.display()
                );
            }
            for f in &c.in_place {
                out += &format!(
                    "oomguard:   {} was edited in place for it and is now put back: the line alone runs at its original values\n",
                    f.display()
                );
            }
            if let Some(r) = &c.resume {
                out += &format!(
                    "oomguard:   it resumes from {r} (added by oomguard): leave that out to start over\n"
                );
            }
        }
        for a in self.attempts {
            let Some(who) = &a.foreign else {
                continue;
            };
            let n = a.n;
            out.push_str(&if matches!(a.next, Next::Retry) {
                format!(
                    "oomguard: attempt {n}: OOM caused by another tenant ({who}); waited and retried the same settings\n"
                )
            } else {
                format!(
                    "oomguard: attempt {n}: another tenant ({who}) held the memory past --wait-timeout; the policy applied\n"
                )
            });
        }
        out
    }

    /// The table's rows: each knob that changed, and why.
    fn rows(&self, decisions: &[(u32, &Evidence, &Decision)]) -> Vec<Row> {
        let (first, last) = (self.first, self.last);
        let mut rows = Vec::new();
        for (k, v0) in &first.knobs {
            let Some(v1) = last.knobs.get(k) else {
                continue;
            };
            if v0 == v1 {
                continue;
            }
            let changed: Vec<&(u32, &Evidence, &Decision)> = decisions
                .iter()
                .filter(|(_, _, d)| d.before.knobs.get(k) != d.after.knobs.get(k))
                .collect();
            let at: Vec<String> = changed.iter().map(|(n, _, _)| n.to_string()).collect();
            let plural = if at.len() == 1 { "" } else { "s" };
            let why = match changed.first() {
                Some((_, _, d))
                    if *k == Knob::GradAccum
                        && d.before.knobs.get(&Knob::MicroBatch)
                            != d.after.knobs.get(&Knob::MicroBatch) =>
                {
                    match last.global_batch() {
                        Some(g) => {
                            format!("keeps the global batch at {g} as the micro-batch shrank")
                        }
                        None => "keeps micro-batch × accumulation as the micro-batch shrank".into(),
                    }
                }
                Some((_, ev, d)) => format!(
                    "{} after the {} in attempt{plural} {}",
                    // A decision from the memory model changes several knobs at
                    // once: each row names the step that changes its own knob.
                    step_of(*k)
                        .filter(|s| *s != d.step && moved(d) > 1)
                        .unwrap_or(d.step),
                    if ev.outcome == OutcomeKind::HostOom {
                        "host OOM"
                    } else {
                        match ev.when() {
                            Some(When::Evaluation) => "OOM during evaluation",
                            Some(When::Loading) => "OOM while loading a checkpoint",
                            Some(When::Saving) => "OOM while saving a checkpoint",
                            _ => "OOM",
                        }
                    },
                    at.join(", ")
                ),
                None => self
                    .decided_by
                    .map(|who| format!("{who} decided"))
                    .unwrap_or_default(),
            };
            rows.push(Row {
                knob: k.name().into(),
                before: v0.to_string(),
                after: v1.to_string(),
                why,
            });
        }
        rows
    }
}

/// The step that changes knob `k`.
fn step_of(k: Knob) -> Option<StepKind> {
    Some(match k {
        Knob::MicroBatch | Knob::GradAccum => StepKind::HalveMicroBatch,
        Knob::GradCheckpointing => StepKind::EnableGradCheckpointing,
        Knob::SeqLen => StepKind::ShortenSeq,
        Knob::ZeroStage => StepKind::RaiseZeroStage,
        Knob::OffloadOptimizer => StepKind::OffloadOptimizer,
        Knob::OffloadParam => StepKind::OffloadParam,
        Knob::DataloaderWorkers => StepKind::HalveDataloaderWorkers,
        Knob::EvalBatch => StepKind::HalveEvalBatch,
        Knob::GatherOnSave => StepKind::NoGatherOnSave,
        Knob::Fsdp => StepKind::FsdpFullShard,
    })
}

/// How many of the step knobs a decision changed (accumulation, which follows
/// the micro-batch, and the ZeRO stage an offload raises itself not counted).
fn moved(d: &Decision) -> usize {
    d.after
        .knobs
        .iter()
        .filter(|(k, v)| {
            !matches!(k, Knob::GradAccum | Knob::ZeroStage) && d.before.knobs.get(k) != Some(v)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(&[Row {
            knob: "micro_batch".into(),
            before: "16".into(),
            after: "4".into(),
            why: "OOM".into(),
        }]);
        assert_eq!(
            t,
            "  knob         before  after  why\n  micro_batch  16      4      OOM\n"
        );
    }

    fn settings(micro: u64, accum: u64) -> Settings {
        use crate::knobs::Value;
        Settings {
            knobs: [
                (Knob::MicroBatch, Value::Int(micro)),
                (Knob::GradAccum, Value::Int(accum)),
            ]
            .into_iter()
            .collect(),
            world_size: 2,
            accum_covers_world: false,
        }
    }

    #[test]
    fn the_time_lost_is_one_figure_said_as_far_as_it_is_known() {
        let s = |ooms: Vec<u32>, step, state, seconds| Setback {
            ooms,
            step,
            since: std::time::SystemTime::UNIX_EPOCH,
            state,
            ended_in: Some(3),
            seconds,
            seen_back: false,
        };
        use SetbackState::*;
        assert_eq!(time_lost_text(&[], false), None);
        assert_eq!(
            time_lost_text(&[s(vec![1], Some(6), Back, Some(2.0))], false).unwrap(),
            "2.0 s from the OOM back to the step it died at (restart and redone steps)"
        );
        assert_eq!(
            time_lost_text(
                &[
                    s(vec![1], Some(6), Back, Some(2.0)),
                    s(vec![2], Some(6), NotBack, Some(1.5))
                ],
                false
            )
            .unwrap(),
            "at least 3.5 s from each OOM back to the step it died at (restart and redone steps); attempt 3 had not got back to step 6 when the run ended (1.5 s after the OOM in attempt 2)"
        );
        let unknown = time_lost_text(&[s(vec![1], None, Unknown, None)], false).unwrap();
        assert_eq!(
            unknown,
            "the time from the OOM back to the step it died at is unknown; the step attempt 1 died at was not seen exactly, so the time back after it cannot be told"
        );
        assert!(!unknown.contains("0.0 s"));
        assert!(
            time_lost_text(&[s(vec![1], Some(6), Behind, Some(4.0))], true)
                .unwrap()
                .ends_with(
                    "attempt 3 is not back at step 6 yet (4.0 s since the OOM in attempt 1)"
                )
        );
    }

    #[test]
    fn the_summary_is_told_from_the_records() {
        let (first, last) = (settings(8, 1), settings(4, 2));
        let reached = crate::progress::Reached {
            step: 7,
            at_least: false,
        };
        let oom = Evidence::gpu_oom(None, false, Some(reached), 0);
        let decision = Decision {
            step: StepKind::HalveMicroBatch,
            before: first.clone(),
            after: last.clone(),
            reason: "OOM: micro-batch 8 → 4".into(),
        };
        let record = |n, outcome, next, foreign: Option<&str>| AttemptRecord {
            n,
            pid: 100 + n,
            outcome,
            duration: Duration::from_secs(2),
            evidence: Some(oom.clone()),
            foreign: foreign.map(String::from),
            next,
        };
        let attempts = [
            record(1, OutcomeKind::CudaOom, Next::Retry, Some("pid 9 (bob)")),
            record(
                2,
                OutcomeKind::CudaOom,
                Next::Decided { decision },
                Some("pid 9 (bob)"),
            ),
            record(3, OutcomeKind::Success, Next::Stop, None),
        ];
        // The story the run's events tell: three attempts, the work the OOM
        // in attempt 2 cost, one stretch of time back, nine seconds in all.
        use crate::events::{Event, Listener};
        let t0 = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let start = Event::RunStart {
            argv: vec!["python3".into(), "train.py".into()],
            policy: "default".into(),
            max_attempts: 8,
            settings: first.knobs.clone(),
            world_size: 2,
            world_source: "default".into(),
            global_batch: first.global_batch(),
            env: serde_json::Value::Null,
            notes: vec![],
            warnings: vec![],
            tty: false,
            supervisor: None,
            logging: None,
        };
        let mut story = Story::begin(&start, Some(crate::report::journal::stamp(t0))).unwrap();
        for n in 1..=3 {
            story.on(
                t0,
                &Event::AttemptStart {
                    attempt: n,
                    gpu: serde_json::Value::Null,
                    argv: vec![],
                    env: Default::default(),
                    settings: last.knobs.clone(),
                    global_batch: last.global_batch(),
                    resume: None,
                    files: vec![],
                },
            );
        }
        story.on(
            t0,
            &Event::WorkLost {
                attempt: 2,
                step_reached: Some(7),
                step_reached_at_least: false,
                started_from_step: None,
                resume_from_step: Some(5),
                steps_lost: Some(2),
                steps_lost_at_least: false,
                seconds_lost: 1.0,
            },
        );
        story.on(
            t0,
            &Event::TimeLost {
                attempt: 3,
                state: SetbackState::Back,
                ooms: vec![1, 2],
                back_to_step: Some(7),
                since: crate::report::journal::stamp(t0),
                seconds: Some(1.25),
            },
        );
        story.on(
            t0 + Duration::from_secs(9),
            &Event::RunEnd {
                exit_code: 0,
                attempts: 3,
                lost_s: 4.0,
                settings: last.knobs.clone(),
                time_lost_s: 1.25,
                time_lost_complete: true,
                last_command: None,
            },
        );
        let last_command = LastCommand {
            line: "python3 train.py --bs 4 --accum 2 --resume out/checkpoint-5".into(),
            copies: vec![("ds.json".into(), "run/attempt-3/ds.json".into())],
            in_place: Vec::new(),
            resume: Some("out/checkpoint-5".into()),
            changed: true,
        };
        let end = End {
            first: &first,
            last: &last,
            attempts: &attempts,
            story: &story,
            journal: Some(Path::new("run/journal.jsonl")),
            decided_by: None,
            last_command: Some(&last_command),
        };
        assert_eq!(lost(&attempts), Duration::from_secs(4));
        assert_eq!(end.losses().len(), 1);
        let text = end.summary();
        assert_eq!(
            text,
            "\noomguard: finished after 3 attempts; 9.0 s in all\n\
             oomguard: work lost to 1 OOM: 2 steps of redone training; 1.2 s from each OOM back to the step it died at (restart and redone steps)\n\
             \x20 knob         before  after  why\n\
             \x20 micro_batch  8       4      halve_micro_batch after the OOM in attempt 2\n\
             \x20 grad_accum   1       2      keeps the global batch at 16 as the micro-batch shrank\n\
             \x20 attempt 2: OOM at step 7 → halve_micro_batch\n\
             oomguard: journal: run/journal.jsonl\n\
             oomguard: to rerun at the settings that fit: python3 train.py --bs 4 --accum 2 --resume out/checkpoint-5\n\
             oomguard:   run/attempt-3/ds.json is oomguard's copy of ds.json with the changed settings (kept in the run folder)\n\
             oomguard:   it resumes from out/checkpoint-5 (added by oomguard): leave that out to start over\n\
             oomguard: attempt 1: OOM caused by another tenant (pid 9 (bob)); waited and retried the same settings\n\
             oomguard: attempt 2: another tenant (pid 9 (bob)) held the memory past --wait-timeout; the policy applied\n"
        );
    }
}
