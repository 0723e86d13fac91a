//! `oomguard plan`: the run's pipeline with launch replaced by "assume OOM",
//! rendered as text or JSON. Nothing runs and nothing is written.
//!
//! Every rung and every "after an OOM ..." section is [`assume`]: the same
//! `next::next` a run calls, iterated over assumed OOMs of one kind. Nothing
//! here knows a rule: a new rule of `next` shows in the plan by itself.
//!
//! The ladder built here is also what `run` checks before its first attempt,
//! so a config value that cannot be written fails at once, not at 3 a.m.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::checkpoint::{self, ResumeHow, Skipped};
use crate::envmerge::EnvSet;
use crate::evidence::{Evidence, When};
use crate::exit;
use crate::journal::{knob_values, lossy};
use crate::knobs::{self, Knob, Settings, Value};
use crate::next::{self, Because, Verdict};
use crate::policy::{self, Decision, NotApplicable};
use crate::resume::{Resumer, Resumption};
use crate::run_config::RunConfig;

/// Quote an argv for display the way a POSIX shell would read it back.
pub fn shell_quote(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| {
            let s = a.to_string_lossy();
            if !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                s.into_owned()
            } else {
                format!("'{}'", s.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// [`shell_quote`], continued with ` \\` onto lines of about `width`
/// characters (an argument is never split), indented by four spaces.
pub fn shell_lines(argv: &[OsString], width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for (i, a) in argv.iter().enumerate() {
        let q = shell_quote(std::slice::from_ref(a));
        if i > 0 {
            if line + 1 + q.chars().count() + 2 > width {
                out.push_str(" \\\n    ");
                line = 4;
            } else {
                out.push(' ');
                line += 1;
            }
        }
        line += q.chars().count();
        out.push_str(&q);
    }
    out
}

/// The `oomguard plan` command line that shows why for this command (with `--`
/// when the command could be read as a subcommand or an option).
pub fn plan_hint(argv: &[OsString]) -> String {
    const SUBCOMMANDS: &[&str] = &[
        "plan",
        "estimate",
        "diagnose",
        "gpus",
        "restore",
        "status",
        "runs",
        "completions",
        "man",
        "help",
    ];
    let first = argv
        .first()
        .map(|a| a.to_string_lossy())
        .unwrap_or_default();
    let dashes = first.starts_with('-') || SUBCOMMANDS.contains(&first.as_ref());
    format!(
        "`oomguard plan {}{}`",
        if dashes { "-- " } else { "" },
        shell_quote(argv)
    )
}

/// What oomguard can change in the command and what it cannot, in one line:
/// each knob found with where it lives, then the knobs not found.
pub fn changeable(cfg: &RunConfig) -> String {
    let found: Vec<String> = cfg
        .target
        .disc
        .knobs
        .iter()
        .map(|(k, b)| format!("{k} ({})", b.describe()))
        .collect();
    let missing: Vec<&str> = Knob::ALL
        .iter()
        .filter(|k| !cfg.target.disc.knobs.contains_key(k) && !k.only_added())
        .map(|k| k.name())
        .collect();
    let can = if found.is_empty() {
        "nothing".to_string()
    } else {
        found.join(", ")
    };
    let mut line = format!("can change: {can}");
    if !missing.is_empty() {
        let _ = write!(
            line,
            "; cannot change (not found in the command): {}; {} shows why and how to bind a knob with --knob",
            missing.join(", "),
            plan_hint(&cfg.opts.argv)
        );
    }
    line
}

/// The notes that say how to bind the knobs oomguard did not find
/// (`micro_batch: --batch_size may be the global batch ...`).
/// One note per knob, the first said: a knob the program's parser lacks is not
/// also told "bind it with --knob … (added when absent)".
pub fn unbound_notes(cfg: &RunConfig) -> Vec<&str> {
    let mut seen: Vec<Knob> = Vec::new();
    cfg.target
        .disc
        .notes
        .iter()
        .filter(|n| {
            let knob = Knob::ALL.iter().copied().find(|k| {
                !cfg.target.disc.knobs.contains_key(k)
                    && n.strip_prefix(k.name()).is_some_and(|r| r.starts_with(':'))
            });
            match knob {
                Some(k) if !seen.contains(&k) => {
                    seen.push(k);
                    true
                }
                _ => false,
            }
        })
        .map(String::as_str)
        .collect()
}

/// One rung of the ladder: the settings an attempt would run with.
pub struct Rung {
    /// `None` for the first attempt, which runs as given.
    pub step: Option<Decision>,
    pub settings: Settings,
    pub m: knobs::Materialized,
}

/// Every rung the policy can reach, materialized (files in memory only); the
/// relaunches resume where `resume` says and carry `flags`.
pub fn ladder(
    cfg: &RunConfig,
    resume: Option<&knobs::ResumeArg>,
    flags: &[String],
) -> Result<Vec<Rung>, knobs::KnobError> {
    let mut rungs = Vec::new();
    // As a run starts: from what fit last time, when remembered.
    let (s, _) = cfg.start_settings();
    rungs.push(Rung {
        step: None,
        settings: s.clone(),
        m: knobs::materialize(
            &cfg.opts.argv,
            &cfg.target.disc,
            &s,
            None,
            &[],
            &cfg.attempt_dir(1),
        )?,
    });
    // Each relaunch after an assumed OOM is a rung, whichever rule of `next` made it.
    for v in assume(cfg, &assumed(None), cfg.opts.max_attempts) {
        let Verdict::Relaunch {
            settings, because, ..
        } = v
        else {
            break;
        };
        let Some(decision) = because.decision().cloned() else {
            break;
        };
        let dir = cfg.attempt_dir(rungs.len() + 1);
        rungs.push(Rung {
            m: knobs::materialize(
                &cfg.opts.argv,
                &cfg.target.disc,
                &settings,
                resume,
                flags,
                &dir,
            )?,
            step: Some(decision),
            settings,
        });
    }
    Ok(rungs)
}

/// An assumed GPU OOM (`phase`: where in the run, when assumed there), with
/// no other tenant on the GPU.
fn assumed(phase: Option<crate::detect::phase::Phase>) -> next::Ended {
    let mut ev = Evidence::assumed();
    ev.phase = phase.map(|phase| crate::detect::phase::Seen {
        phase,
        how: "assumed".into(),
    });
    let mut e = next::Ended::new(
        crate::evidence::Outcome::GpuOom {
            finding: None,
            hung: false,
        },
        Some(ev),
    );
    e.tenants = Some(Vec::new());
    e
}

/// An assumed host (CPU) OOM.
fn assumed_host_oom() -> next::Ended {
    next::Ended::new(
        crate::evidence::Outcome::HostOom {
            finding: None,
            victim: None,
            code: 137,
        },
        Some(Evidence {
            outcome: crate::evidence::OutcomeKind::HostOom,
            oom: None,
            step_reached: None,
            steps_done: None,
            phase: None,
        }),
    )
}

/// What a run does after attempts that each end as `ended` says, from the
/// settings a run starts with, within `max_attempts`: `next`'s verdicts, one a
/// attempt, each relaunch's settings (and the memory model it calibrated, the
/// phases it retried, the offloads it ruled out) the next attempt's, up to and
/// with the first verdict that is not a relaunch.
pub fn assume(cfg: &RunConfig, ended: &next::Ended, max_attempts: u32) -> Vec<Verdict> {
    let first = cfg.target.disc.settings();
    let (mut s, _) = cfg.start_settings();
    let mut model = cfg.calibrated();
    let (mut retried, mut ruled_out) = (Vec::new(), Vec::new());
    let rules = next::Rules {
        policy: &cfg.opts.policy,
        max_attempts,
        workers_floor: cfg.target.workers_floor,
    };
    let mut out = Vec::new();
    for n in 1.. {
        let h = next::History {
            n,
            first: &first,
            settings: &s,
            attempts: &[],
            model: model.as_ref(),
            no_cpu_offload: &ruled_out,
            retried: &retried,
            role: next::Role::Alone,
            resumable: None,
        };
        let v = next::next(&h, ended, &rules);
        let Verdict::Relaunch {
            settings,
            because,
            model: m,
            ..
        } = &v
        else {
            out.push(v);
            break;
        };
        s = settings.clone();
        if m.is_some() {
            model = m.clone();
        }
        match because {
            Because::PhaseRetry { when, .. } => retried.push(*when),
            Because::OffloadUndone { undone: k, .. } | Because::Workers { ruled_out: k, .. } => {
                ruled_out.extend(k.iter().copied());
            }
            _ => {}
        }
        out.push(v);
    }
    out
}

/// Every knob a decision changes, `knob before → after`, in the knobs' order:
/// a step's name alone does not say that halving the micro-batch doubles the
/// accumulation, or that an offload raises the ZeRO stage it needs.
pub fn changes_of(d: &Decision) -> Vec<(Knob, String, String)> {
    Knob::ALL
        .iter()
        .filter_map(|k| {
            let after = d.after.knobs.get(k)?;
            let before = d.before.knobs.get(k);
            (before != Some(after)).then(|| {
                (
                    *k,
                    before.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                    after.to_string(),
                )
            })
        })
        .collect()
}

/// The rung's name: the step, and every knob it changes.
fn step_label(d: &Decision) -> String {
    let parts: Vec<String> = changes_of(d)
        .iter()
        .map(|(k, a, b)| format!("{k} {a} → {b}"))
        .collect();
    if parts.is_empty() {
        d.step.name().to_string()
    } else {
        format!("{} ({})", d.step.name(), parts.join(", "))
    }
}

/// Everything `plan` shows, computed once for both renderings.
struct Plan<'a> {
    cfg: &'a RunConfig,
    env: Vec<EnvSet>,
    res: Resumption,
    rungs: Vec<Rung>,
    na: Vec<NotApplicable>,
    settings: Settings,
}

/// `oomguard plan`: print what would be done; run nothing.
pub fn plan_main(cfg: &RunConfig, as_json: bool) -> i32 {
    // As a run would see it at its start: every checkpoint there now is
    // another run's, and plan says so.
    let resumer =
        Resumer::now(cfg.target.layout.clone()).refusing(cfg.target.resume_refused.clone());
    let res = resumer.search();
    let rungs = match ladder(cfg, res.arg.as_ref(), &resumer.relaunch_flags()) {
        Ok(r) => r,
        Err(e) => {
            crate::report::terminal::get().error(&e.to_string());
            return exit::USAGE;
        }
    };
    let p = Plan {
        env: cfg.env_defaults(),
        res,
        rungs,
        na: policy::not_applicable(&cfg.opts.policy, &cfg.target.disc),
        settings: cfg.target.disc.settings(),
        cfg,
    };
    if as_json {
        println!("{}", p.json());
    } else {
        print!("{}", p.text());
    }
    exit::SUCCESS
}

/// `plan --json`: the keys are an interface (scripts read them).
#[derive(Serialize)]
struct PlanJson<'a> {
    #[serde(serialize_with = "lossy")]
    command: &'a [OsString],
    policy: PolicyJson<'a>,
    max_attempts: u32,
    knobs: BTreeMap<&'static str, KnobJson<'a>>,
    world_size: u64,
    world_source: &'a str,
    world_uncertain: bool,
    /// An elastic torchrun's largest world (`PET_NNODES=1:4`), and the global
    /// batch there; `world_size` and `global_batch` are its smallest.
    #[serde(skip_serializing_if = "Option::is_none")]
    world_max: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    global_batch_max: Option<u64>,
    hf_style: bool,
    families: &'a [&'static str],
    global_batch: Option<u64>,
    env: BTreeMap<&'a str, &'a str>,
    resume: Option<ResumeJson<'a>>,
    notes: &'a [String],
    warnings: &'a [String],
    not_applicable: &'a [NotApplicable],
    ladder: Vec<RungJson<'a>>,
    /// The DataLoader workers each host (CPU) OOM in turn relaunches with
    /// (empty: no worker knob, or none to halve: a host OOM stops the run).
    host_oom_workers: Vec<u64>,
    /// The evaluation batch each OOM during evaluation in turn relaunches with
    /// (empty: no evaluation batch knob, or it is 1: the ladder applies).
    eval_oom_eval_batch: Vec<u64>,
    /// What each phase's OOM gets, in turn: `loading`, `saving` (each entry a
    /// step's name, `retry_same_settings`, or `stop`).
    phase_fixes: BTreeMap<&'static str, Vec<String>>,
    /// The memory model's table (`estimate --json`'s object).
    estimate: EstimateReport,
}

