//! Reading a journal back (`oomguard status`, `oomguard runs`): each line
//! into one typed [`Line`], the lines of one run folded into a [`Run`].
//!
//! The writer's [`Event`](super::Event) borrows everything it writes, so it
//! cannot be read into; [`Line`] is its owned mirror for the fields a reader
//! needs, built on the same shared types the writer serialises ([`Knob`],
//! [`Value`], [`OutcomeKind`], [`StepKind`], [`PeakReport`], [`Supervisor`]), so
//! a name or a JSON type changed on one side fails the round-trip test below.
//! The OOM line's fields are read into [`OomLine`], as plain numbers: the
//! writer's `OomRecord` is built from `detect`'s types, which are not readable.
//!
//! A journal is read while it is being written: a last line without its
//! newline may be half written and is skipped without a word; any other line
//! that cannot be read (a future event's field this version does not know) is
//! counted, never fatal. Events a reader does not need are [`Line::Other`].

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SameSettings;
use crate::detect::OomNumbers;
use crate::evidence::{Evidence, OutcomeKind};
use crate::gpu::PeakReport;
use crate::knobs::{Knob, Value};
use crate::liveness::Supervisor;
use crate::policy::StepKind;

/// A settings' knob values, as the journal writes them (`{"micro_batch": 8}`).
pub type Knobs = BTreeMap<Knob, Value>;

/// One journal line a reader needs; `time` is the writer's RFC 3339 stamp.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Line {
    RunStart(RunStart),
    AttemptStart(AttemptStart),
    Oom(Oom),
    AttemptEnd(AttemptEnd),
    WorkLost(WorkLost),
    Decision(Decision),
    TimeLost(TimeLost),
    RunEnd(RunEnd),
    /// Any other event (checkpoints skipped, a config changed, ...).
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunStart {
    pub time: String,
    pub argv: Vec<String>,
    pub policy: String,
    pub max_attempts: u32,
    pub settings: Knobs,
    pub world_size: u64,
    pub global_batch: Option<u64>,
    /// Absent in journals written before oomguard recorded it.
    pub supervisor: Option<Supervisor>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AttemptStart {
    pub time: String,
    pub attempt: u32,
    pub settings: Knobs,
    pub global_batch: Option<u64>,
    /// The checkpoint it resumes from.
    pub resume: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Oom {
    pub attempt: u32,
    pub finding: OomLine,
    /// Seconds from launch to the OOM line.
    pub after_s: Option<f64>,
    /// When in the run it happened; absent in journals written before
    /// oomguard told it, and when nothing told it.
    #[serde(default)]
    pub phase: Option<crate::evidence::When>,
    #[serde(default)]
    pub step_reached: Option<u64>,
}

/// The decisive OOM line and its numbers (the journal's `finding`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct OomLine {
    pub line: String,
    pub device: Option<u32>,
    pub tried_to_allocate_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
}

/// `attempt_end`, also as written when the command could not be started
/// (then `error` is set and `exit`, `duration_s` are not).
#[derive(Debug, Clone, Deserialize)]
pub struct AttemptEnd {
    pub attempt: u32,
    pub outcome: OutcomeKind,
    pub status: i32,
    pub exit: Option<String>,
    pub duration_s: Option<f64>,
    pub gpu_peak: Option<PeakReport>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WorkLost {
    pub attempt: u32,
    pub step_reached: Option<u64>,
    pub steps_lost: Option<u64>,
    /// Journals before this field said nothing: their counts were taken as exact.
    #[serde(default)]
    pub steps_lost_at_least: bool,
}

/// The step of a `decision` line: the policy's, or the same settings again
/// after another tenant's memory came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum DecisionStep {
    Policy(StepKind),
    Same(SameSettings),
}

impl std::fmt::Display for DecisionStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecisionStep::Policy(s) => s.fmt(f),
            DecisionStep::Same(SameSettings::RetrySameSettings) => {
                f.write_str("retry_same_settings")
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Decision {
    pub attempt: u32,
    pub step: DecisionStep,
    pub reason: String,
    pub resume: Option<String>,
    pub resume_step: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunEnd {
    pub time: String,
    pub exit_code: i32,
    pub lost_s: f64,
    /// Absent in journals written before oomguard recorded it.
    #[serde(default)]
    pub last_command: Option<String>,
}

/// `time_lost`: one stretch of time lost to OOMs, as it stood when written.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeLost {
    pub attempt: u32,
    pub state: super::SetbackState,
    pub ooms: Vec<u32>,
    pub back_to_step: Option<u64>,
    pub since: String,
    pub seconds: Option<f64>,
}

/// One attempt, as far as the journal has got.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub start: AttemptStart,
    pub oom: Option<Oom>,
    pub end: Option<AttemptEnd>,
    pub lost: Option<WorkLost>,
    pub decision: Option<Decision>,
}

/// One run: its `run_start` and what followed, in order.
#[derive(Debug, Clone)]
pub struct Run {
    pub start: RunStart,
    pub attempts: Vec<Attempt>,
    pub end: Option<RunEnd>,
    /// The stretches of time lost to OOMs, each as its last `time_lost` line has it.
    pub setbacks: Vec<TimeLost>,
    /// The time of the last line read.
    pub last_time: Option<String>,
    /// Lines that could not be read (not counting a half-written last line).
    pub unreadable: usize,
}

/// Why a journal gives no run.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} has no run_start line: not an oomguard journal, or its run has not started")]
    NoRun { path: String },
}

