//! What follows an attempt: the verdict, from the history and how the attempt
//! ended. Every rule that decides it lives here, as one pure function, [`next`]:
//! no file, process, GPU or clock is touched. The attempt loop (`supervise`)
//! gathers the facts (the outcome `evidence::classify` made, the OOM's
//! evidence, the other copies' ends, other tenants on the GPU) and carries the
//! verdict out; `plan` iterates the same function over assumed OOMs, so what
//! it prints is what a run would do.
//!
//! Theory of operation: a verdict is one of
//!
//! - [`Verdict::Relaunch`]: the next attempt's settings, where it resumes, and
//!   why ([`Because`], typed: the text is rendered by the listeners);
//! - [`Verdict::Wait`]: a fact is missing that the loop can get (the other
//!   copies' ends, whether another tenant holds the GPU, whether its memory
//!   comes back): the loop gets it and asks again;
//! - [`Verdict::Follow`]: a follower copy of a job takes copy 0's verdict;
//! - [`Verdict::Stop`]: the run is over, with this exit code, and why.
//!
//! The rules, in the order they are tried (one arm each, one test row each):
//!
//! | outcome | verdict |
//! |---|---|
//! | success | stop 0 |
//! | interrupted by the user | stop 128+N, never a relaunch |
//! | any failure of a follower copy | follow copy 0 |
//! | leader: a failure not its own OOM | wait for the copies' ends; a copy's OOM decides as a GPU OOM |
//! | another tenant's memory (GPU OOM, not hung) | wait for it (bounded), then the same settings |
//! | GPU OOM at --max-attempts | stop 75 |
//! | OOM while loading a checkpoint | retry once, then offload the optimizer's state, then (where the user offloads it) the parameters, then stop 75 |
//! | OOM while saving a checkpoint | no gather on save, else retry once, then stop 75 |
//! | OOM during evaluation | halve the evaluation batch |
//! | GPU OOM (spike or steady) | the memory model's pick, else the policy's next step, a step whose settings load the run's checkpoint first; none: stop 75 |
//! | host OOM | undo a CPU offload oomguard made, else halve the DataLoader's workers, else stop |
//! | rejected flag, or a change that failed before the first step | drop the knob, decide the last OOM again without it |
//! | absurd request, other failure, a peer's failure | stop with the command's status |

use std::path::PathBuf;

use crate::evidence::{Evidence, Outcome, OutcomeKind, When};
use crate::exit;
use crate::gpu::Tenant;
use crate::memory::Calibrated;
use crate::policy::{self, Decision, Policy, Step, StepKind};
use crate::settings::{Knob, Offload, Settings, Value};

/// What followed an attempt.
pub enum Next {
    /// Nothing: the run ended with it.
    Stop,
    /// Another tenant's memory came back (or a phase's OOM is retried, or a
    /// follower took copy 0's verdict): the same settings again, or copy 0's.
    Retry,
    /// The policy's step (the work the OOM cost is its `work_lost` event).
    Decided { decision: Decision },
}

/// One attempt that ran (was launched), and what followed it: the history
/// `next` reads. The end summary is not told from these but by the story,
/// from the events (`report::summary`).
pub struct AttemptRecord {
    pub n: u32,
    pub pid: u32,
    pub outcome: OutcomeKind,
    pub duration: std::time::Duration,
    /// What its OOM showed (GPU OOMs, and host OOMs a step followed).
    pub evidence: Option<Evidence>,
    /// Whose memory caused the OOM, when another tenant's did.
    pub foreign: Option<String>,
    pub next: Next,
}

/// How many times another tenant's memory is waited for in one run before the
/// policy shrinks the run instead.
pub const TENANT_RETRIES: usize = crate::gpuwatch::TENANT_RETRIES as usize;

/// What the user and the policy file allow.
pub struct Rules<'a> {
    pub policy: &'a Policy,
    pub max_attempts: u32,
    /// The DataLoader's fewest workers (1 where the command sets a prefetch
    /// factor or persistent workers, which need one).
    pub workers_floor: u64,
}

