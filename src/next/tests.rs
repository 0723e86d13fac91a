//! The verdict's rules, table-first: one row per rule (see the table at the top
//! of `next.rs`), then the rules' own finer tests.

use std::time::Duration;

use super::*;
use crate::detect::phase::{Phase, Seen};
use crate::detect::{self, OomNumbers};
use crate::memory::{Calibrated, GIB, ModelSpec};
use crate::policy::tests::settings;
use crate::progress::Reached;

fn with(mut s: Settings, k: Knob, v: Value) -> Settings {
    s.knobs.insert(k, v);
    s
}

fn numbers() -> OomNumbers {
    OomNumbers {
        tried_to_allocate_bytes: Some(4 << 30),
        device: Some(0),
        free_bytes: Some(1 << 30),
        total_bytes: Some(80 << 30),
        ..Default::default()
    }
}

/// A GPU OOM's evidence: its numbers, the steps it completed, its phase.
fn gpu(steps_done: Option<u64>, phase: Option<Phase>) -> Evidence {
    Evidence {
        outcome: OutcomeKind::CudaOom,
        oom: Some(numbers()),
        step_reached: steps_done.map(|s| Reached {
            step: s,
            at_least: false,
        }),
        steps_done,
        phase: phase.map(|phase| Seen {
            phase,
            how: "the traceback runs through f".into(),
        }),
    }
}

fn oom_line() -> detect::Finding {
    detect::classify_log(
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which 1.00 GiB is free.\n",
    )
}

fn gpu_oom(ev: Evidence, hung: bool) -> Ended {
    let mut e = Ended::new(
        Outcome::GpuOom {
            finding: Some(oom_line()),
            hung,
        },
        Some(ev),
    );
    e.tenants = Some(Vec::new());
    e
}

fn host_oom() -> Ended {
    Ended::new(
        Outcome::HostOom {
            finding: None,
            victim: None,
            code: 137,
        },
        Some(Evidence {
            outcome: OutcomeKind::HostOom,
            oom: None,
            step_reached: None,
            steps_done: None,
            phase: None,
        }),
    )
}

fn other(code: i32) -> Outcome {
    Outcome::Other {
        code,
        exit: format!("exit code {code}"),
        why: None,
    }
}

fn tenant() -> Tenant {
    Tenant {
        pid: 4242,
        user: Some("bob".into()),
        bytes: 39 << 30,
        grew_by: 38 << 30,
        gpu: Some(0),
        oomguard_attempt: None,
    }
}

/// The run so far, for one row.
struct Case {
    n: u32,
    first: Settings,
    settings: Settings,
    attempts: Vec<AttemptRecord>,
    model: Option<Calibrated>,
    no_cpu_offload: Vec<Knob>,
    retried: Vec<When>,
    role: Role,
    policy: Policy,
    max_attempts: u32,
    resumable: Option<crate::loadable::Written>,
}

impl Case {
    fn at(settings: Settings) -> Case {
        Case {
            n: 1,
            first: settings.clone(),
            settings,
            attempts: Vec::new(),
            model: None,
            no_cpu_offload: Vec::new(),
            retried: Vec::new(),
            role: Role::Alone,
            policy: Policy::load("default").unwrap(),
            max_attempts: 6,
            resumable: None,
        }
    }

    fn next(&self, e: &Ended) -> Verdict {
        let h = History {
            n: self.n,
            first: &self.first,
            settings: &self.settings,
            attempts: &self.attempts,
            model: self.model.as_ref(),
            no_cpu_offload: &self.no_cpu_offload,
            retried: &self.retried,
            role: self.role,
            resumable: self.resumable,
        };
        let r = Rules {
            policy: &self.policy,
            max_attempts: self.max_attempts,
            workers_floor: 0,
        };
        next(&h, e, &r)
    }
}

