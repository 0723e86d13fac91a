//! The run's typed events: one owned [`Event`] per fact of the run (attempt
//! started, OOM seen, decision, ...). It is the journal's schema — a line of
//! `journal.jsonl` is one `Event` serialised, with the time added — and what
//! every listener of the run receives: the terminal, the journal and the story
//! (`report::{terminal, journal, story}`).
//!
//! The same type is written and read back (`oomguard status` folds a journal's
//! lines into a [`Story`](crate::report::story::Story)), so a field's name and
//! JSON type are an interface: users and tests read these keys. Fields that
//! journals written by older versions lack are `#[serde(default)]`; records the
//! story never reads (the GPU probe before an attempt, the kernel's victim,
//! torchrun's restarts, other tenants, edits of a config file) are kept as the
//! JSON they were written as, so that this module names no module of the
//! pipeline beyond the shared vocabulary.
//!
//! Two lines share a name: `attempt_end` is also written when the command could
//! not be started ([`CannotExecute`], with an `error`), and `decision` also
//! when the same settings are tried again ([`RetrySame`], step
//! `retry_same_settings`); [`Event::read`] tells them apart.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::evidence::{OutcomeKind, When};
use crate::gpu::PeakReport;
use crate::knobs::{Knob, Settings, Value};
use crate::liveness::Supervisor;
use crate::policy::StepKind;
use crate::progress::Logging;

/// A settings' knob values, as the journal writes them (`{"micro_batch": 8}`).
pub type Knobs = BTreeMap<Knob, Value>;

