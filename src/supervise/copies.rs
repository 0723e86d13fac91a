//! The attempt loop inside a job of several copies (`crate::job`): following
//! copy 0's decision, a requeued Slurm job, the settings a requeue starts at.

use super::*;

impl<'c> Run<'c> {
    /// A requeued or preempted Slurm job (`SLURM_RESTART_COUNT` > 0): start
    /// at the settings it last launched with and resume from the newest
    /// complete checkpoint of the run; this new run folder names the old one.
    pub(super) fn requeued(&mut self, restarts: u32) {
        if restarts == 0 {
            return;
        }
        self.start_at_fitting(&format!("requeued job (SLURM_RESTART_COUNT={restarts})"));
    }

    /// A pod of a Kubernetes job that the operator restarted (its container after
    /// a failure, `restartPolicy: OnFailure`, or the whole job, `backoffLimit`):
    /// the job's folder holds the settings it last launched (a job that finished
    /// forgets them), so start there, as a requeued Slurm job does. Every pod
    /// reads the same file, so the pods start at the same settings.
    pub(super) fn restarted_pod(&mut self) {
        let Some(path) = self.live.fitting.clone() else {
            return;
        };
        if !job::in_pod(&|k| std::env::var_os(k)) || in_slurm() {
            return;
        }
        if std::fs::symlink_metadata(&path).is_ok() {
            self.start_at_fitting(&format!(
                "restarted pod of a Kubernetes job (the job's last settings are in {})",
                path.display()
            ));
        }
    }

    /// A job that finished (copy 0's success): its settings are no restart's.
    pub(super) fn job_finished(&self, code: i32) {
        let Some(path) = &self.live.fitting else {
            return;
        };
        let leader = self.live.job.as_ref().is_none_or(job::Job::leader);
        if code == exit::SUCCESS && leader && !in_slurm() && job::in_pod(&|k| std::env::var_os(k)) {
            job::forget_fitting(path);
        }
    }

