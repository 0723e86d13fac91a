//! The attempt loop: the only place that sequences the others.
//!
//! Theory of operation (data flows one way):
//!
//!   argv ──discover──▶ bindings + settings₀
//!   settings_n ──materialize──▶ attempt n: argv', env'
//!   attempt n ──launch + watch──▶ outcome_n      (output passes through untouched)
//!   history + outcome_n ──next──▶ verdict ──carry out──▶ settings_n+1 (+ resume checkpoint), or stop
//!   every arrow ──▶ journal
//!
//! What follows an attempt is decided by `next::next` alone, a pure function;
//! this loop gathers the facts it asks for (`Verdict::Wait`: the other copies'
//! ends, another tenant's memory) and carries its verdict out. `plan` iterates
//! the same `next` over assumed OOMs, so what it prints is what a run would do. Only an OOM leads to another attempt: a
//! failure of any other kind is not fixed by shrinking, so oomguard stops and
//! exits with the command's own status; a user's signal is never followed by a
//! relaunch.
//!
//! The loop's state is one [`Run`], in four parts: [`Past`], the history
//! `next` reads (an [`AttemptRecord`] per attempt that ran: its outcome, its
//! evidence, and what followed it); [`Report`], the listeners (terminal,
//! journal, story) and what the run measures for them; [`Live`], the live
//! services (GPU watch, job, in-place guard); [`Upcoming`], the settings and
//! resume point of the next attempt. What the end of
//! the run reports (the table, each OOM's cause, tenant retries, the work and
//! time lost, the command to rerun) is told by the story, from the events
//! every listener hears (`report::summary`).
//! One attempt goes through phases, one function each: prepare (materialize,
//! journal), launch, ended (classify, journal), after (the verdict, carried out).

mod copies;
mod decide;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::checkpoint;
use crate::detect::Finding;
use crate::detect::kernel;
use crate::envmerge::EnvSet;
use crate::events::{self, Event, Listener, RetrySame, SameSettings, SetbackState};
use crate::evidence::{self, Evidence, Outcome, OutcomeKind};
use crate::exit;
use crate::gpu::PeakReport;
use crate::gpuwatch::GpuWatch;
use crate::inplace::InPlace;
use crate::job;
use crate::journal::{self, Journal};
use crate::knobs::{self, Settings};
use crate::launch;
use crate::next::{self, AttemptRecord, Because, For, Next, Peers, Role, Verdict};
use crate::plan;
use crate::policy::{self, Decision, StepKind};
use crate::progress::{self, Loss, Reached};
use crate::report::story::Story;
use crate::report::summary::Summary;
use crate::report::terminal::{self, Terminal};
use crate::resume::{self, Resumer, Resumption};
use crate::run_config::RunConfig;
use crate::run_folder::{self, RunDirError};

/// How long a copy's ranks may go on after it heard that the job moved on before
/// it stops them (see `job::Job::moved_on`).
const JOB_END_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Time lost to attempts that did not succeed.
fn lost(attempts: &[AttemptRecord]) -> Duration {
    attempts
        .iter()
        .filter(|a| a.outcome != OutcomeKind::Success)
        .map(|a| a.duration)
        .sum()
}

/// The live services a run is handed or opens: the GPU watch (`main` opened
/// it), the job with its folder opened, the run folder made, the in-place
/// guard, and where this run keeps what it must find again.
struct Live {
    gw: GpuWatch,
    /// This copy's place in a job, its folder opened (see `job`).
    job: Option<job::Job>,
    /// The run folder made (the one asked for when it could not be made).
    folder: PathBuf,
    inplace: InPlace,
    /// Where config copies go when the run folder cannot be written: a fresh
    /// private temporary folder, made once.
    scratch: Option<PathBuf>,
    /// Where this Slurm or Kubernetes job keeps the settings it last launched
    /// with, for a requeue or a restarted pod (see `job::Fitting`); None outside
    /// both or without checkpoints.
    fitting: Option<PathBuf>,
}

/// The verdict side: the history `next` reads (see `history`), and what the
/// run learnt and must not do again.
struct Past {
    /// The settings of the first attempt (the command as written).
    first: Settings,
    /// A relaunch started over: the newest checkpoint could not be loaded at its
    /// settings (see `loadable`).
    started_over: bool,
    /// Attempts begun, counting one that could not be prepared or launched.
    begun: u32,
    attempts: Vec<AttemptRecord>,
    /// The memory model, calibrated by every OOM so far (`None`: no model config).
    cal: Option<crate::memory::Calibrated>,
    /// The phase the last attempt's GPU OOM happened in (see `detect::phase`),
    /// told as it ended; taken by the decision after it.
    phase: Option<crate::detect::phase::Seen>,
    /// The phases (loading, saving) whose OOM was retried at the same
    /// settings (each is, once a run).
    retried: Vec<crate::evidence::When>,
    /// Offloads whose CPU form ran the host out of memory: never to CPU again.
    no_cpu_offload: Vec<knobs::Knob>,
    /// Knobs dropped because the command refused what oomguard added for them.
    dropped: Vec<knobs::Knob>,
    /// The step the last ended attempt's log shows, read once: telling the end, its
    /// evidence and its OOM each ask, and a Trainer's log is read whole (up to 12 MiB,
    /// its log dicts counted) for it.
    log_reached: std::cell::RefCell<Option<LogReached>>,
}