/// One fact of the run, as the journal writes it: the event's name under
/// `"event"` and its fields (serde_json's map keeps the keys sorted, as the
/// journal has always had them). The time is the listener's: the journal adds
/// it as `"time"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run, before its first attempt.
    RunStart {
        argv: Vec<String>,
        policy: String,
        max_attempts: u32,
        settings: Knobs,
        world_size: u64,
        #[serde(default)]
        world_source: String,
        global_batch: Option<u64>,
        /// The environment oomguard adds to the user's.
        #[serde(default)]
        env: Json,
        #[serde(default)]
        notes: Vec<String>,
        #[serde(default)]
        warnings: Vec<String>,
        #[serde(default)]
        tty: bool,
        /// This oomguard (pid, its start time, boot, host): whether the run is
        /// still supervised (`oomguard status`). Absent in journals written
        /// before oomguard recorded it.
        supervisor: Option<Supervisor>,
        /// How often the trainer prints its log dicts (`--logging_steps`, or
        /// the recipe's `logging_steps`), as the run knew it; absent when not
        /// known (and in journals written before oomguard recorded it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logging: Option<Logging>,
    },
    /// One attempt, as launched.
    AttemptStart {
        attempt: u32,
        /// `null` without a GPU probe.
        #[serde(default)]
        gpu: Json,
        #[serde(default)]
        argv: Vec<String>,
        /// The variables the knobs set.
        #[serde(default)]
        env: BTreeMap<String, String>,
        settings: Knobs,
        global_batch: Option<u64>,
        /// The checkpoint it resumes from.
        resume: Option<String>,
        #[serde(default)]
        files: Vec<FileCopy>,
    },
    /// The OOM line that decided how the attempt ended.
    Oom {
        attempt: u32,
        finding: OomRecord,
        /// Seconds from launch to the OOM line.
        after_s: Option<f64>,
        /// The per-task output file the OOM line is in (`srun --output=...%t`),
        /// when it is in one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<String>,
        /// When in the run the OOM happened (`loading`, `saving`, `evaluation`,
        /// `first_step`, `steady_state`, `training`); absent when nothing tells
        /// (and in journals written before oomguard told it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<When>,
        /// How the phase was told ("the traceback runs through load_state_dict").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase_how: Option<String>,
        /// The training step the attempt reached before the OOM, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step_reached: Option<u64>,
    },
    AttemptEnd {
        attempt: u32,
        /// The exit code, or 128+N for death by signal N.
        status: i32,
        /// "exit code 1", "signal 9 (SIGKILL)".
        #[serde(default)]
        exit: String,
        outcome: OutcomeKind,
        /// Why a kill is not a host OOM ("killed by SIGKILL (not by the OOM killer...)").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
        /// The run's process the kernel's OOM killer killed (pid, name, anon-rss).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel_oom_kill: Option<Json>,
        #[serde(default)]
        duration_s: f64,
        #[serde(default)]
        error_line: Option<String>,
        #[serde(default)]
        gpu_peak: Option<PeakReport>,
        /// torchrun's own restarts within this attempt (`--max-restarts N`): how
        /// many, and whether oomguard stopped torchrun at a worker's OOM.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        torchrun: Option<Json>,
    },
    /// The command could not be started (an `attempt_end` line).
    #[serde(rename = "attempt_end", skip_deserializing)]
    CannotExecute(CannotExecute),
    /// A config file the command names changed since the run started (the
    /// user edited it): the relaunch is made from the text read at start.
    ConfigChanged {
        attempt: u32,
        path: String,
        /// The knobs bound in the file whose value the edit changed.
        knobs: Json,
    },
    /// A sign that the trainer ignores a changed setting.
    Suspect { attempt: u32, why: String },
    /// The OOM was caused by another tenant's memory.
    ForeignOom { attempt: u32, tenants: Json },
    /// The command's parser refused an argument oomguard added for `knob` (its
    /// `line`): the knob is dropped from this run's settings.
    Refused {
        attempt: u32,
        knob: Knob,
        added: String,
        line: String,
    },
    /// The command's parser refused the argument oomguard added to tell it where to
    /// resume (`added`, its `line`): every later attempt starts from the beginning.
    ResumeRefused {
        attempt: u32,
        added: String,
        line: String,
    },
    /// A newer checkpoint that the next attempt will not resume from.
    CheckpointSkipped {
        attempt: u32,
        path: String,
        why: String,
    },
    /// A half-written checkpoint of this run's (`path`, `why`) renamed `to` before the
    /// relaunch that follows `attempt`, so that the script's own folder search
    /// (`get_last_checkpoint`) does not load it.
    CheckpointMovedAside {
        attempt: u32,
        path: String,
        to: String,
        why: String,
    },
    /// The newer checkpoints skipped beyond the first few named in
    /// `checkpoint_skipped` lines: how many, and why, counted.
    CheckpointsSkipped {
        attempt: u32,
        count: usize,
        reasons: Json,
    },
    /// Checkpoints this run did not write (there when it started, or written
    /// before): never resumed from. The newest few by path, all counted.
    CheckpointsIgnored {
        attempt: u32,
        count: usize,
        newest: Vec<String>,
        reasons: Json,
    },
    /// The training an OOM cost.
    WorkLost {
        attempt: u32,
        /// `null` when the step cannot be told (never 0 for an unknown).
        step_reached: Option<u64>,
        /// The step reached is a lower bound (a checkpoint the attempt saved,
        /// the last log dict of a Trainer logging every N > 1 steps).
        #[serde(default)]
        step_reached_at_least: bool,
        #[serde(default)]
        started_from_step: Option<u64>,
        #[serde(default)]
        resume_from_step: Option<u64>,
        /// `null` when unknown.
        steps_lost: Option<u64>,
        /// `steps_lost` is a lower bound. Journals before this field said
        /// nothing: their counts were taken as exact.
        #[serde(default)]
        steps_lost_at_least: bool,
        #[serde(default)]
        seconds_lost: f64,
    },
    /// The policy's step after an OOM.
    Decision {
        attempt: u32,
        step: StepKind,
        #[serde(default)]
        before: Knobs,
        #[serde(default)]
        after: Knobs,
        #[serde(default)]
        global_batch_before: Option<u64>,
        #[serde(default)]
        global_batch_after: Option<u64>,
        reason: String,
        resume: Option<String>,
        #[serde(default)]
        resume_step: Option<u64>,
    },
    /// Another tenant held the memory and let it go, or the allocator's
    /// fragmentation was the cause: the same settings again (a `decision` line).
    #[serde(rename = "decision", skip_deserializing)]
    RetrySameSettings(RetrySame),
    /// The time OOMs cost, from an OOM until a relaunch got back to the step
    /// the failed attempt died at (restart and redone steps): written when a
    /// relaunch follows a failed attempt (`behind`), and when that stretch ends
    /// (`back`, `not_back`, `unknown`).
    TimeLost {
        /// The attempt that failed (`behind`), or the one that ended the stretch.
        attempt: u32,
        state: SetbackState,
        /// The failed attempts of the stretch: the first OOM starts it, an
        /// attempt that fails again before it is back joins it.
        ooms: Vec<u32>,
        /// The step to get back to (the highest the failed attempts reached);
        /// `null`: not seen.
        back_to_step: Option<u64>,
        /// When the first OOM of the stretch ended its attempt (RFC 3339).
        since: String,
        /// `back`: the time from the OOM until the relaunch printed that step;
        /// `not_back`: the time until the run ended without it (a lower bound);
        /// `null` otherwise.
        seconds: Option<f64>,
    },
    RunEnd {
        exit_code: i32,
        #[serde(default)]
        attempts: u32,
        /// Seconds spent in attempts that did not succeed (the whole attempt).
        lost_s: f64,
        #[serde(default)]
        settings: Knobs,
        /// The time from each OOM back to the step it died at, summed over the
        /// `time_lost` stretches that got back or ended (see `time_lost`).
        #[serde(default)]
        time_lost_s: f64,
        /// Every stretch got back (`time_lost_s` is exact, not a lower bound
        /// nor missing an unknown one).
        #[serde(default)]
        time_lost_complete: bool,
        /// The last attempt's command line, shell-quoted, with the environment
        /// variables its knobs set in front. Absent in journals written before
        /// oomguard recorded it.
        #[serde(default)]
        last_command: Option<String>,
    },
    /// A line of an event this version does not know (never written).
    #[serde(other, skip_serializing)]
    Other,
}