#[derive(Serialize)]
struct PolicyJson<'a> {
    name: &'a str,
    description: &'a str,
}

#[derive(Serialize)]
struct KnobJson<'a> {
    value: &'a Value,
    binding: String,
}

#[derive(Serialize)]
struct ResumeJson<'a> {
    layout: &'a str,
    dir: Option<&'a Path>,
    how: Option<&'a ResumeHow>,
    checkpoint: Option<&'a Path>,
    skipped: &'a [Skipped],
    /// Checkpoints a relaunch would not resume from: not this run's.
    ignored: &'a [Skipped],
    /// How the steps that change a checkpoint's format are taken (see `loadable`).
    format: Option<&'static str>,
    why: String,
}

#[derive(Serialize)]
struct RungJson<'a> {
    step: &'static str,
    /// Every knob this rung changes from the one before (the step's own knob
    /// and those it changes with it: accumulation, the ZeRO stage, ...).
    changes: Vec<ChangeJson>,
    #[serde(serialize_with = "knob_values")]
    settings: &'a Settings,
    global_batch: Option<u64>,
    #[serde(serialize_with = "lossy")]
    argv: &'a [OsString],
    env: BTreeMap<&'a str, &'a str>,
    files: Vec<FileJson<'a>>,
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ChangeJson {
    knob: &'static str,
    from: String,
    to: String,
}