/// [`Past::log_reached`]: what was read, for which log and count.
struct LogReached {
    log: PathBuf,
    from: u64,
    counting: crate::progress::Counting,
    reached: Option<crate::progress::Reached>,
}

/// The report side: the listeners of the run's events (the terminal, the
/// journal, the story that tells the end summary) and what the run measures
/// or says once for them.
struct Report {
    /// The only writer of `oomguard:` lines.
    term: &'static Terminal,
    j: Journal,
    /// The run's events, folded: what the end summary tells.
    story: Story,
    /// The time lost to OOMs, stretch by stretch (the last may be open).
    setbacks: Vec<journal::Setback>,
    /// The command line of the last attempt prepared (shell-quoted, with the
    /// environment variables its knobs set in front).
    last_command: Option<String>,
    /// Whether "the kernel's log cannot be read" was said (it is said once a run).
    kernel_unreadable_said: bool,
    /// The content hashes of the config files read at start, and the changes
    /// to them already reported (path, hash now).
    start_hashes: Vec<Option<String>>,
    reported: Vec<(PathBuf, Option<String>)>,
}

/// The next attempt: its settings, where it resumes, its environment.
struct Upcoming {
    /// The settings of the next attempt.
    settings: Settings,
    /// Where the next attempt resumes from (see `resume`).
    resumer: Resumer,
    /// Added to every attempt's environment.
    env_defaults: Vec<EnvSet>,
    tty: bool,
    /// What the attempt being run added to the command (see `evidence::Added`): a
    /// refusal of one of them by the command's parser is oomguard's doing.
    added: evidence::Added,
}

/// The run between attempts: what it was given (options and target, read
/// only), and four parts: the history `next` reads, the report side, the live
/// services, and the next attempt's settings and resume point.
struct Run<'c> {
    cfg: &'c RunConfig,
    past: Past,
    report: Report,
    live: Live,
    now: Upcoming,
}

/// `oomguard COMMAND`: run and recover. Returns the exit code.
///
/// `gw` is the GPU watch `main` opened to inspect the command; the run keeps
/// it for the waits, peaks and tenants of every attempt.
pub fn run(cfg: &RunConfig, gw: GpuWatch, signals: &launch::Signals) -> i32 {
    // The scanner's patterns are built while the first attempt starts, not at its first
    // OOM line (where the build delayed the hang timer's reaction).
    std::thread::spawn(crate::detect::warm);
    // How much oomguard says was decided once, by `main` (`--quiet`, `-v`).
    let term = terminal::get();
    // Everything the policy could do is checked before anything runs: a config
    // value that cannot be written fails now, not at 3 a.m.
    let rungs = match plan::ladder(cfg, None, &[]) {
        Ok(r) => r.len(),
        Err(e) => {
            term.error(&e.to_string());
            return exit::USAGE;
        }
    };
    // A module still holding the edit of a run that did not finish would be
    // read as the original: refused before anything is created.
    let in_place: Vec<&Path> = cfg
        .target
        .disc
        .in_place_files()
        .into_iter()
        .map(|(_, path, _)| path)
        .collect();
    if let Err(e) = crate::inplace::check_unfinished(&in_place) {
        term.error(&e.to_string());
        return exit::USAGE;
    }
    // The run folder is created fresh and private, or refused before anything
    // runs; so are the files --edit-in-place would edit.
    let run_dir = match run_folder::create_run_dir(&cfg.opts.run_dir, cfg.opts.run_dir_given) {
        Ok(d) => Ok(d),
        Err(RunDirError::Unsafe(e)) => {
            term.error(&e.to_string());
            return exit::USAGE;
        }
        // The journal warns and the run goes on without one.
        Err(e @ RunDirError::Unwritable { .. }) => Err(e),
    };
    let folder = run_dir
        .as_ref()
        .map_or_else(|_| cfg.opts.run_dir.clone(), Clone::clone);
    let files: Vec<(&Path, &str)> = cfg
        .target
        .disc
        .in_place_files()
        .into_iter()
        .map(|(_, path, text)| (path, text))
        .collect();
    let inplace = match InPlace::prepare(run_dir, &files) {
        Ok(g) => g,
        Err(e) => {
            term.error(&e.to_string());
            return exit::USAGE;
        }
    };
    // The job's folder is private and the user's, or refused before anything
    // runs (see `job`): another user's files there would steer this run.
    let mut job = cfg.target.job.clone();
    if let Some(job) = job.as_mut()
        && let Err(e) = job.open()
    {
        term.error(&e.to_string());
        return exit::USAGE;
    }
    let live = Live {
        gw,
        job,
        folder,
        inplace,
        scratch: None,
        fitting: None,
    };
    let mut run = Run::start(cfg, live, rungs, term);
    run.requeued(job::restart_count(&|k| std::env::var_os(k)));
    run.restarted_pod();
    let code = loop {
        if let Some(sig) = signals.pending() {
            break sig.exit_code();
        }
        // Continue: launch the next attempt; Break: the run is over, with this code.
        if let ControlFlow::Break(code) = run.attempt(signals) {
            break code;
        }
    };
    run.job_finished(code);
    run.finish(code)
}