/// This copy's place in a job (see `job`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A run of one copy.
    Alone,
    /// Copy 0 of a job: it decides for every copy.
    Leader,
    /// Another copy: it follows copy 0.
    Follower,
}

/// The run so far, as the verdict needs it.
pub struct History<'a> {
    /// The attempt that ended (1-based).
    pub n: u32,
    /// The settings of the command as written.
    pub first: &'a Settings,
    /// The settings the attempt ran with.
    pub settings: &'a Settings,
    /// The attempts before this one.
    pub attempts: &'a [AttemptRecord],
    /// The memory model, calibrated by every OOM before this one.
    pub model: Option<&'a Calibrated>,
    /// Offloads whose CPU form ran the host out of memory: never to CPU again.
    pub no_cpu_offload: &'a [Knob],
    /// The phases whose OOM was already retried at the same settings.
    pub retried: &'a [When],
    pub role: Role,
    /// How the checkpoint the next attempt would resume from was written (`None`:
    /// none, or a format oomguard does not know): a step whose settings can load
    /// it is taken before one that cannot (see `loadable`).
    pub resumable: Option<crate::loadable::Written>,
}

/// How the attempt ended, and the facts gathered since.
#[derive(Debug, Clone)]
pub struct Ended {
    /// As `evidence::classify` made it.
    pub outcome: Outcome,
    /// What its OOM showed (a GPU OOM's numbers, step and phase; a host OOM's
    /// step), or the OOM of another copy of the job ([`Peers::Oom`]).
    pub evidence: Option<Evidence>,
    pub peers: Peers,
    /// Who else held GPU memory at the OOM (`None`: not looked yet).
    pub tenants: Option<Vec<Tenant>>,
    /// Whether their memory came back in time (`None`: not waited yet).
    pub memory_back: Option<bool>,
}

impl Ended {
    /// An attempt that ended with `outcome`, nothing else known yet.
    pub fn new(outcome: Outcome, evidence: Option<Evidence>) -> Ended {
        Ended {
            outcome,
            evidence,
            peers: Peers::NotHeard,
            tenants: None,
            memory_back: None,
        }
    }
}

/// What the other copies of a job said about the attempt (copy 0 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    NotHeard,
    /// Their ends are in; none ran out of memory.
    Heard,
    /// Copy `rank` ran out of GPU memory: the job's outcome is that OOM.
    Oom {
        rank: u32,
    },
}

/// What follows an attempt.
#[derive(Debug, Clone)]
pub enum Verdict {
    Relaunch {
        settings: Settings,
        resume: Resume,
        because: Because,
        /// The memory model as this OOM calibrated it (`None`: not calibrated).
        model: Option<Calibrated>,
    },
    /// Get the fact and ask again.
    Wait(For),
    /// Take copy 0's verdict.
    Follow,
    Stop {
        code: i32,
        because: Because,
    },
}

/// Where the next attempt resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// From the newest complete checkpoint this run wrote.
    Newest,
    /// Where the attempt that ended resumed from.
    Same,
    /// From this checkpoint (copy 0's, for every copy of the job).
    From(PathBuf),
    /// Without a resume argument: the command as written.
    Fresh,
}

/// What a [`Verdict::Wait`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum For {
    /// The other copies' ends ([`Ended::peers`]).
    PeerEnds,
    /// Who else holds GPU memory ([`Ended::tenants`]).
    Tenants,
    /// Their memory to come back ([`Ended::memory_back`]); `tries_left` false:
    /// this run waited [`TENANT_RETRIES`] times already, so it is not back.
    Memory { tries_left: bool },
}

/// Why not the evaluation batch, after a GPU OOM the ladder met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalNot {
    /// The OOM did not happen during evaluation (or it cannot be told).
    Training,
    /// No evaluation batch setting in the command.
    Unbound,
    /// The evaluation batch is already 1.
    AtOne,
}

/// Why no setting lowers a load's or a save's peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeakNot {
    /// A load: the optimizer's state is already offloaded (there).
    Offloaded(Offload),
    /// A load: the optimizer's state cannot be offloaded at these settings.
    NotOffloadable,
    /// A load: the command has no optimizer offload setting.
    NoOffloadSetting,
    /// A save: the 16-bit gather is already off.
    GatherOff,
    /// A save: the command has no saving setting oomguard can change.
    NoSavingSetting,
}

