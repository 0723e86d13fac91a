//! The story: the fold of a run's [`events`](crate::events), from which both
//! the end of the run and `oomguard status` are told.
//!
//! Theory of operation. Every event the run emits is heard by the story as it
//! happens (a listener of the supervisor), and every line of a journal read
//! back is the same [`Event`]: so the story of a run in progress, of a run that
//! ended, and of a run whose oomguard was killed are one fold. What the run
//! derives once — the step an attempt started from, the trainer's logging
//! interval, the stretches of time lost to OOMs — the story keeps as the run
//! said it, and `status` reads it from here instead of working it out again.
//!
//! A journal is read while it is being written: a last line without its
//! newline may be half written and is skipped without a word; any other line
//! that cannot be read (a future event's field this version does not know) is
//! counted, never fatal. Events the story does not need are heard and dropped.

use std::io;
use std::path::Path;
use std::time::SystemTime;

use chrono::{DateTime, FixedOffset};
use serde::{Deserialize, Serialize};

use crate::events::{Event, FileCopy, Knobs, Listener, SameSettings, SetbackState};
use crate::evidence::{Evidence, OutcomeKind, When};
use crate::gpu::PeakReport;
use crate::liveness::Supervisor;
use crate::policy::StepKind;
use crate::progress::Logging;

/// The run before its first attempt (`run_start`); `time` is when it started.
#[derive(Debug, Clone)]
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
    /// The trainer's logging interval as the run knew it (absent in journals
    /// written before oomguard recorded it: see [`Story::logging`]).
    pub logging: Option<Logging>,
}

#[derive(Debug, Clone)]
pub struct AttemptStart {
    pub time: String,
    pub attempt: u32,
    pub settings: Knobs,
    pub global_batch: Option<u64>,
    /// The checkpoint it resumes from.
    pub resume: Option<String>,
    /// oomguard put `resume` in its argv (`--resume_from_checkpoint PATH`); false
    /// when the command finds it in its folder by itself (Megatron, fairseq).
    pub resume_added: bool,
    /// The config files it reads changed: oomguard's copies, and the files
    /// edited in place (a copy that is its original).
    pub files: Vec<FileCopy>,
}

