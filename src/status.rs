//! `oomguard status [RUN_DIR]` and `oomguard runs`: where a run stands, for a
//! second tmux pane or a script, once the pane with the summary is gone.
//!
//! Theory of operation: nothing here writes. The run's `journal.jsonl` is read
//! into its [`Story`] (a running run's last line may be half written), which
//! keeps what the run said once — the step each attempt started from, the
//! trainer's logging interval, the time lost to OOMs; [`Status::of`] looks at
//! it at one instant — the attempt's output
//! log for the step reached, `/proc` for whether its oomguard still runs
//! ([`liveness`](crate::liveness)), the GPUs (when a probe opens) for what the
//! run holds now — and names the run's [`State`]. Text and JSON are two
//! renderings of one [`Status`]. `--follow` repeats this every interval until
//! the run has ended.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, FixedOffset, Local};
use serde::Serialize;

use crate::events::Knobs;
use crate::evidence::OutcomeKind;
use crate::exit;
use crate::gpu::{self, Probe, gib};
use crate::liveness::{Liveness, Supervisor};
use crate::progress;
use crate::report::story::{self as read, DecisionStep, OomLine, ReadError, Story};
use crate::report::terminal;
use crate::run_folder::LOG_HEAD_BYTES;

use crate::run_folder::RunFolder;
/// Where the run folders of the current directory are.
use crate::run_folder::names::RUNS;
use crate::signal::Signal;

/// How a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Before its first attempt (waiting for GPU memory).
    Starting,
    /// An attempt is running.
    Running,
    /// An attempt ended and oomguard is preparing the next (the decision, a
    /// wait for memory).
    BetweenAttempts,
    Finished,
    /// The policy ran out of steps or attempts (exit 75).
    GaveUp,
    /// Another failure, or oomguard could not go on (the exit code says).
    Failed,
    /// The user stopped it.
    Interrupted,
    /// No end in the journal, and its oomguard is gone: killed (SIGKILL, the
    /// kernel's OOM killer) or the machine rebooted.
    Killed,
}

impl State {
    pub fn ended(self) -> bool {
        !matches!(
            self,
            State::Starting | State::Running | State::BetweenAttempts
        )
    }

    fn words(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::BetweenAttempts => "between attempts",
            State::Finished => "finished",
            State::GaveUp => "gave up",
            State::Failed => "failed",
            State::Interrupted => "interrupted",
            State::Killed => "killed",
        }
    }
}