/// `attempt_end` when the command could not be started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CannotExecute {
    pub attempt: u32,
    /// Always [`OutcomeKind::CannotExecute`].
    pub outcome: OutcomeKind,
    pub error: String,
    pub status: i32,
}

/// `decision` with the same settings again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrySame {
    pub attempt: u32,
    pub step: SameSettings,
    pub before: Knobs,
    pub after: Knobs,
    pub reason: String,
    pub resume: Option<String>,
}

/// The step of a decision that keeps the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SameSettings {
    RetrySameSettings,
}

/// Where a stretch of time lost to OOMs stands (see [`Event::TimeLost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetbackState {
    /// A relaunch follows the OOM and has not got back yet.
    Behind,
    /// A relaunch printed the step the failed attempt died at.
    Back,
    /// The run ended before a relaunch printed that step.
    NotBack,
    /// The step the failed attempt died at was not seen: the time back cannot be told.
    Unknown,
}

/// A changed config file: the user's original and the copy the attempt reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileCopy {
    pub original: String,
    pub copy: String,
}

/// The journal's record of an OOM line: the finding and its numbers, flat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    /// `gpu_oom` for a GPU OOM: the one place the journal keeps the old word
    /// (its readers read it here); the outcome, and `diagnose`, say `cuda_oom`.
    #[serde(default)]
    pub kind: String,
    pub line: String,
    #[serde(default)]
    pub line_no: u64,
    pub device: Option<u32>,
    pub tried_to_allocate_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub allocated_bytes: Option<u64>,
    #[serde(default)]
    pub reserved_unallocated_bytes: Option<u64>,
    #[serde(default)]
    pub other_processes: Json,
    /// The kernel's OOM-killer record, when the output shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim: Option<Json>,
}

impl From<&crate::detect::Finding> for OomRecord {
    fn from(f: &crate::detect::Finding) -> OomRecord {
        use crate::detect::Kind;
        let n = &f.numbers;
        OomRecord {
            kind: match f.kind {
                Kind::GpuOom => "gpu_oom".to_string(),
                k => k.as_str().to_string(),
            },
            line: f.line.clone(),
            line_no: f.line_no,
            device: n.device,
            tried_to_allocate_bytes: n.tried_to_allocate_bytes,
            total_bytes: n.total_bytes,
            free_bytes: n.free_bytes,
            allocated_bytes: n.allocated_bytes,
            reserved_unallocated_bytes: n.reserved_unallocated_bytes,
            other_processes: json(&n.other_processes),
            victim: n.victim.as_ref().map(json),
        }
    }
}

impl Event {
    /// One journal line read back; `None` when it cannot be read (a future
    /// event's field this version does not know the type of, a half line).
    pub fn read(v: Json) -> Option<Event> {
        let name = v.get("event").and_then(Json::as_str);
        match name {
            Some("attempt_end") if v.get("error").is_some() => {
                serde_json::from_value(v).ok().map(Event::CannotExecute)
            }
            Some("decision")
                if v.get("step").and_then(Json::as_str) == Some("retry_same_settings") =>
            {
                serde_json::from_value(v).ok().map(Event::RetrySameSettings)
            }
            _ => serde_json::from_value(v).ok(),
        }
    }

    /// The attempt an event is about (0 for the run's own).
    pub fn attempt(&self) -> u32 {
        match self {
            Event::RunStart { .. } | Event::RunEnd { .. } | Event::Other => 0,
            Event::CannotExecute(c) => c.attempt,
            Event::RetrySameSettings(r) => r.attempt,
            Event::AttemptStart { attempt, .. }
            | Event::Oom { attempt, .. }
            | Event::AttemptEnd { attempt, .. }
            | Event::ConfigChanged { attempt, .. }
            | Event::Suspect { attempt, .. }
            | Event::ForeignOom { attempt, .. }
            | Event::Refused { attempt, .. }
            | Event::ResumeRefused { attempt, .. }
            | Event::CheckpointSkipped { attempt, .. }
            | Event::CheckpointMovedAside { attempt, .. }
            | Event::CheckpointsSkipped { attempt, .. }
            | Event::CheckpointsIgnored { attempt, .. }
            | Event::WorkLost { attempt, .. }
            | Event::Decision { attempt, .. }
            | Event::TimeLost { attempt, .. } => *attempt,
        }
    }
}