#[derive(Debug, Clone)]
pub struct Oom {
    pub attempt: u32,
    pub finding: OomLine,
    /// Seconds from launch to the OOM line.
    pub after_s: Option<f64>,
    /// When in the run it happened; absent in journals written before
    /// oomguard told it, and when nothing told it.
    pub phase: Option<When>,
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
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub outcome: OutcomeKind,
    pub status: i32,
    pub exit: Option<String>,
    pub duration_s: Option<f64>,
    pub gpu_peak: Option<PeakReport>,
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct WorkLost {
    pub step_reached: Option<u64>,
    pub steps_lost: Option<u64>,
    pub steps_lost_at_least: bool,
    pub seconds_lost: f64,
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

#[derive(Debug, Clone)]
pub struct Decision {
    pub attempt: u32,
    pub step: DecisionStep,
    /// The knobs before and after it.
    pub before: Knobs,
    pub after: Knobs,
    pub reason: String,
    pub resume: Option<String>,
    pub resume_step: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct RunEnd {
    pub time: String,
    pub exit_code: i32,
    /// Attempts begun (one that could not be started counts).
    pub attempts: u32,
    pub lost_s: f64,
    /// The settings of the last attempt.
    pub settings: Knobs,
    /// Absent in journals written before oomguard recorded it.
    pub last_command: Option<String>,
}

/// `time_lost`: one stretch of time lost to OOMs, as it stood when told.
#[derive(Debug, Clone)]
pub struct TimeLost {
    pub attempt: u32,
    pub state: SetbackState,
    pub ooms: Vec<u32>,
    pub back_to_step: Option<u64>,
    pub since: String,
    pub seconds: Option<f64>,
}

/// One attempt, as far as the story has got.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub start: AttemptStart,
    pub oom: Option<Oom>,
    pub end: Option<AttemptEnd>,
    pub lost: Option<WorkLost>,
    pub decision: Option<Decision>,
    /// What oomguard added that the command refused, when it did.
    pub refused: Option<Refused>,
    /// Whose memory caused its OOM, when another tenant's did.
    pub foreign: Option<String>,
    /// The decision that replaced this attempt's, when a later attempt's
    /// command refused a knob it changed and its OOM was decided again.
    pub redecided: Option<Decision>,
}

/// What oomguard added that an attempt's command refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A knob's flag or override, and the knob dropped for it
    /// ("--gradient_accumulation_steps (grad_accum)").
    Knob(String),
    /// The argument that told it where to resume ("--resume_from_checkpoint").
    Resume(String),
}

/// One run: its start and what followed, in order.
#[derive(Debug, Clone)]
pub struct Story {
    pub start: RunStart,
    pub attempts: Vec<Attempt>,
    pub end: Option<RunEnd>,
    /// The stretches of time lost to OOMs, each as its last `time_lost` has it.
    pub setbacks: Vec<TimeLost>,
    /// The time of the last event heard.
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

/// The events of `text` (journal lines) that can be read, with their times,
/// and how many cannot. A last line without its newline is read when it is
/// whole and dropped otherwise.
pub fn lines(text: &[u8]) -> (Vec<(Event, Option<String>)>, usize) {
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

fn parse(line: &[u8]) -> Option<(Event, Option<String>)> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    let time = v.get("time").and_then(|t| t.as_str()).map(String::from);
    Some((Event::read(v)?, time))
}

/// Fold the events of a journal into the story of its last run (a run folder
/// given again with `--run-dir` holds every run's lines: the last `run_start`
/// begins the one that counts).
pub fn fold(events: Vec<(Event, Option<String>)>, unreadable: usize) -> Option<Story> {
    let first = events
        .iter()
        .rposition(|(e, _)| matches!(e, Event::RunStart { .. }))?;
    let mut it = events.into_iter().skip(first);
    let (start, t0) = it.next()?;
    let mut story = Story::begin(&start, t0)?;
    story.unreadable = unreadable;
    for (e, time) in it {
        story.hear(&e, time);
    }
    Some(story)
}

impl Story {
    /// The story of a run that starts with `run_start` (told at `time`);
    /// `None` for any other event.
    pub fn begin(e: &Event, time: Option<String>) -> Option<Story> {
        let Event::RunStart {
            argv,
            policy,
            max_attempts,
            settings,
            world_size,
            global_batch,
            supervisor,
            logging,
            ..
        } = e
        else {
            return None;
        };
        Some(Story {
            start: RunStart {
                time: time.clone().unwrap_or_default(),
                argv: argv.clone(),
                policy: policy.clone(),
                max_attempts: *max_attempts,
                settings: settings.clone(),
                world_size: *world_size,
                global_batch: *global_batch,
                supervisor: supervisor.clone(),
                logging: *logging,
            },
            attempts: Vec::new(),
            end: None,
            setbacks: Vec::new(),
            last_time: time,
            unreadable: 0,
        })
    }