/// Where a run stands at one instant; `--json` prints it as it is.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub run_dir: String,
    pub state: State,
    /// oomguard's exit code, once the run has ended.
    pub exit_code: Option<i32>,
    /// Whether the oomguard that runs it is alive; `null` when that cannot be
    /// told from here (another host, a journal without the record).
    pub alive: Option<bool>,
    pub liveness: Liveness,
    pub supervisor: Option<Supervisor>,
    pub command: Vec<String>,
    pub policy: String,
    pub started: String,
    pub ended: Option<String>,
    pub elapsed_s: Option<f64>,
    /// Time spent in attempts that did not succeed.
    pub lost_s: f64,
    /// The time from each OOM until a relaunch was back at the step it died
    /// at (restart and redone steps), where it can be told; `null` when it
    /// cannot be told at all or there was no OOM relaunched.
    pub time_lost_s: Option<f64>,
    /// `time_lost_s` is the whole figure: every relaunch got back and every
    /// step died at was seen (else it is a lower bound, or misses some).
    pub time_lost_exact: bool,
    /// The same in words, as the summary says it.
    pub time_lost: Option<String>,
    /// The last attempt's command line (as the summary has it, once ended).
    pub last_command: Option<String>,
    /// Training steps redone after OOMs, where known (`None`: none known).
    pub steps_lost: Option<u64>,
    /// OOMs after which the steps redone are unknown or only a lower bound:
    /// `steps_lost` is then "at least".
    pub steps_lost_unknown: usize,
    /// The attempt running, or the last one (0 before the first).
    pub attempt: u32,
    /// How long it has run (ran, once ended).
    pub attempt_elapsed_s: Option<f64>,
    pub max_attempts: u32,
    pub world_size: u64,
    pub settings: SettingsNow,
    pub global_batch: Before<Option<u64>>,
    /// The last step the current (or last) attempt printed.
    pub step_reached: Option<u64>,
    /// The step may be older than the attempt's progress: its live log stops
    /// after the first 8 MiB of output until the attempt ends.
    pub step_reached_partial: bool,
    /// The checkpoint the current (or last) attempt resumed from, and its step.
    pub resumed_from: Option<String>,
    pub resumed_from_step: Option<u64>,
    pub last_oom: Option<LastOom>,
    pub last_decision: Option<LastDecision>,
    /// Peak GPU memory of the run, per attempt and GPU (measured while an
    /// attempt runs, written when it ends).
    pub gpu_peak: Vec<Peak>,
    /// What the run holds on each GPU now (a running attempt; needs NVML).
    pub gpu_now: Option<Vec<Now>>,
    pub attempts: Vec<AttemptRow>,
    /// Journal lines this version could not read.
    pub unreadable_lines: usize,
    /// Files this run edited in place (`--edit-in-place`) that still hold its
    /// edit: put back when the run ends; after a hard kill, by `oomguard restore`.
    pub still_edited: Vec<String>,
    /// The run has ended (or its oomguard is gone) and `still_edited` is not
    /// empty: `oomguard restore RUN_DIR` puts the originals back.
    pub restore_needed: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SettingsNow {
    pub original: Knobs,
    pub current: Knobs,
    /// The knobs whose value differs from the original.
    pub changed: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Before<T> {
    pub original: T,
    pub current: T,
}

#[derive(Debug, Clone, Serialize)]
pub struct LastOom {
    pub attempt: u32,
    /// Seconds from the attempt's launch to the OOM line.
    pub after_s: Option<f64>,
    /// As the summary words it: "OOM (tried to allocate ... on GPU 0, ... free)".
    pub cause: String,
    #[serde(flatten)]
    pub finding: OomLine,
}

#[derive(Debug, Clone, Serialize)]
pub struct LastDecision {
    pub attempt: u32,
    pub step: DecisionStep,
    pub reason: String,
    pub resume: Option<String>,
    pub resume_step: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    pub attempt: u32,
    pub gpu: u32,
    pub run_peak_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Now {
    pub gpu: u32,
    pub run_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AttemptRow {
    pub attempt: u32,
    pub started: String,
    pub settings: Knobs,
    /// `null` while it runs.
    pub outcome: Option<OutcomeKind>,
    pub exit: Option<String>,
    /// The exit code, or 128+N for death by signal N.
    pub status: Option<i32>,
    pub duration_s: Option<f64>,
    pub step_reached: Option<u64>,
    pub resume: Option<String>,
    /// The step chosen after it.
    pub decision: Option<DecisionStep>,
}

fn parse_time(t: &str) -> Option<DateTime<FixedOffset>> {
    DateTime::parse_from_rfc3339(t).ok()
}

/// Seconds from `a` to `b`.
fn secs(a: &str, b: DateTime<FixedOffset>) -> Option<f64> {
    let a = parse_time(a)?;
    Some((b - a).num_milliseconds() as f64 / 1000.0)
}

impl Status {
    /// The run in `dir`, as its journal says at `now`. `gpus`: a probe to ask
    /// what a running attempt holds.
    pub fn of(
        dir: &Path,
        run: &Story,
        now: DateTime<FixedOffset>,
        gpus: Option<&mut Box<dyn Probe>>,
    ) -> Status {
        let sup = run.start.supervisor.clone();
        let liveness = sup.as_ref().map_or(Liveness::Unknown, Supervisor::liveness);
        let last = run.attempts.last();
        let state = match (&run.end, last) {
            (Some(e), _) => ended_state(e.exit_code, last),
            (None, _) if liveness == Liveness::Gone => State::Killed,
            (None, None) => State::Starting,
            (None, Some(a)) if a.end.is_none() => State::Running,
            (None, Some(_)) => State::BetweenAttempts,
        };
        let ended = match (&run.end, state) {
            (Some(e), _) => Some(e.time.clone()),
            // Killed: its last sign of life, the journal's last line or the
            // last attempt's output, whichever is later.
            (None, State::Killed) => last_sign_of_life(dir, run),
            _ => None,
        };
        let until = ended.as_deref().and_then(parse_time).unwrap_or(now);
        let lost_s = run.lost_s();
        let (steps_lost, steps_lost_unknown) = run.steps_lost();
        let original = run.start.settings.clone();
        let current = last.map_or_else(|| original.clone(), |a| a.start.settings.clone());
        let changed = current
            .iter()
            .filter(|(k, v)| original.get(k) != Some(v))
            .map(|(k, _)| k.name().to_string())
            .collect();
        // The Trainer's log dicts name no step: their interval, as the run knew it.
        let logging = run.logging();
        // What the trainer's step numbers count (nanoGPT's `iter N`, Lightning's batches).
        let argv: Vec<std::ffi::OsString> = run.start.argv.iter().map(Into::into).collect();
        let counting = crate::frameworks::counting(&crate::command::Command::parse(&argv));
        let rows: Vec<AttemptRow> = run
            .attempts
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let counting = counting.at_accum(
                    a.start
                        .settings
                        .get(&crate::settings::Knob::GradAccum)
                        .and_then(crate::settings::Value::as_int),
                );
                row(dir, a, logging, run.started_from(i).unwrap_or(0), counting)
            })
            .collect();
        let running = state == State::Running;
        let (step_reached, step_reached_partial) = match last {
            Some(a) => {
                let log = RunFolder::at(dir).output_log(a.start.attempt);
                let partial =
                    running && std::fs::metadata(&log).is_ok_and(|m| m.len() >= LOG_HEAD_BYTES);
                let step = rows.last().and_then(|r| r.step_reached);
                (step, partial)
            }
            None => (None, false),
        };
        // The decision that led to the last attempt says the step it resumes at.
        let resumed_from = last.and_then(|a| a.start.resume.clone());
        let resumed_from_step = run
            .attempts
            .len()
            .checked_sub(1)
            .and_then(|i| run.started_from(i));
        let last_oom = run.attempts.iter().rev().find_map(|a| {
            let o = a.oom.as_ref()?;
            Some(LastOom {
                attempt: o.attempt,
                after_s: o.after_s,
                cause: o.cause(a.end.as_ref().map(|e| e.outcome)),
                finding: o.finding.clone(),
            })
        });
        let last_decision = run.attempts.iter().rev().find_map(|a| {
            let d = a.decision.as_ref()?;
            Some(LastDecision {
                attempt: d.attempt,
                step: d.step,
                reason: d.reason.clone(),
                resume: d.resume.clone(),
                resume_step: d.resume_step,
            })
        });
        let gpu_peak = run
            .attempts
            .iter()
            .filter_map(|a| Some((a.start.attempt, a.end.as_ref()?.gpu_peak.as_ref()?)))
            .flat_map(|(n, p)| {
                p.per_gpu.iter().map(move |g| Peak {
                    attempt: n,
                    gpu: g.gpu,
                    run_peak_bytes: g.run_peak_bytes,
                    total_bytes: g.total_bytes,
                })
            })
            .collect();
        let still_edited = crate::inplace::still_edited(dir);
        let last_step = rows.last().and_then(|r| r.step_reached);
        let time_lost = run.time_lost(until, last_step, !state.ended());
        let gpu_now = match (running, liveness, &sup, gpus) {
            (true, Liveness::Alive, Some(s), Some(p)) => held_now(p.as_mut(), s.pid),
            _ => None,
        };
        Status {
            run_dir: dir.display().to_string(),
            state,
            exit_code: run.end.as_ref().map(|e| e.exit_code),
            alive: match liveness {
                Liveness::Alive => Some(true),
                Liveness::Gone => Some(false),
                Liveness::OtherHost | Liveness::Unknown => None,
            },
            liveness,
            supervisor: sup,
            command: run.start.argv.clone(),
            policy: run.start.policy.clone(),
            started: run.start.time.clone(),
            elapsed_s: secs(&run.start.time, until),
            ended,
            lost_s,
            time_lost_s: time_lost.seconds,
            time_lost_exact: time_lost.exact,
            time_lost: time_lost.text,
            last_command: run.end.as_ref().and_then(|e| e.last_command.clone()),
            steps_lost,
            steps_lost_unknown,
            attempt: last.map_or(0, |a| a.start.attempt),
            attempt_elapsed_s: last.and_then(|a| {
                a.end
                    .as_ref()
                    .and_then(|e| e.duration_s)
                    .or_else(|| secs(&a.start.time, until))
            }),
            max_attempts: run.start.max_attempts,
            world_size: run.start.world_size,
            global_batch: Before {
                original: run.start.global_batch,
                current: last.map_or(run.start.global_batch, |a| a.start.global_batch),
            },
            settings: SettingsNow {
                original,
                current,
                changed,
            },
            step_reached,
            step_reached_partial,
            resumed_from,
            resumed_from_step,
            last_oom,
            last_decision,
            gpu_peak,
            gpu_now,
            attempts: rows,
            unreadable_lines: run.unreadable,
            restore_needed: !still_edited.is_empty() && state.ended(),
            still_edited: still_edited
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
        }
    }

    /// What `--follow` prints anew when it changes (the clock aside).
    fn key(&self) -> String {
        format!(
            "{:?} {:?} {} {} {:?} {:?} {:?}",
            self.state,
            self.alive,
            self.attempt,
            self.attempts.iter().filter(|a| a.outcome.is_some()).count(),
            self.step_reached,
            self.last_decision.as_ref().map(|d| d.attempt),
            self.gpu_now
                .as_ref()
                .map(|g| g.iter().map(|n| n.run_bytes).sum::<u64>()),
        )
    }

    /// The text form.
    pub fn text(&self) -> String {
        let mut s = format!("oomguard run {}\n", self.run_dir);
        let mut field = |name: &str, value: String| {
            s += &format!("  {name:<10}{value}\n");
        };
        field("command", quote(&self.command));
        let who = match (&self.supervisor, self.liveness) {
            (Some(p), Liveness::Alive) => format!("oomguard (pid {}) is running it", p.pid),
            (Some(p), Liveness::Gone) => format!("its oomguard (pid {}) is gone", p.pid),
            (Some(p), Liveness::OtherHost) => format!(
                "its oomguard (pid {}) runs on {}: cannot tell from here whether it is alive",
                p.pid,
                p.host.as_deref().unwrap_or("another host")
            ),
            _ => "the journal does not name its oomguard: cannot tell whether it is alive"
                .to_string(),
        };
        let attempt_age = self.attempt_elapsed_s.map(duration);
        let state = match self.state {
            State::Starting => format!("starting (before attempt 1); {who}"),
            State::Running => format!(
                "running: attempt {} of at most {}, for {}; {who}",
                self.attempt,
                self.max_attempts,
                attempt_age.unwrap_or_else(|| "?".into())
            ),
            State::BetweenAttempts => format!(
                "between attempts: attempt {} ended, the next is being prepared; {who}",
                self.attempt
            ),
            State::Killed => format!(
                "killed: the journal has no end and {who} (SIGKILL, the OOM killer, a reboot?)"
            ),
            st => format!(
                "{} after {} attempt{} (exit {})",
                st.words(),
                self.attempt,
                if self.attempt == 1 { "" } else { "s" },
                self.exit_code.map_or("?".into(), |c| c.to_string())
            ),
        };
        field("state", state);
        let mut time = format!("started {}", local_time(&self.started));
        if let Some(e) = self.elapsed_s {
            time += &format!(
                ", {} {}",
                duration(e),
                if self.state.ended() {
                    "in all"
                } else {
                    "so far"
                }
            );
        }
        if self.state == State::Killed {
            time += " until it was killed (its last journal line or output)";
        }
        if let Some(t) = &self.time_lost {
            // The steps redone follow in their own parentheses.
            time += &format!("; {}", t.replacen(" (restart and redone steps)", "", 1));
        }
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        time += &match (self.steps_lost, self.steps_lost_unknown) {
            (Some(n), 0) => format!(" ({n} step{} redone)", plural(n)),
            (Some(n), k) => format!(
                " (at least {n} step{} redone; the exact count after {k} OOM{} is unknown)",
                plural(n),
                plural(k as u64)
            ),
            (None, 0) => String::new(),
            (None, _) => " (steps redone: unknown)".into(),
        };
        field("time", time);
        let mut step = match (self.step_reached, self.step_reached_partial) {
            (Some(n), false) => format!("{n}"),
            (Some(n), true) => format!(
                "at least {n} (the live log stops after its first 8 MiB; the rest is written when the attempt ends)"
            ),
            (None, _) if self.state == State::Running => "none printed yet".into(),
            // Never 0: the attempt ended without a step that can be read.
            (None, _) => "unknown".into(),
        };
        match (&self.resumed_from, self.resumed_from_step) {
            (Some(c), Some(n)) => step += &format!("; resumed from {c} (step {n})"),
            (Some(c), None) => step += &format!("; resumed from {c}"),
            (None, _) if self.attempt > 1 => step += "; started fresh (no checkpoint of this run)",
            _ => {}
        }
        field("step", step);
        if let Some(o) = &self.last_oom {
            let after = o
                .after_s
                .map(|a| format!(" after {}", duration(a)))
                .unwrap_or_default();
            field(
                "last OOM",
                format!("attempt {}{after}: {}", o.attempt, o.cause),
            );
        }
        if let Some(d) = &self.last_decision {
            let mut v = format!("after attempt {}: {}: {}", d.attempt, d.step, d.reason);
            if let Some(r) = &d.resume {
                v += &format!("; resume from {r}");
            }
            field("decision", v);
        }
        for n in self.gpu_now.iter().flatten() {
            field(
                "GPU now",
                format!(
                    "GPU {}: {} of {}",
                    n.gpu,
                    gib(n.run_bytes).trim_end_matches(" GiB"),
                    gib(n.total_bytes)
                ),
            );
        }
        for p in &self.gpu_peak {
            field(
                "GPU peak",
                format!(
                    "attempt {}: GPU {}: {} of {}",
                    p.attempt,
                    p.gpu,
                    gib(p.run_peak_bytes).trim_end_matches(" GiB"),
                    gib(p.total_bytes)
                ),
            );
        }
        if !self.still_edited.is_empty() {
            let files = self.still_edited.join(", ");
            field(
                "edited",
                if self.restore_needed {
                    format!(
                        "{files} still {} this run's in-place edit: run `oomguard restore {}` to put the original back (a new run refuses to start until then)",
                        if self.still_edited.len() == 1 {
                            "holds"
                        } else {
                            "hold"
                        },
                        self.run_dir
                    )
                } else {
                    format!("{files} edited in place by this run (put back when it ends)")
                },
            );
        }
        if self.unreadable_lines > 0 {
            field(
                "note",
                format!(
                    "{} journal line(s) could not be read (written by another version?)",
                    self.unreadable_lines
                ),
            );
        }
        s += &format!(
            "  settings of attempt {} against the original:\n",
            self.attempt.max(1)
        );
        let mut rows: Vec<[String; 3]> = vec![["knob".into(), "original".into(), "now".into()]];
        for (k, v) in &self.settings.current {
            let orig = self
                .settings
                .original
                .get(k)
                .map_or("-".into(), ToString::to_string);
            rows.push([k.name().into(), orig, v.to_string()]);
        }
        let show = |g: Option<u64>| g.map_or("?".into(), |g| g.to_string());
        rows.push([
            "world size".into(),
            self.world_size.to_string(),
            self.world_size.to_string(),
        ]);
        rows.push([
            "global batch".into(),
            show(self.global_batch.original),
            show(self.global_batch.current),
        ]);
        let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
        let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0);
        for r in rows {
            let mark = if r[1] != r[2] && r[0] != "knob" {
                "  (changed)"
            } else {
                ""
            };
            s += &format!("    {:w0$}  {:w1$}  {}{mark}\n", r[0], r[1], r[2]);
        }
        s
    }
}