#[derive(Serialize)]
struct FileJson<'a> {
    original: &'a Path,
    copy: &'a Path,
    diff: &'a str,
}

impl Plan<'_> {
    fn json(&self) -> String {
        let (cfg, res) = (self.cfg, &self.res);
        let out = PlanJson {
            command: &cfg.opts.argv,
            policy: PolicyJson {
                name: &cfg.opts.policy.name,
                description: &cfg.opts.policy.description,
            },
            max_attempts: cfg.opts.max_attempts,
            knobs: cfg
                .target
                .disc
                .knobs
                .iter()
                .map(|(k, b)| {
                    let binding = b.describe();
                    (
                        k.name(),
                        KnobJson {
                            value: &b.value,
                            binding,
                        },
                    )
                })
                .collect(),
            world_size: cfg.target.disc.world.size,
            world_source: &cfg.target.disc.world.source,
            world_uncertain: cfg.target.disc.world.uncertain,
            world_max: cfg.target.elastic.map(|(_, max)| max),
            global_batch_max: cfg
                .target
                .elastic
                .and_then(|(_, max)| at_world(&self.settings, max).global_batch()),
            hf_style: cfg.target.disc.hf_style,
            families: &cfg.target.disc.families,
            global_batch: self.settings.global_batch(),
            env: self
                .env
                .iter()
                .map(|e| (e.name.as_str(), e.value.as_str()))
                .collect(),
            resume: res.found.as_ref().map(|f| ResumeJson {
                layout: &f.layout,
                dir: cfg.target.layout.as_ref().map(|l| l.root.as_path()),
                how: cfg.target.layout.as_ref().map(|l| &l.how),
                checkpoint: res.chosen.as_ref().map(|c| c.path.as_path()),
                skipped: &f.skipped,
                ignored: &f.ignored,
                why: res.because.to_string(),
                format: format_rule(&self.settings, cfg.target.layout.is_some()),
            }),
            notes: &cfg.target.disc.notes,
            warnings: &cfg.target.disc.warnings,
            not_applicable: &self.na,
            ladder: self.rungs.iter().map(rung_json).collect(),
            host_oom_workers: host_oom_workers(cfg),
            eval_oom_eval_batch: eval_oom_batches(cfg),
            phase_fixes: phase_fixes(cfg)
                .into_iter()
                .map(|(w, fixes)| (w.name(), fixes.into_iter().map(|(s, _)| s).collect()))
                .collect(),
            estimate: EstimateReport::build(self.cfg),
        };
        // Through a `serde_json::Value`: its map sorts the keys, as `plan --json`
        // has always printed them.
        let value = serde_json::to_value(&out).expect("plan serializes");
        serde_json::to_string_pretty(&value).expect("plan serializes")
    }

    fn text(&self) -> String {
        let mut o = String::new();
        self.header(&mut o);
        self.knobs(&mut o);
        self.environment(&mut o);
        self.resume(&mut o);
        self.lists(&mut o);
        self.ladder(&mut o);
        self.host_oom(&mut o);
        self.eval_oom(&mut o);
        self.phase_oom(&mut o);
        EstimateReport::build(self.cfg).text(&mut o, 12);
        o
    }

    fn header(&self, o: &mut String) {
        let (cfg, settings) = (self.cfg, &self.settings);
        o.push_str("oomguard plan: nothing is run\n\n");
        let _ = writeln!(o, "command:      {}", shell_quote(&cfg.opts.argv));
        if let (_, Some(line)) = cfg.start_settings() {
            let _ = writeln!(o, "start:        {line}");
        }
        let _ = writeln!(
            o,
            "policy:       {} ({}), at most {} attempts",
            cfg.opts.policy.name, cfg.opts.policy.description, cfg.opts.max_attempts
        );
        let _ = writeln!(
            o,
            "world size:   {} ({}){}",
            cfg.target.disc.world.size,
            cfg.target.disc.world.source,
            if cfg.target.disc.world.uncertain {
                " — uncertain: check the global batch below"
            } else {
                ""
            }
        );
        let _ = match (
            settings.int(Knob::MicroBatch),
            settings.int(Knob::GradAccum),
            settings.global_batch(),
        ) {
            (Some(m), Some(a), Some(g)) if settings.accum_covers_world => writeln!(
                o,
                "global batch: {g} = micro-batch {m} × accumulation {a} (the accumulation counts all {} ranks)",
                settings.world_size
            ),
            (Some(m), Some(a), Some(g)) => writeln!(
                o,
                "global batch: {g} = micro-batch {m} × accumulation {a} × world size {}",
                settings.world_size
            ),
            _ => writeln!(
                o,
                "global batch: unknown (micro-batch or accumulation not bound)"
            ),
        };
        if let Some((_, max)) = cfg.target.elastic
            && let Some(g) = at_world(settings, max).global_batch()
        {
            let _ = writeln!(
                o,
                "              elastic: up to {g} with world size {max} (the global batch grows with the nodes that join)"
            );
        }
    }

    fn knobs(&self, o: &mut String) {
        o.push_str("\nknobs:\n");
        let w = Knob::ALL.iter().map(|k| k.name().len()).max().unwrap_or(0);
        for k in Knob::ALL {
            let _ = match self.cfg.target.disc.knobs.get(&k) {
                Some(b) => writeln!(
                    o,
                    "  {:w$}  {:<6}  {}",
                    k.name(),
                    b.value.to_string(),
                    b.describe()
                ),
                None if k.only_added() => Ok(()),
                None => writeln!(o, "  {:w$}  {:<6}  not found", k.name(), "-"),
            };
        }
    }

    fn environment(&self, o: &mut String) {
        o.push_str("\nenvironment added to yours:\n");
        if self.env.is_empty() {
            o.push_str(if self.cfg.opts.no_env {
                "  none (--no-env)\n"
            } else {
                "  none (you set them all)\n"
            });
        }
        for e in &self.env {
            let _ = writeln!(o, "  {}={}  ({})", e.name, e.value, e.how);
        }
    }

    fn resume(&self, o: &mut String) {
        o.push_str("\nresume:\n");
        if let Some(f) = &self.res.found {
            if let Some(l) = &self.cfg.target.layout {
                let _ = writeln!(o, "  layout: {} in {}", f.layout, l.root.display());
            }
            let named = f.skipped.len().min(checkpoint::NAMED);
            for s in &f.skipped[..named] {
                let _ = writeln!(o, "  skipped {}: {}", s.path.display(), s.why);
            }
            if f.skipped.len() > named {
                let rest = &f.skipped[named..];
                let _ = writeln!(
                    o,
                    "  skipped {} more: {}",
                    rest.len(),
                    checkpoint::kinds_text(rest)
                );
            }
            if !f.ignored.is_empty() {
                let _ = writeln!(
                    o,
                    "  ignored {}: a relaunch resumes only from checkpoints this run writes",
                    checkpoint::ignored_text(&f.ignored)
                );
            }
        }
        let _ = writeln!(o, "  {}", self.res.because);
        if let Some(rule) = format_rule(&self.settings, self.cfg.target.layout.is_some()) {
            let _ = writeln!(o, "  {rule}");
        }
    }

    /// Warnings, notes, and the steps that cannot apply.
    fn lists(&self, o: &mut String) {
        let disc = &self.cfg.target.disc;
        for (title, items) in [("warnings", &disc.warnings), ("notes", &disc.notes)] {
            if !items.is_empty() {
                let _ = writeln!(o, "\n{title}:");
                for i in items {
                    let _ = writeln!(o, "  - {i}");
                }
            }
        }
        if !self.na.is_empty() {
            o.push_str("\nnot applicable:\n");
            for n in &self.na {
                let _ = writeln!(o, "  - {}: {}", n.step, n.why);
            }
        }
    }

    /// What a host (CPU) OOM would do: halve the DataLoader's workers, or stop.
    fn host_oom(&self, o: &mut String) {
        let cfg = self.cfg;
        o.push_str("\nafter a host (CPU) OOM (not a GPU one; the ladder above does not apply):\n");
        let halvings = host_oom_workers(cfg);
        let start = cfg.start_settings().0.int(Knob::DataloaderWorkers);
        let _ = match start {
            Some(w) if !halvings.is_empty() => {
                let chain: Vec<String> = std::iter::once(w)
                    .chain(halvings.iter().copied())
                    .map(|n| n.to_string())
                    .collect();
                writeln!(
                    o,
                    "  dataloader_workers {}, one halving per host OOM, each relaunched from the last checkpoint (the batches are the same); {}",
                    chain.join(" → "),
                    if cfg.target.workers_floor > 0 {
                        "not below 1: the command sets a prefetch factor or persistent workers; then oomguard stops with advice"
                    } else {
                        "then oomguard stops with advice"
                    }
                )
            }
            Some(w) => writeln!(
                o,
                "  dataloader_workers is {w}, none to halve: oomguard stops with advice"
            ),
            None => writeln!(
                o,
                "  no DataLoader worker knob (looked for {}): oomguard stops with advice; bind yours with --knob dataloader_workers=FLAG to have it halved",
                crate::frameworks::looked_for(Knob::DataloaderWorkers)
            ),
        };
        o.push_str(
            "  (a host OOM right after a CPU offload oomguard made undoes that offload first)\n",
        );
    }

    /// What an OOM during evaluation would do: halve the evaluation batch, or
    /// take the ladder.
    fn eval_oom(&self, o: &mut String) {
        let cfg = self.cfg;
        o.push_str(
            "\nafter an OOM during evaluation (its traceback or progress shows evaluation):\n",
        );
        let halvings = eval_oom_batches(cfg);
        let start = cfg.start_settings().0;
        let kept = match start.global_batch() {
            Some(g) => format!("the training batch and the global batch ({g}) stay"),
            None => "the training batch stays".into(),
        };
        let _ = match (
            start.int(Knob::EvalBatch),
            cfg.target.disc.knobs.get(&Knob::EvalBatch),
        ) {
            (Some(b), Some(bound)) if !halvings.is_empty() => {
                let chain: Vec<String> = std::iter::once(b)
                    .chain(halvings.iter().copied())
                    .map(|n| n.to_string())
                    .collect();
                writeln!(
                    o,
                    "  eval_batch {} ({}), one halving per such OOM, each relaunched from the last checkpoint; {kept}; then the ladder above",
                    chain.join(" → "),
                    bound.describe()
                )
            }
            (Some(b), _) => writeln!(
                o,
                "  eval_batch is {b}, none to halve: the ladder above applies"
            ),
            (None, _) => writeln!(
                o,
                "  the ladder above applies: {}",
                crate::frameworks::no_eval_batch(&cfg.target.disc.families)
            ),
        };
    }

    /// What an OOM while loading or saving a checkpoint would get, and that
    /// the first step and the steady state get the ladder.
    fn phase_oom(&self, o: &mut String) {
        for (w, fixes) in phase_fixes(self.cfg) {
            let _ = writeln!(
                o,
                "\nafter an OOM {} (its traceback or progress shows it; no smaller batch, the memory model not calibrated):",
                match w {
                    When::Loading => "while loading a checkpoint",
                    _ => "while saving a checkpoint",
                }
            );
            for (i, (_, text)) in fixes.iter().enumerate() {
                let _ = writeln!(o, "  {}. {text}", i + 1);
            }
        }
        let _ = writeln!(
            o,
            "\nafter an OOM at the first step or in training: the ladder above; in the steady state ({} or more good steps before it) the memory model takes it for a spike",
            crate::memory::SPIKE_STEPS
        );
    }

    fn ladder(&self, o: &mut String) {
        o.push_str("\nladder (attempt 1 runs as given; each OOM moves one rung down):\n");
        for (i, r) in self.rungs.iter().enumerate() {
            rung_text(o, i + 1, r);
        }
        let max = self.cfg.opts.max_attempts;
        let _ = if (self.rungs.len() as u32) < max {
            writeln!(
                o,
                "  after rung {}: no step left; oomguard stops with exit {}",
                self.rungs.len(),
                exit::EXHAUSTED
            )
        } else {
            writeln!(
                o,
                "  after attempt {max}: --max-attempts reached; oomguard stops with exit {}",
                exit::EXHAUSTED
            )
        };
    }
}