    /// One more event of the run, told at `time`.
    pub fn hear(&mut self, e: &Event, time: Option<String>) {
        if time.is_some() {
            self.last_time.clone_from(&time);
        }
        let time = time.unwrap_or_default();
        let n = e.attempt();
        if let Event::AttemptStart {
            attempt,
            argv,
            settings,
            global_batch,
            resume,
            files,
            ..
        } = e
        {
            // A journal written before attempts recorded their argv: as it was then
            // told, added.
            let resume_added = resume.as_deref().is_some_and(|r| {
                argv.is_empty()
                    || argv
                        .iter()
                        .any(|a| a == r || a.strip_suffix(r).is_some_and(|f| f.ends_with('=')))
            });
            self.attempts.push(Attempt {
                start: AttemptStart {
                    time,
                    attempt: *attempt,
                    settings: settings.clone(),
                    global_batch: *global_batch,
                    resume: resume.clone(),
                    resume_added,
                    files: files.clone(),
                },
                oom: None,
                end: None,
                lost: None,
                decision: None,
                refused: None,
                foreign: None,
                redecided: None,
            });
            return;
        }
        match e {
            Event::RunEnd {
                exit_code,
                attempts,
                lost_s,
                settings,
                last_command,
                ..
            } => {
                self.end = Some(RunEnd {
                    time,
                    exit_code: *exit_code,
                    attempts: *attempts,
                    lost_s: *lost_s,
                    settings: settings.clone(),
                    last_command: last_command.clone(),
                });
                return;
            }
            Event::TimeLost {
                attempt,
                state,
                ooms,
                back_to_step,
                since,
                seconds,
            } => {
                let t = TimeLost {
                    attempt: *attempt,
                    state: *state,
                    ooms: ooms.clone(),
                    back_to_step: *back_to_step,
                    since: since.clone(),
                    seconds: *seconds,
                };
                // A stretch is named by its first OOM.
                match self
                    .setbacks
                    .iter_mut()
                    .find(|s| s.ooms.first() == t.ooms.first())
                {
                    Some(s) => *s = t,
                    None => self.setbacks.push(t),
                }
                return;
            }
            _ => {}
        }
        let Some(i) = self.attempts.iter().rposition(|a| a.start.attempt == n) else {
            return;
        };
        // A decision after a refusal decides the last OOM again without the
        // refused knob: it is that OOM's decision now.
        if let Event::Decision { .. } = e
            && self.attempts[i].refused.is_some()
            && self.attempts[i].oom.is_none()
            && let Some(p) = self.attempts[..i].iter().rposition(|a| {
                a.decision
                    .as_ref()
                    .is_some_and(|d| matches!(d.step, DecisionStep::Policy(_)))
            })
        {
            self.attempts[p].redecided = decision_of(e);
        }
        let a = &mut self.attempts[i];
        match e {
            Event::Oom {
                attempt,
                finding,
                after_s,
                phase,
                step_reached,
                ..
            } => {
                a.oom = Some(Oom {
                    attempt: *attempt,
                    finding: OomLine {
                        line: finding.line.clone(),
                        device: finding.device,
                        tried_to_allocate_bytes: finding.tried_to_allocate_bytes,
                        total_bytes: finding.total_bytes,
                        free_bytes: finding.free_bytes,
                    },
                    after_s: *after_s,
                    phase: *phase,
                    step_reached: *step_reached,
                })
            }
            Event::AttemptEnd {
                status,
                exit,
                outcome,
                duration_s,
                gpu_peak,
                ..
            } => {
                a.end = Some(AttemptEnd {
                    outcome: *outcome,
                    status: *status,
                    exit: Some(exit.clone()),
                    duration_s: Some(*duration_s),
                    gpu_peak: gpu_peak.clone(),
                    error: None,
                })
            }
            Event::CannotExecute(c) => {
                a.end = Some(AttemptEnd {
                    outcome: c.outcome,
                    status: c.status,
                    exit: None,
                    duration_s: None,
                    gpu_peak: None,
                    error: Some(c.error.clone()),
                })
            }
            Event::WorkLost {
                step_reached,
                steps_lost,
                steps_lost_at_least,
                seconds_lost,
                ..
            } => {
                a.lost = Some(WorkLost {
                    step_reached: *step_reached,
                    steps_lost: *steps_lost,
                    steps_lost_at_least: *steps_lost_at_least,
                    seconds_lost: *seconds_lost,
                })
            }
            Event::Decision { .. } | Event::RetrySameSettings(_) => a.decision = decision_of(e),
            Event::Refused { knob, added, .. } => {
                a.refused = Some(Refused::Knob(format!("{added} ({knob})")))
            }
            Event::ResumeRefused { added, .. } => a.refused = Some(Refused::Resume(added.clone())),
            Event::ForeignOom { tenants, .. } => {
                let tenants: Vec<crate::gpu::Tenant> =
                    serde_json::from_value(tenants.clone()).unwrap_or_default();
                let who: Vec<String> = tenants.iter().map(ToString::to_string).collect();
                a.foreign = Some(who.join("; "));
            }
            _ => {}
        }
    }

    /// The settings of the last attempt: as the run's end says, or as the
    /// last attempt started with, or the run's first.
    pub fn last_settings(&self) -> &Knobs {
        match (&self.end, self.attempts.last()) {
            (Some(e), _) if !e.settings.is_empty() => &e.settings,
            (_, Some(a)) => &a.start.settings,
            _ => &self.start.settings,
        }
    }