/// When a run whose oomguard is gone last showed it was alive: the later of
/// its journal's last line and the last change of its journal or of its last
/// attempt's output log (a killed run's real duration, not its last event's).
fn last_sign_of_life(dir: &Path, run: &Story) -> Option<String> {
    let mut best = run.last_time.as_deref().and_then(parse_time);
    let folder = RunFolder::at(dir);
    let mut files = vec![folder.journal()];
    if let Some(a) = run.attempts.last() {
        files.push(folder.output_log(a.start.attempt));
    }
    for f in files {
        let Ok(m) = std::fs::symlink_metadata(&f) else {
            continue;
        };
        let Ok(t) = m.modified() else {
            continue;
        };
        let t: DateTime<Local> = t.into();
        let t = t.fixed_offset();
        if best.is_none_or(|b| t > b) {
            best = Some(t);
        }
    }
    best.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, false))
}

/// How a run that journaled its end ended. oomguard's own codes (75, 128+N
/// for the user's signal) count as such only when the last attempt could have
/// been followed by another (an OOM): a command that exits 75 or dies of
/// SIGTERM by itself has failed.
fn ended_state(code: i32, last: Option<&read::Attempt>) -> State {
    let outcome = last.and_then(|a| a.end.as_ref()).map(|e| e.outcome);
    let would_go_on = matches!(
        outcome,
        None | Some(OutcomeKind::CudaOom | OutcomeKind::HungAfterOom)
    );
    let users_signal = Signal::from_exit_code(code).is_some_and(Signal::is_user_interrupt);
    match code {
        exit::SUCCESS => State::Finished,
        _ if outcome == Some(OutcomeKind::Interrupted) => State::Interrupted,
        exit::EXHAUSTED if would_go_on => State::GaveUp,
        _ if would_go_on && users_signal => State::Interrupted,
        _ => State::Failed,
    }
}