/// What a rejected addition leads to.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// No OOM led to it (the first attempt started from remembered settings):
    /// the command as written, less what it refused.
    AsWritten,
    /// The last OOM decided again without the knob; its decision (record
    /// `index` of the history) is replaced by this one.
    Redecided { index: usize, decision: Decision },
    /// --max-attempts reached.
    MaxAttempts,
    /// Without the knob the policy has no other step for the OOM of `attempt`.
    NoStep { attempt: u32 },
}

/// Why a verdict: the rule that made it, with its facts.
#[derive(Debug, Clone)]
pub enum Because {
    /// The command succeeded.
    Success,
    /// The user's signal.
    Interrupted { signal: crate::signal::Signal },
    /// A failure that is not an OOM: shrinking would not fix it.
    NotAnOom,
    /// A peer of the distributed run failed, and no OOM was seen here.
    PeerFailed,
    /// An allocation no GPU or machine has: a bug.
    Absurd,
    /// A host OOM that no knob meets. `undone`: the CPU offloads oomguard made,
    /// whose undoing left the policy no step.
    HostOom { undone: Vec<Knob> },
    /// A GPU OOM at --max-attempts.
    MaxAttempts,
    /// The policy has no step left (after an evaluation OOM whose batch could
    /// not be halved: `eval` says why).
    NothingLeft { eval: EvalNot },
    /// An OOM while loading or saving a checkpoint that nothing lowers.
    PhaseStop { when: When, not: PeakNot },
    /// The same settings once more after an OOM while loading or saving (a
    /// save's: why not its own setting).
    PhaseRetry { when: When, not: Option<PeakNot> },
    /// The phase's own remedy (the optimizer offloaded for a load, no gather on save).
    PhaseStep { decision: Decision },
    /// A GPU OOM in training (a spike included): the memory model's pick or the
    /// policy's next step; `eval`: why not the evaluation batch.
    Ladder { decision: Decision, eval: EvalNot },
    /// An OOM during evaluation: its batch halved.
    EvalBatch { decision: Decision },
    /// A host OOM after CPU offloads oomguard made: undone, and the next step
    /// taken without them.
    OffloadUndone {
        undone: Vec<Knob>,
        decision: Decision,
    },
    /// A host OOM: the DataLoader's workers halved. `ruled_out`: CPU offloads
    /// whose undoing left no step (kept, and never taken again).
    Workers {
        ruled_out: Vec<Knob>,
        decision: Decision,
    },
    /// Another tenant held the memory, and it came back.
    ForeignMemory,
    /// The command's parser refused what oomguard added for `knob`.
    Refused {
        knob: Knob,
        added: String,
        /// The settings without the knob.
        without: Settings,
        then: Refusal,
    },
    /// The command's parser refused the argument oomguard added to tell it where
    /// to resume (`added`): the same settings again, from the beginning, as every
    /// later attempt.
    ResumeRefused { added: String },
    /// Copy 0 of the job decided: its verdict as carried out, published to the
    /// other copies.
    Copy0,
}

impl Because {
    /// The policy's step and settings before and after, when the verdict takes one.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Because::PhaseStep { decision, .. }
            | Because::Ladder { decision, .. }
            | Because::EvalBatch { decision }
            | Because::OffloadUndone { decision, .. }
            | Because::Workers { decision, .. }
            | Because::Refused {
                then: Refusal::Redecided { decision, .. },
                ..
            } => Some(decision),
            _ => None,
        }
    }
}