    /// The step attempt `i` (its index) started from: the step of the
    /// checkpoint that the decision before it resumed from; `None` for a fresh
    /// start (and the first attempt, which runs the command as written).
    pub fn started_from(&self, i: usize) -> Option<u64> {
        let a = self.attempts.get(i)?;
        i.checked_sub(1)
            .and_then(|p| self.attempts[p].decision.as_ref())
            .filter(|d| d.resume.is_some() && d.resume == a.start.resume)
            .and_then(|d| d.resume_step)
    }

    /// How often the trainer prints its log dicts (they name no step), as the
    /// run knew it: from its flags and the recipes it names. A journal written
    /// before oomguard recorded it has the command's flags only.
    pub fn logging(&self) -> Option<Logging> {
        self.start.logging.or_else(|| {
            let argv: Vec<std::ffi::OsString> = self.start.argv.iter().map(Into::into).collect();
            crate::frameworks::logging(
                &crate::command::Command::parse(&argv),
                &crate::frameworks::Ctx {
                    recipe_output_dir: None,
                    recipe_value: &|_| None,
                },
            )
        })
    }

    /// Seconds spent in attempts that did not succeed: as the run's end says,
    /// or so far.
    pub fn lost_s(&self) -> f64 {
        match &self.end {
            Some(e) => e.lost_s,
            None => self
                .attempts
                .iter()
                .filter_map(|a| a.end.as_ref())
                .filter(|e| e.outcome != OutcomeKind::Success)
                .filter_map(|e| e.duration_s)
                .sum(),
        }
    }

    /// Training steps redone after OOMs where known (`None`: none known), and
    /// how many OOMs' count is unknown or only a lower bound.
    pub fn steps_lost(&self) -> (Option<u64>, usize) {
        let lost: Vec<&WorkLost> = self
            .attempts
            .iter()
            .filter_map(|a| a.lost.as_ref())
            .collect();
        let known: Vec<u64> = lost.iter().filter_map(|l| l.steps_lost).collect();
        let unknown = lost
            .iter()
            .filter(|l| l.steps_lost.is_none() || l.steps_lost_at_least)
            .count();
        ((!known.is_empty()).then(|| known.iter().sum()), unknown)
    }

    /// The stretches of time lost to OOMs at `until`: an open one (a relaunch
    /// not back yet) counts until then, and is `seen_back` when the running
    /// attempt already printed the step (`live_step`), at a time only its end
    /// will tell.
    pub fn setbacks(
        &self,
        until: DateTime<FixedOffset>,
        live_step: Option<u64>,
    ) -> Vec<crate::journal::Setback> {
        let last = self.attempts.last();
        self.setbacks
            .iter()
            .filter_map(|t| {
                let since = DateTime::parse_from_rfc3339(&t.since).ok()?;
                let open = t.state == SetbackState::Behind;
                Some(crate::journal::Setback {
                    ooms: t.ooms.clone(),
                    step: t.back_to_step,
                    since: since.into(),
                    state: t.state,
                    ended_in: if open {
                        last.map(|a| a.start.attempt)
                    } else {
                        Some(t.attempt)
                    },
                    seconds: if open {
                        Some(((until - since).num_milliseconds() as f64 / 1000.0).max(0.0))
                    } else {
                        t.seconds
                    },
                    seen_back: open
                        && last.is_some_and(|a| a.end.is_none())
                        && t.back_to_step.zip(live_step).is_some_and(|(s, r)| r >= s),
                    // Ended by an attempt that finished the training (see `Setback`).
                    finished: t.state == SetbackState::NotBack
                        && self.attempts.iter().any(|a| {
                            a.start.attempt == t.attempt
                                && a.end
                                    .as_ref()
                                    .is_some_and(|e| e.outcome == OutcomeKind::Success)
                        }),
                })
            })
            .collect()
    }