/// The DataLoader workers each host (CPU) OOM in turn relaunches with, from
/// the settings a run starts with, within --max-attempts.
fn host_oom_workers(cfg: &RunConfig) -> Vec<u64> {
    assume(cfg, &assumed_host_oom(), cfg.opts.max_attempts)
        .into_iter()
        .map_while(|v| match v {
            Verdict::Relaunch {
                settings,
                because: Because::Workers { .. },
                ..
            } => settings.int(Knob::DataloaderWorkers),
            _ => None,
        })
        .collect()
}

/// What each OOM while loading, then while saving, gets in turn from the
/// settings a run starts with (the same `policy` functions a run calls):
/// (the step's name, the text `plan` shows).
fn phase_fixes(cfg: &RunConfig) -> Vec<(When, Vec<(String, String)>)> {
    use crate::detect::phase::Phase;
    let mut out = Vec::new();
    for (when, phase) in [
        (When::Loading, Phase::Loading),
        (When::Saving, Phase::Saving),
    ] {
        let load = when == When::Loading;
        // Every fix, whatever --max-attempts.
        let fixes = assume(cfg, &assumed(Some(phase)), u32::MAX)
            .into_iter()
            .map(|v| match v {
                Verdict::Relaunch {
                    because: Because::PhaseRetry { .. },
                    ..
                } => (
                    "retry_same_settings".to_string(),
                    if load {
                        "the same settings once more, relaunched from the last checkpoint, with PYTORCH_CUDA_ALLOC_CONF expandable_segments:True (a key you set is kept)"
                    } else {
                        "the same settings once more, relaunched from the last complete checkpoint, with PYTORCH_CUDA_ALLOC_CONF expandable_segments:True (a key you set is kept)"
                    }
                    .to_string(),
                ),
                Verdict::Relaunch { because, .. } => match because.decision() {
                    Some(d) => (
                        d.step.name().to_string(),
                        format!("{}: {} → {}", d.step, d.before, d.after),
                    ),
                    None => ("stop".into(), stop_text(cfg, load)),
                },
                _ => ("stop".into(), stop_text(cfg, load)),
            })
            .collect();
        out.push((when, fixes));
    }
    out
}