/// The lines of `text` that can be read, and how many cannot. A last line
/// without its newline is read when it is whole and dropped otherwise.
pub fn lines(text: &[u8]) -> (Vec<(Line, Option<String>)>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let (line, next, complete) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], &rest[i + 1..], true),
            None => (rest, &rest[rest.len()..], false),
        };
        rest = next;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse(line) {
            Some(l) => out.push(l),
            None if complete => bad += 1,
            None => {} // being written
        }
    }
    (out, bad)
}

fn parse(line: &[u8]) -> Option<(Line, Option<String>)> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    let time = v.get("time").and_then(|t| t.as_str()).map(String::from);
    let l = Line::deserialize(v).ok()?;
    Some((l, time))
}

/// Fold the lines of a journal into its last run (a run folder given again
/// with `--run-dir` holds every run's lines: the last `run_start` begins the
/// one that counts).
pub fn fold(lines: Vec<(Line, Option<String>)>, unreadable: usize) -> Option<Run> {
    let first = lines
        .iter()
        .rposition(|(l, _)| matches!(l, Line::RunStart(_)))?;
    let mut it = lines.into_iter().skip(first);
    let Some((Line::RunStart(start), t0)) = it.next() else {
        unreachable!("rposition found a run_start here")
    };
    let mut run = Run {
        start,
        attempts: Vec::new(),
        end: None,
        setbacks: Vec::new(),
        last_time: t0,
        unreadable,
    };
    for (line, time) in it {
        if time.is_some() {
            run.last_time = time;
        }
        let n = match &line {
            Line::Oom(o) => o.attempt,
            Line::AttemptEnd(e) => e.attempt,
            Line::WorkLost(w) => w.attempt,
            Line::Decision(d) => d.attempt,
            _ => 0,
        };
        let at = run.attempts.iter_mut().rev().find(|a| a.start.attempt == n);
        match (line, at) {
            (Line::AttemptStart(s), _) => run.attempts.push(Attempt {
                start: s,
                oom: None,
                end: None,
                lost: None,
                decision: None,
            }),
            (Line::Oom(o), Some(a)) => a.oom = Some(o),
            (Line::AttemptEnd(e), Some(a)) => a.end = Some(e),
            (Line::WorkLost(w), Some(a)) => a.lost = Some(w),
            (Line::Decision(d), Some(a)) => a.decision = Some(d),
            (Line::RunEnd(e), _) => run.end = Some(e),
            (Line::TimeLost(t), _) => {
                // A stretch is named by its first OOM.
                match run
                    .setbacks
                    .iter_mut()
                    .find(|s| s.ooms.first() == t.ooms.first())
                {
                    Some(s) => *s = t,
                    None => run.setbacks.push(t),
                }
            }
            _ => {}
        }
    }
    Some(run)
}

/// The most of a journal's beginning and end `status` and `runs` read.
const JOURNAL_HEAD: u64 = 16 << 20;
const JOURNAL_TAIL: u64 = 48 << 20;