impl<'c> Run<'c> {
    /// `rungs`: how many attempts the policy's ladder has (1: nothing to change).
    fn start(cfg: &'c RunConfig, mut live: Live, rungs: usize, term: &'static Terminal) -> Run<'c> {
        let mut j = Journal::open(live.folder.clone());
        for w in j.take_warnings() {
            term.warn(&w);
        }
        let env_defaults = cfg.env_defaults();
        let tty = std::io::stdout().is_terminal();
        let first = cfg.target.disc.settings();
        let start = Event::RunStart {
            argv: events::argv(&cfg.opts.argv),
            policy: cfg.opts.policy.name.clone(),
            max_attempts: cfg.opts.max_attempts,
            settings: events::knobs(&first),
            world_size: first.world_size,
            world_source: cfg.target.disc.world.source.clone(),
            global_batch: first.global_batch(),
            env: events::json(&env_defaults),
            notes: cfg.target.disc.notes.clone(),
            warnings: cfg.target.disc.warnings.clone(),
            tty,
            supervisor: Some(crate::liveness::Supervisor::me()),
            logging: cfg.target.logging,
        };
        let at = SystemTime::now();
        j.on(at, &start);
        let story = Story::begin(&start, Some(crate::report::journal::stamp(at)))
            .expect("run_start begins a story");
        for w in &cfg.target.disc.warnings {
            term.warn(w);
        }
        start_lines(cfg, term, rungs);
        // A follower of a job starts at copy 0's settings for attempt 1 (the
        // first meeting gives them: remembered, climbed back, --fit), never at
        // what this node remembers: its fits.json may differ or be absent.
        let follower = live.job.as_ref().is_some_and(|j| !j.leader());
        let (settings, remembered) = if follower {
            (first.clone(), None)
        } else {
            cfg.start_settings()
        };
        if let Some(line) = remembered {
            term.info(&line);
        }
        live.fitting = cfg.target.layout.as_ref().and_then(|l| {
            let env = |k: &str| std::env::var_os(k);
            job::fitting_path(&env, &l.root).or_else(|| {
                job::pod_fitting_path(&cfg.target.cmd, &env, live.job.as_ref(), &l.root)
            })
        });
        Run {
            cfg,
            past: Past {
                started_over: false,
                first,
                begun: 0,
                attempts: Vec::new(),
                cal: cfg.calibrated_for_run(),
                phase: None,
                retried: Vec::new(),
                no_cpu_offload: Vec::new(),
                dropped: Vec::new(),
                log_reached: Default::default(),
            },
            report: Report {
                term,
                j,
                story,
                setbacks: Vec::new(),
                last_command: None,
                kernel_unreadable_said: false,
                start_hashes: knobs::drift::start_hashes(&cfg.target.disc),
                reported: Vec::new(),
            },
            live,
            now: Upcoming {
                settings,
                resumer: Resumer::new(cfg.target.layout.clone(), resume::SETTLE)
                    .refusing(cfg.target.resume_refused.clone()),
                env_defaults,
                tty,
                added: evidence::Added::default(),
            },
        }
    }

    /// One attempt, from preparing it to what follows it.
    fn attempt(&mut self, signals: &launch::Signals) -> ControlFlow<i32> {
        self.past.begun += 1;
        let n = self.past.begun;
        if let Some(job) = &self.live.job {
            if n == 1 && job.leader() {
                job.clear_stale();
            }
            // The copies launch together: a relaunch of one copy alone would
            // wait in the rendezvous for peers that are not coming.
            // What this copy is about to launch; copy 0's settings for attempt 1
            // (remembered, requeued) are the job's: the copies start alike.
            let me = job::Launch::new(job.copies, &self.now.settings);
            let met = job.meet(n, Some(&me));
            // Half a job launched would wait in its rendezvous for ranks that
            // are not coming: nothing is launched, and the non-zero status
            // lets the job's own failure policy (Kubernetes, Slurm) act.
            if let Some(why) = met.disagree {
                self.report.term.say(&format!(
                    "the copies of this job disagree before attempt {n}: {why} ({})\noomguard: nothing was launched; stopping with status {} so that the job fails as a whole (check that every pod runs the same command and environment)",
                    job.dir.display(),
                    exit::USAGE
                ));
                return ControlFlow::Break(exit::USAGE);
            }
            if !met.all {
                self.report.term.warn(&format!(
                    "not every copy of the job came to attempt {n} within {:?} ({}); launching anyway",
                    job.timeout,
                    job.dir.display()
                ));
            }
            if let Some(knobs) = met.start {
                self.take_copy0_start(knobs);
            }
        }
        let (spec, started) = match self.prepare(n) {
            Ok(p) => p,
            Err(code) => return ControlFlow::Break(code),
        };
        self.save_fitting();
        let (report, peak) = match self.launch(n, &spec, signals) {
            Ok(r) => r,
            Err(code) => return ControlFlow::Break(code),
        };
        self.now.resumer.note_announced(&report.saves);
        let outcome = self.ended(n, &report, peak.as_ref(), spec.log.as_deref(), started);
        // The peak of an attempt that ran without a GPU OOM is a measured point
        // for the memory model (its next OOM solves two points); an OOM's own
        // peak is only the GPU's size.
        if !matches!(outcome, Outcome::GpuOom { .. })
            && let (Some(cal), Some(b)) = (
                self.past.cal.as_mut(),
                peak.as_ref().and_then(PeakReport::run_peak),
            )
        {
            cal.learn_peak(&self.now.settings, b as f64);
        }
        let mut rec = AttemptRecord {
            n,
            pid: report.pid,
            outcome: outcome.kind(),
            duration: report.duration,
            evidence: None,
            foreign: None,
            next: Next::Stop,
        };
        let flow = self.after(&mut rec, outcome, &report, spec.log.as_deref(), started);
        self.track_setback(&rec, &report, started, flow.is_continue());
        self.past.attempts.push(rec);
        flow
    }

    /// Before attempt `n`: this run's half-written checkpoints out of the way of a
    /// script's own folder search (see `Resumer::move_aside_half_written`), said and
    /// journaled.
    fn move_aside_half_written(&mut self, n: u32) {
        for m in self.now.resumer.move_aside_half_written() {
            match m {
                Ok(m) => {
                    self.report.term.info(&format!(
                        "moved {} aside to {} ({}): the script resumes by itself from its folder's newest checkpoint-N, whole or not; delete it once the run is done",
                        m.from.display(),
                        m.to.display(),
                        m.why
                    ));
                    self.emit(Event::CheckpointMovedAside {
                        attempt: n - 1,
                        path: events::path(&m.from),
                        to: events::path(&m.to),
                        why: m.why,
                    });
                }
                Err(e) => self.report.term.warn(&e),
            }
        }
    }

    /// Materialize the settings (writing changed config copies), journal the
    /// attempt, and build what to launch. `Err`: the exit code.
    fn prepare(&mut self, n: u32) -> Result<(launch::Spec, SystemTime), i32> {
        let cfg = self.cfg;
        let adir = self.report.j.attempt_dir(n);
        // Derived config files go in the attempt's folder; if the run folder
        // cannot be written, in a fresh private temporary one (a relaunch must
        // not depend on the journal, nor write where another user could plant
        // a link).
        let files_dir = match &adir {
            Some(d) => d.clone(),
            None => self.scratch_dir(n)?,
        };
        if n > 1 {
            self.config_changes(n);
            self.move_aside_half_written(n);
        }
        // The first attempt runs the command as written; a relaunch carries the flags
        // that keep a script's own folder search from overriding where it resumes.
        let flags = if n > 1 {
            self.now.resumer.relaunch_flags()
        } else {
            Vec::new()
        };
        let m = knobs::materialize(
            &cfg.opts.argv,
            &cfg.target.disc,
            &self.now.settings,
            self.now.resumer.next(),
            &flags,
            &files_dir,
        )
        .map_err(|e| {
            self.report
                .term
                .error(&format!("cannot prepare attempt {n}: {e}"));
            exit::EXHAUSTED
        })?;
        if let Err(e) = self.live.inplace.write_derived(&m.files) {
            self.report.term.error(&format!(
                "cannot write attempt {n}'s files: {e}\noomguard: attempt {n} was not launched"
            ));
            return Err(exit::CANNOT_WRITE);
        }
        self.now.added = evidence::Added {
            knobs: knobs::added(&cfg.target.disc, &self.now.settings),
            resume: knobs::resume_added(&cfg.opts.argv, self.now.resumer.next(), &flags),
            changed: self.changed_after_training(),
        };
        let env_set: Vec<(OsString, OsString)> = self
            .now
            .env_defaults
            .iter()
            .map(|e| (OsString::from(&e.name), OsString::from(&e.value)))
            .chain(
                m.env
                    .iter()
                    .map(|(k, v)| (OsString::from(k), OsString::from(v))),
            )
            .collect();
        let prev_pid = self.past.attempts.last().map(|a| a.pid);
        let gpu = self.live.gw.before_attempt(n, prev_pid);
        if let Some(g) = &gpu {
            self.report
                .term
                .detail(&format!("GPUs before attempt {n}: {}", g.summary));
        }
        if n == 1 {
            // As late as possible before the launch: what is there now is not
            // this run's (the wait for GPU memory above may have been long).
            self.now.resumer.take_baseline();
        }
        let resume = self.now.resumer.next().map(|r| Path::new(&r.path));
        self.report.last_command = Some(last_command(&m));
        let start = attempt_start(n, gpu.as_ref(), &m, &self.now.settings, resume);
        self.emit(start);
        let started = SystemTime::now();
        if n > 1 {
            self.report.term.info(&format!(
                "attempt {n}/{}: {}",
                cfg.opts.max_attempts,
                plan::shell_quote(&m.argv)
            ));
        } else {
            self.report
                .term
                .detail(&format!("attempt 1: {}", plan::shell_quote(&m.argv)));
        }
        let spec = launch::Spec {
            argv: m.argv,
            env_set,
            tty: self.now.tty,
            log: adir.as_deref().map(run_folder::output_log_in),
            log_head_bytes: run_folder::LOG_HEAD_BYTES,
            log_tail_bytes: run_folder::LOG_TAIL_BYTES,
            hang_timeout: cfg.opts.hang_timeout,
            grace: cfg.opts.grace,
            task_files: cfg.target.task_files.clone(),
            // A copy of a job hears while its ranks still run that the job moved on
            // (copy 0 decided, or another copy's ranks are gone): see `job`.
            // Ranks finishing on their own get [`JOB_END_GRACE`] first: at the end of
            // a run one node's teardown can fail as its peers exit (a gloo or store
            // connection closed), and that end must not kill this copy's finishing ranks.
            // A relaunch after an OOM: when is it back at the step the failed
            // attempt died at (the time the OOM cost)?
            back_to: self
                .report
                .setbacks
                .last()
                .filter(|s| s.state == SetbackState::Behind)
                .and_then(|s| s.step)
                .map(|step| {
                    let counting = cfg
                        .target
                        .counting
                        .at_accum(self.now.settings.int(crate::knobs::Knob::GradAccum));
                    progress::StepWatch::new(
                        step,
                        self.started_from(),
                        cfg.target.logging,
                        counting,
                    )
                }),
            stop_when: self.live.job.clone().map(|job| {
                let seen = std::sync::Mutex::new(None::<std::time::Instant>);
                launch::StopWhen(std::sync::Arc::new(move || {
                    let why = job.moved_on(n)?;
                    let mut first = seen.lock().unwrap_or_else(|e| e.into_inner());
                    let at = *first.get_or_insert_with(std::time::Instant::now);
                    (at.elapsed() >= JOB_END_GRACE).then_some(why)
                }))
            }),
            torchrun_restarts: cfg.target.inside.torchrun_restarts,
        };
        Ok((spec, started))
    }

    /// The fresh private folder for attempt `n`'s config copies when the run
    /// folder cannot be written. `Err`: the exit code.
    fn scratch_dir(&mut self, n: u32) -> Result<std::path::PathBuf, i32> {
        if self.live.scratch.is_none() {
            match run_folder::fresh_temp_dir() {
                Ok(d) => self.live.scratch = Some(d),
                Err(e) => {
                    self.report.term.error(&format!(
                        "cannot prepare attempt {n}: no run folder, and no private temporary folder: {e}"
                    ));
                    return Err(exit::CANNOT_WRITE);
                }
            }
        }
        let dir = self.live.scratch.as_ref().expect("made above");
        Ok(dir.join(run_folder::names::attempt(n)))
    }

    /// A config file the user edited since the run started is not in the
    /// relaunch (copies are made from the text read at start): say so, once
    /// per change, on the terminal and in the journal.
    fn config_changes(&mut self, n: u32) {
        for d in knobs::drift::changed(&self.cfg.target.disc, &self.report.start_hashes) {
            let key = (d.path.clone(), d.hash.clone());
            if self.report.reported.contains(&key) {
                continue;
            }
            self.report.reported.push(key);
            self.report.term.say(&d.line(n));
            self.emit(Event::ConfigChanged {
                attempt: n,
                path: events::path(&d.path),
                knobs: events::json(&d.knobs),
            });
        }
    }

    /// Run the attempt, sampling the GPUs' peak. `Err`: the command could not
    /// be started, with its exit code (journaled).
    fn launch(
        &mut self,
        n: u32,
        spec: &launch::Spec,
        signals: &launch::Signals,
    ) -> Result<(launch::Report, Option<PeakReport>), i32> {
        self.live.gw.start_sampling();
        let launched = launch::run(spec, signals);
        let peak = self.live.gw.stop_sampling().cloned();
        match launched {
            Ok(r) => Ok((r, peak)),
            Err(e) => {
                let code = match &e {
                    launch::Error::NotFound { .. } => exit::NOT_FOUND,
                    launch::Error::NotExecutable { .. } => exit::CANNOT_EXECUTE,
                    launch::Error::Io(_) => exit::CANNOT_EXECUTE,
                };
                self.report.term.error(&e.to_string());
                self.emit(Event::CannotExecute(events::CannotExecute {
                    attempt: n,
                    outcome: OutcomeKind::CannotExecute,
                    error: e.to_string(),
                    status: code,
                }));
                Err(code)
            }
        }
    }

    /// Classify how the attempt ended and journal it.
    fn ended(
        &mut self,
        n: u32,
        report: &launch::Report,
        peak: Option<&PeakReport>,
        log: Option<&Path>,
        started: SystemTime,
    ) -> Outcome {
        for w in &report.warnings {
            self.report.term.warn(w);
        }
        if let Some(why) = &report.stopped {
            self.report.term.info(&format!(
                "attempt {n}: {why} while this copy's ranks still ran; stopped them"
            ));
        }
        if let Some(tf) = &self.cfg.target.task_files
            && report.task_files.is_empty()
        {
            self.report.term.warn(&format!(
                "attempt {n}: no file of srun's {} was written by this step in {}; an OOM printed there could not be seen",
                tf.patterns.join(", "),
                tf.cwd.display()
            ));
        }
        if let Some(t) = &report.torchrun {
            if t.stopped_at_oom {
                self.report.term.info(&format!(
                    "attempt {n}: a torchrun worker died of a GPU OOM: stopped torchrun before its --max-restarts {} re-ran the same settings",
                    t.max_restarts
                ));
            }
            if t.restarts > 0 {
                self.report.term.info(&format!(
                    "attempt {n}: torchrun restarted its workers {} time{} within this attempt (--max-restarts {})",
                    t.restarts,
                    if t.restarts == 1 { "" } else { "s" },
                    t.max_restarts
                ));
            }
        }
        let from = self.started_from();
        let steps_beyond = || {
            self.reached(log, started)
                .filter(|r| r.step > from)
                .map(|r| r.step)
        };
        let evidence::Classified {
            outcome,
            unreadable,
            thrust_at,
        } = evidence::classify_attempt(report, &kernel::System, &self.now.added, &steps_beyond);
        if let Some(step) = thrust_at {
            self.report.term.info(&format!(
                "thrust's allocation failed with no size after training reached step {step}: taken for a GPU OOM (an extension built for another GPU fails at its first call, before any step)"
            ));
        }
        if let Outcome::Refused {
            knob, added, line, ..
        } = &outcome
        {
            let e = Event::Refused {
                attempt: n,
                knob: *knob,
                added: added.clone(),
                line: line.clone(),
            };
            self.emit(e);
        }
        if let Outcome::ResumeRefused { added, line, .. } = &outcome {
            let e = Event::ResumeRefused {
                attempt: n,
                added: added.clone(),
                line: line.clone(),
            };
            self.emit(e);
        }
        let unconfirmed = unreadable
            .as_deref()
            .is_some_and(|w| w.starts_with("the kernel's OOM killer killed"));
        if let Some(why) = unreadable.as_deref().filter(|_| unconfirmed) {
            self.report
                .term
                .say(&format!("attempt {n}: killed by SIGKILL; {why}"));
        } else if let Some(why) = unreadable
            && !std::mem::replace(&mut self.report.kernel_unreadable_said, true)
        {
            self.report.term.warn(&format!(
                "cannot read the kernel's log ({why}): a process killed by SIGKILL is taken for a host OOM without checking the OOM killer's record (root, CAP_SYSLOG or kernel.dmesg_restrict=0 lets oomguard check)"
            ));
        }
        if let Some(f) = outcome.finding() {
            if let Some(file) = &report.oom_file {
                self.report.term.info(&format!(
                    "attempt {n}: the OOM was found in {} (srun's per-task output file)",
                    file.display()
                ));
            }
            // When in the run it happened: its traceback and progress, and the
            // step it reached (a GPU OOM's only: it decides the next attempt).
            let mut seen = Evidence::gpu_oom(Some(f), false, None, self.started_from());
            if matches!(outcome, Outcome::GpuOom { .. }) {
                seen.phase = log.and_then(|l| crate::detect::phase::from_log(l, &f.line));
                seen.step_reached = self.reached(log, started);
                seen.steps_done = seen
                    .step_reached
                    .map(|r| r.step.saturating_sub(self.started_from()));
            }
            self.emit(Event::Oom {
                attempt: n,
                finding: f.into(),
                after_s: report.oom_at.map(|d| d.as_secs_f64()),
                file: report.oom_file.as_deref().map(events::path),
                phase: seen.when(),
                phase_how: seen.phase_how().map(str::to_string),
                step_reached: seen.step_reached.map(|r| r.step),
            });
            self.past.phase = seen.phase.clone();
        }
        self.emit(Event::AttemptEnd {
            attempt: n,
            status: report.exit.status_code(),
            exit: report.exit.to_string(),
            outcome: outcome.kind(),
            why: outcome.why().map(str::to_string),
            kernel_oom_kill: outcome.victim().map(events::json),
            duration_s: report.duration.as_secs_f64(),
            error_line: report.scanner.error_line().map(str::to_string),
            gpu_peak: peak.cloned(),
            torchrun: report.torchrun.as_ref().map(events::json),
        });
        outcome
    }

    /// What follows an attempt: the facts `next` asks for, gathered (the OOM's
    /// evidence, the other copies' ends, another tenant's memory), then its
    /// verdict carried out. A copy of a job (see `job`) does not decide alone:
    /// a follower whose attempt failed follows copy 0's verdict; copy 0 takes an
    /// OOM of any copy as the job's and publishes its verdict.
    fn after(
        &mut self,
        rec: &mut AttemptRecord,
        outcome: Outcome,
        report: &launch::Report,
        log: Option<&Path>,
        started: SystemTime,
    ) -> ControlFlow<i32> {
        let n = rec.n;
        let job = self.live.job.clone();
        let role = match &job {
            None => Role::Alone,
            Some(j) if j.leader() => Role::Leader,
            Some(_) => Role::Follower,
        };
        if let Some(job) = job.as_ref().filter(|j| j.leader())
            && !matches!(outcome, Outcome::Success | Outcome::Interrupted { .. })
        {
            // The followers' ranks cannot go on without this copy's: they end
            // theirs when they see this (see `job`), and say how.
            self.publish_end(job, n, &outcome);
        }
        let evidence = match (&outcome, role) {
            (_, Role::Follower) => None,
            (Outcome::GpuOom { finding, hung }, _) => {
                Some(self.oom_evidence(finding.as_ref(), *hung, log, started))
            }
            (Outcome::HostOom { .. }, _) => {
                let reached = self.reached(log, started);
                self.note_reached(reached);
                Some(self.host_evidence(reached))
            }
            _ => None,
        };
        // The OOM line that decides: this copy's, or another copy's.
        let mut finding = outcome.finding().cloned();
        let mut ended = next::Ended::new(outcome, evidence);
        let mut said = false;
        // Copy 0 decides; a follower takes its verdict.
        let resumable = (role != Role::Follower).then(|| self.resumable()).flatten();
        let verdict = loop {
            let gpu_oom = matches!(ended.outcome, Outcome::GpuOom { .. })
                || matches!(ended.peers, Peers::Oom { .. });
            if gpu_oom
                && role != Role::Follower
                && !std::mem::replace(&mut said, true)
                && let Some(ev) = ended.evidence.clone()
            {
                self.report.term.info(&format!("attempt {n}: {ev}"));
                self.suspect(n, &ev);
            }
            let v = next::next(&self.history(n, role, resumable), &ended, &self.rules());
            match v {
                Verdict::Wait(For::PeerEnds) => {
                    let Some(job) = &job else {
                        ended.peers = Peers::Heard;
                        continue;
                    };
                    // A peer's OOM ends this copy as "connection closed by peer",
                    // a rendezvous error, an NCCL error: the followers say what they saw.
                    let ends = job.await_ends(n);
                    ended.peers = match ends.iter().find(|e| e.oom_line.is_some()) {
                        Some(e) => {
                            self.report.term.info(&format!(
                                "attempt {n}: copy {} of the job ran out of memory; this copy ended with {}",
                                e.rank,
                                kind_word(ended.outcome.kind())
                            ));
                            let line = e.oom_line.clone().unwrap_or_default();
                            let f = crate::detect::classify_log(line.as_bytes());
                            let hung = e.outcome == OutcomeKind::HungAfterOom;
                            ended.evidence = Some(self.oom_evidence(Some(&f), hung, log, started));
                            finding = Some(f);
                            Peers::Oom { rank: e.rank }
                        }
                        None => Peers::Heard,
                    };
                }
                Verdict::Wait(For::Tenants) => {
                    ended.tenants = Some(self.live.gw.tenants(finding.as_ref()));
                }
                Verdict::Wait(For::Memory { tries_left }) => {
                    let tenants = ended.tenants.as_deref().unwrap_or_default();
                    ended.memory_back =
                        Some(self.wait_for_tenants(rec, tenants, tries_left, report.pid));
                }
                v => break v,
            }
        };
        let flow = self.carry_out(rec, &ended, verdict, report, started);
        if let Some(job) = job.as_ref().filter(|j| j.leader()) {
            // What was carried out: the checkpoint every copy resumes from.
            let done = match flow {
                ControlFlow::Break(code) => Verdict::Stop {
                    code,
                    because: Because::Copy0,
                },
                ControlFlow::Continue(()) => Verdict::Relaunch {
                    settings: self.now.settings.clone(),
                    resume: match self.now.resumer.next() {
                        Some(r) => next::Resume::From(PathBuf::from(&r.path)),
                        None => next::Resume::Fresh,
                    },
                    because: Because::Copy0,
                    model: None,
                },
            };
            if let Some(published) = job::Published::of(&done)
                && let Err(e) = job.publish_decision(n, &published)
            {
                self.report.term.warn(&format!("could not publish the job's decision in {}: {e}; the other copies will stop when they stop waiting", job.dir.display()));
            }
        }
        flow
    }

    /// The time lost to OOMs after attempt `rec` (see `journal::Setback`): the
    /// open stretch ends when this attempt got back to its step (or the step was
    /// never seen, or the run ends here); a failed attempt that is relaunched
    /// starts one, or joins the open one when it failed before getting back.
    fn track_setback(
        &mut self,
        rec: &AttemptRecord,
        report: &launch::Report,
        started: SystemTime,
        again: bool,
    ) {
        let n = rec.n;
        let failed = rec.outcome != OutcomeKind::Success;
        // Only a step seen exactly: a lower bound (a checkpoint it saved, a log
        // dict every N steps) would time the way back to the wrong step.
        let reached = rec
            .evidence
            .as_ref()
            .and_then(|e| e.step_reached)
            .filter(|r| !r.at_least);
        let ended = started + report.duration;
        let mut closed = None;
        if let Some(s) = self
            .report
            .setbacks
            .last_mut()
            .filter(|s| s.state == SetbackState::Behind)
        {
            let secs = |t: SystemTime| t.duration_since(s.since).unwrap_or_default().as_secs_f64();
            if let Some(at) = report.back_at {
                (s.state, s.seconds) = (SetbackState::Back, Some(secs(started + at)));
            } else if s.step.is_none() {
                s.state = SetbackState::Unknown;
            } else if !(again && failed) {
                (s.state, s.seconds) = (SetbackState::NotBack, Some(secs(ended)));
                // It finished the training: back, though its output never said when.
                s.finished = !failed;
            } else {
                // A refusal of what oomguard added is no OOM: the stretch goes on.
                if rec.outcome != OutcomeKind::RejectedAddition {
                    s.ooms.push(n);
                }
                s.step = s.step.max(reached.map(|r| r.step));
            }
            if s.state != SetbackState::Behind {
                s.ended_in = Some(n);
                closed = Some(s.clone());
            }
        }
        if let Some(s) = closed {
            self.record_setback(n, &s);
        }
        let open = self
            .report
            .setbacks
            .last()
            .is_some_and(|s| s.state == SetbackState::Behind);
        if again && failed && !open && rec.outcome != OutcomeKind::RejectedAddition {
            let s = journal::Setback {
                ooms: vec![n],
                step: reached.map(|r| r.step),
                since: started + report.oom_at.unwrap_or(report.duration),
                state: SetbackState::Behind,
                ended_in: None,
                seconds: None,
                seen_back: false,
                finished: false,
            };
            self.record_setback(n, &s);
            self.report.setbacks.push(s);
        }
    }

    /// Tell every listener of the run: the journal (whose write warnings the
    /// terminal says), the story, the terminal.
    fn emit(&mut self, e: Event) {
        let at = SystemTime::now();
        self.report.j.on(at, &e);
        for w in self.report.j.take_warnings() {
            self.report.term.warn(&w);
        }
        self.report.story.on(at, &e);
        self.report.term.hear(&e);
    }

    fn record_setback(&mut self, n: u32, s: &journal::Setback) {
        self.emit(Event::TimeLost {
            attempt: n,
            state: s.state,
            ooms: s.ooms.clone(),
            back_to_step: s.step,
            since: crate::report::journal::stamp(s.since),
            seconds: s.seconds,
        });
    }

    /// Journal the end, restore files edited in place, and print the summary.
    fn finish(mut self, code: i32) -> i32 {
        // The fallback folder of config copies (no run folder) is this run's
        // alone: gone with it (`remove_dir_all` never follows a link).
        if let Some(d) = self.live.scratch.take() {
            let _ = std::fs::remove_dir_all(&d);
        }
        let lost = lost(&self.past.attempts);
        // A relaunch that had not got back when the run ended.
        let n = self.past.begun;
        if let Some(s) = self
            .report
            .setbacks
            .last_mut()
            .filter(|s| s.state == SetbackState::Behind)
        {
            s.state = SetbackState::NotBack;
            s.ended_in = Some(n);
            s.seconds = Some(
                SystemTime::now()
                    .duration_since(s.since)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
            let s = s.clone();
            self.record_setback(n, &s);
        }
        self.emit(Event::RunEnd {
            exit_code: code,
            attempts: self.past.begun,
            lost_s: lost.as_secs_f64(),
            settings: events::knobs(&self.now.settings),
            time_lost_s: self
                .report
                .setbacks
                .iter()
                .map(journal::Setback::counted)
                .sum(),
            time_lost_complete: self
                .report
                .setbacks
                .iter()
                .all(|s| s.state == SetbackState::Back),
            last_command: self.report.last_command.clone(),
        });
        for l in self.live.inplace.restore() {
            self.report.term.say(&l);
        }
        let path = self.report.j.path();
        let summary = Summary {
            story: &self.report.story,
            journal: path.as_deref(),
            decided_by: self
                .live
                .job
                .as_ref()
                .filter(|j| !j.leader())
                .map(|_| "copy 0 of the job"),
        };
        self.report.term.block(&summary.text());
        if let Some(p) = self.live.gw.peak_summary() {
            self.report
                .term
                .say(&format!("GPU memory of the last attempt: {p}"));
        }
        // Steps trained again after a start over are the step's, not the save interval's.
        if let Some(line) = progress::save_interval_advice(
            &self.report.story.losses(),
            self.cfg.target.layout.as_ref(),
            lost,
        )
        .filter(|_| !self.past.started_over)
        {
            self.report.term.block(&line);
        }
        code
    }
}

