//! What an attempt showed, typed: how it ended (the outcome), the numbers in
//! its OOM message, whether it hung after the OOM, and the step it reached.
//!
//! `classify` turns a launch report into an [`Outcome`]; an OOM outcome becomes
//! the [`Evidence`] the policy decides from (and `plan` decides from an assumed
//! one). The words shown for it ("hung after OOM (tried to allocate ...)") are
//! built here, once, from the numbers, for the log, the decision's reason and
//! the summary alike.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::detect::kernel::{self, Victim};
use crate::detect::phase::{Phase, Seen};
use crate::detect::{self, Finding, Kind, OomNumbers, format_size};
use crate::launch;
use crate::progress::Reached;
use crate::settings::Knob;
use crate::signal::Signal;

/// How one attempt ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Success,
    GpuOom {
        finding: Option<Finding>,
        hung: bool,
    },
    HostOom {
        finding: Option<Finding>,
        /// The process the kernel's OOM killer killed, when its record names one of
        /// the run's.
        victim: Option<Victim>,
        code: i32,
    },
    /// An allocation far beyond the device or any machine: a bug, never shrunk for.
    AbsurdRequest {
        finding: Finding,
        code: i32,
    },
    Other {
        code: i32,
        exit: String,
        /// Why a kill is not a host OOM ([`detect::NOT_THE_OOM_KILLER`]), if it is that.
        why: Option<&'static str>,
    },
    Interrupted {
        signal: Signal,
    },
    /// The command failed because a peer of the distributed run did (`Connection closed
    /// by peer`, a rendezvous or store error, NCCL's watchdog), printing no error of its
    /// own and no OOM; or the job's copy 0 (or a copy's failure) ended the attempt while
    /// it still ran. In a job of several copies: wait for the decision, never stop alone.
    PeerFailure {
        code: i32,
        /// The peer-failure line, or why the job ended the attempt.
        line: String,
    },
    /// The command's parser refused an argument oomguard added for `knob` (a flag such
    /// as `--gradient_accumulation_steps`, an override such as `++a.b`): oomguard's own
    /// doing, not the run's failure (see [`refused`]).
    Refused {
        code: i32,
        knob: Knob,
        /// What oomguard added, as it stood in argv (without its value); for a
        /// change that failed at start-up, `knob=value`.
        added: String,
        /// The parser's line; for a change that failed at start-up, the error's.
        line: String,
        /// Not a parser's refusal: the attempt failed before its first step right
        /// after oomguard changed `knob` (see [`failed_after_change`]).
        at_start: bool,
    },
    /// The command's parser refused the argument oomguard added to tell it where to
    /// resume (`--resume_from_checkpoint`, a parser whose source does not show its
    /// options): oomguard's doing; the command cannot be told where to resume.
    ResumeRefused {
        code: i32,
        /// The flag or override key, as it stood in argv (without its value).
        added: String,
        /// The parser's line.
        line: String,
    },
}

/// An outcome's name, as the journal writes it (`"outcome": "cuda_oom"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Success,
    CudaOom,
    HungAfterOom,
    HostOom,
    /// An allocation far beyond the device or any machine (see `detect::absurd`).
    AbsurdRequest,
    OtherFailure,
    Interrupted,
    /// Ended because a peer of the distributed run failed (see [`Outcome::PeerFailure`]).
    PeerFailure,
    /// The command's parser refused an argument oomguard added (see [`Outcome::Refused`]).
    RejectedAddition,
    /// The command could not be started at all (not found, not executable).
    CannotExecute,
    /// `plan`'s dry run: nothing ran, an OOM is assumed.
    AssumedOom,
}

impl Outcome {
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Success => OutcomeKind::Success,
            Outcome::GpuOom { hung: false, .. } => OutcomeKind::CudaOom,
            Outcome::GpuOom { hung: true, .. } => OutcomeKind::HungAfterOom,
            Outcome::HostOom { .. } => OutcomeKind::HostOom,
            Outcome::AbsurdRequest { .. } => OutcomeKind::AbsurdRequest,
            Outcome::Other { .. } => OutcomeKind::OtherFailure,
            Outcome::Interrupted { .. } => OutcomeKind::Interrupted,
            Outcome::PeerFailure { .. } => OutcomeKind::PeerFailure,
            Outcome::Refused { .. } | Outcome::ResumeRefused { .. } => {
                OutcomeKind::RejectedAddition
            }
        }
    }

    /// Why a failure is not a host OOM, when a kill made it look like one.
    pub fn why(&self) -> Option<&'static str> {
        match self {
            Outcome::Other { why, .. } => *why,
            _ => None,
        }
    }

    /// The process the kernel's OOM killer killed, for a host OOM it explains.
    pub fn victim(&self) -> Option<&Victim> {
        match self {
            Outcome::HostOom { victim, .. } => victim.as_ref(),
            _ => None,
        }
    }

    /// The OOM line that decided, for a GPU or host OOM.
    pub fn finding(&self) -> Option<&Finding> {
        match self {
            Outcome::GpuOom { finding, .. } | Outcome::HostOom { finding, .. } => finding.as_ref(),
            Outcome::AbsurdRequest { finding, .. } => Some(finding),
            _ => None,
        }
    }
}