/// Read `dir/journal.jsonl` (without following a link at its name).
pub fn read_run(dir: &Path) -> Result<Run, ReadError> {
    let path = crate::run_folder::RunFolder::at(dir).journal();
    let shown = path.display().to_string();
    // Not blocking on a FIFO, nothing but a regular file, and at most
    // JOURNAL_HEAD + JOURNAL_TAIL bytes of it (a sparse 20 GB journal costs
    // what a 64 MiB one does): its beginning (the run's start) and its end
    // (where it stands now).
    let (bytes, _left_out) = crate::untrusted::read_head_tail(
        &path,
        JOURNAL_HEAD,
        JOURNAL_TAIL,
        crate::untrusted::Expect {
            no_link: true,
            ..Default::default()
        },
    )
    .map_err(|source| ReadError::Io {
        path: shown.clone(),
        source,
    })?;
    let (lines, bad) = lines(&bytes);
    fold(lines, bad).ok_or(ReadError::NoRun { path: shown })
}

impl Oom {
    /// "OOM (tried to allocate 2.00 GiB on GPU 0, 1.00 GiB free)": worded as
    /// the end-of-run summary words it.
    pub fn cause(&self, outcome: Option<OutcomeKind>) -> String {
        let f = &self.finding;
        let s = Evidence {
            outcome: match outcome {
                Some(OutcomeKind::HungAfterOom) => OutcomeKind::HungAfterOom,
                _ => OutcomeKind::CudaOom,
            },
            oom: Some(OomNumbers {
                device: f.device,
                tried_to_allocate_bytes: f.tried_to_allocate_bytes,
                total_bytes: f.total_bytes,
                free_bytes: f.free_bytes,
                ..OomNumbers::default()
            }),
            step_reached: None,
            steps_done: None,
            phase: None,
        }
        .to_string();
        match self.phase {
            Some(w) => s.replacen("OOM", &format!("OOM{}", w.words(self.step_reached)), 1),
            None => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Event, Journal};
    use crate::knobs::Settings;
    use crate::settings::Offload;

    fn settings(micro: u64, accum: u64) -> Settings {
        Settings {
            knobs: [
                (Knob::MicroBatch, Value::Int(micro)),
                (Knob::GradAccum, Value::Int(accum)),
                (Knob::GradCheckpointing, Value::Bool(false)),
                (
                    Knob::OffloadOptimizer,
                    Value::Offload(Offload::Nvme {
                        path: Some("/local_nvme".into()),
                    }),
                ),
            ]
            .into_iter()
            .collect(),
            world_size: 2,
            accum_covers_world: false,
        }
    }

    /// What the writer writes, the reader reads: the shared types round-trip.
    #[test]
    fn the_writers_events_read_back() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        let mut j = Journal::open(dir.clone());
        let (a, b) = (settings(8, 1), settings(4, 2));
        let me = Supervisor::me();
        let argv = vec!["python3".into(), "train.py".into()];
        j.record(&Event::RunStart {
            argv: &argv,
            policy: "default",
            max_attempts: 8,
            settings: &a,
            world_size: 2,
            world_source: "default",
            global_batch: a.global_batch(),
            env: &[],
            notes: &[],
            warnings: &[],
            tty: false,
            supervisor: &me,
        });
        j.record(&Event::AttemptStart {
            attempt: 1,
            gpu: None,
            argv: &argv,
            env: BTreeMap::new(),
            settings: &a,
            global_batch: a.global_batch(),
            resume: None,
            files: vec![],
        });
        let peak = PeakReport {
            per_gpu: vec![crate::gpu::GpuPeak {
                gpu: 0,
                run_peak_bytes: 20 << 30,
                device_peak_bytes: 21 << 30,
                total_bytes: 24 << 30,
            }],
            samples: 3,
            ..PeakReport::default()
        };
        j.record(&Event::AttemptEnd {
            attempt: 1,
            status: 1,
            exit: "exit code 1".into(),
            outcome: OutcomeKind::CudaOom,
            duration_s: 2.5,
            error_line: None,
            why: None,
            kernel_oom_kill: None,
            gpu_peak: Some(&peak),
            torchrun: None,
        });
        j.record(&Event::Suspect {
            attempt: 1,
            why: "not read",
        });
        j.record(&Event::WorkLost {
            attempt: 1,
            step_reached: Some(7),
            step_reached_at_least: true,
            started_from_step: None,
            resume_from_step: Some(5),
            steps_lost: Some(2),
            steps_lost_at_least: true,
            seconds_lost: 0.5,
        });
        j.record(&Event::Decision {
            attempt: 1,
            step: StepKind::HalveMicroBatch,
            before: &a,
            after: &b,
            global_batch_before: a.global_batch(),
            global_batch_after: b.global_batch(),
            reason: "OOM: micro-batch 8 → 4",
            resume: Some(Path::new("out/checkpoint-5")),
            resume_step: Some(5),
        });
        j.record(&Event::RetrySameSettings {
            attempt: 1,
            step: SameSettings::RetrySameSettings,
            before: &b,
            after: &b,
            reason: "another tenant".into(),
            resume: None,
        });
        j.record(&Event::CannotExecute {
            attempt: 2,
            outcome: OutcomeKind::CannotExecute,
            error: "not found".into(),
            status: 127,
        });
        let since = "2026-01-01T00:00:00.000+00:00".to_string();
        j.record(&Event::TimeLost {
            attempt: 1,
            state: crate::journal::SetbackState::Behind,
            ooms: &[1],
            back_to_step: Some(7),
            since: since.clone(),
            seconds: None,
        });
        j.record(&Event::TimeLost {
            attempt: 2,
            state: crate::journal::SetbackState::NotBack,
            ooms: &[1],
            back_to_step: Some(7),
            since,
            seconds: Some(3.5),
        });
        j.record(&Event::RunEnd {
            exit_code: 127,
            attempts: 2,
            lost_s: 2.5,
            settings: &b,
            time_lost_s: 3.5,
            time_lost_complete: false,
            last_command: Some("python3 train.py --bs 4"),
        });
        let run = read_run(&dir).unwrap();
        assert_eq!(run.unreadable, 0);
        assert_eq!(run.start.settings, a.knobs);
        assert_eq!(run.start.supervisor.as_ref(), Some(&me));
        assert_eq!(run.attempts.len(), 1, "attempt 2 never started");
        let a1 = &run.attempts[0];
        assert_eq!(a1.end.as_ref().unwrap().outcome, OutcomeKind::CudaOom);
        let p = a1.end.as_ref().unwrap().gpu_peak.as_ref().unwrap();
        assert_eq!(p.per_gpu, peak.per_gpu);
        assert_eq!(a1.lost.as_ref().unwrap().step_reached, Some(7));
        assert!(a1.lost.as_ref().unwrap().steps_lost_at_least);
        // The later decision line (the retry) is the one kept.
        let d = a1.decision.as_ref().unwrap();
        assert_eq!(d.step, DecisionStep::Same(SameSettings::RetrySameSettings));
        assert_eq!(d.reason, "another tenant");
        assert_eq!(run.end.as_ref().unwrap().exit_code, 127);
        assert_eq!(
            run.end.as_ref().unwrap().last_command.as_deref(),
            Some("python3 train.py --bs 4")
        );
        // One stretch of time lost, as its last line has it.
        assert_eq!(run.setbacks.len(), 1);
        let s = &run.setbacks[0];
        assert_eq!(s.state, crate::journal::SetbackState::NotBack);
        assert_eq!((s.back_to_step, s.seconds), (Some(7), Some(3.5)));
    }