    /// Start at the job's last settings (`why`: whose restart this is) and resume
    /// from the newest complete checkpoint; this new run folder names the old one.
    fn start_at_fitting(&mut self, why: &str) {
        let Some(path) = self.live.fitting.clone() else {
            return;
        };
        let fitting = match job::load_fitting(&path) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                self.report.term.warn(&format!(
                    "{why}: the job's last settings are not used: {e}; starting at {}",
                    self.now.settings
                ));
                return;
            }
        };
        let mut next = self.now.settings.clone();
        for (name, value) in &fitting.knobs {
            if let Ok(k) = name.parse::<crate::settings::Knob>()
                && next.knobs.contains_key(&k)
            {
                next.knobs.insert(k, value.clone());
            }
        }
        // oomguard keeps the global batch: settings that change it were not
        // written by oomguard, whoever wrote the file.
        if next.global_batch() != self.now.settings.global_batch() {
            self.report.term.warn(&format!("{why}: {} would change the global batch ({} → {}), which oomguard never does: not used; starting at {}", path.display(),
                self.now.settings
                    .global_batch()
                    .map_or("unknown".into(), |g| g.to_string()),
                next.global_batch()
                    .map_or("unknown".into(), |g| g.to_string()),
                self.now.settings));
            return;
        }
        self.now.settings = next;
        let res = self.now.resumer.search_any();
        self.now.resumer.resume_from(&res, res.step());
        self.report.term.info(&format!(
            "{why}: starting at {} (the last settings launched, from {}); {}",
            self.now.settings,
            fitting.run_dir.display(),
            res.because
        ));
        let note = format!("{}\n", fitting.run_dir.display());
        if let Err(e) = crate::job::write_previous_run(&self.live.folder, note.as_bytes()) {
            tracing::warn!(
                "cannot write previous-run in {}: {e}",
                self.live.folder.display()
            );
        }
    }

    /// A follower at the first meeting: copy 0's settings for attempt 1 (its
    /// remembered or requeued ones), not this copy's own.
    pub(super) fn take_copy0_start(
        &mut self,
        knobs: std::collections::BTreeMap<String, knobs::Value>,
    ) {
        let before = self.now.settings.clone();
        for (name, value) in knobs {
            if let Ok(k) = name.parse::<crate::settings::Knob>()
                && self.now.settings.knobs.contains_key(&k)
            {
                self.now.settings.knobs.insert(k, value);
            }
        }
        if self.now.settings != before {
            self.report.term.info(&format!(
                "starting at copy 0's settings: {} (this copy's own were {before})",
                self.now.settings
            ));
        }
    }

    /// The settings about to launch are the job's last (for a requeue); only
    /// copy 0 of a job writes them.
    pub(super) fn save_fitting(&self) {
        let Some(path) = &self.live.fitting else {
            return;
        };
        if self.live.job.as_ref().is_some_and(|j| !j.leader()) {
            return;
        }
        let f = job::Fitting {
            knobs: self
                .now
                .settings
                .knobs
                .iter()
                .map(|(k, v)| (k.name().to_string(), v.clone()))
                .collect(),
            run_dir: std::path::absolute(&self.live.folder)
                .unwrap_or_else(|_| self.live.folder.clone()),
        };
        if let Err(e) = job::save_fitting(path, &f) {
            tracing::warn!("cannot keep the job's settings in {}: {e}", path.display());
        }
    }

    /// Say in the job's folder how this copy's attempt `n` failed (its OOM line,
    /// for an OOM).
    pub(super) fn publish_end(&self, job: &job::Job, n: u32, outcome: &Outcome) {
        let end = job::End {
            rank: job.rank,
            outcome: outcome.kind(),
            oom_line: match outcome {
                Outcome::GpuOom { finding, .. } => Some(
                    finding
                        .as_ref()
                        .map(|f| f.line.clone())
                        .unwrap_or_else(|| "CUDA out of memory".into()),
                ),
                _ => None,
            },
        };
        if let Err(e) = job.publish_end(n, &end) {
            self.report.term.warn(&format!(
                "could not write this copy's end in {}: {e}",
                job.dir.display()
            ));
        }
    }

    /// A follower after a failed attempt: say how it ended, wait for the
    /// leader's decision, and take its settings and checkpoint.
    pub(super) fn follow(
        &mut self,
        job: &job::Job,
        rec: &mut AttemptRecord,
        outcome: &Outcome,
        report: &launch::Report,
    ) -> ControlFlow<i32> {
        let n = rec.n;
        let own = report.exit.status_code().max(1);
        self.publish_end(job, n, outcome);
        let why = match outcome {
            Outcome::PeerFailure { line, .. } => format!(" ({line})"),
            _ => String::new(),
        };
        self.report.term.info(&format!(
            "attempt {n}: {} on copy {} of the job{why}; waiting for copy 0's decision",
            kind_word(outcome.kind()),
            job.rank
        ));
        match job.await_decision(n) {
            None => {
                self.report.term.say(&format!("no decision from copy 0 of the job within {:?} ({}); stopping with status {own} rather than deciding alone", job.timeout,
                    job.dir.display()));
                ControlFlow::Break(own)
            }
            Some(job::Published::Stop { code }) => {
                self.report.term.info(&format!(
                    "copy 0 of the job stopped (status {code}); stopping"
                ));
                ControlFlow::Break(if code == 0 { own } else { code })
            }
            Some(job::Published::Relaunch { knobs, resume }) => {
                let before = self.now.settings.clone();
                // A knob copy 0 dropped (the command refused what oomguard added
                // for it) is dropped here too.
                self.now.settings.knobs.retain(|k, _| knobs.contains_key(k));
                self.now.settings.knobs.extend(knobs);
                // The checkpoint is named by its absolute path; one this copy
                // cannot reach (another filesystem, an older copy 0's relative
                // path) stops this copy, and with it the job, as Slurm does
                // when a task fails: never a relaunch that dies of a missing
                // folder while copy 0 goes on alone.
                if let Some(p) = &resume
                    && (!p.is_absolute() || std::fs::metadata(p).is_err())
                {
                    self.report.term.say(&format!("copy 0 of the job decided to resume from {}, which this copy cannot use ({}); stopping this copy with status {own}, which ends the job", p.display(),
                        if p.is_absolute() {
                            "not found here: the output folder must be on a filesystem every copy shares"
                        } else {
                            "not an absolute path"
                        }));
                    let end = job::End {
                        rank: job.rank,
                        outcome: crate::evidence::OutcomeKind::OtherFailure,
                        oom_line: None,
                    };
                    let _ = job.publish_end(n + 1, &end);
                    return ControlFlow::Break(own);
                }
                self.now.resumer.follow(resume);
                self.report.term.info(&format!(
                    "copy 0 of the job decided: {} → {}{}",
                    before,
                    self.now.settings,
                    self.now
                        .resumer
                        .next()
                        .map(|r| format!(", resuming from {}", r.path.to_string_lossy()))
                        .unwrap_or_default()
                ));
                rec.next = Next::Retry;
                ControlFlow::Continue(())
            }
        }
    }
}

/// Inside a Slurm job, whose requeues are counted by Slurm.
fn in_slurm() -> bool {
    std::env::var_os("SLURM_JOB_ID").is_some_and(|v| !v.is_empty())
}