/// The verdict after attempt `h.n` ended as `e` says, under `r`.
pub fn next(h: &History, e: &Ended, r: &Rules) -> Verdict {
    use Outcome as O;
    match &e.outcome {
        O::Success => return stop(exit::SUCCESS, Because::Success),
        O::Interrupted { signal } => {
            return stop(signal.exit_code(), Because::Interrupted { signal: *signal });
        }
        // A follower never stops alone: a peer's OOM shows here as a peer's
        // failure (`Connection closed by peer`, a rendezvous or NCCL error).
        _ if h.role == Role::Follower => return Verdict::Follow,
        _ => {}
    }
    // Copy 0's failure that is not an OOM of its own: the other copies' ends
    // first, whose OOM decides.
    if h.role == Role::Leader
        && matches!(
            e.outcome,
            O::Other { .. } | O::HostOom { .. } | O::PeerFailure { .. }
        )
    {
        match e.peers {
            Peers::NotHeard => return Verdict::Wait(For::PeerEnds),
            Peers::Oom { .. } => return gpu_oom(h, e, r),
            Peers::Heard => {}
        }
    }
    match &e.outcome {
        O::GpuOom { .. } => gpu_oom(h, e, r),
        O::HostOom { code, .. } => host_oom(h, e, r, *code),
        O::Refused { knob, added, .. } => refused(h, r, *knob, added),
        O::ResumeRefused { added, .. } => resume_refused(h, r, added),
        O::AbsurdRequest { code, .. } => stop(*code, Because::Absurd),
        O::PeerFailure { code, .. } => stop(*code, Because::PeerFailed),
        O::Other { code, .. } => stop(*code, Because::NotAnOom),
        O::Success | O::Interrupted { .. } => unreachable!("decided above"),
    }
}

fn stop(code: i32, because: Because) -> Verdict {
    Verdict::Stop { code, because }
}

fn relaunch(decision: Decision, because: impl FnOnce(Decision) -> Because) -> Verdict {
    Verdict::Relaunch {
        settings: decision.after.clone(),
        resume: Resume::Newest,
        because: because(decision),
        model: None,
    }
}

/// After a GPU OOM: another tenant's memory is waited for; otherwise, within
/// --max-attempts, the phase's rules, the evaluation batch, then the memory
/// model or the policy's ladder.
fn gpu_oom(h: &History, e: &Ended, r: &Rules) -> Verdict {
    let fallback;
    let ev = match &e.evidence {
        Some(ev) => ev,
        None => {
            fallback = Evidence::gpu_oom(None, false, None, 0);
            &fallback
        }
    };
    let (n, max) = (h.n, r.max_attempts);
    if !ev.hung() && n < max {
        match (&e.tenants, e.memory_back) {
            (None, _) => return Verdict::Wait(For::Tenants),
            (Some(t), None) if !t.is_empty() => {
                let waited = h
                    .attempts
                    .iter()
                    .filter(|a| matches!(a.next, Next::Retry) && a.foreign.is_some())
                    .count();
                return Verdict::Wait(For::Memory {
                    tries_left: waited < TENANT_RETRIES,
                });
            }
            (Some(t), Some(true)) if !t.is_empty() => {
                return Verdict::Relaunch {
                    settings: h.settings.clone(),
                    resume: Resume::Newest,
                    because: Because::ForeignMemory,
                    model: None,
                };
            }
            _ => {}
        }
    }
    if n >= max {
        return stop(exit::EXHAUSTED, Because::MaxAttempts);
    }
    let policy = without_offloads(r.policy, h.no_cpu_offload);
    // An OOM while loading or saving a checkpoint: not the batch's, so
    // neither a smaller batch nor the memory model's activations.
    match ev.when() {
        Some(when @ When::Loading) => {
            let retried = h.retried.contains(&when);
            return phase(
                when,
                after_load_oom(&policy, h.first, h.settings, ev, retried),
                h,
            );
        }
        Some(when @ When::Saving) => {
            let retried = h.retried.contains(&when);
            return phase(when, after_save_oom(h.settings, ev, retried), h);
        }
        _ => {}
    }
    // An OOM during evaluation: its batch first, the training's untouched.
    let eval = match halve_eval_batch(h.settings, ev) {
        Ok(d) => return relaunch(d, |decision| Because::EvalBatch { decision }),
        Err(not) => not,
    };
    // The memory model learns from this OOM first; what it finds nothing for,
    // the policy's ladder meets.
    // A step whose settings can load the checkpoint the relaunch resumes from
    // comes first: one that cannot (a ZeRO stage that reads other files, FSDP on
    // a checkpoint written without it) throws the run's steps away. Results
    // still come first: a shorter sequence is never taken to keep a checkpoint.
    let keeps = |s: &Settings| {
        h.resumable.is_none_or(|w| crate::loadable::loads(w, s))
            && s.int(Knob::SeqLen) == h.settings.int(Knob::SeqLen)
    };
    let mut model = h.model.filter(|_| policy.memory_model).cloned();
    let picked = model.as_mut().and_then(|m| {
        m.learn(h.settings, ev.oom.as_ref(), ev.steps_done);
        let d = crate::memory::next_from_model(&policy, h.settings, ev, m, &keeps)?;
        let free = crate::memory::next_from_model(&policy, h.settings, ev, m, &|_| true);
        Some(kept_over(d, free, h.resumable))
    });
    let laddered = || {
        let free = policy::next_rung(&policy, h.settings, ev);
        match policy::next_rung_where(&policy, h.settings, ev, &keeps) {
            Some(d) => Some(kept_over(d, free, h.resumable)),
            None => free,
        }
    };
    match picked.or_else(laddered) {
        Some(decision) => Verdict::Relaunch {
            settings: decision.after.clone(),
            resume: Resume::Newest,
            because: Because::Ladder { decision, eval },
            model,
        },
        None => stop(exit::EXHAUSTED, Because::NothingLeft { eval }),
    }
}