/// Classify a finished attempt. The user's signal wins; then an absurd request, a hang
/// after an OOM, a success; then, for a non-zero exit, the pending OOM: the first one
/// printed (the root cause, not the errors that follow it) unless later output showed
/// the process went on after it (a caught OOM, see `detect`), so only an OOM that ended
/// the process decides.
///
/// A death the output does not explain — a process of the run killed by SIGKILL with no
/// message (the command itself, or a worker a launcher reports as `exitcode: -9`), or
/// any other failure — is checked against the kernel's OOM-killer record (`kernel`,
/// read only then): a host OOM naming the victim when the kernel killed one of the
/// run's processes after the attempt started; otherwise a kill is "killed by SIGKILL
/// (not by the OOM killer)". When the record cannot be read, a kill is taken for a host
/// OOM as the output says, and the reason comes back to be said once.
pub fn classify(r: &launch::Report, kernel: &dyn kernel::Source) -> (Outcome, Option<String>) {
    if let Some(signal) = r.interrupted {
        return (Outcome::Interrupted { signal }, None);
    }
    let code = r.exit.status_code();
    // An absurd request is a bug however the attempt ended (a hang after it included).
    if let Some(f) = r
        .scanner
        .first_oom()
        .filter(|f| f.kind == Kind::AbsurdRequest)
        && (r.hung || code != 0)
    {
        let finding = f.clone();
        return (Outcome::AbsurdRequest { finding, code }, None);
    }
    if r.hung {
        let finding = r.scanner.first_oom().cloned();
        return (
            Outcome::GpuOom {
                finding,
                hung: true,
            },
            None,
        );
    }
    // The job ended the attempt while it ran (copy 0 decided, or another copy's
    // attempt failed): never a success, and an OOM it printed itself still counts.
    if let Some(why) = &r.stopped {
        let own_oom = r.scanner.first_oom().filter(|f| f.kind == Kind::GpuOom);
        let outcome = match own_oom {
            Some(f) => Outcome::GpuOom {
                finding: Some(f.clone()),
                hung: false,
            },
            None => Outcome::PeerFailure {
                code: if code == 0 { 1 } else { code },
                line: why.clone(),
            },
        };
        return (outcome, None);
    }
    if code == 0 {
        return (Outcome::Success, None);
    }
    // Slurm cancelled the job or step (scancel, preemption, a time limit), even
    // after an OOM line: relaunching would defeat the cancel.
    if let Some(line) = r.scanner.slurm_cancelled() {
        let outcome = Outcome::Other {
            code,
            exit: format!("{} — cancelled by Slurm: {line}", r.exit),
            why: None,
        };
        return (outcome, None);
    }
    let kill_line = match r.scanner.first_oom() {
        Some(f) if f.kind == Kind::GpuOom => {
            let finding = Some(f.clone());
            return (
                Outcome::GpuOom {
                    finding,
                    hung: false,
                },
                None,
            );
        }
        Some(f) if !detect::only_a_kill(f) => {
            let outcome = Outcome::HostOom {
                finding: Some(f.clone()),
                victim: f.numbers.victim.clone(),
                code,
            };
            return (outcome, None);
        }
        kill => kill, // only a kill signal, or nothing
    };
    // A peer's failure, with no error of its own before it: the run's root cause
    // is elsewhere (another rank, another node).
    if kill_line.is_none()
        && !matches!(r.exit, launch::Exit::Signal(Signal::KILL))
        && let Some(line) = r.scanner.peer_failure()
    {
        let outcome = Outcome::PeerFailure {
            code,
            line: line.to_string(),
        };
        return (outcome, None);
    }
    let killed = kill_line.is_some() || matches!(r.exit, launch::Exit::Signal(Signal::KILL));
    let other = |why| Outcome::Other {
        code,
        exit: r.exit.to_string(),
        why,
    };
    match kernel.read() {
        Ok(log) => {
            let mut pids = r.pids.clone();
            pids.insert(r.pid);
            pids.extend(r.scanner.named_pids());
            let all = kernel::victims(&log);
            // More than the pid: inside a PID namespace the kernel's record names
            // host pids, and a small pid of ours may be another tenant's there. A
            // victim is this run's when its pid is one of the run's and its name
            // one of theirs (as far as they were seen).
            let named =
                |v: &Victim| r.names.is_empty() || v.name.is_empty() || r.names.contains(&v.name);
            // And its memory cgroup one of the run's, where the record names one
            // (`task_memcg=`) and the run's were seen: a record with the run's pid
            // and name in another cgroup is another tenant's, in another namespace.
            let tie = |v: &Victim| kernel::in_run_cgroup(v.memcg.as_deref(), &r.cgroups);
            let (victims, elsewhere): (Vec<Victim>, Vec<Victim>) =
                kernel::of_run(&all, &pids, r.started_ms)
                    .into_iter()
                    .filter(|v| named(v))
                    .partition(|v| tie(v) != Some(false));
            let cgroups = || {
                r.cgroups
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            match victims.into_iter().next() {
                Some(victim) => (
                    Outcome::HostOom {
                        finding: kill_line.cloned(),
                        victim: Some(victim),
                        code,
                    },
                    None,
                ),
                None if killed && !elsewhere.is_empty() => (
                    Outcome::HostOom {
                        finding: kill_line.cloned(),
                        victim: None,
                        code,
                    },
                    Some(format!(
                        "the kernel's OOM killer killed {} during this attempt, with a pid and name of this run's, but in memory cgroup {}, not this run's ({}): cannot confirm it was this run's",
                        elsewhere[0].describe(),
                        elsewhere[0].memcg.as_deref().unwrap_or("?"),
                        cgroups()
                    )),
                ),
                None if killed => {
                    // A kill of a process by the name of one of the run's, during
                    // the attempt, whose pid is not the run's: a PID namespace's
                    // host pid, or another tenant's process of the same name.
                    let since = |v: &Victim| match (v.at_ms, r.started_ms) {
                        (Some(at), Some(s)) => at + 10_000 >= s,
                        _ => false,
                    };
                    match all.iter().rev().find(|v| {
                        !v.name.is_empty()
                            && r.names.contains(&v.name)
                            && since(v)
                            && tie(v) != Some(false)
                    }) {
                        // In the run's own cgroup (not its namespace's root): the
                        // run's, under a host pid.
                        Some(v) if tie(v) == Some(true) => (
                            Outcome::HostOom {
                                finding: kill_line.cloned(),
                                victim: Some(v.clone()),
                                code,
                            },
                            None,
                        ),
                        Some(v) => (
                            Outcome::HostOom {
                                finding: kill_line.cloned(),
                                victim: None,
                                code,
                            },
                            Some(format!(
                                "the kernel's OOM killer killed {} during this attempt, but its pid is not one of this run's (inside a PID namespace the kernel names host pids): cannot confirm it was this run's",
                                v.describe()
                            )),
                        ),
                        None => (other(Some(detect::NOT_THE_OOM_KILLER)), None),
                    }
                }
                None => (other(None), None),
            }
        }
        // Unread, a kill is what the output says it is (or what it most often is).
        Err(why) if killed => {
            let outcome = Outcome::HostOom {
                finding: kill_line.cloned(),
                victim: None,
                code,
            };
            (outcome, Some(why.to_string()))
        }
        Err(_) => (other(None), None),
    }
}

/// How an attempt ended, as the attempt loop is told it: [`classify`]'s
/// outcome, with thrust's sizeless `bad_alloc` after training steps taken for a
/// GPU OOM and a parser's refusal of what oomguard added told apart
/// ([`refused`]). The one place the outcome is made: the loop and `next` only
/// read it.
pub struct Classified {
    pub outcome: Outcome,
    /// Why the kernel's log could not confirm a kill (see [`classify`]).
    pub unreadable: Option<String>,
    /// The step training had reached when thrust's sizeless allocation
    /// failed, when that made it a GPU OOM.
    pub thrust_at: Option<u64>,
}

/// Classify a finished attempt (see [`Classified`]). `added`: what oomguard
/// added to its command (see [`Added`]); `steps_beyond`: the step the
/// attempt reached, when beyond the one it started from (asked only after
/// thrust's sizeless `bad_alloc`: an extension built for another GPU fails at
/// its first call, before any step; after training steps ran in this attempt
/// it is memory running out).
pub fn classify_attempt(
    r: &launch::Report,
    kernel: &dyn kernel::Source,
    added: &Added,
    steps_beyond: &dyn Fn() -> Option<u64>,
) -> Classified {
    let (outcome, unreadable) = classify(r, kernel);
    let (outcome, thrust_at) = match outcome {
        Outcome::AbsurdRequest { finding, code } => {
            match detect::sizeless_thrust_alloc(&finding)
                .then(steps_beyond)
                .flatten()
            {
                Some(step) => (
                    Outcome::GpuOom {
                        finding: Some(finding),
                        hung: false,
                    },
                    Some(step),
                ),
                None => (Outcome::AbsurdRequest { finding, code }, None),
            }
        }
        o => (o, None),
    };
    let outcome = failed_after_change(
        refused(outcome, &r.tail, added),
        r.scanner.error_line(),
        added,
        steps_beyond,
    );
    Classified {
        outcome,
        unreadable,
        thrust_at,
    }
}

/// What oomguard added to an attempt's command, each as it stood in argv without
/// its value: a flag (`--gradient_accumulation_steps`) or an override's `PREFIX KEY`
/// (`++trainer.accumulate_grad_batches`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Added {
    /// Each knob changed in a place the command did not have (see `knobs::added`).
    pub knobs: Vec<(Knob, String)>,
    /// The arguments that tell it where to resume, and the flags a relaunch
    /// carries, where the command did not have them (see `knobs::resume_added`).
    pub resume: Vec<String>,
    /// The knobs the decision before this attempt changed, other than the
    /// micro-batch and accumulation, each with `knob=value` — only where the
    /// attempt decided on got past its start (see [`failed_after_change`]).
    pub changed: Vec<(Knob, String)>,
}

