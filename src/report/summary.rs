//! The end-of-run summary, told by the [`Story`]: how the run ended and what the
//! OOMs cost (`Story::ending`), the table of changed knobs (knob, before,
//! after, why), each OOM's cause and what followed it, the journal, the command
//! line to rerun, and the OOMs other tenants caused.
//!
//! It is a fold of the same events the journal gets, so the summary at the end
//! of a run and `oomguard status` of it are told from one story.

use std::path::Path;

use crate::evidence::{OutcomeKind, When};
use crate::knobs::Knob;
use crate::policy::StepKind;
use crate::report::story::{Attempt, Decision, DecisionStep, Refused, Story};

/// One row of the summary table.
pub struct Row {
    pub knob: String,
    pub before: String,
    pub after: String,
    pub why: String,
}

/// Render the summary table (knob, before, after, why) as aligned text.
pub fn table(rows: &[Row]) -> String {
    let w0 = rows.iter().map(|r| r.knob.len()).max().unwrap_or(0).max(4);
    let w1 = rows
        .iter()
        .map(|r| r.before.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let w2 = rows.iter().map(|r| r.after.len()).max().unwrap_or(0).max(5);
    let mut out = format!("  {:w0$}  {:w1$}  {:w2$}  why\n", "knob", "before", "after");
    for r in rows {
        out.push_str(&format!(
            "  {:w0$}  {:w1$}  {:w2$}  {}\n",
            r.knob, r.before, r.after, r.why
        ));
    }
    out
}

/// What the summary is told from: the story, and what only the end of the
/// run knows.
pub struct Summary<'a> {
    pub story: &'a Story,
    /// The journal's path, when it could be written.
    pub journal: Option<&'a Path>,
    /// Who decided the changes, when this copy of a job followed another
    /// (`copy 0 of the job`): the table's "why" for them; such a copy tells no
    /// cause of its own.
    pub decided_by: Option<&'a str>,
}

/// An OOM the summary tells: its attempt, how it ended, and its cause.
struct Told<'s> {
    a: &'s Attempt,
    outcome: Option<OutcomeKind>,
    cause: String,
    when: Option<When>,
}

impl<'s> Told<'s> {
    /// The decision that followed it: the policy's step, or a later one that
    /// replaced it (see `Attempt::redecided`).
    fn decision(&self) -> Option<&'s Decision> {
        self.a
            .redecided
            .as_ref()
            .or(self.a.decision.as_ref())
            .filter(|d| matches!(d.step, DecisionStep::Policy(_)))
    }

    fn step(&self) -> Option<StepKind> {
        match self.decision()?.step {
            DecisionStep::Policy(s) => Some(s),
            DecisionStep::Same(_) => None,
        }
    }

    /// Another tenant's memory came back: the same settings again.
    fn retried(&self) -> bool {
        self.a
            .decision
            .as_ref()
            .is_some_and(|d| matches!(d.step, DecisionStep::Same(_)))
    }
}