/// `d`, with why where it differs from the choice `free` made without regard to
/// the checkpoint (`written` so): that one could not have loaded it.
fn kept_over(
    mut d: Decision,
    free: Option<Decision>,
    written: Option<crate::loadable::Written>,
) -> Decision {
    if let (Some(f), Some(w)) = (free, written)
        && f.after != d.after
    {
        d.reason.push_str(&format!(
            " ({} was passed over: its settings could not load the checkpoint the relaunch resumes from, written {w})",
            f.step
        ));
    }
    d
}

fn phase(when: When, fix: PhaseFix, h: &History) -> Verdict {
    match fix {
        PhaseFix::Retry { not } => Verdict::Relaunch {
            settings: h.settings.clone(),
            resume: Resume::Newest,
            because: Because::PhaseRetry { when, not },
            model: None,
        },
        PhaseFix::Step(d) => relaunch(d, |decision| Because::PhaseStep { decision }),
        PhaseFix::Stop { not } => stop(exit::EXHAUSTED, Because::PhaseStop { when, not }),
    }
}

/// After a host (CPU) OOM, within --max-attempts, in this order: a CPU offload
/// oomguard made is undone and the next step taken without it (an NVMe
/// offload when the policy gives a path); otherwise (no such offload, or no
/// step left without it) the DataLoader's workers are halved when the command
/// has them; otherwise stop with the command's status.
fn host_oom(h: &History, e: &Ended, r: &Rules, code: i32) -> Verdict {
    let host = Evidence {
        outcome: OutcomeKind::HostOom,
        oom: None,
        step_reached: None,
        steps_done: None,
        phase: None,
    };
    let ev = e.evidence.as_ref().unwrap_or(&host);
    if h.n >= r.max_attempts {
        return stop(code, Because::HostOom { undone: Vec::new() });
    }
    let cpu = Value::Offload(Offload::Cpu);
    let added: Vec<Knob> = [Knob::OffloadOptimizer, Knob::OffloadParam]
        .into_iter()
        .filter(|k| h.settings.knobs.get(k) == Some(&cpu) && h.first.knobs.get(k) != Some(&cpu))
        .collect();
    let workers =
        |ruled_out: Vec<Knob>| match halve_dataloader_workers(h.settings, r.workers_floor, ev) {
            Some(d) => relaunch(d, |decision| Because::Workers {
                ruled_out,
                decision,
            }),
            None => stop(code, Because::HostOom { undone: ruled_out }),
        };
    if added.is_empty() {
        return workers(Vec::new());
    }
    let mut undone = h.settings.clone();
    for k in &added {
        if let Some(v) = h.first.knobs.get(k) {
            undone.knobs.insert(*k, v.clone());
        }
    }
    let ruled_out: Vec<Knob> = h.no_cpu_offload.iter().chain(&added).copied().collect();
    let policy = without_offloads(r.policy, &ruled_out);
    // Undone, the GPU would overflow again: fewer workers, with the offload
    // kept, may make the room in host memory instead.
    let Some(next) = policy::next_rung(&policy, &undone, ev) else {
        return workers(added);
    };
    let undo: Vec<String> = added.iter().map(|k| format!("{k} cpu undone")).collect();
    let decision = Decision {
        reason: format!("{}; {}", undo.join(", "), next.reason),
        before: h.settings.clone(),
        ..next
    };
    relaunch(decision, |decision| Because::OffloadUndone {
        undone: added,
        decision,
    })
}