/// One attempt's row: how it ended, and the step it reached (from the
/// journal's `work_lost`, which the supervisor wrote knowing the checkpoints,
/// else from its output log: bars, step lines, and with `logging` known the
/// Trainer's log dicts since step `from`).
fn row(
    dir: &Path,
    a: &read::Attempt,
    logging: Option<progress::Logging>,
    from: u64,
    counting: progress::Counting,
) -> AttemptRow {
    let n = a.start.attempt;
    let log = RunFolder::at(dir).output_log(n);
    AttemptRow {
        attempt: n,
        started: a.start.time.clone(),
        settings: a.start.settings.clone(),
        outcome: a.end.as_ref().map(|e| e.outcome),
        exit: a
            .end
            .as_ref()
            .and_then(|e| e.exit.clone().or_else(|| e.error.clone())),
        status: a.end.as_ref().map(|e| e.status),
        duration_s: a.end.as_ref().and_then(|e| e.duration_s),
        step_reached: a
            .lost
            .as_ref()
            .and_then(|l| l.step_reached)
            .or_else(|| progress::read(&log, logging, from, counting).map(|r| r.step)),
        resume: a.start.resume.clone(),
        decision: a.decision.as_ref().map(|d| d.step),
    }
}

/// What the processes of the oomguard with pid `pid` hold on each GPU now
/// (`None` when the probe fails).
fn held_now(probe: &mut dyn Probe, pid: u32) -> Option<Vec<Now>> {
    let marker = format!("{pid}.");
    let all = probe.gpus().ok()?;
    Some(
        all.iter()
            .filter_map(|g| {
                let run: u64 = g
                    .processes
                    .iter()
                    .filter(|p| gpu::belongs(p.oomguard_attempt.as_deref(), &marker))
                    .map(|p| p.used)
                    .sum();
                (run > 0).then_some(Now {
                    gpu: g.index,
                    run_bytes: run,
                    total_bytes: g.total,
                })
            })
            .collect(),
    )
}