    /// The time lost to OOMs at `until` (see [`Story::setbacks`]): seconds where
    /// any can be told, whether that is the whole figure, and in words as the
    /// summary says it. `going`: the run still runs.
    pub fn time_lost(
        &self,
        until: DateTime<FixedOffset>,
        live_step: Option<u64>,
        going: bool,
    ) -> TimeLostNow {
        let setbacks = self.setbacks(until, live_step);
        let counted = |s: &&crate::journal::Setback| {
            s.state != SetbackState::Unknown && !s.seen_back && !s.finished
        };
        let measured = setbacks.iter().any(|s| counted(&s));
        TimeLostNow {
            seconds: measured.then(|| {
                setbacks
                    .iter()
                    .filter(counted)
                    .filter_map(|s| s.seconds)
                    .sum()
            }),
            exact: setbacks.iter().all(|s| s.state == SetbackState::Back),
            text: crate::journal::time_lost_text(&setbacks, going),
        }
    }
}

impl Story {
    /// The work each OOM that was decided on cost (a `work_lost` each), in
    /// the order of the attempts.
    pub fn losses(&self) -> Vec<crate::progress::Loss> {
        self.attempts
            .iter()
            .filter_map(|a| a.lost.as_ref())
            .map(|l| crate::progress::Loss {
                steps: l.steps_lost,
                at_least: l.steps_lost_at_least,
                seconds: l.seconds_lost,
            })
            .collect()
    }

    /// Seconds from the run's start to its end (or to the last event heard).
    pub fn elapsed(&self) -> Option<f64> {
        let start = DateTime::parse_from_rfc3339(&self.start.time).ok()?;
        let last = self
            .end
            .as_ref()
            .map(|e| e.time.as_str())
            .or(self.last_time.as_deref())?;
        let last = DateTime::parse_from_rfc3339(last).ok()?;
        Some(((last - start).num_milliseconds() as f64 / 1000.0).max(0.0))
    }