    #[test]
    fn a_half_written_last_line_is_skipped_and_a_bad_one_counted() {
        let text = concat!(
            r#"{"event":"run_start","time":"2026-01-01T00:00:00.000+00:00","argv":["x"],"policy":"default","max_attempts":8,"settings":{"micro_batch":8},"world_size":1,"global_batch":null}"#,
            "\n",
            "{not json}\n",
            r#"{"event":"attempt_start","time":"2026-01-01T00:00:01.000+00:00","attempt":1,"settings":{"micro_batch":8},"global_batch":null,"resume":null}"#,
            "\n",
            r#"{"event":"attempt_end","time":"2026-01-01T00:00:02.0"#,
        );
        let (lines, bad) = lines(text.as_bytes());
        assert_eq!(bad, 1);
        let run = fold(lines, bad).unwrap();
        assert_eq!(run.attempts.len(), 1);
        assert!(run.attempts[0].end.is_none());
        assert!(run.start.supervisor.is_none(), "an older journal");
        assert_eq!(
            run.last_time.as_deref(),
            Some("2026-01-01T00:00:01.000+00:00")
        );
    }

    #[test]
    fn the_last_run_start_begins_the_run() {
        let start = |n: u64| {
            format!(
                r#"{{"event":"run_start","time":"t{n}","argv":["x"],"policy":"p","max_attempts":8,"settings":{{"micro_batch":{n}}},"world_size":1,"global_batch":null}}"#
            )
        };
        let text = format!("{}\n{}\n", start(8), start(2));
        let (lines, bad) = lines(text.as_bytes());
        let run = fold(lines, bad).unwrap();
        assert_eq!(run.start.settings[&Knob::MicroBatch], Value::Int(2));
        assert!(fold(Vec::new(), 0).is_none());
    }
}
