//! The attempt loop carries out the verdict (`next`): what it says on the
//! terminal and in the journal, the checkpoint a relaunch resumes from and the
//! work the OOM cost, another tenant's memory waited for, a knob the command
//! refused dropped. The rules themselves are `next`'s: nothing here decides.

use super::*;
use crate::evidence::When;
use crate::next::{EvalNot, Refusal};

impl<'c> Run<'c> {
    /// The run so far, as `next` reads it (`n`: the attempt that ended;
    /// `resumable`: see [`Run::resumable`]).
    pub(super) fn history(
        &self,
        n: u32,
        role: Role,
        resumable: Option<crate::loadable::Written>,
    ) -> next::History<'_> {
        next::History {
            n,
            first: &self.past.first,
            settings: &self.now.settings,
            attempts: &self.past.attempts,
            model: self.past.cal.as_ref(),
            no_cpu_offload: &self.past.no_cpu_offload,
            retried: &self.past.retried,
            role,
            resumable,
        }
    }

    /// How the checkpoint the next attempt would resume from was written: read
    /// once per attempt's end, for all of `next`'s questions about it.
    pub(super) fn resumable(&self) -> Option<crate::loadable::Written> {
        let res = self.now.resumer.search_reached(None);
        crate::loadable::written(&res.chosen?.path)
    }

    /// What the user and the policy allow.
    pub(super) fn rules(&self) -> next::Rules<'c> {
        next::Rules {
            policy: &self.cfg.opts.policy,
            max_attempts: self.cfg.opts.max_attempts,
            workers_floor: self.cfg.target.workers_floor,
        }
    }

    /// The evidence of a GPU OOM (`finding`: its line) of the attempt that ran
    /// since `started`: the step it reached, and where in the run it happened.
    pub(super) fn oom_evidence(
        &mut self,
        finding: Option<&Finding>,
        hung: bool,
        log: Option<&Path>,
        started: SystemTime,
    ) -> Evidence {
        let reached = self.reached(log, started);
        self.note_reached(reached);
        let mut ev = Evidence::gpu_oom(finding, hung, reached, self.started_from());
        // Where in the run it happened: its traceback and progress.
        ev.phase = self.past.phase.take();
        ev
    }

    /// Carry out `verdict` after attempt `rec` ended as `ended` says.
    pub(super) fn carry_out(
        &mut self,
        rec: &mut AttemptRecord,
        ended: &next::Ended,
        verdict: Verdict,
        report: &launch::Report,
        started: SystemTime,
    ) -> ControlFlow<i32> {
        let n = rec.n;
        let gpu_oom = matches!(ended.outcome, Outcome::GpuOom { .. })
            || matches!(ended.peers, Peers::Oom { .. });
        let ev = ended.evidence.clone();
        let oom_after = report.oom_at.unwrap_or(report.duration);
        let flow = match verdict {
            Verdict::Follow => {
                let job = self
                    .live
                    .job
                    .clone()
                    .expect("a follower is a copy of a job");
                return self.follow(&job, rec, &ended.outcome, report);
            }
            Verdict::Wait(_) => unreachable!("the loop gets what a wait asks for"),
            Verdict::Stop { code, because } => {
                self.say_stop(rec, ended, report, because);
                ControlFlow::Break(code)
            }
            // Where it resumes follows from why: a new checkpoint search after an
            // OOM (`decide`, `retry_same`, `retry_foreign`), the same one after a
            // refusal.
            Verdict::Relaunch {
                settings,
                resume: _,
                because,
                model,
            } => {
                let ev = ev.clone().unwrap_or_else(Evidence::assumed);
                match because {
                    Because::Ladder { decision, eval } => {
                        if let Some(why) = self.eval_fallback(&ev, eval) {
                            self.report.term.info(&why);
                        }
                        if model.is_some() {
                            self.past.cal = model;
                        }
                        rec.next = self.decide(n, &ev, decision, started, oom_after);
                    }
                    Because::EvalBatch { decision } | Because::PhaseStep { decision, .. } => {
                        rec.next = self.decide(n, &ev, decision, started, oom_after);
                    }
                    ref b @ Because::PhaseRetry { when, .. } => {
                        let reason = next::words::phase_reason(b, &ev).unwrap_or_default();
                        self.retry_same(rec, &ev, when, reason);
                    }
                    Because::OffloadUndone { undone, decision } => {
                        self.past.no_cpu_offload.extend(undone);
                        self.report
                            .term
                            .info(&format!("attempt {n}: host OOM after the CPU offload"));
                        rec.next = self.decide(n, &ev, decision, started, oom_after);
                        rec.evidence = Some(ev);
                    }
                    Because::Workers {
                        ruled_out,
                        decision,
                    } => {
                        self.past.no_cpu_offload.extend(ruled_out);
                        self.report.term.info(&format!(
                            "attempt {n}: host OOM: halving the DataLoader's workers"
                        ));
                        rec.next = self.decide(n, &ev, decision, started, oom_after);
                        rec.evidence = Some(ev);
                    }
                    Because::ForeignMemory => {
                        self.retry_foreign(rec, ended.tenants.as_deref().unwrap_or_default());
                    }
                    Because::Refused {
                        knob,
                        added,
                        without,
                        then,
                    } => {
                        self.say_refused(rec, &ended.outcome, knob, &added);
                        match then {
                            Refusal::Redecided {
                                index, decision, ..
                            } => self.redecided(n, index, decision),
                            _ => {
                                self.report
                                    .term
                                    .info(&format!("relaunching at {without} without {added}"));
                            }
                        }
                    }
                    Because::ResumeRefused { added } => {
                        self.say_resume_refused(rec, &ended.outcome, &added);
                        self.report.term.info(&format!(
                            "relaunching at {settings} from the beginning, without {added}"
                        ));
                    }
                    b => unreachable!("{b:?} is no relaunch's"),
                }
                self.now.settings = settings;
                ControlFlow::Continue(())
            }
        };
        if gpu_oom {
            rec.evidence = ended.evidence.clone();
        }
        flow
    }

    /// Say why the run stops here, after attempt `rec`.
    fn say_stop(
        &mut self,
        rec: &mut AttemptRecord,
        ended: &next::Ended,
        report: &launch::Report,
        because: Because,
    ) {
        let (n, max) = (rec.n, self.cfg.opts.max_attempts);
        match because {
            Because::Success => {
                self.live.gw.record_success();
                let fit = crate::remember::Remembered {
                    knobs: self.now.settings.knobs.clone(),
                    peak: self.live.gw.last_peak(),
                    failed: self
                        .past
                        .cal
                        .as_ref()
                        .map(|c| c.failed.iter().map(|s| s.knobs.clone()).collect())
                        .unwrap_or_default(),
                };
                if let Some((path, key)) = &self.cfg.target.remember
                    && let Err(e) = crate::remember::record(
                        path,
                        key,
                        &fit,
                        &crate::remember::redact(&self.cfg.opts.argv),
                    )
                {
                    tracing::warn!("cannot remember the settings in {}: {e}", path.display());
                }
            }
            Because::Interrupted { signal } => {
                self.report
                    .term
                    .info(&format!("interrupted by {}; not relaunching", signal));
            }
            Because::NotAnOom => {
                if let Outcome::Other { code, exit, why } = &ended.outcome {
                    let line = why
                        .map(str::to_string)
                        .or_else(|| report.scanner.error_line().map(str::to_string))
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default();
                    self.report.term.say(&format!("the command failed with {exit}, not an out-of-memory error{line}\noomguard: shrinking would not fix that, so oomguard stops here with the command's status {code}"));
                }
            }
            Because::PeerFailed => {
                if let Outcome::PeerFailure { code, line } = &ended.outcome {
                    // A copy alone (no job channel, or oomguard around one launcher): the
                    // rank that failed first is elsewhere, and its output is not here.
                    self.report.term.say(&format!("the command failed with {} because a peer of the distributed run failed: {line}\noomguard: no out-of-memory error was seen in this output (the rank that failed first printed elsewhere: another node, a per-task file), so oomguard stops here with the command's status {code}", report.exit));
                }
            }
            Because::Absurd => {
                if let Outcome::AbsurdRequest { finding, code } = &ended.outcome {
                    if crate::detect::sizeless_thrust_alloc(finding) {
                        self.report.term.say(&format!(
                            "{}: {}\noomguard: {}; stopping with status {code}",
                            crate::detect::absurd_what(finding),
                            finding.line,
                            crate::detect::advice(finding)
                        ));
                    } else {
                        self.report.term.say(&format!("the command asked for an impossible allocation: {}\noomguard: not fixable by smaller settings — likely a bug (a corrupted size, an extension built for another GPU, an overflow); stopping with status {code}", finding.line));
                    }
                }
            }
            Because::HostOom { undone } => {
                if !undone.is_empty() {
                    self.report.term.say(&format!("host (CPU) memory ran out after the CPU offload oomguard made ({}); undoing it leaves the policy no step: give its offload step nvme_path = \"/local_nvme\" to offload to NVMe instead", undone
                            .iter()
                            .map(|k| format!("{k}=cpu"))
                            .collect::<Vec<_>>()
                            .join(" ")));
                }
                if let Outcome::HostOom {
                    finding,
                    victim,
                    code,
                } = &ended.outcome
                {
                    let line = match (victim, finding) {
                        (Some(v), _) => {
                            format!(": the kernel's OOM killer killed {}", v.describe())
                        }
                        (None, Some(f)) => format!(": {}", f.line),
                        (None, None) => {
                            " (killed by SIGKILL; the kernel's log could not be read to confirm the OOM killer, or its record could not be tied to this run: cannot confirm)"
                                .into()
                        }
                    };
                    self.report.term.say(&format!("host (CPU) memory ran out{line}\noomguard: GPU settings would not fix that; {}. Stopping with status {code}", self.host_oom_advice(n)));
                }
            }
            Because::MaxAttempts => self.report.term.say(&format!(
                "{n} attempts made (--max-attempts {max}); the run still does not fit"
            )),
            Because::NothingLeft { eval } => {
                if let Some(why) = ended
                    .evidence
                    .as_ref()
                    .and_then(|ev| self.eval_fallback(ev, eval))
                {
                    self.report.term.info(&why);
                }
                self.nothing_left();
            }
            ref b @ Because::PhaseStop { when, .. } => {
                let ev = ended.evidence.clone().unwrap_or_else(Evidence::assumed);
                let why = next::words::phase_reason(b, &ev).unwrap_or_default();
                self.report.term.say(&format!("{why}; oomguard stops here"));
                let families = &self.cfg.target.disc.families;
                let advice = if when == When::Loading {
                    crate::frameworks::load_advice(families)
                } else {
                    crate::frameworks::save_advice(families)
                };
                for a in advice {
                    self.report.term.say(&format!("  {a}"));
                }
            }
            Because::Refused {
                knob,
                added,
                without,
                then,
            } => {
                self.say_refused(rec, &ended.outcome, knob, &added);
                self.now.settings = without;
                match then {
                    Refusal::NoStep { attempt } => {
                        let without: Vec<&str> = self.past.dropped.iter().map(|k| k.name()).collect();
                        self.report.term.say(&format!("without {}, the policy '{}' has no other step for the OOM of attempt {attempt}: the run still does not fit at {}", without.join(" and "),
                            self.cfg.opts.policy.name,
                            self.now.settings));
                    }
                    _ => self.report.term.say(&format!("{n} attempts made (--max-attempts {max}); the run still does not fit at {}", self.now.settings)),
                }
                self.bind_advice();
            }
            Because::ResumeRefused { added } => {
                self.say_resume_refused(rec, &ended.outcome, &added);
                self.report.term.say(&format!(
                    "{n} attempts made (--max-attempts {max}); the run still does not fit at {}",
                    self.now.settings
                ));
            }
            b => unreachable!("{b:?} is no stop's"),
        }
    }

    /// The command's parser refused `added`, which oomguard added for `knob`:
    /// oomguard's doing, not the run's failure; the knob is dropped for the rest
    /// of the run.
    fn say_refused(
        &mut self,
        rec: &mut AttemptRecord,
        outcome: &Outcome,
        knob: knobs::Knob,
        added: &str,
    ) {
        let n = rec.n;
        if !self.past.dropped.contains(&knob) {
            self.past.dropped.push(knob);
        }
        match outcome {
            Outcome::Refused {
                code,
                line,
                at_start: true,
                ..
            } => {
                self.report.term.say(&format!("attempt {n} failed before its first training step (exit {code}: {line}) right after oomguard set {added}; taken as the command refusing that change: {knob} is dropped for the rest of the run and the OOM is decided again without it"));
            }
            Outcome::Refused { code, line, .. } => {
                self.report.term.say(&format!("attempt {n}: the command refused {added}, which oomguard added for {knob} (exit {code}: {line}); that is oomguard's doing, not the run's failure: {knob} is dropped for the rest of the run"));
            }
            _ => {}
        }
    }

    /// The command's parser refused `added`, the argument oomguard added to tell it
    /// where to resume: oomguard's doing, not the run's failure; the command is never
    /// told where to resume again, so each later attempt starts from the beginning.
    fn say_resume_refused(&mut self, rec: &AttemptRecord, outcome: &Outcome, added: &str) {
        let n = rec.n;
        let Outcome::ResumeRefused { code, line, .. } = outcome else {
            return;
        };
        let why = format!("the command refused {added} (exit {code}: {line})");
        if self.now.resumer.relaunch_flags().iter().any(|f| f == added) {
            self.report.term.say(&format!("attempt {n}: {why}, which oomguard added to turn the script's own search of its output folder off; that is oomguard's doing, not the run's failure: it is never added again (a relaunch may stop on an output folder that holds files: give the script's own spelling of that switch yourself)"));
        } else {
            self.report.term.say(&format!("attempt {n}: {why}, which oomguard added to resume from this run's checkpoint; that is oomguard's doing, not the run's failure: the command cannot be told where to resume, so each later attempt starts from the beginning and trains the steps before it again (a policy's [resume] table describes another way the script resumes)"));
        }
        self.now.resumer.refuse(why, added);
    }

    /// Journal (and say, through the terminal) decision `d` after attempt `n`, resuming
    /// from `resume` at `resume_step`.
    fn emit_decision(
        &mut self,
        n: u32,
        d: &Decision,
        resume: Option<&Path>,
        resume_step: Option<u64>,
    ) {
        self.emit(Event::Decision {
            attempt: n,
            step: d.step,
            before: events::knobs(&d.before),
            after: events::knobs(&d.after),
            global_batch_before: d.before.global_batch(),
            global_batch_after: d.after.global_batch(),
            reason: d.reason.clone(),
            resume: resume.map(events::path),
            resume_step,
        });
    }

    /// The OOM of the attempt record `index` decided again without a refused
    /// knob: its decision is replaced, so the summary tells what was done.
    fn redecided(&mut self, n: u32, index: usize, d: Decision) {
        let resume = self.now.resumer.next().map(|r| PathBuf::from(&r.path));
        let step = self.now.resumer.resumed_step();
        self.emit_decision(n, &d, resume.as_deref(), step);
        if let Next::Decided { decision, .. } = &mut self.past.attempts[index].next {
            *decision = d;
        }
    }

    /// Another tenant's memory, not the run's: say whose, and wait for it
    /// (`tries_left`: this run has not waited [`next::TENANT_RETRIES`] times).
    /// Whether it came back in time.
    pub(super) fn wait_for_tenants(
        &mut self,
        rec: &mut AttemptRecord,
        tenants: &[crate::gpu::Tenant],
        tries_left: bool,
        pid: u32,
    ) -> bool {
        let who: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        let who = who.join("; ");
        self.report
            .term
            .say(&format!("this OOM is not the run's own: {who}"));
        self.emit(Event::ForeignOom {
            attempt: rec.n,
            tenants: events::json(&tenants),
        });
        rec.foreign = Some(who);
        if !tries_left || !self.live.gw.wait_for_tenant(pid) {
            self.report.term.say(
                "the memory did not come back in time (--wait-timeout); falling back to the policy",
            );
            return false;
        }
        true
    }

    /// Another tenant's memory came back: the same settings again, from the
    /// newest checkpoint this run wrote.
    fn retry_foreign(&mut self, rec: &mut AttemptRecord, tenants: &[crate::gpu::Tenant]) {
        let who: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        let who = who.join("; ");
        let res = self.now.resumer.search();
        self.checkpoints_passed_over(rec.n, &res);
        self.now.resumer.resume_from(&res, res.step());
        self.report
            .term
            .info("memory is free again: retrying the same settings");
        self.emit(Event::RetrySameSettings(RetrySame {
            attempt: rec.n,
            step: SameSettings::RetrySameSettings,
            before: events::knobs(&self.now.settings),
            after: events::knobs(&self.now.settings),
            reason: format!("another tenant held the memory: {who}"),
            resume: res.chosen.as_ref().map(|c| events::path(&c.path)),
        }));
        rec.next = Next::Retry;
    }

    /// The evidence of a host OOM of the attempt that reached `reached`.
    pub(super) fn host_evidence(&self, reached: Option<Reached>) -> Evidence {
        Evidence {
            outcome: OutcomeKind::HostOom,
            oom: None,
            step_reached: reached,
            steps_done: reached.map(|r| r.step.saturating_sub(self.started_from())),
            phase: None,
        }
    }

    /// What the last decision changed besides the micro-batch and accumulation,
    /// each as `knob=value`, when the attempt it was decided on got past its
    /// start: it showed training steps, or its OOM's traceback ran through a
    /// training step or an evaluation (so that a next attempt failing with no
    /// step is known to have failed earlier): see `evidence::failed_after_change`.
    pub(super) fn changed_after_training(&self) -> Vec<(knobs::Knob, String)> {
        let Some(last) = self.past.attempts.last() else {
            return Vec::new();
        };
        let (Next::Decided { decision }, Some(ev)) = (&last.next, &last.evidence) else {
            return Vec::new();
        };
        let trained = ev.step_reached.is_some()
            || ev.phase.as_ref().is_some_and(|p| {
                matches!(
                    p.phase,
                    crate::detect::phase::Phase::Training | crate::detect::phase::Phase::Evaluation
                )
            });
        if !trained {
            return Vec::new();
        }
        decision
            .after
            .knobs
            .iter()
            .filter(|(k, _)| !matches!(k, knobs::Knob::MicroBatch | knobs::Knob::GradAccum))
            .filter(|(k, v)| decision.before.knobs.get(k) != Some(*v))
            .map(|(k, v)| (*k, format!("{k}={v}")))
            .collect()
    }

    /// The step the attempt that ran since `started` began from: the checkpoint
    /// it resumed from, else the user's own resume argument's, else 0.
    pub(super) fn started_from(&self) -> u64 {
        self.now.resumer.started_from()
    }

    /// The step the attempt that ran since `started` reached: what its log
    /// shows (bars, step lines, the Trainer's log dicts), or the newest
    /// checkpoint it saved when that is later (a lower bound: it went on
    /// after saving). `None`: it cannot be told.
    pub(super) fn reached(&self, log: Option<&Path>, started: SystemTime) -> Option<Reached> {
        let counting = self
            .cfg
            .target
            .counting
            .at_accum(self.now.settings.int(knobs::Knob::GradAccum));
        let from = self.started_from();
        let printed = log.and_then(|l| {
            let mut memo = self.past.log_reached.borrow_mut();
            if let Some(m) = memo.as_ref()
                && m.log == l
                && m.from == from
                && m.counting == counting
            {
                return m.reached;
            }
            let reached = progress::read(l, self.cfg.target.logging, from, counting);
            *memo = Some(super::LogReached {
                log: l.to_path_buf(),
                from,
                counting,
                reached,
            });
            reached
        });
        // A checkpoint beyond what the output shows is not this attempt's.
        let res = self
            .now
            .resumer
            .search_reached(printed.map(|p| self.step_bound(p)));
        let saved = res
            .chosen
            .as_ref()
            .filter(|c| checkpoint::written_at(&c.path).is_some_and(|w| w > started))
            .and_then(checkpoint::step_for)
            .map(|step| Reached {
                step,
                at_least: true,
            });
        match (printed, saved) {
            (Some(p), Some(s)) => Some(p.max(s)),
            (p, s) => p.or(s),
        }
    }

    /// The highest step an attempt that reached `r` can have saved: `r`, or
    /// with "at least" (log dicts every N steps) up to N - 1 more.
    pub(super) fn step_bound(&self, r: Reached) -> u64 {
        if r.at_least {
            r.step + self.cfg.target.logging.map_or(0, |l| l.every.max(1) - 1)
        } else {
            r.step
        }
    }

    /// After an attempt that reached `r`: checkpoints beyond the highest step
    /// this run reached are never resumed from (another run's, or an old one
    /// touched). Unknown: no bound is added.
    pub(super) fn note_reached(&mut self, r: Option<Reached>) {
        if let Some(r) = r {
            let b = self.step_bound(r);
            self.now.resumer.note_reached(b);
        }
    }

    /// What to do about a host OOM oomguard cannot fix by itself.
    pub(super) fn host_oom_advice(&self, n: u32) -> String {
        let buffers = "reduce host-side buffers (load checkpoints with low_cpu_mem_usage or mmap, less CPU offload) or use a machine with more RAM";
        match self.now.settings.int(knobs::Knob::DataloaderWorkers) {
            Some(w) if w > self.cfg.target.workers_floor && n >= self.cfg.opts.max_attempts => {
                format!(
                    "{n} attempts made (--max-attempts {}), so the DataLoader's {w} workers are not halved again; {buffers}",
                    self.cfg.opts.max_attempts
                )
            }
            Some(0) => {
                format!("the DataLoader already loads in the main process (0 workers); {buffers}")
            }
            Some(w) if self.cfg.target.workers_floor > 0 => format!(
                "the DataLoader already runs with {w} worker (the command sets a prefetch factor or persistent workers, which need one); {buffers}"
            ),
            Some(w) => format!("the DataLoader already runs with {w} workers; {buffers}"),
            None => format!(
                "no DataLoader worker setting was found in the command (looked for {}; bind yours with --knob dataloader_workers=FLAG and oomguard halves it after a host OOM); {buffers}",
                crate::frameworks::looked_for(knobs::Knob::DataloaderWorkers)
            ),
        }
    }

    /// The same settings again after an OOM while loading or saving (`when`),
    /// once a run each, with the allocator set against fragmentation, from the
    /// newest checkpoint this run wrote.
    fn retry_same(&mut self, rec: &mut AttemptRecord, ev: &Evidence, when: When, reason: String) {
        self.past.retried.push(when);
        let alloc = crate::envmerge::against_fragmentation(
            &mut self.now.env_defaults,
            &crate::run_config::real_env,
        );
        let reason = format!("{reason} ({alloc})");
        let n = rec.n;
        let peak = if when == When::Loading {
            "a load's"
        } else {
            "a save's"
        };
        self.report.term.info(&format!(
            "attempt {n}: {ev}: retrying the same settings once ({alloc}); a smaller batch does not lower {peak} peak"
        ));
        let res = self.now.resumer.search();
        self.checkpoints_passed_over(rec.n, &res);
        self.now.resumer.resume_from(&res, res.step());
        self.report.term.info(&res.because.to_string());
        self.emit(Event::RetrySameSettings(RetrySame {
            attempt: rec.n,
            step: SameSettings::RetrySameSettings,
            before: events::knobs(&self.now.settings),
            after: events::knobs(&self.now.settings),
            reason,
            resume: res.chosen.as_ref().map(|c| events::path(&c.path)),
        }));
        rec.next = Next::Retry;
    }

    /// Why the policy has no step left, complete at the default verbosity: the
    /// settings it ran with (or that there is nothing to change), each step that
    /// cannot apply and why, the notes those refer to (how to bind a knob), a
    /// shell script in front of the real command, and the `plan` that shows all.
    fn nothing_left(&self) {
        let cfg = self.cfg;
        let at = if self.now.settings.knobs.is_empty() {
            "as written: oomguard found no setting it can change in this command".to_string()
        } else {
            format!("at {}", self.now.settings)
        };
        self.report.term.say(&format!(
            "the policy '{}' has no step left; the run still does not fit {at}",
            cfg.opts.policy.name
        ));
        for na in policy::not_applicable(&cfg.opts.policy, &cfg.target.disc) {
            self.report
                .term
                .say(&format!("  {} not applicable: {}", na.step, na.why));
        }
        for n in plan::unbound_notes(cfg) {
            self.report.term.say(&format!("  {n}"));
        }
        if let Some(s) = &cfg.target.inside.shell_script {
            self.report
                .term
                .say(&format!("  {}", crate::inside::shell_note(s)));
        }
        self.report.term.say(&format!(
            "  {} shows every knob, where oomguard looked for it and the ladder",
            plan::plan_hint(&cfg.opts.argv)
        ));
    }

    /// Why an OOM during evaluation changes the training settings after all
    /// (`None`: it was not during evaluation).
    fn eval_fallback(&self, ev: &Evidence, not: EvalNot) -> Option<String> {
        let how = ev.evaluation()?;
        let why = match not {
            EvalNot::Training => return None,
            EvalNot::AtOne => "the evaluation batch is already 1".to_string(),
            EvalNot::Unbound => {
                format!(
                    "there is {}",
                    crate::frameworks::no_eval_batch(&self.cfg.target.disc.families)
                )
            }
        };
        Some(format!(
            "the OOM happened during evaluation ({how}), but {why}: the training settings change instead"
        ))
    }

    /// The same OOM again right after the micro-batch was halved: the same
    /// allocation failing with the same memory in use (every figure both
    /// messages print): the trainer may not be using the new value
    /// (transformers 4.36 to early 5.x restored train_batch_size from the
    /// checkpoint's trainer_state.json on resume). The same allocation alone
    /// is no sign: a real CUDA OOM at a halved batch often fails on a block of
    /// the same size, with less in use (seen on an H200, `examples/gpu_checks.sh`).
    pub(super) fn suspect(&mut self, n: u32, ev: &Evidence) {
        let last = self.past.attempts.iter().rev().find_map(|a| match &a.next {
            Next::Decided { decision, .. } => Some((a, decision.step)),
            _ => None,
        });
        let Some((prev, StepKind::HalveMicroBatch)) = last else {
            return;
        };
        let before = prev.evidence.as_ref().and_then(|e| e.oom.as_ref());
        let same = |a: Option<u64>, b: Option<u64>| a.is_none() || b.is_none() || a == b;
        let repeated = before.zip(ev.oom.as_ref()).is_some_and(|(b, e)| {
            b.tried_to_allocate_bytes.is_some()
                && b.tried_to_allocate_bytes == e.tried_to_allocate_bytes
                && same(b.free_bytes, e.free_bytes)
                && same(b.allocated_bytes, e.allocated_bytes)
                && same(b.this_process_bytes, e.this_process_bytes)
        });
        if repeated {
            self.report.term.warn("the OOM was the same as before the micro-batch was halved (the same allocation failed with the same memory in use); the trainer may be ignoring the new value (some transformers versions restore the batch size from the checkpoint on resume)");
            self.emit(Event::Suspect {
                attempt: n,
                why: "same allocation size after halving the micro-batch".into(),
            });
        }
    }

    /// Take the policy's decision: find the checkpoint to resume from, measure
    /// the work lost, journal both, and move to the new settings.
    pub(super) fn decide(
        &mut self,
        n: u32,
        ev: &Evidence,
        d: Decision,
        started: SystemTime,
        oom_after: Duration,
    ) -> Next {
        // The previous attempt's group is gone (launch waits for it), so a
        // checkpoint it was writing is as complete as it will ever be.
        let mut res = self.now.resumer.search();
        self.checkpoints_passed_over(n, &res);
        // A step that changes how the trainer writes its state (the ZeRO stage,
        // FSDP) cannot load what it wrote before: the relaunch would die loading it.
        if let Some(why) = res
            .chosen
            .as_ref()
            .and_then(|c| crate::loadable::check(&c.path, &d.before, &d.after).err())
        {
            self.emit(Event::CheckpointSkipped {
                attempt: n,
                path: events::path(&why.path),
                why: why.to_string(),
            });
            self.now.resumer.start_over(&mut res, why);
            self.past.started_over = true;
        }
        let new_step = res.step();
        let loss = Loss::measure(
            ev.step_reached,
            self.now.resumer.resumed_step(),
            new_step,
            res.chosen
                .as_ref()
                .and_then(|c| checkpoint::written_at(&c.path)),
            started,
            oom_after,
        );
        self.emit(Event::WorkLost {
            attempt: n,
            step_reached: ev.step_reached.map(|r| r.step),
            step_reached_at_least: ev.step_reached.is_some_and(|r| r.at_least),
            started_from_step: self.now.resumer.resumed_step(),
            resume_from_step: new_step,
            steps_lost: loss.steps,
            steps_lost_at_least: loss.at_least,
            seconds_lost: loss.seconds,
        });
        self.now.resumer.resume_from(&res, new_step);
        // The terminal says the decision as it hears it, before the resume.
        let resume = res.chosen.as_ref().map(|c| c.path.as_path());
        self.emit_decision(n, &d, resume, new_step);
        self.report.term.info(&res.because.to_string());
        self.now.settings = d.after.clone();
        Next::Decided { decision: d }
    }

    /// Say which newer checkpoints the next attempt does not resume from, and
    /// why: the newest few skipped one by one, the rest counted; those this
    /// run did not write in one line. (Ten thousand broken folders once wrote
    /// ten thousand lines on every relaunch.)
    pub(super) fn checkpoints_passed_over(&mut self, n: u32, res: &Resumption) {
        let Some(found) = &res.found else { return };
        let named = found.skipped.len().min(checkpoint::NAMED);
        let (first, rest) = found.skipped.split_at(named);
        for s in first {
            self.report
                .term
                .info(&format!("skipped {}: {}", s.path.display(), s.why));
            self.emit(Event::CheckpointSkipped {
                attempt: n,
                path: events::path(&s.path),
                why: s.why.clone(),
            });
        }
        if !rest.is_empty() {
            self.report.term.info(&format!(
                "skipped {} more checkpoints: {}",
                rest.len(),
                checkpoint::kinds_text(rest)
            ));
            self.emit(Event::CheckpointsSkipped {
                attempt: n,
                count: rest.len(),
                reasons: events::json(&checkpoint::count_kinds(rest)),
            });
        }
        if !found.ignored.is_empty() {
            let newest: Vec<String> = found
                .ignored
                .iter()
                .take(checkpoint::NAMED)
                .map(|s| s.path.display().to_string())
                .collect();
            self.report.term.info(&format!(
                "ignored {}; a relaunch resumes only from checkpoints this run wrote",
                checkpoint::ignored_text(&found.ignored)
            ));
            if let Some(s) = found
                .ignored
                .iter()
                .find(|s| s.kind == checkpoint::SkipKind::NotAnnounced)
            {
                self.report
                    .term
                    .info(&format!("{}: {}", s.path.display(), s.why));
            }
            self.emit(Event::CheckpointsIgnored {
                attempt: n,
                count: found.ignored.len(),
                newest,
                reasons: events::json(&checkpoint::count_kinds(&found.ignored)),
            });
        }
    }

    /// How to give oomguard each knob the command refused, where it accepts it.
    fn bind_advice(&self) {
        for k in &self.past.dropped {
            self.report.term.say(&bind_advice(*k).to_string());
        }
    }
}

/// How to give oomguard `knob` where the command accepts it, after the command
/// refused what oomguard added for it.
fn bind_advice(knob: knobs::Knob) -> String {
    use knobs::Knob;
    match knob {
        Knob::GradAccum => "to keep the global batch while the micro-batch shrinks, oomguard needs an accumulation setting the command accepts: bind the script's own option with --knob grad_accum=--ITS_FLAG=1 (added with the value oomguard computes), or =FILE:KEY or =env:VAR, before the command; to let the global batch shrink instead, rerun with --policy smaller-batch (`oomguard plan` shows what each would do)".into(),
        Knob::GradCheckpointing => "bind a gradient checkpointing setting the command accepts with --knob grad_checkpointing=--ITS_FLAG (added when it turns on), or =FILE:KEY, before the command (`oomguard plan` shows what it would do)".into(),
        k => format!(
            "bind {k} where the command accepts it with --knob {k}=--ITS_FLAG=VALUE, =FILE:KEY or =env:VAR, before the command (`oomguard plan` shows what it would do)"
        ),
    }
}