/// The command's parser refused `added`, which oomguard added for `knob`:
/// oomguard's doing, not the run's failure. The knob is dropped for the rest of
/// the run, and the OOM it was changed for is decided again without it (that
/// attempt's decision is replaced, so the summary tells what was done): a
/// relaunch when the policy has another step, otherwise stop (exit 75) at the
/// settings that ran, without the knob.
fn refused(h: &History, r: &Rules, knob: Knob, added: &str) -> Verdict {
    let decided = h
        .attempts
        .iter()
        .rposition(|a| a.evidence.is_some() && matches!(a.next, Next::Decided { .. }));
    let (mut base, last) = match decided.map(|i| (i, &h.attempts[i])) {
        Some((
            i,
            a @ AttemptRecord {
                next: Next::Decided { decision, .. },
                evidence: Some(ev),
                ..
            },
        )) => (decision.before.clone(), Some((i, a.n, ev))),
        _ => (h.first.clone(), None),
    };
    base.knobs.remove(&knob);
    let because = |without: Settings, then| Because::Refused {
        knob,
        added: added.to_string(),
        without,
        then,
    };
    if h.n >= r.max_attempts {
        return stop(exit::EXHAUSTED, because(base, Refusal::MaxAttempts));
    }
    let Some((index, attempt, ev)) = last else {
        return Verdict::Relaunch {
            settings: base.clone(),
            resume: Resume::Same,
            because: because(base, Refusal::AsWritten),
            model: None,
        };
    };
    let policy = without_offloads(r.policy, h.no_cpu_offload);
    let d = h
        .model
        .filter(|_| policy.memory_model)
        .and_then(|m| crate::memory::next_from_model(&policy, &base, ev, m, &|_| true))
        .or_else(|| policy::next_rung(&policy, &base, ev));
    let Some(mut decision) = d else {
        return stop(exit::EXHAUSTED, because(base, Refusal::NoStep { attempt }));
    };
    decision.reason = format!(
        "{} (decided again without {knob}: the command refused {added})",
        decision.reason
    );
    Verdict::Relaunch {
        settings: decision.after.clone(),
        resume: Resume::Same,
        because: because(base, Refusal::Redecided { index, decision }),
        model: None,
    }
}

/// The command's parser refused the argument oomguard added to tell it where to
/// resume (`added`): oomguard's doing, not the run's failure. The parser refused it
/// before any step, so the settings that ran are run again, without it, from the
/// beginning (the command cannot be told where to resume; every later attempt
/// starts there too). At the last attempt allowed, the run stops (exit 75).
fn resume_refused(h: &History, r: &Rules, added: &str) -> Verdict {
    let because = Because::ResumeRefused {
        added: added.to_string(),
    };
    if h.n >= r.max_attempts {
        return stop(exit::EXHAUSTED, because);
    }
    Verdict::Relaunch {
        settings: h.settings.clone(),
        resume: Resume::Fresh,
        because,
        model: None,
    }
}

