//! The attempt loop: the only place that sequences the others.
//!
//! Theory of operation (data flows one way):
//!
//!   argv ──discover──▶ bindings + settings₀
//!   settings_n ──materialize──▶ attempt n: argv', env'
//!   attempt n ──launch + watch──▶ outcome_n      (output passes through untouched)
//!   outcome_n ──policy──▶ decision ──▶ settings_n+1 (+ resume checkpoint)
//!   every arrow ──▶ journal
//!
//! `plan` runs the same pipeline with launch replaced by "assume OOM", so what
//! it prints is what a run would do. Only an OOM leads to another attempt: a
//! failure of any other kind is not fixed by shrinking, so oomguard stops and
//! exits with the command's own status; a user's signal is never followed by a
//! relaunch.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use crate::checkpoint;
use crate::evidence::{self, Evidence, Outcome, OutcomeKind};
use crate::exit;
use crate::gpuwatch::TENANT_RETRIES;
use crate::inplace::InPlace;
use crate::journal::{self, Event, FileCopy, Journal, Row, SameSettings};
use crate::knobs::{self, Knob, Settings};
use crate::launch;
use crate::plan;
use crate::policy::{self, Decision, NotApplicable};
use crate::progress;
use crate::run_config::RunConfig;

struct Log {
    quiet: bool,
}

impl Log {
    fn info(&self, msg: &str) {
        if !self.quiet {
            eprintln!("oomguard: {msg}");
        }
    }
}