/// A verdict in a few words: what it does, which rule, what it changes.
fn words(from: &Settings, v: &Verdict) -> String {
    let changes = |to: &Settings| -> String {
        Knob::ALL
            .iter()
            .filter_map(|k| {
                let (a, b) = (from.knobs.get(k), to.knobs.get(k));
                (a != b).then(|| {
                    let s = |v: Option<&Value>| v.map_or("-".into(), |v| v.to_string());
                    format!(" {k} {}→{}", s(a), s(b))
                })
            })
            .collect()
    };
    let rule = |b: &Because| -> &'static str {
        match b {
            Because::Success => "success",
            Because::Interrupted { .. } => "interrupted",
            Because::NotAnOom => "not_an_oom",
            Because::PeerFailed => "peer_failed",
            Because::Absurd => "absurd",
            Because::HostOom { .. } => "host_oom",
            Because::MaxAttempts => "max_attempts",
            Because::NothingLeft { .. } => "nothing_left",
            Because::PhaseStop { .. } => "phase_stop",
            Because::PhaseRetry { .. } => "phase_retry",
            Because::PhaseStep { .. } => "phase_step",
            Because::Ladder { .. } => "ladder",
            Because::EvalBatch { .. } => "eval_batch",
            Because::OffloadUndone { .. } => "offload_undone",
            Because::Workers { .. } => "workers",
            Because::ForeignMemory => "foreign_memory",
            Because::Refused { .. } => "refused",
            Because::ResumeRefused { .. } => "resume_refused",
            Because::Copy0 => "copy0",
        }
    };
    match v {
        Verdict::Relaunch {
            settings, because, ..
        } => format!("relaunch {}:{}", rule(because), changes(settings)),
        Verdict::Wait(f) => format!("wait {f:?}"),
        Verdict::Follow => "follow".into(),
        Verdict::Stop { code, because } => format!("stop {code} {}", rule(because)),
    }
}

fn decided(n: u32, before: Settings, after: Settings, ev: Evidence) -> AttemptRecord {
    AttemptRecord {
        n,
        pid: 1,
        outcome: OutcomeKind::CudaOom,
        duration: Duration::from_secs(1),
        evidence: Some(ev),
        foreign: None,
        next: Next::Decided {
            decision: Decision {
                step: StepKind::HalveMicroBatch,
                before,
                after,
                reason: String::new(),
            },
        },
    }
}