/// `attempt_start` for the attempt `m` materializes.
fn attempt_start(
    attempt: u32,
    gpu: Option<&crate::gpuwatch::BeforeAttempt>,
    m: &knobs::Materialized,
    settings: &Settings,
    resume: Option<&Path>,
) -> Event {
    Event::AttemptStart {
        attempt,
        gpu: gpu.map_or(serde_json::Value::Null, events::json),
        argv: events::argv(&m.argv),
        env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        settings: events::knobs(settings),
        global_batch: settings.global_batch(),
        resume: resume.map(events::path),
        files: m
            .files
            .iter()
            .map(|f| events::FileCopy {
                original: events::path(&f.original),
                copy: events::path(&f.dest),
            })
            .collect(),
    }
}

/// The command line attempt `m` runs, for the summary: shell-quoted, with the
/// environment variables its knobs set (and the user's environment does not
/// already hold) in front.
fn last_command(m: &knobs::Materialized) -> String {
    let env: Vec<String> = m
        .env
        .iter()
        .filter(|(k, v)| std::env::var(k).ok().as_ref() != Some(v))
        .map(|(k, v)| format!("{k}={}", plan::shell_quote(&[OsString::from(v)])))
        .collect();
    let mut line = env.join(" ");
    if !line.is_empty() {
        line.push(' ');
    }
    line + &plan::shell_quote(&m.argv)
}