/// Whoever hears the run's events: the terminal, the journal, the story.
pub trait Listener {
    /// `at`: when it happened.
    fn on(&mut self, at: SystemTime, event: &Event);
}

/// A record the story does not read, as the JSON it is written as (`null`
/// for one that cannot be: never the case for the pipeline's types).
pub fn json<T: Serialize + ?Sized>(t: &T) -> Json {
    serde_json::to_value(t).unwrap_or(Json::Null)
}

/// An argv as strings (lossy: the journal is text).
pub fn argv(argv: &[OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// A path as a string, lossy: an event must not be lost (nor oomguard stop)
/// over a file name that is not UTF-8.
pub fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Settings as `{"knob": value}` (the world size has its own field).
pub fn knobs(s: &Settings) -> Knobs {
    s.knobs.clone()
}

/// Serialises borrowed settings as [`knobs`] writes them (for reports that
/// borrow, like `plan --json`).
pub fn knob_values<S: serde::Serializer>(settings: &&Settings, s: S) -> Result<S::Ok, S::Error> {
    settings.knobs.serialize(s)
}

/// Serialises a borrowed argv as [`argv`] writes it.
pub fn lossy<S: serde::Serializer>(argv: &&[OsString], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(argv.iter().map(|a| a.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(e: &Event) -> Vec<String> {
        let v = serde_json::to_value(e).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    }

    fn knobs(micro: u64, accum: u64) -> Knobs {
        [
            (Knob::MicroBatch, Value::Int(micro)),
            (Knob::GradAccum, Value::Int(accum)),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn both_decision_lines_keep_their_keys_and_read_back() {
        let d = Event::Decision {
            attempt: 1,
            step: StepKind::HalveMicroBatch,
            before: knobs(8, 1),
            after: knobs(4, 2),
            global_batch_before: Some(16),
            global_batch_after: None,
            reason: "OOM: micro-batch 8 → 4".into(),
            resume: None,
            resume_step: None,
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["event"], "decision");
        assert_eq!(v["step"], "halve_micro_batch");
        assert_eq!(v["before"]["micro_batch"], 8);
        assert!(v["global_batch_after"].is_null() && v["resume"].is_null());
        assert_eq!(
            keys(&d),
            [
                "after",
                "attempt",
                "before",
                "event",
                "global_batch_after",
                "global_batch_before",
                "reason",
                "resume",
                "resume_step",
                "step"
            ]
        );
        assert_eq!(Event::read(v.clone()).map(|e| json(&e)), Some(v));
        let r = Event::RetrySameSettings(RetrySame {
            attempt: 2,
            step: SameSettings::RetrySameSettings,
            before: knobs(8, 1),
            after: knobs(8, 1),
            reason: "another tenant held the memory: bob".into(),
            resume: Some("out/checkpoint-5".into()),
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["event"], "decision");
        assert_eq!(v["step"], "retry_same_settings");
        assert_eq!(
            keys(&r),
            [
                "after", "attempt", "before", "event", "reason", "resume", "step"
            ]
        );
        assert_eq!(Event::read(v.clone()).map(|e| json(&e)), Some(v));
        let c = Event::CannotExecute(CannotExecute {
            attempt: 1,
            outcome: OutcomeKind::CannotExecute,
            error: "x: command not found".into(),
            status: 127,
        });
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            (&v["event"], &v["outcome"]),
            (&"attempt_end".into(), &"cannot_execute".into())
        );
        assert_eq!(Event::read(v.clone()).map(|e| json(&e)), Some(v));
    }

    #[test]
    fn an_attempt_end_keeps_its_keys_and_reads_back() {
        let e = Event::AttemptEnd {
            attempt: 1,
            status: 0,
            exit: "exit code 0".into(),
            outcome: OutcomeKind::Success,
            why: None,
            kernel_oom_kill: None,
            duration_s: 1.5,
            error_line: None,
            gpu_peak: None,
            torchrun: None,
        };
        assert_eq!(
            keys(&e),
            [
                "attempt",
                "duration_s",
                "error_line",
                "event",
                "exit",
                "gpu_peak",
                "outcome",
                "status"
            ]
        );
        let v = json(&e);
        assert_eq!(Event::read(v.clone()).map(|e| json(&e)), Some(v));
    }

    #[test]
    fn an_unknown_event_is_other_and_a_bad_field_is_unreadable() {
        let v = serde_json::json!({"event": "from_the_future", "attempt": 1});
        assert!(matches!(Event::read(v), Some(Event::Other)));
        let v = serde_json::json!({"event": "suspect", "attempt": "one", "why": "x"});
        assert!(Event::read(v).is_none());
    }

    #[test]
    fn a_path_that_is_not_utf8_is_written_lossily() {
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"out/ckpt-\xff"));
        assert_eq!(path(odd), "out/ckpt-\u{fffd}");
    }
}