/// One row per rule: the run so far, how the attempt ended, the verdict.
#[test]
fn one_row_per_rule() {
    let s = settings(8, 2, Some(2048), false);
    let workers = with(s.clone(), Knob::DataloaderWorkers, Value::Int(8));
    let eval = with(s.clone(), Knob::EvalBatch, Value::Int(8));
    let gather = with(s.clone(), Knob::GatherOnSave, Value::Bool(true));
    let alone = Case::at(s.clone());
    let leader = Case {
        role: Role::Leader,
        ..Case::at(s.clone())
    };
    let follower = Case {
        role: Role::Follower,
        ..Case::at(s.clone())
    };
    let last = Case {
        n: 6,
        ..Case::at(s.clone())
    };
    // Only a micro-batch, and the default policy keeps the global batch.
    let micro_only = {
        let mut m = settings(8, 2, None, false);
        m.knobs.remove(&Knob::GradAccum);
        m.knobs.remove(&Knob::GradCheckpointing);
        Case::at(m)
    };
    // A model that knows the GPU, for the memory model's pick.
    let modelled = Case {
        model: Some(Calibrated::new(
            ModelSpec::from_params(1e9),
            Some(80.0 * GIB),
        )),
        ..Case::at(with(
            with(s.clone(), Knob::ZeroStage, Value::Int(0)),
            Knob::OffloadOptimizer,
            Value::Offload(Offload::None),
        ))
    };
    // Eight GPUs, no DeepSpeed or FSDP in the command (the fsdp knob bound,
    // off), and a model whose states alone overflow one GPU.
    let unsharded = {
        let mut m = with(s.clone(), Knob::Fsdp, Value::Bool(false));
        m.world_size = 8;
        Case {
            model: Some(Calibrated::new(
                ModelSpec::from_params(13e9),
                Some(80.0 * GIB),
            )),
            ..Case::at(m)
        }
    };
    // A CPU offload oomguard made (the command as written had none).
    let offloaded = {
        let mut first = with(s.clone(), Knob::ZeroStage, Value::Int(2));
        first.world_size = 1;
        first
            .knobs
            .insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
        let mut c = Case::at(with(
            first.clone(),
            Knob::OffloadOptimizer,
            Value::Offload(Offload::Cpu),
        ));
        c.first = first;
        c
    };
    // Attempt 2 refused the accumulation oomguard added after attempt 1's OOM.
    let refusing = Case {
        n: 2,
        attempts: vec![decided(
            1,
            s.clone(),
            settings(4, 4, Some(2048), false),
            gpu(Some(3), None),
        )],
        ..Case::at(settings(4, 4, Some(2048), false))
    };
    let foreign = |back: Option<bool>| {
        let mut e = gpu_oom(gpu(Some(3), None), false);
        e.tenants = Some(vec![tenant()]);
        e.memory_back = back;
        e
    };
    let peer_oom = {
        let mut e = Ended::new(
            Outcome::PeerFailure {
                code: 1,
                line: "Connection closed by peer".into(),
            },
            Some(gpu(None, None)),
        );
        e.peers = Peers::Oom { rank: 1 };
        e.tenants = Some(Vec::new());
        e
    };
    let refused = Ended::new(
        Outcome::Refused {
            code: 2,
            knob: Knob::GradAccum,
            added: "--gradient_accumulation_steps".into(),
            line: "error: unrecognized arguments: --gradient_accumulation_steps 4".into(),
            at_start: false,
        },
        None,
    );
    let resume_refused = Ended::new(
        Outcome::ResumeRefused {
            code: 2,
            added: "--resume_from_checkpoint".into(),
            line: "error: unrecognized arguments: --resume_from_checkpoint out/checkpoint-10"
                .into(),
        },
        None,
    );
    let eval_case = Case::at(eval);
    let gather_case = Case::at(gather);
    let workers_case = Case::at(workers);
    let retried_case = Case {
        retried: vec![When::Loading],
        ..Case::at(s.clone())
    };
    // ZeRO-3 with the optimizer's state offloaded as written, the parameters not.
    let params_case = Case {
        retried: vec![When::Loading],
        ..Case::at(with(
            with(
                with(s.clone(), Knob::ZeroStage, Value::Int(3)),
                Knob::OffloadOptimizer,
                Value::Offload(Offload::Cpu),
            ),
            Knob::OffloadParam,
            Value::Offload(Offload::None),
        ))
    };
    // FSDP's one offload, not yet on.
    let fsdp_case = {
        let mut f = with(s.clone(), Knob::OffloadParam, Value::Offload(Offload::None));
        f.fsdp_offload = true;
        Case {
            retried: vec![When::Loading],
            ..Case::at(f)
        }
    };
    let last_refusing = Case {
        max_attempts: 2,
        ..Case {
            n: 2,
            attempts: vec![decided(
                1,
                s.clone(),
                settings(4, 4, Some(2048), false),
                gpu(Some(3), None),
            )],
            ..Case::at(settings(4, 4, Some(2048), false))
        }
    };
    let rows: Vec<(&str, &Case, Ended, &str)> = vec![
        (
            "success",
            &alone,
            Ended::new(Outcome::Success, None),
            "stop 0 success",
        ),
        (
            "user interruption",
            &alone,
            Ended::new(
                Outcome::Interrupted {
                    signal: crate::signal::Signal::INT,
                },
                None,
            ),
            "stop 130 interrupted",
        ),
        (
            "GPU OOM: halve the micro-batch, keep the global batch",
            &alone,
            gpu_oom(gpu(Some(3), None), false),
            "relaunch ladder: micro_batch 8→4 grad_accum 2→4",
        ),
        (
            "GPU OOM: another tenant's memory is looked for first",
            &alone,
            Ended {
                tenants: None,
                ..gpu_oom(gpu(Some(3), None), false)
            },
            "wait Tenants",
        ),
        (
            "foreign OOM: wait for the tenant's memory",
            &alone,
            foreign(None),
            "wait Memory { tries_left: true }",
        ),
        (
            "foreign OOM: the memory came back, the same settings",
            &alone,
            foreign(Some(true)),
            "relaunch foreign_memory:",
        ),
        (
            "foreign OOM: the memory did not come back, the ladder",
            &alone,
            foreign(Some(false)),
            "relaunch ladder: micro_batch 8→4 grad_accum 2→4",
        ),
        (
            "hang after OOM: no wait for tenants, the ladder",
            &alone,
            Ended {
                tenants: None,
                ..gpu_oom(
                    Evidence {
                        outcome: OutcomeKind::HungAfterOom,
                        ..gpu(Some(3), None)
                    },
                    true,
                )
            },
            "relaunch ladder: micro_batch 8→4 grad_accum 2→4",
        ),
        (
            "spike: the memory model's pick",
            &modelled,
            gpu_oom(gpu(Some(crate::memory::SPIKE_STEPS), None), false),
            "relaunch ladder: micro_batch 8→4 grad_accum 2→4",
        ),
        (
            "GPU OOM on several GPUs, no sharding, states over one GPU: FSDP full-shard",
            &unsharded,
            gpu_oom(gpu(Some(3), None), false),
            "relaunch ladder: micro_batch 8→2 grad_accum 2→8 fsdp false→true",
        ),
        (
            "eval OOM: halve the evaluation batch",
            &eval_case,
            gpu_oom(gpu(Some(3), Some(Phase::Evaluation)), false),
            "relaunch eval_batch: eval_batch 8→4",
        ),
        (
            "OOM while loading: the same settings once",
            &alone,
            gpu_oom(gpu(Some(0), Some(Phase::Loading)), false),
            "relaunch phase_retry:",
        ),
        (
            "OOM while loading, retried, nothing to offload: stop",
            &retried_case,
            gpu_oom(gpu(Some(0), Some(Phase::Loading)), false),
            "stop 75 phase_stop",
        ),
        (
            "OOM while loading, retried, the optimizer offloaded: the parameters too",
            &params_case,
            gpu_oom(gpu(Some(0), Some(Phase::Loading)), false),
            "relaunch phase_step: offload_param none→cpu",
        ),
        (
            "OOM while loading, retried, under FSDP: its CPU offload",
            &fsdp_case,
            gpu_oom(gpu(Some(0), Some(Phase::Loading)), false),
            "relaunch phase_step: offload_param none→cpu",
        ),
        (
            "OOM while saving: no gather on save",
            &gather_case,
            gpu_oom(gpu(Some(40), Some(Phase::Saving)), false),
            "relaunch phase_step: gather_on_save true→false",
        ),
        (
            "no step applies",
            &micro_only,
            gpu_oom(gpu(Some(3), None), false),
            "stop 75 nothing_left",
        ),
        (
            "attempts exhausted",
            &last,
            gpu_oom(gpu(Some(3), None), false),
            "stop 75 max_attempts",
        ),
        (
            "host OOM: halve the DataLoader's workers",
            &workers_case,
            host_oom(),
            "relaunch workers: dataloader_workers 8→4",
        ),
        (
            "host OOM after oomguard's CPU offload: undone",
            &offloaded,
            host_oom(),
            "relaunch offload_undone: micro_batch 8→4 grad_accum 2→4 offload_optimizer cpu→none",
        ),
        (
            "host OOM, no worker knob: stop with the status",
            &alone,
            host_oom(),
            "stop 137 host_oom",
        ),
        (
            "absurd request",
            &alone,
            Ended::new(
                Outcome::AbsurdRequest {
                    finding: oom_line(),
                    code: 1,
                },
                None,
            ),
            "stop 1 absurd",
        ),
        (
            "other failure",
            &alone,
            Ended::new(other(3), None),
            "stop 3 not_an_oom",
        ),
        (
            "peer failure, alone",
            &alone,
            Ended::new(
                Outcome::PeerFailure {
                    code: 1,
                    line: "Connection closed by peer".into(),
                },
                None,
            ),
            "stop 1 peer_failed",
        ),
        (
            "peer failure, copy 0: the copies' ends first",
            &leader,
            Ended::new(other(1), None),
            "wait PeerEnds",
        ),
        (
            "peer failure, copy 0: another copy's OOM decides",
            &leader,
            peer_oom,
            "relaunch ladder: micro_batch 8→4 grad_accum 2→4",
        ),
        (
            "peer failure, copy 0: no copy ran out of memory",
            &leader,
            Ended {
                peers: Peers::Heard,
                ..Ended::new(other(1), None)
            },
            "stop 1 not_an_oom",
        ),
        ("any failure of a follower", &follower, host_oom(), "follow"),
        (
            "rejected flag: the knob dropped, the OOM decided again",
            &refusing,
            refused.clone(),
            "relaunch refused: micro_batch 4→8 grad_accum 4→- grad_checkpointing false→true",
        ),
        (
            "rejected flag at --max-attempts",
            &last_refusing,
            refused.clone(),
            "stop 75 refused",
        ),
        (
            "rejected resume flag: the same settings, from the beginning",
            &refusing,
            resume_refused.clone(),
            "relaunch resume_refused:",
        ),
        (
            "rejected resume flag at --max-attempts",
            &last_refusing,
            resume_refused.clone(),
            "stop 75 resume_refused",
        ),
    ];
    assert!(
        matches!(
            refusing.next(&resume_refused),
            Verdict::Relaunch {
                resume: Resume::Fresh,
                ..
            }
        ),
        "a refused resume flag relaunches without one"
    );
    let mut failed = Vec::new();
    for (rule, case, ended, want) in rows {
        let got = words(&case.settings, &case.next(&ended));
        if got != want {
            failed.push(format!("{rule}:\n  want {want}\n  got  {got}"));
        }
    }
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}