/// "stop (exit 75), with advice: ..." for the end of a phase's fixes.
fn stop_text(cfg: &RunConfig, load: bool) -> String {
    let fam = &cfg.target.disc.families;
    let advice = if load {
        crate::frameworks::load_advice(fam)
    } else {
        crate::frameworks::save_advice(fam)
    };
    format!(
        "stop (exit {}), with advice: {}",
        exit::EXHAUSTED,
        advice.first().cloned().unwrap_or_default()
    )
}

/// The evaluation batch each OOM during evaluation in turn relaunches with,
/// from the settings a run starts with, within --max-attempts.
fn eval_oom_batches(cfg: &RunConfig) -> Vec<u64> {
    use crate::detect::phase::Phase;
    assume(
        cfg,
        &assumed(Some(Phase::Evaluation)),
        cfg.opts.max_attempts,
    )
    .into_iter()
    .map_while(|v| match v {
        Verdict::Relaunch {
            settings,
            because: Because::EvalBatch { .. },
            ..
        } => settings.int(Knob::EvalBatch),
        _ => None,
    })
    .collect()
}

fn rung_json(r: &Rung) -> RungJson<'_> {
    RungJson {
        step: r.step.as_ref().map(|d| d.step.name()).unwrap_or("as_given"),
        changes: r
            .step
            .as_ref()
            .map(changes_of)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, from, to)| ChangeJson {
                knob: k.name(),
                from,
                to,
            })
            .collect(),
        settings: &r.settings,
        global_batch: r.settings.global_batch(),
        argv: &r.m.argv,
        env: r
            .m
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        files: r
            .m
            .files
            .iter()
            .map(|f| FileJson {
                original: &f.original,
                copy: &f.dest,
                diff: &f.diff,
            })
            .collect(),
        reason: r.step.as_ref().map(|d| d.reason.as_str()),
    }
}