/// A failure that is not an OOM, checked against what oomguard added to this
/// attempt's command (`added`): when the output's last lines hold a parser
/// refusing one of them (`detect::refusal`), the attempt failed of oomguard's
/// doing: [`Outcome::Refused`] for a knob's, [`Outcome::ResumeRefused`] for the
/// resume argument. Any other outcome is returned as it is.
pub fn refused(outcome: Outcome, tail: &[u8], added: &Added) -> Outcome {
    let Outcome::Other { code, .. } = &outcome else {
        return outcome;
    };
    if *code == 0 {
        return outcome;
    }
    let names: Vec<String> = added
        .knobs
        .iter()
        .map(|(_, a)| a.clone())
        .chain(added.resume.iter().cloned())
        .collect();
    if names.is_empty() {
        return outcome;
    }
    match detect::refusal::refused(tail, &names) {
        Some(r) if r.index < added.knobs.len() => Outcome::Refused {
            code: *code,
            knob: added.knobs[r.index].0,
            added: added.knobs[r.index].1.clone(),
            line: r.line,
            at_start: false,
        },
        Some(r) => Outcome::ResumeRefused {
            code: *code,
            added: names[r.index].clone(),
            line: r.line,
        },
        None => outcome,
    }
}

/// A failure that is not an OOM, before the attempt's first training step, right
/// after oomguard changed a setting the command had run with (gradient
/// checkpointing turned on, a ZeRO stage raised, an offload), where the attempt
/// before got past its start: taken as the command refusing that change (a model
/// that "does not support gradient checkpointing", ZeRO-3 with a quantized base,
/// DeepSpeed's CPU Adam failing to build), [`Outcome::Refused`] with `at_start`.
/// `steps_beyond`: the step this attempt reached beyond the one it started from.
/// A kill from outside (`why`) or any step trained is left as it is.
pub fn failed_after_change(
    outcome: Outcome,
    error_line: Option<&str>,
    added: &Added,
    steps_beyond: &dyn Fn() -> Option<u64>,
) -> Outcome {
    let Outcome::Other {
        code, why: None, ..
    } = &outcome
    else {
        return outcome;
    };
    let Some((knob, change)) = added.changed.first() else {
        return outcome;
    };
    if *code == 0 || steps_beyond().is_some() {
        return outcome;
    }
    Outcome::Refused {
        code: *code,
        knob: *knob,
        added: change.clone(),
        line: error_line
            .unwrap_or("no error line in its output")
            .chars()
            .take(400)
            .collect(),
        at_start: true,
    }
}