impl Summary<'_> {
    /// The OOMs oomguard acted on (a GPU OOM of this copy's or another copy's,
    /// a host OOM a step followed), in the order of the attempts.
    fn ooms(&self) -> Vec<Told<'_>> {
        if self.decided_by.is_some() {
            return Vec::new();
        }
        self.story
            .attempts
            .iter()
            .filter_map(|a| {
                let outcome = a.end.as_ref().map(|e| e.outcome);
                let policy = a
                    .decision
                    .as_ref()
                    .is_some_and(|d| matches!(d.step, DecisionStep::Policy(_)));
                let gpu = matches!(
                    outcome,
                    Some(OutcomeKind::CudaOom | OutcomeKind::HungAfterOom)
                );
                let (cause, when) = match (&a.oom, outcome) {
                    (_, Some(OutcomeKind::HostOom)) if policy => ("host OOM".to_string(), None),
                    (Some(oom), _) if gpu => (oom.cause(outcome), oom.phase),
                    // Another copy's OOM that copy 0 decided on.
                    (None, _) if policy && a.refused.is_none() => ("OOM".to_string(), None),
                    _ => return None,
                };
                Some(Told {
                    a,
                    outcome,
                    cause,
                    when,
                })
            })
            .collect()
    }

    /// The summary's text for stderr.
    pub fn text(&self) -> String {
        let story = self.story;
        let code = story.end.as_ref().map_or(0, |e| e.exit_code);
        let ooms = self.ooms();
        let mut out = story.ending().unwrap_or_default();
        let rows = self.rows(&ooms);
        if rows.is_empty() {
            out.push_str("oomguard: no setting was changed\n");
        } else {
            out.push_str(&table(&rows));
        }
        // Each OOM with when in the run it happened, and what followed it.
        for t in &ooms {
            let (n, cause) = (t.a.start.attempt, &t.cause);
            if let Some(step) = t.step() {
                out.push_str(&format!("  attempt {n}: {cause} → {step}\n"));
            } else if t.retried() {
                if t.a.foreign.is_none() {
                    out.push_str(&format!(
                        "  attempt {n}: {cause} → the same settings again, the allocator set against fragmentation\n"
                    ));
                }
            } else if matches!(t.when, Some(When::Loading | When::Saving)) {
                out.push_str(&format!(
                    "  attempt {n}: {cause} → stopped: no setting oomguard can change lowers that peak\n"
                ));
            }
        }
        for a in &story.attempts {
            match &a.refused {
                Some(Refused::Knob(what)) => out.push_str(&format!(
                    "  attempt {}: the command refused {what}, which oomguard added → dropped, not counted as the run's failure\n",
                    a.start.attempt
                )),
                Some(Refused::Resume(what)) => out.push_str(&format!(
                    "  attempt {}: the command refused {what}, which oomguard added to resume → later attempts start from the beginning, not counted as the run's failure\n",
                    a.start.attempt
                )),
                None => {}
            }
        }
        if let Some(p) = self.journal {
            out.push_str(&format!("oomguard: journal: {}\n", p.display()));
        }
        out += &self.last_command(code);
        for a in &story.attempts {
            let Some(who) = &a.foreign else {
                continue;
            };
            let n = a.start.attempt;
            let retried = a
                .decision
                .as_ref()
                .is_some_and(|d| matches!(d.step, DecisionStep::Same(_)));
            out.push_str(&if retried {
                format!(
                    "oomguard: attempt {n}: OOM caused by another tenant ({who}); waited and retried the same settings\n"
                )
            } else {
                format!(
                    "oomguard: attempt {n}: another tenant ({who}) held the memory past --wait-timeout; the policy applied\n"
                )
            });
        }
        out
    }

    /// The command line the last attempt ran, and what to know about it, when
    /// it is not the command as the user wrote it.
    fn last_command(&self, code: i32) -> String {
        let story = self.story;
        let (Some(line), Some(last)) = (
            story.end.as_ref().and_then(|e| e.last_command.as_deref()),
            story.attempts.last(),
        ) else {
            return String::new();
        };
        let user: Vec<std::ffi::OsString> = story.start.argv.iter().map(Into::into).collect();
        let files = &last.start.files;
        if line == crate::plan::shell_quote(&user) && files.is_empty() {
            return String::new();
        }
        let mut out = if code == 0 {
            format!("oomguard: to rerun at the settings that fit: {line}\n")
        } else {
            format!("oomguard: the last attempt ran: {line}\n")
        };
        for f in files.iter().filter(|f| f.copy != f.original) {
            out += &format!(
                "oomguard:   {} is oomguard's copy of {} with the changed settings (kept in the run folder)\n",
                f.copy, f.original
            );
        }
        for f in files.iter().filter(|f| f.copy == f.original) {
            out += &format!(
                "oomguard:   {} was edited in place for it and is now put back: the line alone runs at its original values\n",
                f.copy
            );
        }
        match &last.start.resume {
            Some(r) if last.start.resume_added => {
                out += &format!(
                    "oomguard:   it resumes from {r} (added by oomguard): leave that out to start over\n"
                )
            }
            Some(r) => {
                out += &format!(
                    "oomguard:   it resumes from {r}, which the command loads from its folder by itself: move it away to start over\n"
                )
            }
            None => {}
        }
        out
    }

    /// The table's rows: each knob that changed, and why.
    fn rows(&self, ooms: &[Told<'_>]) -> Vec<Row> {
        let story = self.story;
        let (first, last) = (&story.start.settings, story.last_settings());
        let decided: Vec<(&Told<'_>, &Decision)> = ooms
            .iter()
            .filter_map(|t| Some((t, t.decision()?)))
            .collect();
        let mut rows = Vec::new();
        for (k, v0) in first {
            let Some(v1) = last.get(k) else {
                continue;
            };
            if v0 == v1 {
                continue;
            }
            let changed: Vec<&(&Told<'_>, &Decision)> = decided
                .iter()
                .filter(|(_, d)| d.before.get(k) != d.after.get(k))
                .collect();
            let at: Vec<String> = changed
                .iter()
                .map(|(t, _)| t.a.start.attempt.to_string())
                .collect();
            let plural = if at.len() == 1 { "" } else { "s" };
            let why = match changed.first() {
                Some((_, d))
                    if *k == Knob::GradAccum
                        && d.before.get(&Knob::MicroBatch) != d.after.get(&Knob::MicroBatch) =>
                {
                    match self.global_batch() {
                        Some(g) => {
                            format!("keeps the global batch at {g} as the micro-batch shrank")
                        }
                        None => "keeps micro-batch × accumulation as the micro-batch shrank".into(),
                    }
                }
                Some((t, d)) => {
                    let step = match d.step {
                        DecisionStep::Policy(s) => s,
                        DecisionStep::Same(_) => unreachable!("a policy's decision"),
                    };
                    format!(
                        "{} after the {} in attempt{plural} {}",
                        // A decision from the memory model changes several knobs
                        // at once: each row names the step that changes its own.
                        step_of(*k)
                            .filter(|s| *s != step && moved(d) > 1)
                            .unwrap_or(step),
                        if t.outcome == Some(OutcomeKind::HostOom) {
                            "host OOM"
                        } else {
                            match t.when {
                                Some(When::Evaluation) => "OOM during evaluation",
                                Some(When::Loading) => "OOM while loading a checkpoint",
                                Some(When::Saving) => "OOM while saving a checkpoint",
                                _ => "OOM",
                            }
                        },
                        at.join(", ")
                    )
                }
                None => self
                    .decided_by
                    .map(|who| format!("{who} decided"))
                    .unwrap_or_default(),
            };
            rows.push(Row {
                knob: k.name().into(),
                before: v0.to_string(),
                after: v1.to_string(),
                why,
            });
        }
        rows
    }

    /// The global batch at the last settings: as the last attempt started
    /// with them (the run knew whether its accumulation covers the world).
    fn global_batch(&self) -> Option<u64> {
        let last = self.story.last_settings();
        match self.story.attempts.last() {
            Some(a) if &a.start.settings == last => a.start.global_batch,
            _ => crate::knobs::Settings {
                knobs: last.clone(),
                world_size: self.story.start.world_size,
                accum_covers_world: false,
                micro_floor: 0,
                fsdp_offload: false,
            }
            .global_batch(),
        }
    }
}

/// The step that changes knob `k`.
fn step_of(k: Knob) -> Option<StepKind> {
    Some(match k {
        Knob::MicroBatch | Knob::GradAccum => StepKind::HalveMicroBatch,
        Knob::GradCheckpointing => StepKind::EnableGradCheckpointing,
        Knob::SeqLen => StepKind::ShortenSeq,
        Knob::ZeroStage => StepKind::RaiseZeroStage,
        Knob::OffloadOptimizer => StepKind::OffloadOptimizer,
        Knob::OffloadParam => StepKind::OffloadParam,
        Knob::DataloaderWorkers => StepKind::HalveDataloaderWorkers,
        Knob::EvalBatch => StepKind::HalveEvalBatch,
        Knob::GatherOnSave => StepKind::NoGatherOnSave,
        Knob::Fsdp => StepKind::FsdpFullShard,
    })
}

/// How many of the step knobs a decision changed (accumulation, which follows
/// the micro-batch, and the ZeRO stage an offload raises itself not counted).
fn moved(d: &Decision) -> usize {
    d.after
        .iter()
        .filter(|(k, v)| {
            !matches!(k, Knob::GradAccum | Knob::ZeroStage) && d.before.get(k) != Some(v)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, FileCopy, Knobs, Listener, OomRecord, RetrySame, SameSettings};
    use crate::events::{SetbackState, json};
    use crate::knobs::Value;
    use std::time::{Duration, SystemTime};

    #[test]
    fn table_aligns_columns() {
        let t = table(&[Row {
            knob: "micro_batch".into(),
            before: "16".into(),
            after: "4".into(),
            why: "OOM".into(),
        }]);
        assert_eq!(
            t,
            "  knob         before  after  why\n  micro_batch  16      4      OOM\n"
        );
    }

    fn knobs(micro: u64, accum: u64) -> Knobs {
        [
            (Knob::MicroBatch, Value::Int(micro)),
            (Knob::GradAccum, Value::Int(accum)),
        ]
        .into_iter()
        .collect()
    }

    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
    }

    /// The story the events tell, heard as the supervisor hears them.
    fn told(events: &[Event], secs: u64) -> Story {
        let start = Event::RunStart {
            argv: vec!["python3".into(), "train.py".into()],
            policy: "default".into(),
            max_attempts: 8,
            settings: knobs(8, 1),
            world_size: 2,
            world_source: "default".into(),
            global_batch: Some(16),
            env: serde_json::Value::Null,
            notes: vec![],
            warnings: vec![],
            tty: false,
            supervisor: None,
            logging: None,
        };
        let mut story = Story::begin(&start, Some(crate::report::journal::stamp(t0()))).unwrap();
        // The run's end is heard `secs` after its start.
        let (last, rest) = events.split_last().unwrap();
        for e in rest {
            story.on(t0(), e);
        }
        story.on(t0() + Duration::from_secs(secs), last);
        story
    }

    fn attempt(n: u32, settings: Knobs, resume: Option<&str>, files: Vec<FileCopy>) -> Event {
        Event::AttemptStart {
            attempt: n,
            gpu: serde_json::Value::Null,
            argv: vec![],
            env: Default::default(),
            global_batch: Some(settings.values().filter_map(Value::as_int).product::<u64>() * 2),
            settings,
            resume: resume.map(String::from),
            files,
        }
    }

    fn oom(n: u32, phase: When, step: Option<u64>) -> Event {
        Event::Oom {
            attempt: n,
            finding: OomRecord {
                kind: "gpu_oom".into(),
                line: "torch.OutOfMemoryError: CUDA out of memory.".into(),
                line_no: 9,
                device: None,
                tried_to_allocate_bytes: None,
                total_bytes: None,
                free_bytes: None,
                allocated_bytes: None,
                reserved_unallocated_bytes: None,
                other_processes: serde_json::Value::Null,
                victim: None,
            },
            after_s: Some(1.0),
            file: None,
            phase: Some(phase),
            phase_how: None,
            step_reached: step,
        }
    }

    fn end(n: u32, outcome: OutcomeKind) -> Event {
        Event::AttemptEnd {
            attempt: n,
            status: i32::from(outcome != OutcomeKind::Success),
            exit: "exit code 1".into(),
            outcome,
            why: None,
            kernel_oom_kill: None,
            duration_s: 2.0,
            error_line: None,
            gpu_peak: None,
            torchrun: None,
        }
    }

    fn decision(n: u32, step: StepKind, before: Knobs, after: Knobs) -> Event {
        Event::Decision {
            attempt: n,
            step,
            before,
            after,
            global_batch_before: Some(32),
            global_batch_after: Some(32),
            reason: "OOM: micro-batch 8 → 4".into(),
            resume: Some("out/checkpoint-5".into()),
            resume_step: Some(5),
        }
    }

    fn retry(n: u32) -> Event {
        Event::RetrySameSettings(RetrySame {
            attempt: n,
            step: SameSettings::RetrySameSettings,
            before: knobs(8, 1),
            after: knobs(8, 1),
            reason: "another tenant held the memory".into(),
            resume: None,
        })
    }

    fn foreign(n: u32) -> Event {
        Event::ForeignOom {
            attempt: n,
            tenants: json(&[crate::gpu::Tenant {
                pid: 9,
                user: Some("bob".into()),
                bytes: 1 << 30,
                grew_by: 0,
                gpu: Some(0),
                oomguard_attempt: None,
            }]),
        }
    }

    fn run_end(code: i32, attempts: u32, settings: Knobs, line: &str) -> Event {
        Event::RunEnd {
            exit_code: code,
            attempts,
            lost_s: 4.0,
            settings,
            time_lost_s: 1.25,
            time_lost_complete: true,
            last_command: Some(line.into()),
        }
    }

    #[test]
    fn the_summary_is_told_from_the_events() {
        let events = [
            attempt(1, knobs(8, 1), None, vec![]),
            oom(1, When::Training, Some(7)),
            end(1, OutcomeKind::CudaOom),
            foreign(1),
            retry(1),
            attempt(2, knobs(8, 1), None, vec![]),
            oom(2, When::Training, Some(7)),
            end(2, OutcomeKind::CudaOom),
            foreign(2),
            Event::WorkLost {
                attempt: 2,
                step_reached: Some(7),
                step_reached_at_least: false,
                started_from_step: None,
                resume_from_step: Some(5),
                steps_lost: Some(2),
                steps_lost_at_least: false,
                seconds_lost: 1.0,
            },
            decision(2, StepKind::HalveMicroBatch, knobs(8, 1), knobs(4, 2)),
            attempt(
                3,
                knobs(4, 2),
                Some("out/checkpoint-5"),
                vec![FileCopy {
                    original: "ds.json".into(),
                    copy: "run/attempt-3/ds.json".into(),
                }],
            ),
            Event::TimeLost {
                attempt: 3,
                state: SetbackState::Back,
                ooms: vec![1, 2],
                back_to_step: Some(7),
                since: crate::report::journal::stamp(t0()),
                seconds: Some(1.25),
            },
            end(3, OutcomeKind::Success),
            run_end(
                0,
                3,
                knobs(4, 2),
                "python3 train.py --bs 4 --accum 2 --resume out/checkpoint-5",
            ),
        ];
        let story = told(&events, 9);
        let text = Summary {
            story: &story,
            journal: Some(Path::new("run/journal.jsonl")),
            decided_by: None,
        }
        .text();
        assert_eq!(
            text,
            "\noomguard: finished after 3 attempts; 9.0 s in all\n\
             oomguard: work lost to 1 OOM: 2 steps of redone training; 1.2 s from each OOM back to the step it died at (restart and redone steps)\n\
             \x20 knob         before  after  why\n\
             \x20 micro_batch  8       4      halve_micro_batch after the OOM in attempt 2\n\
             \x20 grad_accum   1       2      keeps the global batch at 16 as the micro-batch shrank\n\
             \x20 attempt 2: OOM at step 7 → halve_micro_batch\n\
             oomguard: journal: run/journal.jsonl\n\
             oomguard: to rerun at the settings that fit: python3 train.py --bs 4 --accum 2 --resume out/checkpoint-5\n\
             oomguard:   run/attempt-3/ds.json is oomguard's copy of ds.json with the changed settings (kept in the run folder)\n\
             oomguard:   it resumes from out/checkpoint-5 (added by oomguard): leave that out to start over\n\
             oomguard: attempt 1: OOM caused by another tenant (pid 9 (bob) holds 1.0 GiB on GPU 0); waited and retried the same settings\n\
             oomguard: attempt 2: another tenant (pid 9 (bob) holds 1.0 GiB on GPU 0) held the memory past --wait-timeout; the policy applied\n"
        );
    }

    #[test]
    fn a_refused_knob_redecides_the_last_oom_and_a_load_oom_stops() {
        // Attempt 2's command refused the accumulation oomguard added: attempt
        // 1's OOM is decided again without it (the summary tells that step);
        // attempt 3 ran out of memory loading its checkpoint and the run stopped.
        let micro = |m| [(Knob::MicroBatch, Value::Int(m))].into_iter().collect();
        let events = [
            attempt(1, knobs(8, 1), None, vec![]),
            oom(1, When::FirstStep, None),
            end(1, OutcomeKind::CudaOom),
            decision(1, StepKind::HalveMicroBatch, knobs(8, 1), knobs(4, 2)),
            attempt(2, knobs(4, 2), None, vec![]),
            Event::Refused {
                attempt: 2,
                knob: Knob::GradAccum,
                added: "--accum 2".into(),
                line: "error: unrecognized arguments: --accum 2".into(),
            },
            end(2, OutcomeKind::RejectedAddition),
            decision(2, StepKind::EnableGradCheckpointing, micro(8), micro(8)),
            attempt(3, micro(8), None, vec![]),
            oom(3, When::Loading, None),
            end(3, OutcomeKind::CudaOom),
            run_end(75, 3, micro(8), "python3 train.py"),
        ];
        let story = told(&events, 3);
        let text = Summary {
            story: &story,
            journal: None,
            decided_by: None,
        }
        .text();
        assert_eq!(
            text,
            "\noomguard: gave up: the run still does not fit after 3 attempts; 3.0 s in all\n\
             oomguard: no setting was changed\n\
             \x20 attempt 1: OOM at the first step → enable_grad_checkpointing\n\
             \x20 attempt 3: OOM while loading a checkpoint → stopped: no setting oomguard can change lowers that peak\n\
             \x20 attempt 2: the command refused --accum 2 (grad_accum), which oomguard added → dropped, not counted as the run's failure\n"
        );
        // A copy that followed copy 0 tells no cause of its own: copy 0 decided.
        let events = [
            attempt(1, knobs(8, 1), None, vec![]),
            oom(1, When::Training, Some(3)),
            end(1, OutcomeKind::CudaOom),
            attempt(2, knobs(4, 2), None, vec![]),
            end(2, OutcomeKind::Success),
            run_end(0, 2, knobs(4, 2), "python3 train.py --bs 4 --accum 2"),
        ];
        let story = told(&events, 3);
        let text = Summary {
            story: &story,
            journal: None,
            decided_by: Some("copy 0 of the job"),
        }
        .text();
        assert!(
            text.ends_with(
                "\x20 knob         before  after  why\n\
                 \x20 micro_batch  8       4      copy 0 of the job decided\n\
                 \x20 grad_accum   1       2      copy 0 of the job decided\n\
                 oomguard: to rerun at the settings that fit: python3 train.py --bs 4 --accum 2\n"
            ),
            "{text}"
        );
    }
}