/// The memory model learns from the OOM it decides, and says a spike is one.
#[test]
fn a_spike_is_the_memory_models_and_calibrates_it() {
    let mut c = Case::at(with(
        with(
            settings(8, 2, Some(2048), false),
            Knob::ZeroStage,
            Value::Int(0),
        ),
        Knob::OffloadOptimizer,
        Value::Offload(Offload::None),
    ));
    c.model = Some(Calibrated::new(
        ModelSpec::from_params(1e9),
        Some(80.0 * GIB),
    ));
    let v = c.next(&gpu_oom(gpu(Some(crate::memory::SPIKE_STEPS), None), false));
    let Verdict::Relaunch {
        because: Because::Ladder { decision, .. },
        model: Some(m),
        ..
    } = v
    else {
        panic!("{v:?}")
    };
    assert!(decision.reason.contains("a spike"), "{}", decision.reason);
    assert_eq!(m.failed, vec![c.settings.clone()]);
}

/// Another tenant's memory is waited for at most TENANT_RETRIES times a run.
#[test]
fn another_tenants_memory_is_waited_for_a_bounded_number_of_times() {
    let s = settings(8, 2, Some(2048), false);
    let mut c = Case::at(s.clone());
    let mut e = gpu_oom(gpu(Some(3), None), false);
    e.tenants = Some(vec![tenant()]);
    for _ in 0..TENANT_RETRIES {
        c.attempts.push(AttemptRecord {
            foreign: Some("pid 4242".into()),
            next: Next::Retry,
            ..decided(1, s.clone(), s.clone(), gpu(None, None))
        });
    }
    c.n = c.attempts.len() as u32 + 1;
    c.max_attempts = 10;
    assert_eq!(words(&s, &c.next(&e)), "wait Memory { tries_left: false }");
}