/// The command as `plan` shows it, quoted for a shell.
fn quote(argv: &[String]) -> String {
    let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
    crate::plan::shell_quote(&argv)
}

pub use crate::journal::duration;

/// "2026-11-21 07:31:55" in local time; the stamp as written if unreadable.
fn local_time(t: &str) -> String {
    parse_time(t).map_or_else(
        || t.to_string(),
        |d| {
            d.with_timezone(&Local)
                .format("%Y-%m-%d %H:%M:%S")
                .to_string()
        },
    )
}

/// The run folders under `.oomguard/runs`, oldest first: by their names
/// (`<time>`, then `<time>-2`, `<time>-3`... for runs started in one second).
pub fn run_folders(runs: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(runs)? {
        let e = e?;
        // Only real folders: a link someone put there is not one of our runs.
        if e.file_type()?.is_dir() {
            dirs.push(e.path());
        }
    }
    dirs.sort_by_cached_key(|p| {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        match name.rsplit_once('-') {
            Some((stamp, n)) if stamp.contains('-') => {
                (stamp.to_string(), n.parse::<u64>().unwrap_or(0))
            }
            _ => (name.to_string(), 1),
        }
    });
    Ok(dirs)
}

/// No run folder with a journal under [`RUNS`] here: `status` needs one named.
#[derive(Debug, thiserror::Error)]
#[error(
    "no run under {RUNS} in {}; give the run folder: oomguard status RUN_DIR",
    cwd.display()
)]
struct NoRun {
    /// The current folder (`.` when it cannot be had).
    cwd: PathBuf,
}

