//! `oomguard plan`: the run's pipeline with launch replaced by "assume OOM",
//! rendered as text or JSON. Nothing runs and nothing is written.
//!
//! The ladder built here is also what `run` checks before its first attempt,
//! so a config value that cannot be written fails at once, not at 3 a.m.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::checkpoint::{self, ResumeHow, Skipped};
use crate::envmerge::EnvSet;
use crate::evidence::Evidence;
use crate::exit;
use crate::journal::{knob_values, lossy};
use crate::knobs::{self, Knob, Settings, Value};
use crate::policy::{self, Decision, NotApplicable};
use crate::run_config::{ResumeInfo, RunConfig};

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

/// One rung of the ladder: the settings an attempt would run with.
pub struct Rung {
    /// `None` for the first attempt, which runs as given.
    pub step: Option<Decision>,
    pub settings: Settings,
    pub m: knobs::Materialized,
}

/// Every rung the policy can reach, materialized (files in memory only).
pub fn ladder(
    cfg: &RunConfig,
    resume: Option<&knobs::ResumeArg>,
) -> Result<Vec<Rung>, knobs::KnobError> {
    let mut rungs = Vec::new();
    // As a run starts: from what fit last time, when remembered.
    let (mut s, _) = cfg.start_settings();
    let mut cal = cfg.calibrated();
    rungs.push(Rung {
        step: None,
        settings: s.clone(),
        m: knobs::materialize(&cfg.argv, &cfg.disc, &s, None, &cfg.attempt_dir(1))?,
    });
    while (rungs.len() as u32) < cfg.max_attempts {
        let Some(d) = crate::memory::decide(&cfg.policy, &s, &Evidence::assumed(), cal.as_mut())
        else {
            break;
        };
        s = d.after.clone();
        let dir = cfg.attempt_dir(rungs.len() + 1);
        rungs.push(Rung {
            step: Some(d),
            settings: s.clone(),
            m: knobs::materialize(&cfg.argv, &cfg.disc, &s, resume, &dir)?,
        });
    }
    Ok(rungs)
}

/// Everything `plan` shows, computed once for both renderings.
struct Plan<'a> {
    cfg: &'a RunConfig,
    env: Vec<EnvSet>,
    res: ResumeInfo,
    rungs: Vec<Rung>,
    na: Vec<NotApplicable>,
    settings: Settings,
}

/// `oomguard plan`: print what would be done; run nothing.
pub fn plan(cfg: &RunConfig, as_json: bool) -> i32 {
    // As a run would see it at its start: every checkpoint there now is
    // another run's, and plan says so.
    let res = cfg.resume(&cfg.baseline(), Duration::ZERO);
    let rungs = match ladder(cfg, res.arg.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("oomguard: error: {e}");
            return exit::USAGE;
        }
    };
    let p = Plan {
        env: cfg.env_defaults(),
        res,
        rungs,
        na: policy::not_applicable(&cfg.policy, &cfg.disc),
        settings: cfg.disc.settings(),
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
    why: &'a str,
}

#[derive(Serialize)]
struct RungJson<'a> {
    step: &'static str,
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
struct FileJson<'a> {
    original: &'a Path,
    copy: &'a Path,
    diff: &'a str,
}