/// What a user must know before a night's run, at the default verbosity: what
/// oomguard can change and what it cannot, a shell script it cannot see into,
/// restarters and batch-size finders inside the command; every note with -v.
fn start_lines(cfg: &RunConfig, log: &Terminal, rungs: usize) {
    if let Some(s) = &cfg.target.inside.shell_script {
        log.info(&format!("warning: {}", crate::inside::shell_note(s)));
    }
    if rungs <= 1 && cfg.opts.max_attempts > 1 {
        let mut line = if cfg.target.disc.knobs.is_empty() {
            format!(
                "warning: oomguard found no setting it can change after a GPU OOM in this command: an OOM ends the run (exit 75) instead of a relaunch; {} shows where it looked",
                plan::plan_hint(&cfg.opts.argv)
            )
        } else {
            // Knobs found, but no step of the policy can use them (a micro-batch
            // without an accumulation to keep the global batch).
            format!(
                "warning: no step of the policy '{}' applies to this command: an OOM ends the run (exit 75) instead of a relaunch; {} shows why each step does not",
                cfg.opts.policy.name,
                plan::plan_hint(&cfg.opts.argv)
            )
        };
        if let Some(n) = plan::unbound_notes(cfg)
            .into_iter()
            .find(|n| n.starts_with("micro_batch:"))
            .filter(|_| cfg.target.inside.shell_script.is_none())
        {
            line.push_str(&format!(". {n}"));
        }
        log.info(&line);
    }
    log.info(&plan::changeable(cfg));
    let inside = cfg.target.inside.notes();
    for n in &cfg.target.disc.notes {
        let shell = cfg.target.inside.shell_script.is_some() && inside.first() == Some(n);
        log.note(n, inside.contains(n) && !shell);
    }
}

/// An outcome's journal word (`cuda_oom`, `other_failure`).
fn kind_word(k: OutcomeKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