fn rung_text(o: &mut String, n: usize, r: &Rung) {
    let step = r
        .step
        .as_ref()
        .map(step_label)
        .unwrap_or_else(|| "as given".into());
    let _ = writeln!(o, "  {n}. {step}: {}", r.settings);
    if let Some(d) = &r.step {
        let _ = writeln!(o, "     why:  {}", d.reason);
    }
    for (k, v) in &r.m.env {
        let _ = writeln!(o, "     env:  {k}={v}");
    }
    let _ = writeln!(o, "     argv: {}", shell_quote(&r.m.argv));
    for f in &r.m.files {
        let _ = if f.in_place {
            writeln!(
                o,
                "     file: {} (edited in place, restored at the end)",
                f.dest.display()
            )
        } else {
            writeln!(o, "     file: {} (copy of {})", f.dest.display(), f.shown)
        };
        for line in f.diff.lines() {
            let _ = writeln!(o, "       {line}");
        }
    }
}

/// `s` with another world size (an elastic run's other end).
fn at_world(s: &Settings, world: u64) -> Settings {
    let mut s = s.clone();
    s.world_size = world;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_round_trips_awkward_arguments() {
        let argv: Vec<OsString> = ["python", "a b", "it's", "--x=1", "$(rm -rf /)"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            shell_quote(&argv),
            r#"python 'a b' 'it'\''s' --x=1 '$(rm -rf /)'"#
        );
    }
}

/// `oomguard estimate` (and the same table in `plan`): the memory per GPU of
/// the settings as given and of each candidate the policy can reach.
#[derive(Serialize)]
pub struct EstimateReport {
    pub model: Option<crate::memory::ModelSpec>,
    /// Bytes per GPU, `None` when unknown (no NVML, no `--gpu-memory`).
    pub gpu_total_bytes: Option<f64>,
    pub margin: f64,
    /// The settings a run starts with (as given, or what fit last time).
    pub given: Option<crate::memory::Candidate>,
    /// Candidates: the pick first, then those that fit (longest sequence,
    /// fastest first), then the rest.
    pub candidates: Vec<crate::memory::Candidate>,
    /// What a run relaunches with after an OOM at `given`: `plan`'s rung 2
    /// (the same function, [`assume`]).
    pub pick: Option<usize>,
    pub why: String,
    /// When nothing the policy can reach is predicted to fit: the ways out
    /// that apply to this command, each with what it would need per GPU.
    pub advice: Vec<String>,
}

/// The widest line of the `estimate` table (a 100-column pane).
pub const WIDTH: usize = 100;

impl EstimateReport {
    pub fn build(cfg: &RunConfig) -> EstimateReport {
        let (start, remembered) = cfg.start_settings();
        let Some(cal) = cfg.calibrated() else {
            return EstimateReport {
                model: None,
                gpu_total_bytes: cfg.target.gpu_memory,
                margin: crate::memory::MARGIN,
                given: None,
                candidates: Vec::new(),
                pick: None,
                why: cfg
                    .target
                    .disc
                    .warnings
                    .iter()
                    .find_map(|w| w.strip_prefix("memory model: "))
                    .map(str::to_string)
                    .unwrap_or_else(|| "no model config found (a local --model_name_or_path folder's config.json, the Hugging Face cache for a hub name, a recipe's base_model): give --knob params=7e9; without a model oomguard follows the policy's ladder".into()),
                advice: Vec::new(),
            };
        };
        let given = crate::memory::Candidate {
            estimate: cal.estimate(&start),
            throughput: crate::memory::throughput(&start, crate::memory::DEFAULT_SEQ),
            fits: cal.fits(&start),
            fits_without_margin: cal.fits_whole_gpu(&start),
            near: cal.near(&start),
            settings: start.clone(),
            steps: Vec::new(),
        };
        let mut cands = crate::memory::candidates(&cfg.opts.policy, &start, &cal);
        let seq = |c: &crate::memory::Candidate| c.settings.int(Knob::SeqLen).unwrap_or(0);
        cands.sort_by(|a, b| {
            (b.fits == Some(true))
                .cmp(&(a.fits == Some(true)))
                .then(seq(b).cmp(&seq(a)))
                .then(b.throughput.total_cmp(&a.throughput))
                .then(a.steps.len().cmp(&b.steps.len()))
        });
        // The pick is what `plan` shows as rung 2: the same decision.
        // (Whatever --max-attempts: the pick is the first OOM's.)
        let picked = match assume(cfg, &assumed(None), u32::MAX).into_iter().next() {
            Some(Verdict::Relaunch { settings, .. }) => Some(settings),
            _ => None,
        };
        let pick = picked.and_then(|p| cands.iter().position(|c| c.settings == p));
        if let Some(i) = pick {
            let c = cands.remove(i);
            cands.insert(0, c);
        }
        let pick = pick.map(|_| 0);
        let any_fits = cands.iter().any(|c| c.fits == Some(true));
        let start_words = if remembered.is_none() || start == cfg.target.disc.settings() {
            "the settings as given"
        } else if cfg.opts.fit && cfg.target.remembered.is_none() {
            "the settings --fit starts at"
        } else if remembered
            .as_deref()
            .is_some_and(|l| l.starts_with("climbing back"))
        {
            "the settings the run climbs back to"
        } else {
            "the settings that fit last time"
        };
        let mut why = match (cal.gpu_total, given.fits) {
            (None, _) => "the GPU's memory is unknown (no NVML here): give --gpu-memory GIB to say which settings fit".to_string(),
            (Some(_), Some(true)) => format!(
                "{start_words} are predicted to fit; if they OOM anyway, oomguard relaunches with * (plan's rung 2)"
            ),
            (Some(_), _) if any_fits => format!(
                "{start_words} are predicted not to fit; after the OOM oomguard relaunches with * (plan's rung 2: the fastest that fits once the model is calibrated by the OOM)"
            ),
            (Some(_), _) => format!(
                "nothing the policy can reach from {start_words} is predicted to fit on this GPU"
            ),
        };
        let advice = if cal.gpu_total.is_some() && given.fits != Some(true) && !any_fits {
            why.push_str(
                "; after an OOM oomguard follows the policy's ladder (* is plan's rung 2), but the run is unlikely to fit as it is",
            );
            ways_out(&cal, &given, &cands)
        } else {
            Vec::new()
        };
        EstimateReport {
            model: Some((*cal.model).clone()),
            gpu_total_bytes: cal.gpu_total,
            margin: crate::memory::MARGIN,
            given: Some(given),
            candidates: cands,
            pick,
            why,
            advice,
        }
    }