fn eval_oom(how: Option<&str>) -> Evidence {
    Evidence {
        phase: how.map(|h| Seen {
            phase: Phase::Evaluation,
            how: h.to_string(),
        }),
        ..Evidence::cuda_oom(Some(OomNumbers {
            tried_to_allocate_bytes: Some(4 << 30),
            device: Some(0),
            free_bytes: Some(1 << 30),
            ..Default::default()
        }))
    }
}

/// An OOM during evaluation halves the evaluation batch and nothing else
/// (the training batch, the accumulation, the global batch as they were),
/// down to 1; then, and for an OOM in training or a command without an
/// evaluation batch, it is not taken, and says why.
#[test]
fn an_oom_during_evaluation_halves_the_eval_batch_only() {
    let mut s = settings(8, 2, Some(2048), false);
    s.knobs.insert(Knob::EvalBatch, Value::Int(8));
    let ev = eval_oom(Some("the traceback runs through evaluation_loop"));
    let mut seen = Vec::new();
    let mut cur = s.clone();
    while let Ok(d) = halve_eval_batch(&cur, &ev) {
        assert_eq!(d.step, StepKind::HalveEvalBatch);
        assert_eq!(d.before, cur);
        for k in [
            Knob::MicroBatch,
            Knob::GradAccum,
            Knob::SeqLen,
            Knob::GradCheckpointing,
        ] {
            assert_eq!(d.after.knobs.get(&k), s.knobs.get(&k), "{k}");
        }
        assert_eq!(d.after.global_batch(), s.global_batch());
        cur = d.after;
        seen.push(cur.int(Knob::EvalBatch).unwrap());
    }
    assert_eq!(seen, [4, 2, 1]);
    assert_eq!(halve_eval_batch(&cur, &ev).unwrap_err(), EvalNot::AtOne);
    let d = halve_eval_batch(&s, &ev).unwrap();
    assert_eq!(
        d.reason,
        "OOM during evaluation (tried to allocate 4.00 GiB on GPU 0, 1.00 GiB free) (the traceback runs through evaluation_loop): evaluation batch 8 → 4; the training batch and the global batch (32) are unchanged"
    );
    // An OOM in training: the policy's steps, whatever the evaluation batch.
    assert_eq!(
        halve_eval_batch(&s, &eval_oom(None)).unwrap_err(),
        EvalNot::Training
    );
    // No evaluation batch in the command.
    assert_eq!(
        halve_eval_batch(&settings(8, 2, None, false), &ev).unwrap_err(),
        EvalNot::Unbound
    );
    // An odd batch halves down: 3 → 1.
    s.knobs.insert(Knob::EvalBatch, Value::Int(3));
    let d = halve_eval_batch(&s, &ev).unwrap();
    assert_eq!(d.after.int(Knob::EvalBatch), Some(1));
}