/// `oomguard COMMAND`: run and recover. Returns the exit code.
pub fn run(mut cfg: RunConfig, signals: &launch::Signals) -> i32 {
    let mut gw = cfg.gpu.take().expect("from_args opened the GPU watch");
    let cfg = &cfg;
    let mut prev_pid: Option<u32> = None;
    let mut tenant_retries = 0u32;
    let mut tenant_notes: Vec<String> = Vec::new();
    // (tried_to_allocate of the last OOM, whether the step after it halved the micro-batch)
    let mut last_tried: Option<(u64, bool)> = None;
    let log = Log { quiet: cfg.quiet };
    // Everything the policy could do is checked before anything runs: a config
    // value that cannot be written fails now, not at 3 a.m.
    if let Err(e) = plan::ladder(cfg, None) {
        eprintln!("oomguard: error: {e}");
        return exit::USAGE;
    }
    let mut j = Journal::open(cfg.run_dir.clone());
    let mut inplace = InPlace::new(&cfg.run_dir);
    let env_defaults = cfg.env_defaults();
    let tty = std::io::stdout().is_terminal();
    let first = cfg.disc.settings();

    j.record(&Event::RunStart {
        argv: &cfg.argv,
        policy: &cfg.policy.name,
        max_attempts: cfg.max_attempts,
        settings: &first,
        world_size: first.world_size,
        world_source: &cfg.disc.world.source,
        global_batch: first.global_batch(),
        env: &env_defaults,
        notes: &cfg.disc.notes,
        warnings: &cfg.disc.warnings,
        tty,
    });
    for w in &cfg.disc.warnings {
        eprintln!("oomguard: warning: {w}");
    }
    if cfg.verbose > 0 {
        for n in &cfg.disc.notes {
            log.info(&format!("note: {n}"));
        }
    }

    let mut settings = first.clone();
    let mut decisions: Vec<(u32, Evidence, Decision)> = Vec::new();
    let mut lost = Duration::ZERO;
    let mut attempts = 0u32;
    // The first attempt runs the command as given: a resume argument the user
    // wrote stays theirs. Later attempts resume from the newest complete checkpoint.
    let mut resume: Option<knobs::ResumeArg> = None;
    let mut resumed_step: Option<u64> = None;
    let mut oom_losses: Vec<Loss> = Vec::new();

    let code = loop {
        if let Some(sig) = signals.pending() {
            break exit::SIGNAL_BASE + sig;
        }
        attempts += 1;
        let adir = j.attempt_dir(attempts);
        // Derived config files go in the attempt's folder; if the run folder
        // cannot be written, in a private temporary one (a relaunch must not
        // depend on the journal).
        let files_dir = adir.clone().unwrap_or_else(|| {
            std::env::temp_dir()
                .join(format!("oomguard-{}", std::process::id()))
                .join(format!("attempt-{attempts}"))
        });
        let m =
            match knobs::materialize(&cfg.argv, &cfg.disc, &settings, resume.as_ref(), &files_dir)
                .map_err(|e| e.to_string())
                .and_then(|m| write_derived(&m.files, &mut inplace).map(|()| m))
            {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("oomguard: error: cannot prepare attempt {attempts}: {e}");
                    break exit::EXHAUSTED;
                }
            };
        let mut env_set: Vec<(OsString, OsString)> = env_defaults
            .iter()
            .map(|e| (OsString::from(&e.name), OsString::from(&e.value)))
            .collect();
        env_set.extend(
            m.env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        let gpu_state = gw.before_attempt(attempts, prev_pid);
        if let Some(g) = &gpu_state
            && cfg.verbose > 0
        {
            log.info(&format!("GPUs before attempt {attempts}: {}", g.summary));
        }
        j.record(&Event::AttemptStart {
            attempt: attempts,
            gpu: gpu_state.as_ref(),
            argv: &m.argv,
            env: m
                .env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            settings: &settings,
            global_batch: settings.global_batch(),
            resume: resume.as_ref().map(|r| Path::new(&r.path)),
            files: m
                .files
                .iter()
                .map(|f| FileCopy {
                    original: &f.original,
                    copy: &f.dest,
                })
                .collect(),
        });
        let attempt_started = std::time::SystemTime::now();
        if attempts > 1 {
            log.info(&format!(
                "attempt {attempts}/{}: {}",
                cfg.max_attempts,
                plan::shell_quote(&m.argv)
            ));
        } else if cfg.verbose > 0 {
            log.info(&format!("attempt 1: {}", plan::shell_quote(&m.argv)));
        }

        let log_path = adir.map(|d| d.join("output.log"));
        let spec = launch::Spec {
            argv: m.argv.clone(),
            env_set,
            tty,
            log: log_path.clone(),
            log_head_bytes: 8 << 20,
            log_tail_bytes: 4 << 20,
            hang_timeout: cfg.hang_timeout,
            grace: cfg.grace,
        };
        gw.start_sampling();
        let launched = launch::run(&spec, signals);
        let peak = gw.stop_sampling().cloned();
        let report = match launched {
            Ok(r) => r,
            Err(e) => {
                let code = match &e {
                    launch::Error::NotFound { .. } => exit::NOT_FOUND,
                    launch::Error::NotExecutable { .. } => exit::CANNOT_EXECUTE,
                    launch::Error::Io(_) => exit::CANNOT_EXECUTE,
                };
                eprintln!("oomguard: error: {e}");
                j.record(&Event::CannotExecute {
                    attempt: attempts,
                    outcome: OutcomeKind::CannotExecute,
                    error: e.to_string(),
                    status: code,
                });
                break code;
            }
        };
        for w in &report.warnings {
            eprintln!("oomguard: warning: {w}");
        }
        let outcome = evidence::classify(&report);
        if let Some(f) = outcome.finding() {
            j.record(&Event::Oom {
                attempt: attempts,
                finding: f.into(),
                after_s: report.oom_at.map(|d| d.as_secs_f64()),
            });
        }
        j.record(&Event::AttemptEnd {
            attempt: attempts,
            status: report.exit.status_code(),
            exit: report.exit.to_string(),
            outcome: outcome.kind(),
            duration_s: report.duration.as_secs_f64(),
            error_line: report.scanner.error_line(),
            gpu_peak: peak.as_ref(),
        });
        prev_pid = Some(report.pid);
        if !matches!(outcome, Outcome::Success) {
            lost += report.duration;
        }

        match outcome {
            Outcome::Success => {
                gw.record_success();
                break exit::SUCCESS;
            }
            Outcome::Interrupted { signal } => {
                log.info(&format!(
                    "interrupted by {}; not relaunching",
                    signal_name(signal)
                ));
                break exit::SIGNAL_BASE + signal;
            }
            Outcome::Other { code, exit } => {
                let line = report
                    .scanner
                    .error_line()
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default();
                eprintln!(
                    "oomguard: the command failed with {exit}, not an out-of-memory error{line}\noomguard: shrinking would not fix that, so oomguard stops here with the command's status {code}"
                );
                break code;
            }
            Outcome::HostOom { finding, code } => {
                let line = finding
                    .as_ref()
                    .map(|f| format!(": {}", f.line))
                    .unwrap_or_else(|| " (killed by SIGKILL: the kernel's OOM killer?)".into());
                eprintln!(
                    "oomguard: host (CPU) memory ran out{line}\noomguard: GPU settings would not fix that; reduce DataLoader workers or host-side buffers. Stopping with status {code}"
                );
                break code;
            }
            Outcome::GpuOom { ref finding, .. } => {
                let reached = log_path.as_deref().and_then(progress::step_reached);
                let cause = Evidence::of(&outcome, reached).expect("a GPU OOM is evidence");
                log.info(&format!("attempt {attempts}: {cause}"));
                // The same allocation failing again right after the micro-batch was
                // halved: the trainer may not be using the new value (transformers
                // 4.36 to early 5.x restored train_batch_size from the checkpoint's
                // trainer_state.json on resume).
                let tried = cause.tried_to_allocate();
                if let (Some(t), Some((prev_t, true))) = (tried, last_tried)
                    && t == prev_t
                {
                    eprintln!(
                        "oomguard: warning: the OOM tried to allocate exactly as much as before the micro-batch was halved; the trainer may be ignoring the new value (some transformers versions restore the batch size from the checkpoint on resume)"
                    );
                    j.record(&Event::Suspect {
                        attempt: attempts,
                        why: "same allocation size after halving the micro-batch",
                    });
                }
                // Another tenant's memory, not the run's: wait for it and retry the
                // same settings instead of shrinking (bounded; then the policy applies).
                let tenants = if cause.hung() {
                    Vec::new()
                } else {
                    gw.tenants(finding.as_ref())
                };
                if !tenants.is_empty() && attempts < cfg.max_attempts {
                    let who: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
                    eprintln!(
                        "oomguard: this OOM is not the run's own: {}",
                        who.join("; ")
                    );
                    j.record(&Event::ForeignOom {
                        attempt: attempts,
                        tenants: &tenants,
                    });
                    let freed = tenant_retries < TENANT_RETRIES && gw.wait_for_tenant(report.pid);
                    if freed {
                        tenant_retries += 1;
                        tenant_notes.push(format!(
                            "attempt {attempts}: OOM caused by another tenant ({}); waited and retried the same settings",
                            who.join("; ")
                        ));
                        let res = cfg.resume(Duration::from_millis(200));
                        resume = res.arg.clone();
                        if res.arg.is_some() {
                            resumed_step = res.chosen.as_ref().and_then(checkpoint::step_for);
                        }
                        log.info("memory is free again: retrying the same settings");
                        j.record(&Event::RetrySameSettings {
                            attempt: attempts,
                            step: SameSettings::RetrySameSettings,
                            before: &settings,
                            after: &settings,
                            reason: format!("another tenant held the memory: {}", who.join("; ")),
                            resume: res.chosen.as_ref().map(|c| c.path.as_path()),
                        });
                        continue;
                    }
                    eprintln!(
                        "oomguard: the memory did not come back in time (--wait-timeout); falling back to the policy"
                    );
                    tenant_notes.push(format!(
                        "attempt {attempts}: another tenant ({}) held the memory past --wait-timeout; the policy applied",
                        who.join("; ")
                    ));
                }
                if attempts >= cfg.max_attempts {
                    eprintln!(
                        "oomguard: {attempts} attempts made (--max-attempts {}); the run still does not fit",
                        cfg.max_attempts
                    );
                    break exit::EXHAUSTED;
                }
                let Some(d) = policy::next(&cfg.policy, &settings, &cause) else {
                    let na: Vec<NotApplicable> = policy::not_applicable(&cfg.policy, &cfg.disc);
                    eprintln!(
                        "oomguard: the policy '{}' has no step left; the run still does not fit at {}",
                        cfg.policy.name, settings
                    );
                    for n in na {
                        eprintln!("oomguard:   {} not applicable: {}", n.step, n.why);
                    }
                    break exit::EXHAUSTED;
                };
                // The previous attempt's group is gone (launch waits for it), so a
                // checkpoint it was writing is as complete as it will ever be.
                let res = cfg.resume(Duration::from_millis(200));
                if let Some(f) = &res.found {
                    for s in &f.skipped {
                        log.info(&format!("skipped {}: {}", s.path.display(), s.why));
                        j.record(&Event::CheckpointSkipped {
                            attempt: attempts,
                            path: &s.path,
                            why: &s.why,
                        });
                    }
                }
                let new_step = res.chosen.as_ref().and_then(checkpoint::step_for);
                let oom_after = report.oom_at.unwrap_or(report.duration);
                let loss = Loss::measure(
                    reached,
                    resumed_step,
                    new_step,
                    res.chosen
                        .as_ref()
                        .and_then(|c| checkpoint::written_at(&c.path)),
                    attempt_started,
                    oom_after,
                );
                j.record(&Event::WorkLost {
                    attempt: attempts,
                    step_reached: reached,
                    started_from_step: resumed_step,
                    resume_from_step: new_step,
                    steps_lost: loss.steps,
                    seconds_lost: loss.seconds,
                });
                oom_losses.push(loss);
                resume = res.arg.clone();
                if res.arg.is_some() {
                    resumed_step = new_step;
                }
                log.info(&format!("decision: {} — {}", d.step, d.reason));
                log.info(&res.why);
                j.record(&Event::Decision {
                    attempt: attempts,
                    step: d.step,
                    before: &d.before,
                    after: &d.after,
                    global_batch_before: d.before.global_batch(),
                    global_batch_after: d.after.global_batch(),
                    reason: &d.reason,
                    resume: res.chosen.as_ref().map(|c| c.path.as_path()),
                    resume_step: new_step,
                });
                last_tried = tried.map(|t| (t, d.step == policy::StepKind::HalveMicroBatch));
                settings = d.after.clone();
                decisions.push((attempts, cause, d));
            }
        }
    };

    j.record(&Event::RunEnd {
        exit_code: code,
        attempts,
        lost_s: lost.as_secs_f64(),
        settings: &settings,
    });
    for l in inplace.restore() {
        eprintln!("oomguard: {l}");
    }
    summary(&first, &settings, &decisions, attempts, lost, code, &j);
    for n in &tenant_notes {
        eprintln!("oomguard: {n}");
    }
    if let Some(p) = gw.peak_summary() {
        eprintln!("oomguard: GPU memory of the last attempt: {p}");
    }
    if let Some(line) = save_interval_advice(&oom_losses, cfg.layout.as_ref(), lost) {
        eprint!("{line}");
    }
    code
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// Write the changed config copies, readable by the user only (and, with
/// --edit-in-place, the edited originals, kept and restored by `inplace`).
fn write_derived(files: &[knobs::Derived], inplace: &mut InPlace) -> Result<(), String> {
    for f in files {
        if f.in_place {
            inplace
                .write(&f.dest, &f.text)
                .map_err(|e| format!("{} (edit in place): {e}", f.dest.display()))?;
            continue;
        }
        if let Some(parent) = f.dest.parent() {
            journal::create_private_dir(parent)
                .map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        journal::write_private(&f.dest, f.text.as_bytes())
            .map_err(|e| format!("{}: {e}", f.dest.display()))?;
    }
    Ok(())
}

/// The work one OOM cost: steps redone and the seconds they took.
#[derive(Debug, Clone, Copy, Default)]
struct Loss {
    steps: Option<u64>,
    seconds: f64,
}

impl Loss {
    /// `reached`: last step printed; `from`: the step this attempt started from;
    /// `back_to`: the step the next attempt resumes from.
    fn measure(
        reached: Option<u64>,
        from: Option<u64>,
        back_to: Option<u64>,
        ckpt_written: Option<std::time::SystemTime>,
        attempt_started: std::time::SystemTime,
        oom_after: Duration,
    ) -> Loss {
        let base = back_to.or(from).unwrap_or(0);
        let steps = reached.map(|r| r.saturating_sub(base));
        // Seconds: from the checkpoint resumed from (if this attempt wrote it)
        // to the OOM; otherwise the whole attempt up to the OOM.
        let oom_time = attempt_started + oom_after;
        let seconds = match ckpt_written {
            Some(w) if w > attempt_started => {
                oom_time.duration_since(w).unwrap_or_default().as_secs_f64()
            }
            _ => oom_after.as_secs_f64(),
        };
        Loss { steps, seconds }
    }
}

/// Say when the save interval costs more than the OOMs themselves, and what
/// interval would bound the loss.
fn save_interval_advice(
    losses: &[Loss],
    layout: Option<&checkpoint::Layout>,
    total_lost: Duration,
) -> Option<String> {
    if losses.is_empty() {
        return None;
    }
    let steps: u64 = losses.iter().filter_map(|l| l.steps).sum();
    let secs: f64 = losses.iter().map(|l| l.seconds).sum();
    let mut out = format!(
        "oomguard: work lost to {} OOM{}: {} of redone training ({:.1} s)\n",
        losses.len(),
        if losses.len() == 1 { "" } else { "s" },
        if losses.iter().any(|l| l.steps.is_some()) {
            format!("{steps} steps")
        } else {
            "an unknown number of steps".into()
        },
        secs
    );
    if layout.is_none() {
        out.push_str("oomguard: no checkpoints: every OOM restarted training from the beginning\n");
    }
    let relaunch = total_lost.as_secs_f64() - secs;
    let per_oom = steps.div_ceil(losses.len() as u64);
    if secs > relaunch.max(0.0) && per_oom >= 4 {
        let bound = (per_oom / 4).max(1);
        out.push_str(&format!(
            "oomguard: the save interval costs more than the OOMs: each lost about {per_oom} steps; saving every {bound} steps would bound each loss to {bound} steps\n"
        ));
    }
    Some(out)
}

/// The end-of-run table on stderr: knob, before, after, why.
fn summary(
    first: &Settings,
    last: &Settings,
    decisions: &[(u32, Evidence, Decision)],
    attempts: u32,
    lost: Duration,
    code: i32,
    j: &Journal,
) {
    let mut rows = Vec::new();
    for (k, v0) in &first.knobs {
        let Some(v1) = last.knobs.get(k) else {
            continue;
        };
        if v0 == v1 {
            continue;
        }
        let changed: Vec<&(u32, Evidence, Decision)> = decisions
            .iter()
            .filter(|(_, _, d)| d.before.knobs.get(k) != d.after.knobs.get(k))
            .collect();
        let at: Vec<String> = changed.iter().map(|(n, _, _)| n.to_string()).collect();
        let plural = if at.len() == 1 { "" } else { "s" };
        let why = match changed.first() {
            Some((_, _, d))
                if *k == Knob::GradAccum && d.step == policy::StepKind::HalveMicroBatch =>
            {
                match last.global_batch() {
                    Some(g) => format!("keeps the global batch at {g} as the micro-batch shrank"),
                    None => "keeps micro-batch × accumulation as the micro-batch shrank".into(),
                }
            }
            Some((_, _, d)) => format!(
                "{} after the OOM in attempt{plural} {}",
                d.step,
                at.join(", ")
            ),
            None => String::new(),
        };
        rows.push(Row {
            knob: k.name().into(),
            before: v0.to_string(),
            after: v1.to_string(),
            why,
        });
    }
    let status = match code {
        0 => "finished".to_string(),
        exit::EXHAUSTED => "gave up: the run still does not fit".to_string(),
        c => format!("stopped (exit {c})"),
    };
    let mut out = format!(
        "\noomguard: {status} after {attempts} attempt{}; {:.1} s lost to failed attempts\n",
        if attempts == 1 { "" } else { "s" },
        lost.as_secs_f64()
    );
    if rows.is_empty() {
        out.push_str("oomguard: no setting was changed\n");
    } else {
        out.push_str(&journal::table(&rows));
    }
    for (n, cause, d) in decisions {
        out.push_str(&format!("  attempt {n}: {cause} → {}\n", d.step));
    }
    if let Some(p) = j.path() {
        out.push_str(&format!("oomguard: journal: {}\n", p.display()));
    }
    eprint!("{out}");
}
