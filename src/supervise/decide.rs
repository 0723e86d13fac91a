//! The attempt loop's decisions after an OOM: another tenant's memory, the
//! suspect same-size OOM, the policy or the memory model's pick, a host OOM
//! after a CPU offload, and the checkpoints a relaunch passes over.

use super::*;
use crate::evidence::When;

impl<'c> Run<'c> {
    /// The policy, less the CPU offload steps a host OOM ruled out.
    pub(super) fn policy(&self) -> std::borrow::Cow<'c, policy::Policy> {
        if self.no_cpu_offload.is_empty() {
            return std::borrow::Cow::Borrowed(&self.cfg.policy);
        }
        let mut p = self.cfg.policy.clone();
        p.steps.retain(|s| {
            s.nvme_path.is_some()
                || !self.no_cpu_offload.iter().any(|k| {
                    matches!(
                        (k, s.kind),
                        (knobs::Knob::OffloadOptimizer, StepKind::OffloadOptimizer)
                            | (knobs::Knob::OffloadParam, StepKind::OffloadParam)
                    )
                })
        });
        std::borrow::Cow::Owned(p)
    }

    /// After a host (CPU) OOM, in this order: a CPU offload oomguard made is
    /// undone and the next step taken without it (an NVMe offload when the
    /// policy gives a path); otherwise (no such offload, or no step left
    /// without it) the DataLoader's workers are halved when the command has
    /// them. `None`: neither applies (or --max-attempts is reached): the run
    /// stops as for any host OOM.
    pub(super) fn after_host_oom(
        &mut self,
        rec: &mut AttemptRecord,
        reached: Option<Reached>,
        report: &launch::Report,
        started: SystemTime,
    ) -> Option<Flow> {
        use knobs::{Knob, Offload, Value};
        let n = rec.n;
        if n >= self.cfg.max_attempts {
            return None;
        }
        let cpu = Value::Offload(Offload::Cpu);
        let added: Vec<Knob> = [Knob::OffloadOptimizer, Knob::OffloadParam]
            .into_iter()
            .filter(|k| {
                self.settings.knobs.get(k) == Some(&cpu) && self.first.knobs.get(k) != Some(&cpu)
            })
            .collect();
        if added.is_empty() {
            return self.halve_workers(rec, reached, report, started);
        }
        let mut undone = self.settings.clone();
        for k in &added {
            if let Some(v) = self.first.knobs.get(k) {
                undone.knobs.insert(*k, v.clone());
            }
        }
        self.no_cpu_offload.extend(added.iter().copied());
        let ev = self.host_evidence(reached);
        let Some(next) = policy::next(&self.policy(), &undone, &ev) else {
            // Undone, the GPU would overflow again: fewer workers, with the
            // offload kept, may make the room in host memory instead.
            if let Some(flow) = self.halve_workers(rec, reached, report, started) {
                return Some(flow);
            }
            self.term.say(&format!(
                "host (CPU) memory ran out after the CPU offload oomguard made ({}); undoing it leaves the policy no step: give its offload step nvme_path = \"/local_nvme\" to offload to NVMe instead",
                added
                    .iter()
                    .map(|k| format!("{k}=cpu"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            return None;
        };
        let undo: Vec<String> = added.iter().map(|k| format!("{k} cpu undone")).collect();
        let d = Decision {
            reason: format!("{}; {}", undo.join(", "), next.reason),
            before: self.settings.clone(),
            ..next
        };
        self.term
            .info(&format!("attempt {n}: host OOM after the CPU offload"));
        let oom_after = report.oom_at.unwrap_or(report.duration);
        rec.next = self.decide(n, &ev, d, started, oom_after);
        rec.evidence = Some(ev);
        Some(Flow::Again)
    }

    /// A host OOM with DataLoader workers above their floor: halve them and
    /// relaunch from the last checkpoint. `None`: no worker knob, or at its floor.
    fn halve_workers(
        &mut self,
        rec: &mut AttemptRecord,
        reached: Option<Reached>,
        report: &launch::Report,
        started: SystemTime,
    ) -> Option<Flow> {
        let n = rec.n;
        let ev = self.host_evidence(reached);
        let d = policy::halve_dataloader_workers(&self.settings, self.cfg.workers_floor, &ev)?;
        self.term.info(&format!(
            "attempt {n}: host OOM: halving the DataLoader's workers"
        ));
        let oom_after = report.oom_at.unwrap_or(report.duration);
        rec.next = self.decide(n, &ev, d, started, oom_after);
        rec.evidence = Some(ev);
        Some(Flow::Again)
    }

    /// The evidence of a host OOM of the attempt that reached `reached`.
    fn host_evidence(&self, reached: Option<Reached>) -> Evidence {
        Evidence {
            outcome: OutcomeKind::HostOom,
            oom: None,
            step_reached: reached,
            steps_done: reached.map(|r| r.step.saturating_sub(self.started_from())),
            phase: None,
        }
    }

    /// thrust's sizeless `bad_alloc` is taken for a bug (an extension built for
    /// another GPU fails at its first call); after training steps ran in this
    /// attempt it is memory running out: a GPU OOM.
    pub(super) fn thrust_after_steps(
        &self,
        outcome: Outcome,
        log: Option<&Path>,
        started: SystemTime,
    ) -> Outcome {
        let Outcome::AbsurdRequest { finding, code } = outcome else {
            return outcome;
        };
        let from = self.started_from();
        let reached = crate::detect::sizeless_thrust_alloc(&finding)
            .then(|| self.reached(log, started))
            .flatten()
            .filter(|r| r.step > from);
        match reached {
            Some(r) => {
                self.term.info(&format!(
                    "thrust's allocation failed with no size after training reached step {}: taken for a GPU OOM (an extension built for another GPU fails at its first call, before any step)",
                    r.step
                ));
                Outcome::GpuOom {
                    finding: Some(finding),
                    hung: false,
                }
            }
            None => Outcome::AbsurdRequest { finding, code },
        }
    }

    /// The step the attempt that ran since `started` began from: the checkpoint
    /// it resumed from, else the user's own resume argument's, else 0.
    pub(super) fn started_from(&self) -> u64 {
        self.resumed_step
            .or_else(|| {
                let user = self.cfg.layout.as_ref()?.user_resume.as_ref()?;
                checkpoint::recorded_step(user)
            })
            .unwrap_or(0)
    }

    /// The step the attempt that ran since `started` reached: what its log
    /// shows (bars, step lines, the Trainer's log dicts), or the newest
    /// checkpoint it saved when that is later (a lower bound: it went on
    /// after saving). `None`: it cannot be told.
    pub(super) fn reached(&self, log: Option<&Path>, started: SystemTime) -> Option<Reached> {
        let counting = self
            .cfg
            .counting
            .at_accum(self.settings.int(knobs::Knob::GradAccum));
        let printed =
            log.and_then(|l| progress::read(l, self.cfg.logging, self.started_from(), counting));
        // A checkpoint beyond what the output shows is not this attempt's.
        let mut bounded = self.baseline.clone();
        if let Some(p) = printed {
            bounded.reached = Some(self.step_bound(p).max(bounded.reached.unwrap_or(0)));
        }
        let res = self.cfg.resume(&bounded, Duration::ZERO);
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
            r.step + self.cfg.logging.map_or(0, |l| l.every.max(1) - 1)
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
            self.baseline.reached = Some(self.baseline.reached.map_or(b, |x| x.max(b)));
        }
    }

    /// What to do about a host OOM oomguard cannot fix by itself.
    pub(super) fn host_oom_advice(&self, n: u32) -> String {
        let buffers = "reduce host-side buffers (load checkpoints with low_cpu_mem_usage or mmap, less CPU offload) or use a machine with more RAM";
        match self.settings.int(knobs::Knob::DataloaderWorkers) {
            Some(w) if w > self.cfg.workers_floor && n >= self.cfg.max_attempts => format!(
                "{n} attempts made (--max-attempts {}), so the DataLoader's {w} workers are not halved again; {buffers}",
                self.cfg.max_attempts
            ),
            Some(0) => {
                format!("the DataLoader already loads in the main process (0 workers); {buffers}")
            }
            Some(w) if self.cfg.workers_floor > 0 => format!(
                "the DataLoader already runs with {w} worker (the command sets a prefetch factor or persistent workers, which need one); {buffers}"
            ),
            Some(w) => format!("the DataLoader already runs with {w} workers; {buffers}"),
            None => format!(
                "no DataLoader worker setting was found in the command (looked for {}; bind yours with --knob dataloader_workers=FLAG and oomguard halves it after a host OOM); {buffers}",
                crate::frameworks::looked_for(knobs::Knob::DataloaderWorkers)
            ),
        }
    }

    /// After a GPU OOM: another tenant's memory is waited for; otherwise the
    /// policy decides, within --max-attempts.
    pub(super) fn after_oom(
        &mut self,
        rec: &mut AttemptRecord,
        ev: &Evidence,
        finding: Option<&Finding>,
        report: &launch::Report,
        started: SystemTime,
    ) -> Flow {
        let (n, max) = (rec.n, self.cfg.max_attempts);
        self.term.info(&format!("attempt {n}: {ev}"));
        self.suspect(n, ev);
        if !ev.hung()
            && n < max
            && let Some(flow) = self.foreign_oom(rec, finding, report.pid)
        {
            return flow;
        }
        if n >= max {
            self.term.say(&format!(
                "{n} attempts made (--max-attempts {max}); the run still does not fit"
            ));
            return Flow::Stop(exit::EXHAUSTED);
        }
        let oom_after = report.oom_at.unwrap_or(report.duration);
        // An OOM while loading or saving a checkpoint: not the batch's, so
        // neither a smaller batch nor the memory model's activations.
        match ev.when() {
            Some(When::Loading) => return self.after_load_oom(rec, ev, started, oom_after),
            Some(When::Saving) => return self.after_save_oom(rec, ev, started, oom_after),
            _ => {}
        }
        // An OOM during evaluation: its batch first, the training's untouched.
        match policy::halve_eval_batch(&self.settings, ev) {
            Ok(d) => {
                rec.next = self.decide(n, ev, d, started, oom_after);
                return Flow::Again;
            }
            Err(not) => {
                if let Some(why) = self.eval_fallback(ev, not) {
                    self.term.info(&why);
                }
            }
        }
        let policy = self.policy();
        let Some(d) = crate::memory::decide(&policy, &self.settings, ev, self.cal.as_mut()) else {
            self.nothing_left();
            return Flow::Stop(exit::EXHAUSTED);
        };
        rec.next = self.decide(n, ev, d, started, oom_after);
        Flow::Again
    }

    /// After an OOM while loading a checkpoint: the same settings once, with
    /// the allocator set against fragmentation; then offloading the
    /// optimizer's state; then stop with advice (see `policy::after_load_oom`).
    /// The memory model is not calibrated: the load's peak is no activation.
    fn after_load_oom(
        &mut self,
        rec: &mut AttemptRecord,
        ev: &Evidence,
        started: SystemTime,
        oom_after: Duration,
    ) -> Flow {
        let n = rec.n;
        let retried = self.retried.contains(&When::Loading);
        let fix = policy::after_load_oom(&self.policy(), &self.settings, ev, retried);
        match fix {
            policy::PhaseFix::Retry { reason } => {
                self.retry_same(rec, ev, When::Loading, reason);
                Flow::Again
            }
            policy::PhaseFix::Step(d) => {
                rec.next = self.decide(n, ev, d, started, oom_after);
                Flow::Again
            }
            policy::PhaseFix::Stop { why } => {
                self.term.say(&format!("{why}; oomguard stops here"));
                for a in crate::frameworks::load_advice(&self.cfg.disc.families) {
                    self.term.say(&format!("  {a}"));
                }
                Flow::Stop(exit::EXHAUSTED)
            }
        }
    }

    /// After an OOM while saving a checkpoint: the family's saving setting
    /// (`policy::after_save_oom`), never a smaller batch; else stop with advice.
    fn after_save_oom(
        &mut self,
        rec: &mut AttemptRecord,
        ev: &Evidence,
        started: SystemTime,
        oom_after: Duration,
    ) -> Flow {
        let retried = self.retried.contains(&When::Saving);
        match policy::after_save_oom(&self.settings, ev, retried) {
            policy::PhaseFix::Step(d) => {
                rec.next = self.decide(rec.n, ev, d, started, oom_after);
                Flow::Again
            }
            policy::PhaseFix::Retry { reason } => {
                self.retry_same(rec, ev, When::Saving, reason);
                Flow::Again
            }
            policy::PhaseFix::Stop { why } => {
                self.term.say(&format!("{why}; oomguard stops here"));
                for a in crate::frameworks::save_advice(&self.cfg.disc.families) {
                    self.term.say(&format!("  {a}"));
                }
                Flow::Stop(exit::EXHAUSTED)
            }
        }
    }

    /// The same settings again after an OOM while loading or saving (`when`),
    /// once a run each, with the allocator set against fragmentation, from the
    /// newest checkpoint this run wrote.
    fn retry_same(&mut self, rec: &mut AttemptRecord, ev: &Evidence, when: When, reason: String) {
        self.retried.push(when);
        let alloc = crate::envmerge::against_fragmentation(
            &mut self.env_defaults,
            &crate::run_config::real_env,
        );
        let reason = format!("{reason} ({alloc})");
        let n = rec.n;
        let peak = if when == When::Loading {
            "a load's"
        } else {
            "a save's"
        };
        self.term.info(&format!(
            "attempt {n}: {ev}: retrying the same settings once ({alloc}); a smaller batch does not lower {peak} peak"
        ));
        let res = self.cfg.resume(&self.baseline, Duration::from_millis(200));
        self.checkpoints_passed_over(rec.n, &res);
        self.resume_from(&res, res.chosen.as_ref().and_then(checkpoint::step_for));
        self.term.info(&res.why);
        self.emit(Event::RetrySameSettings(RetrySame {
            attempt: rec.n,
            step: SameSettings::RetrySameSettings,
            before: events::knobs(&self.settings),
            after: events::knobs(&self.settings),
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
        let at = if self.settings.knobs.is_empty() {
            "as written: oomguard found no setting it can change in this command".to_string()
        } else {
            format!("at {}", self.settings)
        };
        self.term.say(&format!(
            "the policy '{}' has no step left; the run still does not fit {at}",
            cfg.policy.name
        ));
        for na in policy::not_applicable(&cfg.policy, &cfg.disc) {
            self.term
                .say(&format!("  {} not applicable: {}", na.step, na.why));
        }
        for n in plan::unbound_notes(cfg) {
            self.term.say(&format!("  {n}"));
        }
        if let Some(s) = &cfg.inside.shell_script {
            self.term
                .say(&format!("  {}", crate::inside::shell_note(s)));
        }
        self.term.say(&format!(
            "  {} shows every knob, where oomguard looked for it and the ladder",
            plan::plan_hint(&cfg.argv)
        ));
    }

    /// Why an OOM during evaluation changes the training settings after all
    /// (`None`: it was not during evaluation).
    fn eval_fallback(&self, ev: &Evidence, not: policy::EvalNot) -> Option<String> {
        let how = ev.evaluation()?;
        let why = match not {
            policy::EvalNot::Training => return None,
            policy::EvalNot::AtOne => "the evaluation batch is already 1".to_string(),
            policy::EvalNot::Unbound => {
                format!(
                    "there is {}",
                    crate::frameworks::no_eval_batch(&self.cfg.disc.families)
                )
            }
        };
        Some(format!(
            "the OOM happened during evaluation ({how}), but {why}: the training settings change instead"
        ))
    }

    /// The same allocation failing again right after the micro-batch was
    /// halved: the trainer may not be using the new value (transformers 4.36 to
    /// early 5.x restored train_batch_size from the checkpoint's
    /// trainer_state.json on resume).
    pub(super) fn suspect(&mut self, n: u32, ev: &Evidence) {
        let last = self.attempts.iter().rev().find_map(|a| match &a.next {
            Next::Decided { decision, .. } => Some((a, decision.step)),
            _ => None,
        });
        let Some((prev, StepKind::HalveMicroBatch)) = last else {
            return;
        };
        let before = prev.evidence.as_ref().and_then(Evidence::tried_to_allocate);
        if before.is_some() && before == ev.tried_to_allocate() {
            self.term.warn(
                "the OOM tried to allocate exactly as much as before the micro-batch was halved; the trainer may be ignoring the new value (some transformers versions restore the batch size from the checkpoint on resume)",
            );
            self.emit(Event::Suspect {
                attempt: n,
                why: "same allocation size after halving the micro-batch".into(),
            });
        }
    }

    /// Another tenant's memory, not the run's: wait for it and retry the same
    /// settings instead of shrinking (bounded; then the policy applies).
    /// `None`: not another tenant's, or it did not leave in time.
    pub(super) fn foreign_oom(
        &mut self,
        rec: &mut AttemptRecord,
        finding: Option<&Finding>,
        pid: u32,
    ) -> Option<Flow> {
        let tenants = self.gw.tenants(finding);
        if tenants.is_empty() {
            return None;
        }
        let who: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        let who = who.join("; ");
        self.term
            .say(&format!("this OOM is not the run's own: {who}"));
        self.emit(Event::ForeignOom {
            attempt: rec.n,
            tenants: events::json(&tenants),
        });
        rec.foreign = Some(who.clone());
        let retries = self
            .attempts
            .iter()
            .filter(|a| matches!(a.next, Next::Retry) && a.foreign.is_some())
            .count();
        if retries >= TENANT_RETRIES as usize || !self.gw.wait_for_tenant(pid) {
            self.term.say(
                "the memory did not come back in time (--wait-timeout); falling back to the policy",
            );
            return None;
        }
        let res = self.cfg.resume(&self.baseline, Duration::from_millis(200));
        self.checkpoints_passed_over(rec.n, &res);
        self.resume_from(&res, res.chosen.as_ref().and_then(checkpoint::step_for));
        self.term
            .info("memory is free again: retrying the same settings");
        self.emit(Event::RetrySameSettings(RetrySame {
            attempt: rec.n,
            step: SameSettings::RetrySameSettings,
            before: events::knobs(&self.settings),
            after: events::knobs(&self.settings),
            reason: format!("another tenant held the memory: {who}"),
            resume: res.chosen.as_ref().map(|c| events::path(&c.path)),
        }));
        rec.next = Next::Retry;
        Some(Flow::Again)
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
        let res = self.cfg.resume(&self.baseline, Duration::from_millis(200));
        self.checkpoints_passed_over(n, &res);
        let new_step = res.chosen.as_ref().and_then(checkpoint::step_for);
        let loss = Loss::measure(
            ev.step_reached,
            self.resumed_step,
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
            started_from_step: self.resumed_step,
            resume_from_step: new_step,
            steps_lost: loss.steps,
            steps_lost_at_least: loss.at_least,
            seconds_lost: loss.seconds,
        });
        self.resume_from(&res, new_step);
        // The terminal says the decision as it hears it, before the resume.
        self.emit(Event::Decision {
            attempt: n,
            step: d.step,
            before: events::knobs(&d.before),
            after: events::knobs(&d.after),
            global_batch_before: d.before.global_batch(),
            global_batch_after: d.after.global_batch(),
            reason: d.reason.clone(),
            resume: res.chosen.as_ref().map(|c| events::path(&c.path)),
            resume_step: new_step,
        });
        self.term.info(&res.why);
        self.settings = d.after.clone();
        Next::Decided { decision: d }
    }

    /// Say which newer checkpoints the next attempt does not resume from, and
    /// why: the newest few skipped one by one, the rest counted; those this
    /// run did not write in one line. (Ten thousand broken folders once wrote
    /// ten thousand lines on every relaunch.)
    pub(super) fn checkpoints_passed_over(&mut self, n: u32, res: &ResumeInfo) {
        let Some(found) = &res.found else { return };
        let named = found.skipped.len().min(checkpoint::NAMED);
        let (first, rest) = found.skipped.split_at(named);
        for s in first {
            self.term
                .info(&format!("skipped {}: {}", s.path.display(), s.why));
            self.emit(Event::CheckpointSkipped {
                attempt: n,
                path: events::path(&s.path),
                why: s.why.clone(),
            });
        }
        if !rest.is_empty() {
            self.term.info(&format!(
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
            self.term.info(&format!(
                "ignored {}; a relaunch resumes only from checkpoints this run wrote",
                checkpoint::ignored_text(&found.ignored)
            ));
            if let Some(s) = found
                .ignored
                .iter()
                .find(|s| s.kind == checkpoint::SkipKind::NotAnnounced)
            {
                self.term.info(&format!("{}: {}", s.path.display(), s.why));
            }
            self.emit(Event::CheckpointsIgnored {
                attempt: n,
                count: found.ignored.len(),
                newest,
                reasons: events::json(&checkpoint::count_kinds(&found.ignored)),
            });
        }
    }

    /// The command's parser refused `added`, which oomguard added for `knob`
    /// (`line`): oomguard's doing, not the run's failure. The knob is dropped for
    /// the rest of the run, and the OOM it was changed for is decided again without
    /// it (that attempt's decision is replaced, so the summary tells what was done):
    /// the run relaunches when the policy has another step, and otherwise stops
    /// (exit 75) at the settings that ran, with how to bind the knob.
    pub(super) fn after_refused(
        &mut self,
        rec: &mut AttemptRecord,
        knob: knobs::Knob,
        added: &str,
        line: &str,
        code: i32,
    ) -> Flow {
        let n = rec.n;
        if !self.dropped.contains(&knob) {
            self.dropped.push(knob);
        }
        self.term.say(&format!(
            "attempt {n}: the command refused {added}, which oomguard added for {knob} (exit {code}: {line}); that is oomguard's doing, not the run's failure: {knob} is dropped for the rest of the run"
        ));
        let decided = self
            .attempts
            .iter()
            .rposition(|a| a.evidence.is_some() && matches!(a.next, Next::Decided { .. }));
        let (mut base, ev, at) = match decided.map(|i| (i, &self.attempts[i])) {
            Some((
                i,
                a @ AttemptRecord {
                    next: Next::Decided { decision, .. },
                    ..
                },
            )) => (decision.before.clone(), a.evidence.clone(), Some(i)),
            _ => (self.first.clone(), None, None),
        };
        base.knobs.remove(&knob);
        if n >= self.cfg.max_attempts {
            self.settings = base;
            self.term.say(&format!(
                "{n} attempts made (--max-attempts {}); the run still does not fit at {}",
                self.cfg.max_attempts, self.settings
            ));
            self.bind_advice();
            return Flow::Stop(exit::EXHAUSTED);
        }
        let (Some(ev), Some(i)) = (ev, at) else {
            // No OOM led here (the first attempt started from remembered settings):
            // the command as written, less what it refused.
            self.settings = base;
            self.term
                .info(&format!("relaunching at {} without {added}", self.settings));
            return Flow::Again;
        };
        let oom_at = self.attempts[i].n;
        let policy = self.policy();
        let d = self
            .cal
            .as_ref()
            .filter(|_| policy.memory_model)
            .and_then(|cal| crate::memory::next_from_model(&policy, &base, &ev, cal))
            .or_else(|| policy::next(&policy, &base, &ev));
        let Some(mut d) = d else {
            self.settings = base;
            let without: Vec<&str> = self.dropped.iter().map(|k| k.name()).collect();
            self.term.say(&format!(
                "without {}, the policy '{}' has no other step for the OOM of attempt {oom_at}: the run still does not fit at {}",
                without.join(" and "),
                self.cfg.policy.name,
                self.settings
            ));
            self.bind_advice();
            return Flow::Stop(exit::EXHAUSTED);
        };
        d.reason = format!(
            "{} (decided again without {knob}: the command refused {added})",
            d.reason
        );
        let resume = self.resume.as_ref().map(|r| PathBuf::from(&r.path));
        // The terminal says the decision as it hears it.
        self.emit(Event::Decision {
            attempt: n,
            step: d.step,
            before: events::knobs(&d.before),
            after: events::knobs(&d.after),
            global_batch_before: d.before.global_batch(),
            global_batch_after: d.after.global_batch(),
            reason: d.reason.clone(),
            resume: resume.as_deref().map(events::path),
            resume_step: self.resumed_step,
        });
        self.settings = d.after.clone();
        if let Next::Decided { decision, .. } = &mut self.attempts[i].next {
            *decision = d;
        }
        Flow::Again
    }

    /// How to give oomguard each knob the command refused, where it accepts it.
    fn bind_advice(&self) {
        for k in &self.dropped {
            self.term.say(&bind_advice(*k));
        }
    }
}

/// How to give oomguard `knob` where the command accepts it, after the command
/// refused what oomguard added for it.
fn bind_advice(knob: knobs::Knob) -> String {
    use knobs::Knob;
    match knob {
        Knob::GradAccum => "to keep the global batch while the micro-batch shrinks, oomguard needs an accumulation setting the command accepts: bind the script's own option with --knob grad_accum=--ITS_FLAG=1 (added with the value oomguard computes), or =FILE:KEY or =env:VAR, before the command; to let the global batch change instead, run with a policy that sets keep_global_batch = false (`oomguard plan` shows what each would do)".into(),
        Knob::GradCheckpointing => "bind a gradient checkpointing setting the command accepts with --knob grad_checkpointing=--ITS_FLAG (added when it turns on), or =FILE:KEY, before the command (`oomguard plan` shows what it would do)".into(),
        k => format!(
            "bind {k} where the command accepts it with --knob {k}=--ITS_FLAG=VALUE, =FILE:KEY or =env:VAR, before the command (`oomguard plan` shows what it would do)"
        ),
    }
}