impl Plan<'_> {
    fn json(&self) -> String {
        let (cfg, res) = (self.cfg, &self.res);
        let out = PlanJson {
            command: &cfg.argv,
            policy: PolicyJson {
                name: &cfg.policy.name,
                description: &cfg.policy.description,
            },
            max_attempts: cfg.max_attempts,
            knobs: cfg
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
            world_size: cfg.disc.world.size,
            world_source: &cfg.disc.world.source,
            world_uncertain: cfg.disc.world.uncertain,
            hf_style: cfg.disc.hf_style,
            families: &cfg.disc.families,
            global_batch: self.settings.global_batch(),
            env: self
                .env
                .iter()
                .map(|e| (e.name.as_str(), e.value.as_str()))
                .collect(),
            resume: res.found.as_ref().map(|f| ResumeJson {
                layout: &f.layout,
                dir: cfg.layout.as_ref().map(|l| l.root.as_path()),
                how: cfg.layout.as_ref().map(|l| &l.how),
                checkpoint: res.chosen.as_ref().map(|c| c.path.as_path()),
                skipped: &f.skipped,
                ignored: &f.ignored,
                why: &res.why,
            }),
            notes: &cfg.disc.notes,
            warnings: &cfg.disc.warnings,
            not_applicable: &self.na,
            ladder: self.rungs.iter().map(rung_json).collect(),
            host_oom_workers: host_oom_workers(cfg),
            eval_oom_eval_batch: eval_oom_batches(cfg),
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
        EstimateReport::build(self.cfg).text(&mut o, 12);
        o
    }

    fn header(&self, o: &mut String) {
        let (cfg, settings) = (self.cfg, &self.settings);
        o.push_str("oomguard plan: nothing is run\n\n");
        let _ = writeln!(o, "command:      {}", shell_quote(&cfg.argv));
        if let (_, Some(line)) = cfg.start_settings() {
            let _ = writeln!(o, "start:        {line}");
        }
        let _ = writeln!(
            o,
            "policy:       {} ({}), at most {} attempts",
            cfg.policy.name, cfg.policy.description, cfg.max_attempts
        );
        let _ = writeln!(
            o,
            "world size:   {} ({}){}",
            cfg.disc.world.size,
            cfg.disc.world.source,
            if cfg.disc.world.uncertain {
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
    }

    fn knobs(&self, o: &mut String) {
        o.push_str("\nknobs:\n");
        let w = Knob::ALL.iter().map(|k| k.name().len()).max().unwrap_or(0);
        for k in Knob::ALL {
            let _ = match self.cfg.disc.knobs.get(&k) {
                Some(b) => writeln!(
                    o,
                    "  {:w$}  {:<6}  {}",
                    k.name(),
                    b.value.to_string(),
                    b.describe()
                ),
                None => writeln!(o, "  {:w$}  {:<6}  not found", k.name(), "-"),
            };
        }
    }

    fn environment(&self, o: &mut String) {
        o.push_str("\nenvironment added to yours:\n");
        if self.env.is_empty() {
            o.push_str(if self.cfg.no_env {
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
            if let Some(l) = &self.cfg.layout {
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
        let _ = writeln!(o, "  {}", self.res.why);
    }

    /// Warnings, notes, and the steps that cannot apply.
    fn lists(&self, o: &mut String) {
        let disc = &self.cfg.disc;
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
                    if cfg.workers_floor > 0 {
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
            cfg.disc.knobs.get(&Knob::EvalBatch),
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
                crate::frameworks::no_eval_batch(&cfg.disc.families)
            ),
        };
    }

    fn ladder(&self, o: &mut String) {
        o.push_str("\nladder (attempt 1 runs as given; each OOM moves one rung down):\n");
        for (i, r) in self.rungs.iter().enumerate() {
            rung_text(o, i + 1, r);
        }
        let max = self.cfg.max_attempts;
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
    let (mut s, _) = cfg.start_settings();
    let mut out = Vec::new();
    let ev = Evidence {
        outcome: crate::evidence::OutcomeKind::HostOom,
        oom: None,
        step_reached: None,
        steps_done: None,
        evaluation: None,
    };
    while (out.len() as u32) + 1 < cfg.max_attempts {
        let Some(d) = policy::halve_dataloader_workers(&s, cfg.workers_floor, &ev) else {
            break;
        };
        s = d.after;
        out.extend(s.int(Knob::DataloaderWorkers));
    }
    out
}

/// The evaluation batch each OOM during evaluation in turn relaunches with,
/// from the settings a run starts with, within --max-attempts.
fn eval_oom_batches(cfg: &RunConfig) -> Vec<u64> {
    let (mut s, _) = cfg.start_settings();
    let mut ev = Evidence::assumed();
    ev.evaluation = Some("assumed".into());
    let mut out = Vec::new();
    while (out.len() as u32) + 1 < cfg.max_attempts {
        let Ok(d) = policy::halve_eval_batch(&s, &ev) else {
            break;
        };
        s = d.after;
        out.extend(s.int(Knob::EvalBatch));
    }
    out
}

fn rung_json(r: &Rung) -> RungJson<'_> {
    RungJson {
        step: r.step.as_ref().map(|d| d.step.name()).unwrap_or("as_given"),
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
    let step = r.step.as_ref().map(|d| d.step.name()).unwrap_or("as given");
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
    pub given: Option<crate::memory::Candidate>,
    /// Candidates, the one the model would pick first, then those that fit
    /// (longest sequence, fastest first), then the rest.
    pub candidates: Vec<crate::memory::Candidate>,
    pub pick: Option<usize>,
    pub why: String,
}

impl EstimateReport {
    pub fn build(cfg: &RunConfig) -> EstimateReport {
        let start = cfg.disc.settings();
        let Some(cal) = cfg.calibrated() else {
            return EstimateReport {
                model: None,
                gpu_total_bytes: cfg.gpu_memory,
                margin: crate::memory::MARGIN,
                given: None,
                candidates: Vec::new(),
                pick: None,
                why: "no model config found (a local --model_name_or_path folder's config.json, the Hugging Face cache for a hub name, a recipe's base_model): give --knob params=7e9; without a model oomguard follows the policy's ladder".into(),
            };
        };
        let given = crate::memory::Candidate {
            estimate: cal.estimate(&start),
            throughput: crate::memory::throughput(&start, crate::memory::DEFAULT_SEQ),
            fits: cal.fits(&start),
            fits_without_margin: cal.fits_whole_gpu(&start),
            settings: start.clone(),
            steps: Vec::new(),
        };
        let mut cands = crate::memory::candidates(&cfg.policy, &start, &cal);
        let seq = |c: &crate::memory::Candidate| c.settings.int(Knob::SeqLen).unwrap_or(0);
        cands.sort_by(|a, b| {
            (b.fits == Some(true))
                .cmp(&(a.fits == Some(true)))
                .then(seq(b).cmp(&seq(a)))
                .then(b.throughput.total_cmp(&a.throughput))
                .then(a.steps.len().cmp(&b.steps.len()))
        });
        let picked = crate::memory::pick(&cands, &start).map(|p| p.settings.clone());
        let pick = picked.and_then(|p| cands.iter().position(|c| c.settings == p));
        let why = match (cal.gpu_total, given.fits, pick) {
            (None, _, _) => "the GPU's memory is unknown (no NVML here): give --gpu-memory GIB to say which settings fit".to_string(),
            (Some(_), Some(true), _) => "the settings as given are predicted to fit".to_string(),
            (Some(_), _, Some(_)) => "the settings as given are predicted not to fit; after an OOM oomguard takes the fastest candidate that fits (marked *), calibrated by the OOM's numbers".to_string(),
            (Some(_), _, None) => "nothing the policy can reach is predicted to fit".to_string(),
        };
        EstimateReport {
            model: Some(cal.model.clone()),
            gpu_total_bytes: cal.gpu_total,
            margin: crate::memory::MARGIN,
            given: Some(given),
            candidates: cands,
            pick,
            why,
        }
    }

    pub fn text(&self, o: &mut String, limit: usize) {
        use crate::memory::{GIB, gib};
        let Some(m) = &self.model else {
            let _ = writeln!(o, "\nmemory per GPU: {}", self.why);
            return;
        };
        let _ = writeln!(
            o,
            "\nmemory per GPU (model from {}: {:.2}B parameters, hidden {}, {} layers; GPU {}):",
            m.source,
            m.params / 1e9,
            m.hidden,
            m.layers,
            self.gpu_total_bytes
                .map(|t| format!("{:.1} GiB, {:.0}% margin", t / GIB, self.margin * 100.0))
                .unwrap_or_else(|| "memory unknown".into())
        );
        let _ = writeln!(
            o,
            "  {:<2}{:<70} {:>8} {:>8} {:>8} {:>8} {:>8}  {:<4} {:>5}  why",
            "", "settings", "weights", "grads", "optim", "activ.", "total", "fits", "speed"
        );
        let budget = self.gpu_total_bytes.map(|t| t * (1.0 - self.margin));
        let row = |o: &mut String, mark: &str, label: String, c: &crate::memory::Candidate| {
            let e = &c.estimate;
            let g = |b: f64| format!("{:.2}", b / GIB);
            // Why it fits or not: the room left under the budget (GPU less the
            // margin), or how far over it the estimate is.
            let why = match budget {
                None => "GPU memory unknown".to_string(),
                Some(b) if e.total() <= b => format!("{:.2} GiB to spare", (b - e.total()) / GIB),
                Some(b) if c.fits_without_margin => {
                    format!(
                        "within the GPU, {:.2} GiB into the margin",
                        (e.total() - b) / GIB
                    )
                }
                Some(b) => format!("{:.2} GiB over", (e.total() - b) / GIB),
            };
            let _ = writeln!(
                o,
                "  {:<2}{:<70} {:>8} {:>8} {:>8} {:>8} {:>8}  {:<4} {:>5.2}  {why}",
                mark,
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
        let _ = writeln!(
            o,
            "  (GiB per GPU, context {} included in total; speed: relative throughput; activations from the architecture, calibrated by each OOM; * the pick)",
            gib(crate::memory::CONTEXT_BYTES)
        );
        let _ = writeln!(o, "  {}", self.why);
    }
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
            shell_quote(&cfg.argv)
        );
        r.text(&mut o, 15);
        print!("{o}");
    }
    exit::SUCCESS
}