/// The policy, less the CPU offload steps a host OOM ruled out.
fn without_offloads<'p>(policy: &'p Policy, ruled_out: &[Knob]) -> std::borrow::Cow<'p, Policy> {
    if ruled_out.is_empty() {
        return std::borrow::Cow::Borrowed(policy);
    }
    let mut p = policy.clone();
    p.steps.retain(|s| {
        s.nvme_path.is_some()
            || !ruled_out.iter().any(|k| {
                matches!(
                    (k, s.kind),
                    (Knob::OffloadOptimizer, StepKind::OffloadOptimizer)
                        | (Knob::OffloadParam, StepKind::OffloadParam)
                )
            })
    });
    std::borrow::Cow::Owned(p)
}

/// After a host (CPU) OOM: halve the DataLoader's workers (N → N/2), down to
/// `floor` (0, or 1 where the command sets a prefetch factor or persistent
/// workers, which PyTorch refuses without workers). `None` when the knob is
/// not bound or already at the floor. The batches are the same with fewer
/// workers: only the host memory their copies of the dataset hold changes.
fn halve_dataloader_workers(cur: &Settings, floor: u64, evidence: &Evidence) -> Option<Decision> {
    let n = cur.int(Knob::DataloaderWorkers)?;
    if n <= floor {
        return None;
    }
    let new = (n / 2).max(floor);
    let mut after = cur.clone();
    after.knobs.insert(Knob::DataloaderWorkers, Value::Int(new));
    Some(Decision {
        step: StepKind::HalveDataloaderWorkers,
        before: cur.clone(),
        after,
        reason: format!(
            "{evidence}: DataLoader workers {n} → {new} (each holds its own copy of the dataset and prefetched batches in host memory; the batches are the same)"
        ),
    })
}

/// After a GPU OOM during evaluation: halve the evaluation batch (N → N/2, not
/// below 1). The training batch, the accumulation and so the global batch are
/// untouched: evaluation holds no gradients or optimizer step, its batch only
/// sizes the activations of one forward pass. `Err` says why not (so that the
/// policy decides as after any OOM): the evidence does not show evaluation,
/// the command has no evaluation batch setting, or it is already 1.
fn halve_eval_batch(cur: &Settings, evidence: &Evidence) -> Result<Decision, EvalNot> {
    let Some(how) = evidence.evaluation() else {
        return Err(EvalNot::Training);
    };
    let Some(n) = cur.int(Knob::EvalBatch) else {
        return Err(EvalNot::Unbound);
    };
    if n <= 1 {
        return Err(EvalNot::AtOne);
    }
    let new = n / 2;
    let mut after = cur.clone();
    after.knobs.insert(Knob::EvalBatch, Value::Int(new));
    let kept = match cur.global_batch() {
        Some(g) => format!("the training batch and the global batch ({g}) are unchanged"),
        None => "the training batch is unchanged".into(),
    };
    Ok(Decision {
        step: StepKind::HalveEvalBatch,
        before: cur.clone(),
        after,
        reason: format!("{evidence} ({how}): evaluation batch {n} → {new}; {kept}"),
    })
}

/// What follows an OOM while loading or saving a checkpoint: a batch is not
/// what overflowed, so neither the micro-batch nor the memory model's
/// activation term is the fix (see [`after_load_oom`], [`after_save_oom`]).
#[derive(Debug, Clone)]
enum PhaseFix {
    /// The same settings once more, with the allocator set against
    /// fragmentation (`expandable_segments`).
    Retry { not: Option<PeakNot> },
    /// A change that lowers the phase's own peak.
    Step(Decision),
    /// Nothing oomguard can change lowers it: stop, saying why.
    Stop { not: PeakNot },
}