    pub fn text(&self, o: &mut String, limit: usize) {
        use crate::memory::{GIB, gib};
        let Some(m) = &self.model else {
            wrap(o, "", &format!("\nmemory per GPU: {}", self.why));
            return;
        };
        wrap(
            o,
            "  ",
            &format!(
                "\nmemory per GPU (model from {}: {:.2}B parameters, {}, hidden {}, {} layers{}; GPU {}):",
                m.source,
                m.params / 1e9,
                m.family,
                m.hidden,
                m.layers,
                if m.facts.is_empty() {
                    String::new()
                } else {
                    format!("; {}", m.facts.join("; "))
                },
                self.gpu_total_bytes
                    .map(|t| format!("{:.1} GiB, {:.0}% margin", t / GIB, self.margin * 100.0))
                    .unwrap_or_else(|| "memory unknown".into())
            ),
        );
        // Columns: mark, settings (wrapped onto a line of its own when longer),
        // five sizes, fits, speed, why — WIDTH columns at most.
        const LABEL: usize = 29;
        let _ = writeln!(
            o,
            "  {:<2}{:<LABEL$} {:>6} {:>6} {:>6} {:>6} {:>6} {:<4} {:>5}  why",
            "", "settings", "weight", "grads", "optim", "activ.", "total", "fits", "speed"
        );
        let budget = self.gpu_total_bytes.map(|t| t * (1.0 - self.margin));
        let row = |o: &mut String, mark: &str, label: String, c: &crate::memory::Candidate| {
            let e = &c.estimate;
            let g = |b: f64| format!("{:.2}", b / GIB);
            // Why it fits or not: the room left under the budget (GPU less the
            // margin), or how far over it the estimate is.
            let why = match budget {
                None => "GPU size unknown".to_string(),
                Some(b) if e.total() <= b => format!("{:.2} GiB to spare", (b - e.total()) / GIB),
                Some(b) if c.fits_without_margin => {
                    format!("{:.2} GiB in margin", (e.total() - b) / GIB)
                }
                Some(b) => format!("{:.2} GiB over", (e.total() - b) / GIB),
            };
            let label = if label.chars().count() > LABEL {
                for line in wrap_words(&label, ", ", WIDTH - 4) {
                    let _ = writeln!(o, "  {mark:<2}{line}");
                }
                String::new()
            } else {
                label
            };
            let _ = writeln!(
                o,
                "  {:<2}{:<LABEL$} {:>6} {:>6} {:>6} {:>6} {:>6} {:<4} {:>5.2}  {why}",
                if label.is_empty() { "" } else { mark },
                label,
                g(e.weights),
                g(e.gradients),
                g(e.optimizer),
                g(e.activations),
                g(e.total()),
                match c.fits {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "?",
                },
                c.throughput
            );
        };
        if let Some(g) = &self.given {
            row(o, "", "as given".into(), g);
            for (i, c) in self.candidates.iter().take(limit).enumerate() {
                let label = changes(&g.settings, &c.settings);
                row(o, if self.pick == Some(i) { "*" } else { "" }, label, c);
            }
            if self.candidates.len() > limit {
                let _ = writeln!(
                    o,
                    "  … and {} more (oomguard estimate --json lists them all)",
                    self.candidates.len() - limit
                );
            }
        }
        wrap(
            o,
            "  ",
            &format!(
                "  (GiB per GPU, context {} included in total; speed: relative throughput; activations from the architecture, calibrated by each OOM; * what a run relaunches with after an OOM, as plan's rung 2)",
                gib(crate::memory::CONTEXT_BYTES)
            ),
        );
        wrap(o, "  ", &format!("  {}", self.why));
        if !self.advice.is_empty() {
            wrap(
                o,
                "  ",
                "  ways out (none of them is a change oomguard makes by itself):",
            );
            for a in &self.advice {
                wrap(o, "      ", &format!("    - {a}"));
            }
        }
    }
}