/// What an OOM attempt showed, for the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// `CudaOom`, `HungAfterOom`, or `AssumedOom` for `plan`.
    pub outcome: OutcomeKind,
    /// The numbers in the OOM message (`None`: no message with numbers).
    pub oom: Option<OomNumbers>,
    /// The training step the attempt reached (see `progress`), if it can be told.
    pub step_reached: Option<Reached>,
    /// The steps the attempt completed before the OOM (the step reached less
    /// the step it started from; at least this many): many good steps make the
    /// OOM a spike, not a steady overflow (see `memory::Calibrated::learn`).
    pub steps_done: Option<u64>,
    /// The phase the OOM happened in (loading or saving a checkpoint,
    /// evaluation, a training step), and how that was told ("the traceback
    /// runs through evaluation_loop"); `None`: it cannot be told (see
    /// `detect::phase`). [`Evidence::when`] refines training by the step.
    pub phase: Option<Seen>,
}

/// When in the run an OOM happened: the phase its output shows, a training
/// step told apart by the steps the attempt had completed. The journal's
/// `phase` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Loading a checkpoint (resuming) or weights.
    Loading,
    /// Writing a checkpoint.
    Saving,
    /// An evaluation inside training.
    Evaluation,
    /// The attempt's first training step (no step completed since it started).
    FirstStep,
    /// After [`crate::memory::SPIKE_STEPS`] or more good steps: a spike.
    SteadyState,
    /// A training step after a few good ones, or at a step that cannot be told.
    Training,
}

impl When {
    /// " while loading a checkpoint", " in the steady state at step 812":
    /// the words that follow "OOM", with the step reached when known.
    pub fn words(self, step: Option<u64>) -> String {
        match (self, step) {
            (When::Loading, _) => " while loading a checkpoint".into(),
            (When::Saving, _) => " while saving a checkpoint".into(),
            (When::Evaluation, _) => " during evaluation".into(),
            (When::FirstStep, _) => " at the first step".into(),
            (When::SteadyState, Some(s)) => format!(" in the steady state at step {s}"),
            (When::SteadyState, None) => " in the steady state".into(),
            (When::Training, Some(s)) => format!(" at step {s}"),
            (When::Training, None) => String::new(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            When::Loading => "loading",
            When::Saving => "saving",
            When::Evaluation => "evaluation",
            When::FirstStep => "first_step",
            When::SteadyState => "steady_state",
            When::Training => "training",
        }
    }
}

impl Evidence {
    /// `plan`: the OOM every rung after the first assumes.
    pub fn assumed() -> Evidence {
        Evidence {
            outcome: OutcomeKind::AssumedOom,
            oom: None,
            step_reached: None,
            steps_done: None,
            phase: None,
        }
    }

    /// A CUDA OOM that ended the attempt, with the message's numbers if any.
    #[cfg(test)]
    pub fn cuda_oom(oom: Option<OomNumbers>) -> Evidence {
        Evidence {
            outcome: OutcomeKind::CudaOom,
            oom,
            step_reached: None,
            steps_done: None,
            phase: None,
        }
    }

    /// The evidence of an [`Outcome::GpuOom`] of an attempt that started at
    /// step `from` and reached `step_reached`.
    pub fn gpu_oom(
        finding: Option<&Finding>,
        hung: bool,
        step_reached: Option<Reached>,
        from: u64,
    ) -> Evidence {
        Evidence {
            outcome: if hung {
                OutcomeKind::HungAfterOom
            } else {
                OutcomeKind::CudaOom
            },
            oom: finding.map(|f| f.numbers.clone()),
            step_reached,
            steps_done: step_reached.map(|r| r.step.saturating_sub(from)),
            phase: None,
        }
    }

    /// The attempt hung (its peers waiting in NCCL) after printing the OOM.
    pub fn hung(&self) -> bool {
        self.outcome == OutcomeKind::HungAfterOom
    }

    /// When in the run the OOM happened (`None`: nothing tells).
    pub fn when(&self) -> Option<When> {
        match self.phase.as_ref().map(|s| s.phase) {
            Some(Phase::Loading) => return Some(When::Loading),
            Some(Phase::Saving) => return Some(When::Saving),
            Some(Phase::Evaluation) => return Some(When::Evaluation),
            _ => {}
        }
        match self.steps_done {
            Some(0) => Some(When::FirstStep),
            Some(k) if k >= crate::memory::SPIKE_STEPS => Some(When::SteadyState),
            Some(_) => Some(When::Training),
            None => self.phase.as_ref().map(|_| When::Training),
        }
    }

    /// How the phase was told, when it was.
    pub fn phase_how(&self) -> Option<&str> {
        self.phase.as_ref().map(|s| s.how.as_str())
    }

    /// How an OOM during evaluation was told (`None`: not during evaluation).
    pub fn evaluation(&self) -> Option<&str> {
        self.phase
            .as_ref()
            .filter(|s| s.phase == Phase::Evaluation)
            .map(|s| s.how.as_str())
    }