/// After an OOM while loading a checkpoint (resuming: the optimizer's state
/// and the weights are loaded onto the GPU beside the model, a transient peak
/// no smaller batch lowers), in this order: the same settings once more with
/// the allocator set against fragmentation (`retried`: that was done in this
/// run); then offloading the optimizer's state, where the command has that
/// setting (the policy's own offload step, its NVMe path included, else to
/// CPU), so that it is loaded into host memory; then, where the command as
/// written offloads the optimizer's state, the parameters (ZeRO-3); then stop.
fn after_load_oom(
    policy: &Policy,
    first: &Settings,
    cur: &Settings,
    ev: &Evidence,
    retried: bool,
) -> PhaseFix {
    let how = ev.phase_how().unwrap_or("its traceback");
    if !retried {
        return PhaseFix::Retry { not: None };
    }
    // The policy's own offload step (its NVMe path included), else to CPU.
    let step = |kind| {
        policy
            .steps
            .iter()
            .find(|s| s.kind == kind)
            .cloned()
            .unwrap_or(Step {
                kind,
                min: 0,
                factor: 0.5,
                multiple_of: 1,
                max: 0,
                nvme_path: None,
            })
    };
    if let Some((after, what)) = policy::offload_optimizer(&step(StepKind::OffloadOptimizer), cur) {
        return PhaseFix::Step(Decision {
            step: StepKind::OffloadOptimizer,
            before: cur.clone(),
            after,
            reason: format!(
                "{ev} ({how}), again after a retry at the same settings: {what}, so that its state is loaded into host memory; the batch is unchanged"
            ),
        });
    }
    // FSDP has one offload, the optimizer step's with the parameters'. Under
    // ZeRO-3, where the command as written offloads the optimizer's state and the
    // load still overflows: the parameters too, so that the weights are loaded
    // into host memory; only where the user chose offloading: a parameter
    // offload slows every step more than any other change.
    let user_offloads = first
        .knobs
        .get(&Knob::OffloadOptimizer)
        .and_then(Value::as_offload)
        .is_some_and(|o| *o != Offload::None);
    let loaded = if cur.fsdp_offload {
        Some("the optimizer's state is")
    } else if user_offloads {
        Some("the weights are")
    } else {
        None
    };
    if let Some(loaded) = loaded
        && let Some((after, what)) = policy::offload_param(&step(StepKind::OffloadParam), cur)
    {
        return PhaseFix::Step(Decision {
            step: StepKind::OffloadParam,
            before: cur.clone(),
            after,
            reason: format!(
                "{ev} ({how}), again after a retry at the same settings: {what}, so that {loaded} loaded into host memory; the batch is unchanged"
            ),
        });
    }
    PhaseFix::Stop {
        not: match cur
            .knobs
            .get(if cur.fsdp_offload {
                &Knob::OffloadParam
            } else {
                &Knob::OffloadOptimizer
            })
            .and_then(Value::as_offload)
        {
            Some(o) if *o != Offload::None => PeakNot::Offloaded(o.clone()),
            Some(_) => PeakNot::NotOffloadable,
            None => PeakNot::NoOffloadSetting,
        },
    }
}

/// After an OOM while saving a checkpoint (a full state dict gathered on
/// one rank): the family's saving setting, `gather_on_save` true → false
/// (DeepSpeed's `stage3_gather_16bit_weights_on_model_save`); never a
/// smaller batch. Without that setting, or with it already off: the same
/// settings once more with the allocator set against fragmentation
/// (`retried`: that was done in this run), then stop.
fn after_save_oom(cur: &Settings, ev: &Evidence, retried: bool) -> PhaseFix {
    let how = ev.phase_how().unwrap_or("its traceback");
    if cur.bool(Knob::GatherOnSave) == Some(true) {
        let mut after = cur.clone();
        after.knobs.insert(Knob::GatherOnSave, Value::Bool(false));
        return PhaseFix::Step(Decision {
            step: StepKind::NoGatherOnSave,
            before: cur.clone(),
            after,
            reason: format!(
                "{ev} ({how}): gather_on_save true → false: each rank saves its own shard instead of one rank gathering the full weights (DeepSpeed: no 16-bit gather, zero_to_fp32.py recovers them; FSDP: SHARDED_STATE_DICT instead of FULL_STATE_DICT); the training is unchanged"
            ),
        });
    }
    let not = match cur.bool(Knob::GatherOnSave) {
        Some(_) => PeakNot::GatherOff,
        None => PeakNot::NoSavingSetting,
    };
    if !retried {
        return PhaseFix::Retry { not: Some(not) };
    }
    PhaseFix::Stop { not }
}

pub mod words;

#[cfg(test)]
mod tests;