/// Split `text` at `sep` into lines of at most `width` characters (a part
/// longer than that gets a line of its own).
fn wrap_words(text: &str, sep: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    let parts: Vec<&str> = text.split(sep).collect();
    for (i, part) in parts.iter().enumerate() {
        let piece = if i + 1 < parts.len() {
            format!("{part}{}", sep.trim_end())
        } else {
            part.to_string()
        };
        let extra = if cur.is_empty() { 0 } else { 1 };
        if !cur.is_empty() && cur.chars().count() + extra + piece.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&piece);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Write `text` (leading newlines kept) word-wrapped at [`WIDTH`] columns,
/// continuation lines indented by `indent`.
fn wrap(o: &mut String, indent: &str, text: &str) {
    let body = text.trim_start_matches('\n');
    for _ in 0..text.len() - body.len() {
        o.push('\n');
    }
    let lead: String = body.chars().take_while(|c| *c == ' ').collect();
    let mut line = lead.clone();
    let mut empty = true;
    for word in body.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            let _ = writeln!(o, "{line}");
            line = indent.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    let _ = writeln!(o, "{line}");
}

/// The ways out when nothing the policy can reach fits: those that apply to
/// this command (what it does not do yet), each with the memory per GPU the
/// smallest settings would need with it.
fn ways_out(
    cal: &crate::memory::Calibrated,
    given: &crate::memory::Candidate,
    cands: &[crate::memory::Candidate],
) -> Vec<String> {
    use crate::knobs::Offload;
    use crate::memory::{GIB, estimate};
    let Some(total) = cal.gpu_total else {
        return Vec::new();
    };
    let budget = total * (1.0 - crate::memory::MARGIN);
    let smallest = cands
        .iter()
        .chain(std::iter::once(given))
        .min_by(|a, b| a.estimate.total().total_cmp(&b.estimate.total()))
        .unwrap_or(given);
    let s = &smallest.settings;
    let need = |spec: &crate::memory::ModelSpec, s: &Settings| {
        let t = estimate(spec, s, cal.scale).total();
        format!(
            "{:.1} GiB per GPU{}",
            t / GIB,
            if t <= budget {
                ", which fits"
            } else {
                ", still over"
            }
        )
    };
    let world = s.world_size.max(1);
    // FSDP shards as the ZeRO stage it matches (full_shard: 3), and its offload
    // is the parameters' with the optimizer's.
    let fsdp = cal.model.fsdp.as_ref();
    let stage = s.int(Knob::ZeroStage).or(fsdp.map(|f| f.stage));
    let off = |k: Knob| {
        s.knobs
            .get(&k)
            .and_then(Value::as_offload)
            .is_some_and(|o| !matches!(o, Offload::None | Offload::Other(_)))
    };
    let fsdp_offloaded = if s.fsdp_offload {
        off(Knob::OffloadParam)
    } else {
        fsdp.is_some_and(|f| f.offload)
    };
    let with = |f: &dyn Fn(&mut Settings)| {
        let mut t = s.clone();
        f(&mut t);
        t
    };
    let mut out = vec![format!(
        "the smallest settings oomguard can reach ({}) need {:.1} GiB per GPU; this GPU has {:.1} GiB ({:.1} GiB with the {:.0}% margin)",
        if smallest.settings == given.settings {
            "as given".to_string()
        } else {
            changes(&given.settings, &smallest.settings)
        },
        smallest.estimate.total() / GIB,
        total / GIB,
        budget / GIB,
        crate::memory::MARGIN * 100.0
    )];
    if stage.unwrap_or(0) < 3 && world > 1 {
        let z3 = with(&|t| {
            t.knobs.insert(Knob::ZeroStage, Value::Int(3));
        });
        out.push(format!(
            "ZeRO-3 or FSDP: shard the weights, gradients and optimizer states over the {world} GPUs (DeepSpeed `zero_optimization.stage: 3` in a --deepspeed JSON, or FSDP `full_shard`): {}",
            need(&cal.model, &z3)
        ));
    }
    if !fsdp_offloaded && (!off(Knob::OffloadOptimizer) || !off(Knob::OffloadParam)) {
        let cpu = with(&|t| {
            t.knobs.insert(Knob::ZeroStage, Value::Int(3));
            t.knobs
                .insert(Knob::OffloadOptimizer, Value::Offload(Offload::Cpu));
            t.knobs
                .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
        });
        let bound = s.knobs.contains_key(&Knob::OffloadOptimizer) || s.fsdp_offload;
        out.push(format!(
            "CPU offload: optimizer states and parameters in CPU memory (DeepSpeed ZeRO-3 `offload_optimizer`/`offload_param` `device: cpu`, or FSDP `cpu_offload`; slower steps{}): {}",
            if bound {
                ""
            } else {
                "; the command has no DeepSpeed config for oomguard to change"
            },
            need(&cal.model, &cpu)
        ));
    }
    if cal.model.trainable > 0.5 {
        let mut lora = cal.model.clone();
        lora.trainable = 0.01;
        out.push(format!(
            "LoRA: train adapters (about 1% of the weights) instead of the whole model (PEFT `--use_peft`, axolotl `adapter: lora`, LLaMA-Factory `finetuning_type: lora`; QLoRA's 4-bit base needs less still): {}",
            need(&lora, s)
        ));
    }
    // More GPUs: the fewest (a power of two, up to 1024) over which ZeRO-3
    // makes the smallest settings fit.
    let z3 = |n: u64| {
        with(&|t| {
            t.knobs.insert(Knob::ZeroStage, Value::Int(3));
            t.world_size = n;
        })
    };
    let more = (1..=10)
        .map(|p| 1u64 << p)
        .filter(|n| *n > world)
        .find(|n| estimate(&cal.model, &z3(*n), cal.scale).total() <= budget);
    match more {
        Some(n) => out.push(format!(
            "more GPUs: with ZeRO-3 or FSDP over {n} GPUs (now {world}) the smallest settings need {} (keep the global batch: fewer accumulation steps per GPU)",
            need(&cal.model, &z3(n))
        )),
        None => out.push(format!(
            "more GPUs alone do not make it fit: the activations of one micro-batch ({:.1} GiB) stay on each GPU whatever their number; a larger GPU, or a shorter sequence",
            smallest.estimate.activations / GIB
        )),
    }
    out
}

/// The knobs `to` changes from `from`, as `knob value`.
fn changes(from: &Settings, to: &Settings) -> String {
    let parts: Vec<String> = to
        .knobs
        .iter()
        .filter(|(k, v)| from.knobs.get(k) != Some(v) && **k != Knob::GradAccum)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let accum = to
        .int(Knob::GradAccum)
        .filter(|a| from.int(Knob::GradAccum) != Some(*a))
        .map(|a| format!(" (accum {a})"))
        .unwrap_or_default();
    format!("{}{accum}", parts.join(", "))
}

/// `oomguard estimate COMMAND`.
pub fn estimate_main(cfg: &RunConfig, as_json: bool) -> i32 {
    let r = EstimateReport::build(cfg);
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("estimate serializes")
        );
    } else {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "oomguard estimate: nothing is run\n\ncommand: {}",
            shell_lines(&cfg.opts.argv, WIDTH - "command: ".len())
        );
        r.text(&mut o, 15);
        print!("{o}");
    }
    exit::SUCCESS
}

/// What a run with a checkpoint layout does about the steps that change how its
/// checkpoints are written (see `loadable`), when the command has such a knob.
fn format_rule(s: &Settings, layout: bool) -> Option<&'static str> {
    if !layout {
        return None;
    }
    if s.int(Knob::ZeroStage).is_some() {
        return Some(
            "checkpoint format: a ZeRO stage loads only checkpoints written at its own stage (1 and 2 load each other's); once this run has saved one, a step that can load it comes before one that cannot (at ZeRO 2, the optimizer's offload before ZeRO 3), and a relaunch after a step that cannot starts from the beginning",
        );
    }
    if s.bool(Knob::Fsdp).is_some() {
        return Some(
            "checkpoint format: FSDP switched on cannot load a checkpoint written without it (the Trainer then reads optimizer.bin or optimizer_0/); once this run has saved one, a relaunch that adds FSDP starts from the beginning",
        );
    }
    None
}