    /// "while loading a checkpoint", "at the first step", "in the steady
    /// state at step 812": the words that follow "OOM" (empty: nothing tells).
    pub fn when_words(&self) -> String {
        self.when()
            .map(|w| w.words(self.step_reached.map(|r| r.step)))
            .unwrap_or_default()
    }
}

/// "OOM", "OOM (tried to allocate 2.00 GiB on GPU 0, 1.06 GiB free)",
/// "hung after OOM (...)", "OOM during evaluation (...)", "OOM while loading a
/// checkpoint (...)", "OOM at the first step (...)", "assumed OOM": the cause
/// that leads a decision's reason.
impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.outcome {
            OutcomeKind::AssumedOom => f.write_str("assumed ")?,
            OutcomeKind::HostOom => return f.write_str("host OOM"),
            OutcomeKind::HungAfterOom => f.write_str("hung after ")?,
            _ => {}
        }
        f.write_str("OOM")?;
        if self.outcome != OutcomeKind::AssumedOom || self.phase.is_some() {
            f.write_str(&self.when_words())?;
        }
        let Some(n) = &self.oom else {
            return Ok(());
        };
        if let Some(t) = n.tried_to_allocate_bytes {
            write!(f, " (tried to allocate {}", format_size(t))?;
            if let Some(d) = n.device {
                write!(f, " on GPU {d}")?;
            }
            // Under a per-process cap the GPU's free memory says nothing of why
            // the allocation failed: the cap and what this process held do.
            match (n.allowed_bytes, n.free_bytes) {
                (Some(cap), _) => {
                    write!(f, ", {} allowed to this process", format_size(cap))?;
                    if let Some(a) = n.allocated_bytes {
                        write!(f, ", {} allocated", format_size(a))?;
                    }
                }
                (None, Some(fr)) => write!(f, ", {} free", format_size(fr))?,
                (None, None) => {}
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_worded_from_the_numbers() {
        assert_eq!(Evidence::assumed().to_string(), "assumed OOM");
        assert_eq!(Evidence::cuda_oom(None).to_string(), "OOM");
        let n = OomNumbers {
            device: Some(0),
            tried_to_allocate_bytes: Some(2 << 30),
            free_bytes: Some(1 << 30),
            ..Default::default()
        };
        let mut e = Evidence::cuda_oom(Some(n));
        assert_eq!(
            e.to_string(),
            "OOM (tried to allocate 2.00 GiB on GPU 0, 1.00 GiB free)"
        );
        // A per-process cap (set_per_process_memory_fraction): the GPU's 135 GiB
        // free is not why it failed; the cap is (seen on an H200).
        let capped = Evidence::cuda_oom(Some(OomNumbers {
            device: Some(0),
            tried_to_allocate_bytes: Some(256 << 20),
            free_bytes: Some(135 << 30),
            allowed_bytes: Some(4 << 30),
            allocated_bytes: Some(3 << 30),
            ..Default::default()
        }));
        assert_eq!(
            capped.to_string(),
            "OOM (tried to allocate 256.00 MiB on GPU 0, 4.00 GiB allowed to this process, 3.00 GiB allocated)"
        );
        e.outcome = OutcomeKind::HungAfterOom;
        assert!(e.hung());
        assert!(e.to_string().starts_with("hung after OOM (tried"));
        // Numbers without the allocation size say nothing more than "OOM".
        let e = Evidence::cuda_oom(Some(OomNumbers {
            free_bytes: Some(1),
            ..Default::default()
        }));
        assert_eq!(e.to_string(), "OOM");
    }

    fn report(log: &str, exit: launch::Exit) -> launch::Report {
        let mut scanner = crate::detect::Scanner::new();
        scanner.feed(crate::detect::Stream::Err, log.as_bytes());
        scanner.finish();
        launch::Report {
            pid: 1,
            exit,
            interrupted: None,
            hung: false,
            scanner,
            duration: std::time::Duration::ZERO,
            oom_at: None,
            warnings: Vec::new(),
            pids: Default::default(),
            names: Default::default(),
            cgroups: Default::default(),
            started_ms: None,
            stopped: None,
            task_files: Vec::new(),
            oom_file: None,
            back_at: None,
            saves: Vec::new(),
            torchrun: None,
            tail: log.as_bytes().to_vec(),
        }
    }

    /// A kernel log that never has a record.
    struct NoKernelLog;
    impl kernel::Source for NoKernelLog {
        fn read(&self) -> Result<String, kernel::Unreadable> {
            Err(kernel::Unreadable::Test("none in tests"))
        }
    }

    fn classify_plain(r: &launch::Report) -> Outcome {
        classify(r, &NoKernelLog).0
    }

    #[test]
    fn only_an_oom_that_ended_the_process_decides() {
        let caught = "caught torch.OutOfMemoryError: CUDA out of memory; retrying with batch size 4\nstep 1\nstep 2\nValueError: bad label\n";
        let o = classify_plain(&report(caught, launch::Exit::Code(3)));
        assert!(matches!(o, Outcome::Other { code: 3, .. }), "{o:?}");
        let survived =
            "torch.OutOfMemoryError: CUDA out of memory.\nstep 1\nstep 2\nValueError: x\n";
        let o = classify_plain(&report(survived, launch::Exit::Code(3)));
        assert!(matches!(o, Outcome::Other { code: 3, .. }), "{o:?}");
        // A mention, then death with no sign of life: the OOM decides.
        let logged = "ERROR: training failed: CUDA out of memory. Tried to allocate 2.00 GiB\n";
        let o = classify_plain(&report(logged, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::CudaOom);
        // A mention in a run that ends well is a success.
        let o = classify_plain(&report(logged, launch::Exit::Code(0)));
        assert_eq!(o.kind(), OutcomeKind::Success);
    }

    /// How ranks end when a peer died (PyTorch's, gloo's, NCCL's and torchrun's own
    /// wordings, as they print them): a peer's failure, which in a job means "wait for
    /// the decision" (a follower) or "collect the followers' ends" (the leader) —
    /// never "stop" — and, in a run of one copy, a stop that says where to look.
    const PEER_ENDINGS: &[&str] = &[
        // gloo, a rank whose peer's process exited (torch 1.x and 2.x paths)
        "Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n    loss.backward()\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:10895\n",
        "[rank0]:     work.wait()\n[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.3.7]:28048\n",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [192.168.70.92]:25266: Connection reset by peer\n",
        "terminate called after throwing an instance of 'gloo::IoException'\n  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.3.7]:4321\n",
        // gloo's collective timing out on a rank that is gone
        "[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\n",
        // the c10d store and torchrun's rendezvous
        "torch.distributed.DistStoreError: Socket Timeout\n",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for workers. 1/2 workers joined.\n",
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?\ntorch.distributed.DistNetworkError: Connection reset by peer\n",
        "    raise RendezvousClosedError()\ntorch.distributed.elastic.rendezvous.api.RendezvousClosedError\n",
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n",
        "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.\n",
        // NCCL after a peer died: the watchdog, the aborted communicator, remote errors
        "[rank1]:[E424 01:11:21.160832730 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for 1800010 milliseconds before timing out.\n",
        "RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2511984, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809553 milliseconds before timing out.\n",
        "[rank3]: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8\n[rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n",
    ];

    /// NCCL reporting a dead peer as an internal error (its "Last error" line holds no
    /// error word the scanner looks at): not told from an error of the rank's own, it
    /// still waits for the decision on a follower, and the leader collects the ends.
    const PEER_ENDINGS_UNTOLD: &[&str] = &[
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, internal error, NCCL version 2.14.3\nncclInternalError: Internal check failed.\nLast error:\nNet : Connection closed by remote peer node2<43236>\n",
    ];

    use crate::next::{For, Verdict};

    /// What a follower copy and copy 0 of a job do after an attempt that ended with `o`.
    fn after_as_copies(o: Outcome) -> (Verdict, Verdict) {
        use crate::next::{Ended, History, Role, Rules, next};
        let s = crate::settings::Settings {
            knobs: Default::default(),
            world_size: 2,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        };
        let policy = crate::policy::Policy::load("default").unwrap();
        let rules = Rules {
            policy: &policy,
            max_attempts: 6,
            workers_floor: 0,
        };
        let e = Ended::new(o, None);
        let verdict = |role| {
            let h = History {
                n: 1,
                first: &s,
                settings: &s,
                attempts: &[],
                model: None,
                no_cpu_offload: &[],
                retried: &[],
                role,
                resumable: None,
            };
            next(&h, &e, &rules)
        };
        (verdict(Role::Follower), verdict(Role::Leader))
    }

    #[test]
    fn a_peers_failure_waits_for_the_decision_and_never_stops_a_copy() {
        for log in PEER_ENDINGS {
            // What torchrun prints after its worker died of it changes nothing.
            let log = format!(
                "{log}E0213 12:07:20.086000 870572 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 876053) of binary: /usr/bin/python3\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            );
            let o = classify_plain(&report(&log, launch::Exit::Code(1)));
            assert!(
                matches!(o, Outcome::PeerFailure { code: 1, .. }),
                "{log}\n→ {o:?}"
            );
            let (follower, leader) = after_as_copies(o);
            assert!(matches!(follower, Verdict::Follow), "{log}");
            assert!(matches!(leader, Verdict::Wait(For::PeerEnds)), "{log}");
        }
        for log in PEER_ENDINGS_UNTOLD {
            let o = classify_plain(&report(log, launch::Exit::Code(1)));
            assert_eq!(o.kind(), OutcomeKind::OtherFailure, "{log}");
            let (follower, leader) = after_as_copies(o);
            assert!(matches!(follower, Verdict::Follow), "{log}");
            assert!(matches!(leader, Verdict::Wait(For::PeerEnds)), "{log}");
        }
    }

    #[test]
    fn the_first_error_decides_between_a_peers_failure_and_ones_own() {
        // The OOM printed before the peers' errors is the cause (root cause wins).
        let oom_first = format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free.\n{}",
            PEER_ENDINGS[0]
        );
        let o = classify_plain(&report(&oom_first, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::CudaOom);
        // An error of the rank's own before a peer's: its own failure.
        let own_first = format!("KeyError: 'labels'\n{}", PEER_ENDINGS[0]);
        let o = classify_plain(&report(&own_first, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::OtherFailure, "{o:?}");
        // A peer's failure first, then what the same node's other ranks print.
        let peer_first = format!("{}ValueError: bad value\n", PEER_ENDINGS[1]);
        let o = classify_plain(&report(&peer_first, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::PeerFailure, "{o:?}");
        // The words in prose are no error line; a run that ends well is a success.
        let prose = "step 3: retrying after Connection reset by peer (network blip)\n";
        let o = classify_plain(&report(prose, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::OtherFailure, "{o:?}");
        let o = classify_plain(&report(PEER_ENDINGS[0], launch::Exit::Code(0)));
        assert_eq!(o.kind(), OutcomeKind::Success);
        // Other errors are not a peer's failure.
        for own in [
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1287, invalid usage, NCCL version 2.17.1\n",
            // This node's own store cannot listen: not a peer's doing.
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n",
            "RuntimeError: CUDA error: an illegal memory access was encountered\n",
        ] {
            let o = classify_plain(&report(own, launch::Exit::Code(1)));
            assert_eq!(o.kind(), OutcomeKind::OtherFailure, "{own}");
        }
    }

    #[test]
    fn an_attempt_the_job_ended_is_a_peers_failure_unless_it_printed_its_own_oom() {
        let mut r = report(
            "step 5\nrank 1: waiting for a peer\n",
            launch::Exit::Signal(Signal::TERM),
        );
        r.stopped = Some("copy 0 of the job decided to relaunch after attempt 1".into());
        let o = classify_plain(&r);
        assert!(
            matches!(&o, Outcome::PeerFailure { code: 143, line } if line.contains("copy 0")),
            "{o:?}"
        );
        // Exit 0 after the SIGTERM is no success: the job moved on without it.
        r.exit = launch::Exit::Code(0);
        assert_eq!(classify_plain(&r).kind(), OutcomeKind::PeerFailure);
        let mut r = report(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
            launch::Exit::Signal(Signal::TERM),
        );
        r.stopped = Some("copy 0 of the job decided".into());
        assert_eq!(classify_plain(&r).kind(), OutcomeKind::CudaOom);
    }

    fn killed(log: &str, exit: launch::Exit, kernel: &str) -> (Outcome, Option<String>) {
        let mut r = report(log, exit);
        r.pid = 4000;
        r.pids.insert(4001);
        r.started_ms = Some(100_000);
        classify(&r, &kernel::Text(kernel.into()))
    }

    const KILLED_4001: &str = "[  120.500000] Memory cgroup out of memory: Killed process 4001 (pt_worker) total-vm:9000kB, anon-rss:2097152kB, file-rss:0kB\n";

    #[test]
    fn a_sigkill_is_a_host_oom_only_when_the_kernel_killed_a_process_of_the_run() {
        // The command itself, or a worker of its tree, killed by the OOM killer.
        for (kernel, pid) in [
            (KILLED_4001, 4001),
            (&KILLED_4001.replace("4001", "4000"), 4000),
        ] {
            let (o, unread) = killed("", launch::Exit::Signal(Signal::KILL), kernel);
            assert!(unread.is_none());
            let v = o.victim().unwrap_or_else(|| panic!("{o:?}"));
            assert_eq!((v.pid, v.anon_rss_bytes), (pid, Some(2 << 30)));
            assert_eq!(o.kind(), OutcomeKind::HostOom);
        }
        // The record names another process, or one killed before the attempt started.
        let other = KILLED_4001.replace("4001", "777");
        let early = KILLED_4001.replace("120.500000", "  3.000000");
        for kernel in ["", other.as_str(), early.as_str()] {
            let (o, _) = killed("", launch::Exit::Signal(Signal::KILL), kernel);
            assert_eq!(o.kind(), OutcomeKind::OtherFailure, "{kernel:?}");
            assert_eq!(o.why(), Some(detect::NOT_THE_OOM_KILLER));
        }
        // A launcher's summary of a worker's SIGKILL: the PID it names is the run's.
        let summary = "  exitcode  : -9 (pid: 5150)\n";
        let (o, _) = killed(
            summary,
            launch::Exit::Code(1),
            &KILLED_4001.replace("4001", "5150"),
        );
        assert_eq!(o.victim().map(|v| v.pid), Some(5150));
        assert!(o.finding().is_some_and(|f| f.line.contains("exitcode")));
        let (o, _) = killed(summary, launch::Exit::Code(1), "");
        assert_eq!(o.why(), Some(detect::NOT_THE_OOM_KILLER));
        // Another failure that the OOM killer explains (a DataLoader worker it took).
        let dl = "RuntimeError: DataLoader worker (pid(s) 812) exited unexpectedly\n";
        let (o, _) = killed(
            dl,
            launch::Exit::Code(1),
            &KILLED_4001.replace("4001", "812"),
        );
        assert_eq!(o.kind(), OutcomeKind::HostOom);
        let (o, _) = killed(dl, launch::Exit::Code(1), "");
        assert!(
            matches!(
                o,
                Outcome::Other {
                    code: 1,
                    why: None,
                    ..
                }
            ),
            "{o:?}"
        );
    }

    #[test]
    fn an_unreadable_kernel_log_leaves_a_kill_a_host_oom_and_says_why() {
        let (o, unread) = classify(
            &report("", launch::Exit::Signal(Signal::KILL)),
            &NoKernelLog,
        );
        assert_eq!(o.kind(), OutcomeKind::HostOom);
        assert!(o.victim().is_none());
        assert_eq!(unread.as_deref(), Some("none in tests"));
        // An ordinary failure does not need the record: nothing to say.
        let (o, unread) = classify(
            &report("ValueError: x\n", launch::Exit::Code(1)),
            &NoKernelLog,
        );
        assert_eq!((o.kind(), unread), (OutcomeKind::OtherFailure, None));
    }

    #[test]
    fn an_absurd_request_is_its_own_outcome_even_after_a_hang() {
        let log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 131062.02 GiB. GPU 0 has a total capacity of 44.53 GiB of which 40.00 GiB is free.\n";
        let o = classify_plain(&report(log, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::AbsurdRequest);
        let mut r = report(log, launch::Exit::Signal(Signal::TERM));
        r.hung = true;
        assert_eq!(classify_plain(&r).kind(), OutcomeKind::AbsurdRequest);
        // A real request of the same shape is an OOM.
        let real = log.replace("131062.02", "50.00");
        let o = classify_plain(&report(&real, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::CudaOom);
    }

    #[test]
    fn a_cancel_by_the_scheduler_after_an_oom_is_not_an_oom() {
        let log = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n\
slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-11-24T00:14:26 ***\n\
srun: error: n1: task 0: Terminated\n";
        let o = classify_plain(&report(log, launch::Exit::Code(143)));
        match &o {
            Outcome::Other {
                code: 143, exit, ..
            } => assert!(exit.contains("CANCELLED AT"), "{exit}"),
            o => panic!("{o:?}"),
        }
        // Fed in pieces, split inside the line.
        let mut scanner = crate::detect::Scanner::new();
        let (a, b) = log.split_at(log.find("CANCEL").unwrap() + 3);
        scanner.feed(crate::detect::Stream::Err, a.as_bytes());
        scanner.feed(crate::detect::Stream::Err, b.as_bytes());
        assert!(scanner.slurm_cancelled().is_some());
        // A job's own words about cancelling are not Slurm's line.
        let mut scanner = crate::detect::Scanner::new();
        scanner.feed(
            crate::detect::Stream::Out,
            b"order 12 CANCELLED AT the store\n",
        );
        assert!(scanner.slurm_cancelled().is_none());
        let o = classify_plain(&report(
            "slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2026-11-24T00:15:00 DUE TO PREEMPTION ***\n",
            launch::Exit::Code(143),
        ));
        assert_eq!(o.kind(), OutcomeKind::OtherFailure);
    }

    /// A failure before any step right after a change is the change refused; one
    /// after training steps, a kill from outside, or one with nothing changed is not.
    #[test]
    fn a_failure_before_any_step_after_a_change_is_the_change_refused() {
        let changed = Added {
            changed: vec![(Knob::GradCheckpointing, "grad_checkpointing=true".into())],
            ..Added::default()
        };
        let other = || Outcome::Other {
            code: 1,
            exit: "exit code 1".into(),
            why: None,
        };
        let line = Some("ValueError: GPT2Model does not support gradient checkpointing.");
        match failed_after_change(other(), line, &changed, &|| None) {
            Outcome::Refused {
                code: 1,
                knob: Knob::GradCheckpointing,
                added,
                line,
                at_start: true,
            } => {
                assert_eq!(added, "grad_checkpointing=true");
                assert!(line.contains("does not support"), "{line}");
            }
            o => panic!("{o:?}"),
        }
        let trained = failed_after_change(other(), line, &changed, &|| Some(7));
        assert_eq!(
            trained.kind(),
            OutcomeKind::OtherFailure,
            "it trained steps"
        );
        let nothing = failed_after_change(other(), line, &Added::default(), &|| None);
        assert_eq!(nothing.kind(), OutcomeKind::OtherFailure, "nothing changed");
        let killed = Outcome::Other {
            code: 137,
            exit: "killed by SIGKILL".into(),
            why: Some(crate::detect::NOT_THE_OOM_KILLER),
        };
        let killed = failed_after_change(killed, line, &changed, &|| None);
        assert_eq!(
            killed.kind(),
            OutcomeKind::OtherFailure,
            "killed from outside"
        );
    }

    #[test]
    fn outcome_names_are_the_journal_words() {
        for (k, name) in [
            (OutcomeKind::CudaOom, "cuda_oom"),
            (OutcomeKind::HungAfterOom, "hung_after_oom"),
            (OutcomeKind::OtherFailure, "other_failure"),
            (OutcomeKind::CannotExecute, "cannot_execute"),
            (OutcomeKind::AbsurdRequest, "absurd_request"),
            (OutcomeKind::RejectedAddition, "rejected_addition"),
        ] {
            assert_eq!(serde_json::json!(k), name);
        }
    }

    /// A failure whose last lines are a parser refusing what oomguard added is
    /// oomguard's doing; the same failure with nothing added, a refusal of something
    /// else, or an OOM keep their outcome.
    #[test]
    fn a_parsers_refusal_of_what_oomguard_added_is_not_the_runs_failure() {
        let added = Added {
            knobs: vec![(Knob::GradAccum, "--gradient_accumulation_steps".to_string())],
            resume: Vec::new(),
            changed: Vec::new(),
        };
        let log = "usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --gradient_accumulation_steps 2\n";
        let r = report(log, launch::Exit::Code(2));
        match refused(classify_plain(&r), &r.tail, &added) {
            Outcome::Refused {
                code,
                knob,
                added,
                line,
                at_start: false,
            } => {
                assert_eq!((code, knob), (2, Knob::GradAccum));
                assert_eq!(added, "--gradient_accumulation_steps");
                assert!(line.contains("unrecognized arguments"), "{line}");
            }
            o => panic!("{o:?}"),
        }
        let o = refused(classify_plain(&r), &r.tail, &Added::default());
        assert_eq!(o.kind(), OutcomeKind::OtherFailure);
        let other = report(
            "train.py: error: unrecognized arguments: --lr 3\n",
            launch::Exit::Code(2),
        );
        let o = refused(classify_plain(&other), &other.tail, &added);
        assert_eq!(o.kind(), OutcomeKind::OtherFailure);
        let oom = report(
            "train.py: error: unrecognized arguments: --gradient_accumulation_steps 2\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
            launch::Exit::Code(1),
        );
        let o = refused(classify_plain(&oom), &oom.tail, &added);
        assert_eq!(o.kind(), OutcomeKind::CudaOom);
    }

    /// The resume argument oomguard added, refused by a parser whose source did not
    /// show its options (click, an argparse parser a helper builds), is oomguard's
    /// doing too, told apart from a knob's; the user's own resume argument (not added)
    /// refused is the run's failure.
    #[test]
    fn a_parsers_refusal_of_the_resume_argument_oomguard_added_is_told_apart() {
        let added = Added {
            knobs: vec![(Knob::GradAccum, "--gradient_accumulation_steps".to_string())],
            resume: vec!["--resume_from_checkpoint".to_string()],
            changed: Vec::new(),
        };
        for log in [
            "train.py: error: unrecognized arguments: --resume_from_checkpoint out/checkpoint-10\n",
            "Usage: train.py [OPTIONS]\nTry 'train.py --help' for help.\n\nError: No such option: --resume_from_checkpoint\n",
            "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--resume_from_checkpoint', 'out/checkpoint-10']\n",
        ] {
            let r = report(log, launch::Exit::Code(2));
            match refused(classify_plain(&r), &r.tail, &added) {
                Outcome::ResumeRefused { code, added, line } => {
                    assert_eq!((code, added.as_str()), (2, "--resume_from_checkpoint"));
                    assert!(line.contains("--resume_from_checkpoint"), "{line}");
                }
                o => panic!("{log}: {o:?}"),
            }
        }
        // The flag a relaunch carries to turn a script's own folder search off is the
        // resume's too (transformers 5 has no --overwrite_output_dir).
        let with_off = Added {
            resume: vec![
                "--resume_from_checkpoint".to_string(),
                "--overwrite_output_dir".to_string(),
            ],
            ..added.clone()
        };
        let r = report(
            "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--overwrite_output_dir']\n",
            launch::Exit::Code(1),
        );
        match refused(classify_plain(&r), &r.tail, &with_off) {
            Outcome::ResumeRefused { added, .. } => assert_eq!(added, "--overwrite_output_dir"),
            o => panic!("{o:?}"),
        }
        let r = report(
            "train.py: error: unrecognized arguments: --resume_from_checkpoint out/checkpoint-10\n",
            launch::Exit::Code(2),
        );
        let users = Added {
            resume: Vec::new(),
            ..added
        };
        let o = refused(classify_plain(&r), &r.tail, &users);
        assert_eq!(o.kind(), OutcomeKind::OtherFailure);
    }
}