    /// The first line of the end summary and the one figure of the work lost
    /// to OOMs (steps redone, time back), as `oomguard:` lines; `None` before
    /// the run's end was heard.
    pub fn ending(&self) -> Option<String> {
        let end = self.end.as_ref()?;
        let (attempts, code) = (end.attempts, end.exit_code);
        let status = match code {
            0 => "finished".to_string(),
            crate::exit::EXHAUSTED => "gave up: the run still does not fit".to_string(),
            c => format!("stopped (exit {c})"),
        };
        let mut out = format!(
            "\noomguard: {status} after {attempts} attempt{}; {} in all\n",
            if attempts == 1 { "" } else { "s" },
            crate::journal::duration(self.elapsed().unwrap_or(0.0))
        );
        // One figure for the work the OOMs cost: the steps redone, and the time
        // from each OOM until a relaunch was back at the step it died at.
        let losses = self.losses();
        let until = DateTime::parse_from_rfc3339(&end.time).ok()?;
        let time = self.time_lost(until, None, false).text;
        if !losses.is_empty() {
            out += &format!(
                "oomguard: work lost to {} OOM{}: {} of redone training",
                losses.len(),
                if losses.len() == 1 { "" } else { "s" },
                crate::progress::steps_text(&losses)
            );
            out += &time.map(|t| format!("; {t}\n")).unwrap_or("\n".into());
        } else if let Some(t) = time {
            let n: usize = self.setbacks.iter().map(|s| s.ooms.len()).sum();
            out += &format!(
                "oomguard: time lost to {n} OOM{}: {t}\n",
                if n == 1 { "" } else { "s" }
            );
        }
        Some(out)
    }
}

/// A `decision` line as the story keeps it (`None` for any other event).
fn decision_of(e: &Event) -> Option<Decision> {
    match e {
        Event::Decision {
            attempt,
            step,
            before,
            after,
            reason,
            resume,
            resume_step,
            ..
        } => Some(Decision {
            attempt: *attempt,
            step: DecisionStep::Policy(*step),
            before: before.clone(),
            after: after.clone(),
            reason: reason.clone(),
            resume: resume.clone(),
            resume_step: *resume_step,
        }),
        Event::RetrySameSettings(r) => Some(Decision {
            attempt: r.attempt,
            step: DecisionStep::Same(r.step),
            before: r.before.clone(),
            after: r.after.clone(),
            reason: r.reason.clone(),
            resume: r.resume.clone(),
            resume_step: None,
        }),
        _ => None,
    }
}

impl Listener for Story {
    fn on(&mut self, at: SystemTime, event: &Event) {
        self.hear(event, Some(crate::report::journal::stamp(at)));
    }
}

/// The time lost to OOMs, at one instant (see [`Story::time_lost`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TimeLostNow {
    pub seconds: Option<f64>,
    pub exact: bool,
    pub text: Option<String>,
}

/// The most of a journal's beginning and end `status` and `runs` read.
const JOURNAL_HEAD: u64 = 16 << 20;
const JOURNAL_TAIL: u64 = 48 << 20;

/// Read `dir/journal.jsonl` (without following a link at its name).
pub fn read_run(dir: &Path) -> Result<Story, ReadError> {
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
            oom: Some(crate::detect::OomNumbers {
                device: f.device,
                tried_to_allocate_bytes: f.tried_to_allocate_bytes,
                total_bytes: f.total_bytes,
                free_bytes: f.free_bytes,
                ..Default::default()
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
    use crate::events::{CannotExecute, RetrySame};
    use crate::knobs::Knob;
    use crate::knobs::Value;
    use crate::report::journal::Journal;
    use crate::settings::Offload;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn knobs(micro: u64, accum: u64) -> Knobs {
        [
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
        .collect()
    }

    fn run_start(settings: Knobs, logging: Option<Logging>) -> Event {
        Event::RunStart {
            argv: vec!["python3".into(), "train.py".into()],
            policy: "default".into(),
            max_attempts: 8,
            settings,
            world_size: 2,
            world_source: "default".into(),
            global_batch: Some(16),
            env: serde_json::json!([]),
            notes: vec![],
            warnings: vec![],
            tty: false,
            supervisor: Some(Supervisor::me()),
            logging,
        }
    }

    fn attempt_start(n: u32, settings: Knobs, resume: Option<&str>) -> Event {
        Event::AttemptStart {
            attempt: n,
            gpu: serde_json::Value::Null,
            argv: vec!["python3".into(), "train.py".into()],
            env: BTreeMap::new(),
            settings,
            global_batch: Some(16),
            resume: resume.map(String::from),
            files: vec![],
        }
    }

    fn end(n: u32, outcome: OutcomeKind, secs: f64) -> Event {
        Event::AttemptEnd {
            attempt: n,
            status: if outcome == OutcomeKind::Success {
                0
            } else {
                1
            },
            exit: "exit code 1".into(),
            outcome,
            why: None,
            kernel_oom_kill: None,
            duration_s: secs,
            error_line: None,
            gpu_peak: None,
            torchrun: None,
        }
    }

    fn decision(n: u32, resume: Option<&str>, resume_step: Option<u64>) -> Event {
        Event::Decision {
            attempt: n,
            step: StepKind::HalveMicroBatch,
            before: knobs(8, 1),
            after: knobs(4, 2),
            global_batch_before: Some(16),
            global_batch_after: Some(16),
            reason: "OOM: micro-batch 8 → 4".into(),
            resume: resume.map(String::from),
            resume_step,
        }
    }

    fn time_lost(n: u32, state: SetbackState, seconds: Option<f64>) -> Event {
        Event::TimeLost {
            attempt: n,
            state,
            ooms: vec![1],
            back_to_step: Some(7),
            since: "2026-01-01T00:00:00.000+00:00".into(),
            seconds,
        }
    }

    /// A story told from events as they happen, one second apart.
    fn told(events: &[Event]) -> Story {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let mut story = Story::begin(&events[0], Some(crate::report::journal::stamp(t0)))
            .expect("a run_start first");
        for (i, e) in events.iter().enumerate().skip(1) {
            story.on(t0 + Duration::from_secs(i as u64), e);
        }
        story
    }

    /// What the run writes, the story reads back: the shared types round-trip,
    /// and a story heard live is the story read from its journal.
    #[test]
    fn the_writers_events_read_back_as_the_same_story() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        let mut j = Journal::open(dir.clone());
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
        let events = vec![
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            {
                let mut e = end(1, OutcomeKind::CudaOom, 2.5);
                if let Event::AttemptEnd { gpu_peak, .. } = &mut e {
                    *gpu_peak = Some(peak.clone());
                }
                e
            },
            Event::Suspect {
                attempt: 1,
                why: "not read".into(),
            },
            Event::WorkLost {
                attempt: 1,
                step_reached: Some(7),
                step_reached_at_least: true,
                started_from_step: None,
                resume_from_step: Some(5),
                steps_lost: Some(2),
                steps_lost_at_least: true,
                seconds_lost: 0.5,
            },
            decision(1, Some("out/checkpoint-5"), Some(5)),
            Event::RetrySameSettings(RetrySame {
                attempt: 1,
                step: SameSettings::RetrySameSettings,
                before: knobs(4, 2),
                after: knobs(4, 2),
                reason: "another tenant".into(),
                resume: None,
            }),
            Event::CannotExecute(CannotExecute {
                attempt: 2,
                outcome: OutcomeKind::CannotExecute,
                error: "not found".into(),
                status: 127,
            }),
            time_lost(1, SetbackState::Behind, None),
            time_lost(2, SetbackState::NotBack, Some(3.5)),
            Event::RunEnd {
                exit_code: 127,
                attempts: 2,
                lost_s: 2.5,
                settings: knobs(4, 2),
                time_lost_s: 3.5,
                time_lost_complete: false,
                last_command: Some("python3 train.py --bs 4".into()),
            },
        ];
        let now = SystemTime::now();
        for e in &events {
            j.on(now, e);
        }
        let run = read_run(&dir).unwrap();
        assert_eq!(run.unreadable, 0);
        assert_eq!(run.start.settings, knobs(8, 1));
        assert_eq!(run.start.supervisor.as_ref(), Some(&Supervisor::me()));
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
        assert_eq!(s.state, SetbackState::NotBack);
        assert_eq!((s.back_to_step, s.seconds), (Some(7), Some(3.5)));
        // Heard live, the same story.
        let live = {
            let stamp = Some(crate::report::journal::stamp(now));
            let mut story = Story::begin(&events[0], stamp).unwrap();
            for e in &events[1..] {
                story.on(now, e);
            }
            story
        };
        assert_eq!(format!("{live:?}"), format!("{run:?}"));
    }

    #[test]
    fn the_step_an_attempt_started_from_is_the_checkpoint_its_decision_resumed() {
        let story = told(&[
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            end(1, OutcomeKind::CudaOom, 2.0),
            decision(1, Some("out/checkpoint-5"), Some(5)),
            attempt_start(2, knobs(4, 2), Some("out/checkpoint-5")),
            end(2, OutcomeKind::CudaOom, 2.0),
            // No checkpoint to resume from: a fresh start, whatever the step says.
            decision(2, None, Some(5)),
            attempt_start(3, knobs(2, 4), None),
        ]);
        assert_eq!(story.started_from(0), None, "the command as written");
        assert_eq!(story.started_from(1), Some(5));
        assert_eq!(story.started_from(2), None);
        assert_eq!(story.started_from(3), None, "no such attempt");
        // Each attempt's time is when it was heard (the fifth event).
        let t4 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_604);
        assert_eq!(
            story.attempts[1].start.time,
            crate::report::journal::stamp(t4)
        );
    }

    /// The logging interval is the run's (its recipe's `logging_steps` included),
    /// not what the command's flags alone say; an older journal without it falls
    /// back to the flags.
    #[test]
    fn the_logging_interval_is_the_one_the_run_knew() {
        let every5 = Logging {
            every: 5,
            first_step: false,
        };
        let story = told(&[run_start(knobs(8, 1), Some(every5))]);
        assert_eq!(story.logging(), Some(every5));
        let mut start = run_start(knobs(8, 1), None);
        if let Event::RunStart { argv, .. } = &mut start {
            argv.extend(["--logging_steps".to_string(), "10".to_string()]);
        }
        let older = told(&[start]);
        assert_eq!(older.logging().map(|l| l.every), Some(10));
        // Written only when known: a journal without it reads as before.
        let v = crate::events::json(&run_start(knobs(8, 1), None));
        assert!(v.get("logging").is_none());
        let v = crate::events::json(&run_start(knobs(8, 1), Some(every5)));
        assert_eq!(
            v["logging"],
            serde_json::json!({"every": 5, "first_step": false})
        );
    }

    #[test]
    fn the_time_lost_is_told_from_the_stretches_as_they_stand() {
        let since = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.000+00:00").unwrap();
        let until = since + chrono::Duration::seconds(4);
        let behind = told(&[
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            end(1, OutcomeKind::CudaOom, 2.0),
            time_lost(1, SetbackState::Behind, None),
            attempt_start(2, knobs(4, 2), None),
        ]);
        // Open: counted until now.
        let now = behind.time_lost(until, Some(3), true);
        assert_eq!(now.seconds, Some(4.0));
        assert!(!now.exact);
        assert!(
            now.text.as_deref().unwrap().ends_with(
                "attempt 2 is not back at step 7 yet (4.0 s since the OOM in attempt 1)"
            ),
            "{now:?}"
        );
        // The running attempt printed step 7: back, at a time its end will tell.
        let seen = behind.time_lost(until, Some(7), true);
        assert_eq!(seen.seconds, None);
        assert!(seen.text.unwrap().contains("attempt 2 is back at step 7"));
        let back = told(&[
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            end(1, OutcomeKind::CudaOom, 2.0),
            time_lost(1, SetbackState::Behind, None),
            attempt_start(2, knobs(4, 2), None),
            end(2, OutcomeKind::Success, 9.0),
            time_lost(2, SetbackState::Back, Some(1.25)),
        ]);
        let done = back.time_lost(until, None, false);
        assert_eq!((done.seconds, done.exact), (Some(1.25), true));
        assert_eq!(
            done.text.as_deref(),
            Some("1.2 s from the OOM back to the step it died at (restart and redone steps)")
        );
        assert_eq!(back.lost_s(), 2.0, "so far: the failed attempt");
        assert_eq!(back.steps_lost(), (None, 0));
    }

    /// The end of the summary is told from the events alone: how the run ended,
    /// its duration, the work the OOMs cost and the time back.
    #[test]
    fn the_ending_is_told_from_the_events() {
        let lost = |n: u32, steps: Option<u64>| Event::WorkLost {
            attempt: n,
            step_reached: steps.map(|s| s + 5),
            step_reached_at_least: false,
            started_from_step: None,
            resume_from_step: Some(5),
            steps_lost: steps,
            steps_lost_at_least: false,
            seconds_lost: 0.5,
        };
        let run_end = |code: i32, attempts: u32| Event::RunEnd {
            exit_code: code,
            attempts,
            lost_s: 4.0,
            settings: knobs(4, 2),
            time_lost_s: 0.0,
            time_lost_complete: false,
            last_command: None,
        };
        let mut events = vec![
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            end(1, OutcomeKind::CudaOom, 2.0),
            lost(1, Some(2)),
            decision(1, Some("out/checkpoint-5"), Some(5)),
            time_lost(1, SetbackState::Behind, None),
            attempt_start(2, knobs(4, 2), Some("out/checkpoint-5")),
        ];
        assert_eq!(told(&events).ending(), None, "not ended yet");
        events.extend([
            end(2, OutcomeKind::CudaOom, 2.0),
            lost(2, None),
            time_lost(2, SetbackState::NotBack, Some(3.0)),
            run_end(crate::exit::EXHAUSTED, 2),
        ]);
        let story = told(&events);
        assert_eq!(story.elapsed(), Some(10.0));
        assert_eq!(
            story.ending().unwrap(),
            "\noomguard: gave up: the run still does not fit after 2 attempts; 10.0 s in all\n\
             oomguard: work lost to 2 OOMs: at least 2 steps (the step reached after 1 of them is unknown) of redone training; \
             at least 3.0 s from the OOM back to the step it died at (restart and redone steps); \
             attempt 2 had not got back to step 7 when the run ended (3.0 s after the OOM in attempt 1)\n"
        );
        // Interrupted before any OOM: the ending alone.
        let story = told(&[
            run_start(knobs(8, 1), None),
            attempt_start(1, knobs(8, 1), None),
            end(1, OutcomeKind::Interrupted, 2.0),
            run_end(130, 1),
        ]);
        assert_eq!(
            story.ending().unwrap(),
            "\noomguard: stopped (exit 130) after 1 attempt; 3.0 s in all\n"
        );
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