fn phase_oom(phase: crate::detect::phase::Phase, steps_done: Option<u64>) -> Evidence {
    Evidence {
        phase: Some(crate::detect::phase::Seen {
            phase,
            how: "the traceback runs through f".into(),
        }),
        steps_done,
        ..Evidence::cuda_oom(None)
    }
}

/// The decision per phase, table-first: loading → the same settings once,
/// then the optimizer offload where the command has it, then stop; saving →
/// the 16-bit gather off, else the same settings once, then stop; neither
/// ever shrinks the batch. Training (first step, steady state) is the
/// ladder's, as before.
#[test]
fn the_decision_per_phase() {
    use crate::detect::phase::Phase;
    let p = Policy::load("default").unwrap();
    let base = settings(8, 2, Some(2048), false);
    let mut offloadable = base.clone();
    offloadable.world_size = 1;
    offloadable.knobs.insert(Knob::ZeroStage, Value::Int(2));
    offloadable
        .knobs
        .insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
    let mut offloaded = offloadable.clone();
    offloaded
        .knobs
        .insert(Knob::OffloadOptimizer, Value::Offload(Offload::Cpu));
    let mut gather = base.clone();
    gather.knobs.insert(Knob::GatherOnSave, Value::Bool(true));
    let mut no_gather = base.clone();
    no_gather
        .knobs
        .insert(Knob::GatherOnSave, Value::Bool(false));
    let fix = |f: PhaseFix| match f {
        PhaseFix::Retry { .. } => "retry".to_string(),
        PhaseFix::Step(d) => {
            assert_eq!(d.after.int(Knob::MicroBatch), Some(8), "{}", d.reason);
            assert_eq!(d.after.global_batch(), d.before.global_batch());
            d.step.name().to_string()
        }
        PhaseFix::Stop { .. } => "stop".to_string(),
    };
    let load = phase_oom(Phase::Loading, Some(0));
    let save = phase_oom(Phase::Saving, Some(40));
    let cases: Vec<(&str, PhaseFix, &str)> = vec![
        (
            "load, first",
            after_load_oom(&p, &base, &base, &load, false),
            "retry",
        ),
        (
            "load, retried, no offload knob",
            after_load_oom(&p, &base, &base, &load, true),
            "stop",
        ),
        (
            "load, retried, offload knob",
            after_load_oom(&p, &offloadable, &offloadable, &load, true),
            "offload_optimizer",
        ),
        (
            "load, retried, offloaded",
            after_load_oom(&p, &offloaded, &offloaded, &load, true),
            "stop",
        ),
        (
            "save, gather on",
            after_save_oom(&gather, &save, false),
            "no_gather_on_save",
        ),
        (
            "save, gather on, retried",
            after_save_oom(&gather, &save, true),
            "no_gather_on_save",
        ),
        (
            "save, gather off",
            after_save_oom(&no_gather, &save, false),
            "retry",
        ),
        (
            "save, no knob",
            after_save_oom(&base, &save, false),
            "retry",
        ),
        (
            "save, no knob, retried",
            after_save_oom(&base, &save, true),
            "stop",
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(fix(got), want, "{what}");
    }
    // The reasons say when, and never a smaller batch.
    let PhaseFix::Stop { not } = after_load_oom(&p, &base, &base, &load, true) else {
        panic!()
    };
    let because = Because::PhaseStop {
        when: When::Loading,
        not,
    };
    assert_eq!(
        words::phase_reason(&because, &load).unwrap(),
        "OOM while loading a checkpoint (the traceback runs through f), again after a retry at the same settings, and the command has no optimizer offload setting: a smaller batch does not lower a load's peak"
    );
    // Training: the first step and the steady state are told apart by the
    // step, and the ladder decides as before.
    for (steps, when) in [
        (Some(0), crate::evidence::When::FirstStep),
        (Some(3), crate::evidence::When::Training),
        (
            Some(crate::memory::SPIKE_STEPS),
            crate::evidence::When::SteadyState,
        ),
    ] {
        let ev = phase_oom(Phase::Training, steps);
        assert_eq!(ev.when(), Some(when));
        assert_eq!(
            policy::next_rung(&p, &base, &ev).unwrap().step,
            StepKind::HalveMicroBatch
        );
    }
    assert_eq!(
        phase_oom(Phase::Evaluation, Some(50)).when(),
        Some(crate::evidence::When::Evaluation)
    );
    assert_eq!(Evidence::cuda_oom(None).when(), None);
}

/// The OOM's decision uses a measured peak at another batch as a second
/// point: states that the model under-counts move the constant, the
/// activations stay as the architecture gives them, and the pick fits the
/// hidden truth.
#[test]
fn a_measured_peak_and_an_oom_calibrate_the_states_not_the_activations() {
    let s8 = with(
        with(
            settings(8, 2, Some(2048), false),
            Knob::ZeroStage,
            Value::Int(0),
        ),
        Knob::OffloadOptimizer,
        Value::Offload(Offload::None),
    );
    let mut s2 = s8.clone();
    s2.knobs.insert(Knob::MicroBatch, Value::Int(2));
    s2.knobs.insert(Knob::GradAccum, Value::Int(8));
    let m = ModelSpec::from_params(1.6e9);
    // The hidden truth: the model's states times `cs`, chosen so that
    // micro-batch 8 needs the OOM's 80 - 1 + 4 GiB.
    let at = |s: &Settings, cs: f64| crate::memory::estimate_scaled(&m, s, 1.0, cs).total();
    let states = at(&s8, 1.0) - at(&s8, 0.0);
    let cs = 1.0 + (83.0 * GIB - at(&s8, 1.0)) / states;
    assert!(
        (1.05..1.6).contains(&cs),
        "the case needs a states error: {cs}"
    );
    let mut cal = Calibrated::new(m.clone(), Some(80.0 * GIB));
    cal.learn_peak(&s2, at(&s2, cs));
    let mut c = Case::at(s8.clone());
    c.model = Some(cal);
    let v = c.next(&gpu_oom(gpu(Some(0), None), false));
    let Verdict::Relaunch {
        settings: picked,
        model: Some(after),
        because: Because::Ladder { decision, .. },
        ..
    } = v
    else {
        panic!("{v:?}")
    };
    assert!(
        decision.reason.contains(
            "solved on two points, this OOM and the peak measured at micro_batch 2, grad_accum 8"
        ),
        "{}",
        decision.reason
    );
    assert!(
        (after.scale - 1.0).abs() < 1e-6,
        "activations moved: {}",
        after.scale
    );
    assert!(
        (after.state_scale - cs).abs() < 1e-6,
        "{} vs {cs}",
        after.state_scale
    );
    assert!(
        at(&picked, cs) <= 80.0 * GIB,
        "{picked:?} does not fit the truth"
    );
    assert!(
        picked.int(Knob::MicroBatch) > Some(2),
        "{picked:?}: needlessly small"
    );
}

/// With a checkpoint of the run to resume from, a step whose settings can load it
/// comes before one that cannot: ZeRO 2 → 3 cannot read a stage-2 checkpoint, so the
/// optimizer's offload at stage 2 is taken, and the reason says why; without a
/// checkpoint, or with only steps that cannot load it, the ladder is as written.
#[test]
fn a_step_that_loads_the_runs_checkpoint_comes_before_one_that_cannot() {
    use crate::loadable::Written;
    let mut s = with(
        with(
            settings(1, 8, Some(2048), true),
            Knob::ZeroStage,
            Value::Int(2),
        ),
        Knob::OffloadOptimizer,
        Value::Offload(Offload::None),
    );
    s.world_size = 2;
    let step = |c: &Case| match c.next(&gpu_oom(gpu(Some(6), None), false)) {
        Verdict::Relaunch {
            because: Because::Ladder { decision, .. },
            ..
        } => (decision.step, decision.reason),
        v => panic!("{}", words(&c.settings, &v)),
    };
    let fresh = Case::at(s.clone());
    assert_eq!(step(&fresh).0, StepKind::RaiseZeroStage);
    let written = |w| Case {
        resumable: Some(w),
        ..Case::at(s.clone())
    };
    let (kind, why) = step(&written(Written::Zero12));
    assert_eq!(kind, StepKind::OffloadOptimizer);
    assert!(
        why.ends_with("(raise_zero_stage was passed over: its settings could not load the checkpoint the relaunch resumes from, written at ZeRO stage 1 or 2)"),
        "{why}"
    );
    // A checkpoint written without DeepSpeed's files changes nothing.
    assert_eq!(step(&written(Written::Plain)).0, StepKind::RaiseZeroStage);
    // No step left that loads it: the ladder as written (the relaunch starts over).
    let mut no_offload = written(Written::Zero12);
    no_offload
        .policy
        .steps
        .retain(|st| !matches!(st.kind, StepKind::OffloadOptimizer | StepKind::OffloadParam));
    assert_eq!(step(&no_offload).0, StepKind::RaiseZeroStage);
}