/// The newest run folder here that has a journal.
fn newest_run() -> Result<PathBuf, NoRun> {
    let none = || NoRun {
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let dirs = run_folders(Path::new(RUNS)).map_err(|_| none())?;
    dirs.into_iter()
        .rev()
        .find(|d| RunFolder::at(d).journal().is_file())
        .ok_or_else(none)
}

fn now() -> DateTime<FixedOffset> {
    let n = Local::now();
    n.with_timezone(n.offset())
}

/// Print `text` on stdout; `false` when stdout is closed (`| head`).
fn out(text: &str) -> bool {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .is_ok()
}

/// `oomguard status [--json] [--follow [--interval SECS]] [RUN_DIR]`.
pub fn status_main(run_dir: Option<&Path>, json: bool, follow: bool, interval: f64) -> i32 {
    if !(interval.is_finite() && interval > 0.0) {
        terminal::get().error("--interval must be a positive number of seconds");
        return exit::USAGE;
    }
    let dir = match run_dir {
        Some(d) => d.to_path_buf(),
        None => match newest_run() {
            Ok(d) => d,
            Err(e) => {
                terminal::get().error(&e.to_string());
                return exit::USAGE;
            }
        },
    };
    let tty = std::io::stdout().is_terminal();
    let mut probe: Option<Box<dyn Probe>> = None;
    let mut tried_probe = false;
    let mut last_key = String::new();
    let mut waiting = false;
    loop {
        let run = match read::read_run(&dir) {
            Ok(r) => r,
            // Followed from before its start (a pane opened with the run): wait
            // for the journal, as `tail -F` waits for its file.
            Err(e) if follow => {
                if !waiting {
                    terminal::get().say(&format!(
                        "{}: {e}; waiting for the run to start (Ctrl-C to stop)",
                        dir.display()
                    ));
                    waiting = true;
                }
                std::thread::sleep(Duration::from_secs_f64(interval));
                continue;
            }
            Err(e) => {
                let advice = match e {
                    ReadError::Io { .. } => {
                        " (a run folder holds journal.jsonl; `oomguard runs` lists them)"
                    }
                    ReadError::NoRun { .. } => "",
                };
                terminal::get().error(&format!("{e}{advice}"));
                return exit::USAGE;
            }
        };
        // The GPUs are asked only about a running attempt, with one probe for
        // the whole of --follow.
        if !tried_probe && run.end.is_none() {
            tried_probe = true;
            probe = gpu::try_open_probe().ok();
        }
        let st = Status::of(&dir, &run, now(), probe.as_mut());
        let key = st.key();
        let shown = if json {
            let line = serde_json::to_string(&st).expect("a status is JSON") + "\n";
            if !follow || key != last_key {
                out(&line)
            } else {
                true
            }
        } else if follow && tty {
            // Redrawn in place, as `watch` does.
            out(&format!("\x1b[H\x1b[2J{}", st.text()))
        } else if !follow {
            out(&st.text())
        } else if key != last_key {
            out(&format!(
                "{}{}",
                if last_key.is_empty() { "" } else { "\n" },
                st.text()
            ))
        } else {
            true
        };
        if !shown || !follow || st.state.ended() {
            return exit::SUCCESS;
        }
        last_key = key;
        std::thread::sleep(Duration::from_secs_f64(interval));
    }
}

/// One line of `oomguard runs`.
#[derive(Debug, Serialize)]
struct RunLine {
    run_dir: String,
    /// `null` when the journal cannot be read (`error` says why).
    state: Option<State>,
    exit_code: Option<i32>,
    attempts: u32,
    started: Option<String>,
    elapsed_s: Option<f64>,
    command: Vec<String>,
    error: Option<String>,
    /// Files the run edited in place that still hold its edit.
    still_edited: Vec<String>,
    /// It has ended with them edited: `oomguard restore RUN_DIR` puts them back.
    restore_needed: bool,
}

/// `oomguard runs [--json]`: the runs under `.oomguard/runs` here, oldest first.
pub fn runs_main(json: bool) -> i32 {
    let dirs = match run_folders(Path::new(RUNS)) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            terminal::get().error(&format!("cannot list {RUNS}: {e}"));
            return exit::USAGE;
        }
    };
    let at = now();
    let lines: Vec<RunLine> = dirs
        .iter()
        .map(|d| match read::read_run(d) {
            Ok(run) => {
                let st = Status::of(d, &run, at, None);
                RunLine {
                    run_dir: st.run_dir,
                    state: Some(st.state),
                    exit_code: st.exit_code,
                    attempts: st.attempt,
                    started: Some(st.started),
                    elapsed_s: st.elapsed_s,
                    command: st.command,
                    error: None,
                    still_edited: st.still_edited,
                    restore_needed: st.restore_needed,
                }
            }
            Err(e) => RunLine {
                run_dir: d.display().to_string(),
                state: None,
                exit_code: None,
                attempts: 0,
                started: None,
                elapsed_s: None,
                command: Vec::new(),
                error: Some(e.to_string()),
                still_edited: Vec::new(),
                restore_needed: false,
            },
        })
        .collect();
    if json {
        out(&(serde_json::json!({ "runs": lines }).to_string() + "\n"));
        return exit::SUCCESS;
    }
    if lines.is_empty() {
        terminal::get().say(&format!("no run under {RUNS} here"));
        return exit::SUCCESS;
    }
    let cells: Vec<[String; 5]> = lines
        .iter()
        .map(|l| {
            let name = Path::new(&l.run_dir)
                .file_name()
                .map_or(l.run_dir.clone(), |n| n.to_string_lossy().into_owned());
            let Some(state) = l.state else {
                return [
                    name,
                    "unreadable".into(),
                    String::new(),
                    String::new(),
                    l.error.clone().unwrap_or_default(),
                ];
            };
            let mut what = match (state, l.exit_code) {
                (State::Running, _) => format!("running (attempt {})", l.attempts),
                (State::Failed, Some(c)) => format!("failed (exit {c})"),
                (s, _) => s.words().to_string(),
            };
            if l.restore_needed {
                what += ", still edited";
            }
            [
                name,
                what,
                format!(
                    "{} attempt{}",
                    l.attempts,
                    if l.attempts == 1 { "" } else { "s" }
                ),
                l.elapsed_s.map(duration).unwrap_or_default(),
                quote(&l.command),
            ]
        })
        .collect();
    let w: Vec<usize> = (0..4)
        .map(|i| cells.iter().map(|c| c[i].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for c in cells {
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {:>w3$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        );
        text += line.trim_end();
        text += "\n";
    }
    for l in lines.iter().filter(|l| l.restore_needed) {
        text += &format!(
            "oomguard: {} still {} the in-place edit of {}: run `oomguard restore {}`\n",
            l.still_edited.join(", "),
            if l.still_edited.len() == 1 {
                "holds"
            } else {
                "hold"
            },
            l.run_dir,
            l.run_dir
        );
    }
    out(&text);
    exit::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step a running attempt reached, from the Trainer's log dicts (which
    /// name no step): counted with the logging interval the run knew (here from
    /// a recipe, not in the command's flags), as the run counted it. A journal
    /// written before the run recorded the interval has the flags only, and
    /// cannot tell the step.
    #[test]
    fn the_step_of_log_dicts_is_counted_with_the_runs_logging_interval() {
        use crate::events::Event;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        std::fs::create_dir(dir.join("attempt-1")).unwrap();
        let dicts = "{'loss': 2.1, 'learning_rate': 1e-05, 'epoch': 0.1}\n\
                     {'loss': 1.9, 'learning_rate': 1e-05, 'epoch': 0.2}\n\
                     {'loss': 1.7, 'learning_rate': 1e-05, 'epoch': 0.3}\n";
        std::fs::write(dir.join("attempt-1/output.log"), dicts).unwrap();
        let step = |logging: Option<progress::Logging>| {
            let start = Event::RunStart {
                argv: ["accelerate", "launch", "train.py", "recipe.yaml"]
                    .map(String::from)
                    .to_vec(),
                policy: "default".into(),
                max_attempts: 8,
                settings: Knobs::new(),
                world_size: 1,
                world_source: "default".into(),
                global_batch: None,
                env: serde_json::Value::Null,
                notes: vec![],
                warnings: vec![],
                tty: false,
                supervisor: Some(Supervisor::me()),
                logging,
            };
            let t0 = "2026-01-01T00:00:00.000+00:00".to_string();
            let mut story = Story::begin(&start, Some(t0.clone())).unwrap();
            story.hear(
                &Event::AttemptStart {
                    attempt: 1,
                    gpu: serde_json::Value::Null,
                    argv: vec![],
                    env: Default::default(),
                    settings: Knobs::new(),
                    global_batch: None,
                    resume: None,
                    files: vec![],
                },
                Some(t0.clone()),
            );
            let s = Status::of(dir, &story, parse_time(&t0).unwrap(), None);
            assert_eq!(s.state, State::Running);
            s.step_reached
        };
        let every = |n| progress::Logging {
            every: n,
            first_step: false,
        };
        assert_eq!(step(Some(every(5))), Some(15));
        assert_eq!(step(Some(every(1))), Some(3));
        assert_eq!(
            step(None),
            None,
            "an older journal: the flags name no interval"
        );
    }

    /// A journal: `run_start`, then an attempt per outcome, then `run_end`
    /// with `code` (none: still going), written by a supervisor that is alive
    /// (this process) or gone.
    fn state_of(outcomes: &[&str], code: Option<i32>, alive: bool) -> State {
        let mut sup = Supervisor::me();
        if !alive {
            sup.start_ticks = sup.start_ticks.map(|t| t + 1);
        }
        let t = "2026-01-01T00:00:00.000+00:00";
        let mut lines = vec![serde_json::json!({"event": "run_start", "time": t,
            "argv": ["python3", "train.py"], "policy": "default", "max_attempts": 8,
            "settings": {"micro_batch": 8}, "world_size": 1, "global_batch": null,
            "supervisor": sup})];
        for (i, o) in outcomes.iter().enumerate() {
            let n = i + 1;
            lines.push(
                serde_json::json!({"event": "attempt_start", "time": t, "attempt": n,
                "settings": {"micro_batch": 8}, "global_batch": null, "resume": null}),
            );
            if !o.is_empty() {
                lines.push(
                    serde_json::json!({"event": "attempt_end", "time": t, "attempt": n,
                    "outcome": o, "status": 1, "exit": "exit code 1", "duration_s": 1.0}),
                );
            }
        }
        if let Some(c) = code {
            lines.push(
                serde_json::json!({"event": "run_end", "time": t, "exit_code": c,
                "attempts": outcomes.len(), "lost_s": 0.0, "settings": {}}),
            );
        }
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let (l, bad) = read::lines(text.as_bytes());
        assert_eq!(bad, 0);
        let run = read::fold(l, bad).unwrap();
        let now = parse_time(t).unwrap();
        Status::of(Path::new("run"), &run, now, None).state
    }

    #[test]
    fn the_state_is_named_from_the_journal_and_proc() {
        use State::*;
        for (outcomes, code, alive, want) in [
            (&[][..], None, true, Starting),
            (&[""][..], None, true, Running),
            (&["cuda_oom"][..], None, true, BetweenAttempts),
            (&["cuda_oom", ""][..], None, false, Killed),
            (&["cuda_oom", "success"][..], Some(0), false, Finished),
            (&["cuda_oom", "cuda_oom"][..], Some(75), false, GaveUp),
            (&["other_failure"][..], Some(75), false, Failed),
            (
                &["cuda_oom", "interrupted"][..],
                Some(130),
                false,
                Interrupted,
            ),
            // Ctrl-C while waiting for memory after an OOM.
            (&["cuda_oom"][..], Some(130), false, Interrupted),
            // The command died of SIGTERM by itself.
            (&["other_failure"][..], Some(143), false, Failed),
            (&["cuda_oom"][..], Some(74), false, Failed),
        ] {
            assert_eq!(
                state_of(outcomes, code, alive),
                want,
                "{outcomes:?} {code:?} alive={alive}"
            );
        }
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(4.24), "4.2 s");
        assert_eq!(duration(185.0), "3m 05s");
        assert_eq!(duration(7380.0), "2h 03m");
        assert_eq!(duration(100800.0), "1d 04h");
        assert_eq!(duration(-1.0), "0.0 s");
    }

    #[test]
    fn run_folders_sort_by_time_then_number() {
        let t = tempfile::tempdir().unwrap();
        for n in [
            "20260101-000000-10",
            "20260101-000000",
            "20260101-000000-2",
            "20251231-235959",
        ] {
            std::fs::create_dir(t.path().join(n)).unwrap();
        }
        std::fs::write(t.path().join("not-a-folder"), "").unwrap();
        let names: Vec<String> = run_folders(t.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "20251231-235959",
                "20260101-000000",
                "20260101-000000-2",
                "20260101-000000-10"
            ]
        );
    }
}
