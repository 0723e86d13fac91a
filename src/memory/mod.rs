//! The memory model: per-GPU estimate of weights, gradients, optimizer states,
//! activations and the CUDA context for given settings, calibrated by evidence,
//! and the choice of the fastest settings the policy allows that fit.
//!
//! Theory of operation: the model states (weights, gradients, optimizer) follow
//! from the parameter count, the weights' dtype, the optimizer, PEFT and the
//! sharding (ZeRO's stage as a knob, FSDP read from the command) as in the ZeRO
//! paper. Activations follow from the architecture ([`arch`]: hidden size,
//! heads, MLP, vocabulary, experts) per sample per token, the term that is
//! hard to know ahead. Everything is read from the run's own facts
//! ([`facts`]); an architecture the model does not know is said, and the
//! policy's ladder decides. An OOM's numbers calibrate the model
//! ([`calibrate`]): the batch-independent states and the batch-dependent
//! activations apart. [`fit`] is the start below the given settings that
//! `--fit` asks for, and the one-line prediction without it.
//!
//! [`climb`] is the start of a run whose last run was shrunk and fit: from the
//! peak NVML measured of it, back up to the largest settings predicted to fit.
//!
//! Modules: [`arch`] (config.json), [`dtype`], [`optim`], [`peft`], [`shard`]
//! (FSDP), [`facts`] (reading them), [`calibrate`], [`fit`], [`climb`].

pub mod arch;
pub mod calibrate;
pub mod climb;
pub mod dtype;
pub mod facts;
pub mod fit;
pub mod optim;
pub mod peft;
pub mod shard;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use calibrate::Calibrated;
pub use optim::Optimizer;

use crate::command::Command;
use crate::knobs::{Knob, Offload, Settings, Value};
use arch::Arch;
use shard::Fsdp;

pub const GIB: f64 = (1u64 << 30) as f64;
/// The CUDA context and NCCL buffers: about 500 MiB per process.
pub const CONTEXT_BYTES: f64 = 500.0 * (1u64 << 20) as f64;
/// After an OOM the activation term is scaled by this much beyond what the
/// message proves: PyTorch names only the allocation that failed, and the
/// allocations after it are unseen.
pub const UNSEEN_DEFICIT: f64 = 1.25;
/// A candidate fits when it is predicted to leave this share of the GPU free.
pub const MARGIN: f64 = 0.05;
/// A candidate predicted over the GPU by no more than this share is within the
/// model's error: when nothing with the sequence as given fits, the one that
/// needs least is tried if it is this near, before a shorter sequence.
pub const NEAR: f64 = 0.05;
/// An OOM after at least this many good steps of the attempt is a spike (a
/// long batch, an evaluation, a save), not a steady overflow.
pub const SPIKE_STEPS: u64 = 10;
/// After a spike the activation term is scaled by this much beyond what the
/// message proves, instead of [`UNSEEN_DEFICIT`]: the steps before it fit, so
/// only the run's peak overflowed. (On `benches/sizing.py --spikes 20`, 1.05 let
/// one run in 40 need a second relaunch; 1.15 none, on seeds 12, 7, 99 and 3.)
pub const SPIKE_DEFICIT: f64 = 1.15;
/// A prediction that failed is scaled up by this much again (after a spike:
/// [`SPIKE_FAILED`]).
pub const FAILED: f64 = 1.5;
pub const SPIKE_FAILED: f64 = 1.1;

/// What the model is, as read from its config and the run's facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Where it was read: a config.json path, or `--knob params=N`.
    pub source: String,
    /// The architecture's family (`model_type`: llama, gpt_neox, mixtral, ...).
    pub family: String,
    pub params: f64,
    /// Parameters a token passes through (a Mixture-of-Experts' top-k).
    pub active_params: f64,
    pub hidden: f64,
    pub layers: f64,
    /// The MLP width a token passes through.
    pub intermediate: f64,
    pub vocab: f64,
    /// Activation bytes per layer per token, 16-bit count (see [`arch`]).
    pub act_per_layer_token: f64,
    /// Trainable share of the parameters (LoRA adapters: about 1%).
    pub trainable: f64,
    /// Bytes per trainable weight: 4 for fp32 weights (a Trainer's `--bf16`
    /// autocasts over them), 2 for weights loaded in bf16/fp16.
    pub weight_bytes: f64,
    /// Bytes per frozen weight (LoRA's base: its dtype; QLoRA 4-bit: 0.55).
    pub frozen_bytes: f64,
    /// Mixed precision said to be off: the matrix products' inputs are kept in
    /// the weights' dtype ([`FP32_FACTOR`] with fp32 weights).
    pub no_mixed_precision: bool,
    pub optimizer: Optimizer,
    /// FSDP, when the command shards with it (ZeRO is a knob).
    pub fsdp: Option<Fsdp>,
    /// What was read and where (`weights bf16 (--torch_dtype bfloat16)`).
    pub facts: Vec<String>,
}

impl ModelSpec {
    fn of_arch(source: String, a: &Arch) -> ModelSpec {
        ModelSpec {
            source,
            family: a.family.clone(),
            params: a.params,
            active_params: a.active_params,
            hidden: a.hidden,
            layers: a.layers,
            intermediate: a.intermediate,
            vocab: a.vocab,
            act_per_layer_token: a.act_per_layer_token,
            trainable: 1.0,
            weight_bytes: 4.0,
            frozen_bytes: 2.0,
            no_mixed_precision: false,
            optimizer: Optimizer::AdamW,
            fsdp: None,
            facts: Vec::new(),
        }
    }

    /// From a Hugging Face `config.json`'s text: `None` when it is not one or
    /// its architecture is not one the model knows (see [`arch`]).
    #[cfg(test)]
    pub fn from_config_json(source: &str, text: &str) -> Option<ModelSpec> {
        let a = Arch::from_config_json(text)?.ok()?;
        Some(ModelSpec::of_arch(source.to_string(), &a))
    }

    /// From a parameter count alone (`--knob params=7e9`): a Llama-shaped
    /// architecture of that size.
    pub fn from_params(params: f64) -> ModelSpec {
        ModelSpec::of_arch(format!("--knob params={params:e}"), &Arch::llama_of(params))
    }

    /// The facts of the run applied: dtype, optimizer, PEFT, FSDP.
    pub fn with_facts(mut self, a: &Arch, f: &facts::Facts) -> ModelSpec {
        if let Some((d, said)) = &f.dtype {
            self.weight_bytes = d.bytes().max(2.0);
            self.frozen_bytes = d.bytes();
            self.facts.push(format!("weights {} ({said})", d.name()));
        }
        if let Some(said) = &f.no_mixed_precision {
            self.no_mixed_precision = true;
            self.facts.push(format!("no mixed precision ({said})"));
        }
        if let Some((o, said)) = &f.optimizer {
            self.optimizer = *o;
            self.facts.push(format!("optimizer {} ({said})", o.name()));
        }
        if let Some(p) = &f.peft {
            let lora = a.lora_params(p.rank, &p.targets);
            self.trainable = (lora / self.params).clamp(1e-6, 1.0);
            // PEFT keeps the adapters in fp32; the base stays in the weights' dtype.
            self.frozen_bytes = self.weight_bytes.min(if f.dtype.is_some() {
                self.frozen_bytes
            } else {
                4.0
            });
            self.weight_bytes = 4.0;
            self.facts.push(format!(
                "LoRA r={} on {:.2}% of the parameters ({})",
                p.rank,
                self.trainable * 100.0,
                p.source
            ));
            if let Some((q, said)) = &f.quant {
                self.frozen_bytes = q.bytes();
                self.facts.push(format!("base {} ({said})", q.name()));
            }
        }
        if let Some(fs) = &f.fsdp {
            self.facts.push(format!(
                "FSDP {}{} ({})",
                if fs.stage >= 3 {
                    "full shard"
                } else {
                    "shard_grad_op"
                },
                if fs.offload { " with CPU offload" } else { "" },
                fs.source
            ));
            self.fsdp = Some(fs.clone());
        }
        if self.params > self.active_params * 1.05 {
            self.facts.push(format!(
                "Mixture-of-Experts: {:.1}B parameters, {:.1}B active per token",
                self.params / 1e9,
                self.active_params / 1e9
            ));
        }
        self
    }

    /// Activations' precision factor: a Trainer's `--bf16` over fp32 weights
    /// keeps the residual stream, norms and activation functions in fp32
    /// ([`AMP_FACTOR`], measured); weights held in 16 bits keep fewer
    /// ([`HALF_FACTOR`], measured). Adapters (LoRA) over a frozen base take
    /// [`AMP_FACTOR`] whatever the base's dtype: PEFT keeps them in fp32 and each
    /// adapted layer saves its own copy of its input (measured on an H200: 1.91×
    /// for LoRA on all linear layers of a bf16 0.95B Llama shape, where 1.15 had
    /// the peak 30% above the estimate).
    /// Without mixed precision, fp32 weights keep every saved tensor in fp32
    /// ([`FP32_FACTOR`], measured).
    fn act_factor(&self) -> f64 {
        let compute = if self.trainable < 0.5 {
            self.frozen_bytes
        } else {
            self.weight_bytes
        };
        if self.no_mixed_precision && compute >= 4.0 {
            FP32_FACTOR
        } else if self.trainable < 0.5 || self.weight_bytes >= 4.0 {
            AMP_FACTOR
        } else {
            HALF_FACTOR
        }
    }
}

/// What [`find_model`] found.
pub enum Found {
    Model(ModelSpec),
    /// A config.json of an architecture the model does not know: the sentence
    /// that says so.
    Unknown(String),
    Nothing,
}

/// Where the command's model config is: a local `--model_name_or_path`
/// folder, a hub name in the Hugging Face cache, or a recipe's `base_model`;
/// `files` are the config files the command names (read for the recipe's
/// model and the run's facts: dtype, optimizer, PEFT, FSDP).
pub fn find_model(cmd: &Command, files: &[String], env: &dyn Fn(&str) -> Option<String>) -> Found {
    let mut texts: Vec<(String, String)> =
        files.iter().filter_map(|f| facts::read_file(f)).collect();
    texts.extend(
        facts::side_files(cmd, env)
            .iter()
            .filter_map(|f| facts::read_file(f)),
    );
    // `accelerate launch` hands its mixed precision to the script so, and the
    // Trainer takes it from there when neither --bf16 nor --fp16 is said.
    if let Some(v) = env("ACCELERATE_MIXED_PRECISION") {
        texts.push((
            "the environment's ACCELERATE_MIXED_PRECISION".into(),
            format!("mixed_precision: {v}\n"),
        ));
    }
    let mut names: Vec<String> = cmd
        .value(&[
            "--model_name_or_path",
            "--model_name",
            "--model",
            "--base_model",
            "--model.model_name",
            "--pretrained_model_name_or_path",
        ])
        .map(str::to_string)
        .into_iter()
        .collect();
    for (name, text) in &texts {
        for p in facts::text_pairs(text, name) {
            if matches!(
                p.key.as_str(),
                "base_model" | "model_name_or_path" | "pretrained_model_name_or_path"
            ) {
                names.push(p.value);
            }
        }
    }
    let mut unknown = None;
    for n in &names {
        match config_for(n, env) {
            Some((src, Ok(a), cfg_dtype)) => {
                let mut f = facts::read(cmd, &texts);
                facts::settle_dtype(&mut f, cfg_dtype, &src, facts::transformers_major(cmd, env));
                return Found::Model(ModelSpec::of_arch(src, &a).with_facts(&a, &f));
            }
            Some((src, Err(u), _)) => {
                unknown.get_or_insert(format!(
                    "memory model: {src} is a '{}' model, an architecture the memory model does not know ({}): decisions follow the policy's ladder (--knob params=N takes it as Llama-shaped)",
                    u.what,
                    arch::known()
                ));
            }
            None => {}
        }
    }
    match unknown {
        Some(u) => Found::Unknown(u),
        None => Found::Nothing,
    }
}

/// Where it was read, the architecture, and config.json's own dtype.
type Config = (String, Result<Arch, arch::Unknown>, Option<dtype::Dtype>);

/// The `config.json` of a local folder or of a hub name in the HF cache.
fn config_for(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<Config> {
    let parse = |p: &Path| -> Option<Config> {
        let t = crate::untrusted::read_config(p).ok()?;
        Some((
            p.display().to_string(),
            Arch::from_config_json(&t)?,
            facts::config_dtype(&t),
        ))
    };
    let local = Path::new(name).join("config.json");
    if local.is_file() {
        return parse(&local);
    }
    let (org, model) = name.split_once('/')?;
    let hub = env("HF_HOME")
        .map(|h| PathBuf::from(h).join("hub"))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))?;
    let snaps = hub
        .join(format!("models--{org}--{model}"))
        .join("snapshots");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&snaps)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    dirs.sort();
    dirs.iter()
        .rev()
        .find_map(|d| parse(&d.join("config.json")))
}

/// One per-GPU estimate, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub context: f64,
}

impl Estimate {
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.context
    }
}

/// Bytes per trainable parameter (weights, gradients, optimizer states): the
/// ZeRO paper's 2 + 2 + 12 for mixed-precision Adam under DeepSpeed (fp32
/// master weights and states), else the weights' own dtype for all three
/// (a Trainer's `--bf16` over fp32 weights: 4 + 4 + 8; weights loaded in bf16:
/// 2 + 2 + 4, Adam's states in the parameters' dtype).
pub fn per_param(opt: Optimizer, weight_bytes: f64, deepspeed: bool) -> (f64, f64, f64) {
    if deepspeed {
        (2.0, 2.0, 4.0 + opt.state_bytes(4.0))
    } else {
        (weight_bytes, weight_bytes, opt.state_bytes(weight_bytes))
    }
}

/// Per-GPU bytes of weights, gradients and optimizer states (the ZeRO paper's
/// model states) for `params` trainable parameters of `bytes` per parameter
/// (see [`per_param`]) at `stage` over `world` ranks.
pub fn model_states(
    bytes: (f64, f64, f64),
    params: f64,
    stage: u64,
    world: u64,
    offload_opt: bool,
    offload_param: bool,
) -> (f64, f64, f64) {
    let n = world.max(1) as f64;
    let (w, g, o) = bytes;
    let shard = |s: u64| if stage >= s { n } else { 1.0 };
    let weights = if offload_param {
        0.0
    } else {
        w * params / shard(3)
    };
    let grads = if offload_param && stage >= 3 {
        0.0
    } else {
        g * params / shard(2)
    };
    let optim = if offload_opt {
        0.0
    } else {
        o * params / shard(1)
    };
    (weights, grads, optim)
}

/// Measured, not derived: a Hugging Face Trainer run with `--bf16` keeps fp32 weights
/// and autocasts only the matrix products, so the residual stream, norms and
/// activation functions keep fp32 tensors. On an H100 (torch 2.11, transformers
/// 5.17, Llama-shaped models of 0.17B and 0.95B, sdpa attention) the peak fitted
/// 1.95× the bf16 count per layer and 13.2 bytes per vocabulary entry per token
/// (`examples/gpu_checks.sh`, `tests/real/gpu_estimate_check.py`).
const AMP_FACTOR: f64 = 1.9;

/// fp32 weights trained without mixed precision (`--bf16 false`): the matrix
/// products' inputs are saved in fp32 too. Measured on an H200 (torch 2.11,
/// transformers 5.17, a 0.17B Llama shape, 8 × 1024 tokens): 2.77×, where
/// [`AMP_FACTOR`] had the peak 16% above the estimate. One shape only.
const FP32_FACTOR: f64 = 2.7;

/// Weights held in 16 bits (`--torch_dtype bfloat16`), trained in full: fewer
/// fp32 tensors than [`AMP_FACTOR`]'s, but the norms and rotary embeddings still
/// upcast to fp32. Measured on an H200 (torch 2.11, transformers 5.17, `--bf16`,
/// sdpa): 1.55× for a 0.95B Llama shape; 1.15, derived from the count, had the
/// peak 14% above the estimate.
const HALF_FACTOR: f64 = 1.6;

/// The logits' bytes per vocabulary entry per token at the loss: bf16 logits (2),
/// their fp32 copy (4), the log-softmax (4) and its gradient (4).
const LOGIT_BYTES: f64 = 14.0;

/// The knobs' values the model reads, with defaults where a knob is not bound.
struct View {
    micro: f64,
    seq: f64,
    gc: bool,
    stage: u64,
    off_opt: bool,
    off_param: bool,
    world: u64,
    deepspeed: bool,
}

fn view(s: &Settings, default_seq: u64) -> View {
    let off = |k| {
        s.knobs
            .get(&k)
            .and_then(Value::as_offload)
            .is_some_and(|o| !matches!(o, Offload::None | Offload::Other(_)))
    };
    View {
        micro: s.int(Knob::MicroBatch).unwrap_or(1) as f64,
        seq: s.int(Knob::SeqLen).unwrap_or(default_seq) as f64,
        gc: s.bool(Knob::GradCheckpointing).unwrap_or(false),
        // FSDP full-shard shards as ZeRO-3 does.
        stage: if s.bool(Knob::Fsdp) == Some(true) {
            3
        } else {
            s.int(Knob::ZeroStage).unwrap_or(0)
        },
        // FSDP's CPU offload takes the optimizer step with the parameters.
        off_opt: off(Knob::OffloadOptimizer) || (s.fsdp_offload && off(Knob::OffloadParam)),
        off_param: off(Knob::OffloadParam),
        world: s.world_size.max(1),
        deepspeed: s.knobs.contains_key(&Knob::ZeroStage),
    }
}

/// The sequence length assumed when the command binds none.
pub const DEFAULT_SEQ: u64 = 2048;

/// Estimate per GPU for settings `s`; `calib` scales the activation term.
pub fn estimate(m: &ModelSpec, s: &Settings, calib: f64) -> Estimate {
    estimate_scaled(m, s, calib, 1.0)
}

/// [`estimate`] with the batch-independent model states scaled by `states`
/// (calibration: see [`calibrate`]).
pub fn estimate_scaled(m: &ModelSpec, s: &Settings, calib: f64, states: f64) -> Estimate {
    let mut v = view(s, DEFAULT_SEQ);
    // FSDP shards as the ZeRO stage it matches, over its degree.
    let mut n = v.world;
    if let Some(f) = m.fsdp.as_ref().filter(|f| f.stage > v.stage) {
        v.stage = f.stage;
        n = f.degree.map_or(n, |d| d.min(n));
        // The command's own offload, unless the settings hold it (an FSDP
        // offload knob): then theirs, which a step may have changed.
        if !s.fsdp_offload {
            v.off_opt |= f.offload;
            v.off_param |= f.offload;
        }
    }
    let trainable = m.params * m.trainable;
    let bytes = per_param(m.optimizer, m.weight_bytes, v.deepspeed);
    let (mut w, g, o) = model_states(bytes, trainable, v.stage, n, v.off_opt, v.off_param);
    // Frozen weights (LoRA's base model) are sharded only at stage 3.
    let frozen = m.params - trainable;
    if frozen > 0.0 && !v.off_param {
        w += frozen * m.frozen_bytes / if v.stage >= 3 { n as f64 } else { 1.0 };
    }
    if v.off_param {
        // Two layers' weights gathered at a time.
        w = 2.0 * 2.0 * m.params / m.layers.max(1.0);
    }
    let tokens = v.micro * v.seq;
    let per_layer = m.act_factor() * m.act_per_layer_token * tokens;
    let layers = if v.gc {
        // Each layer's input is kept; one layer's activations are recomputed at a time.
        2.0 * m.hidden * tokens * m.layers + per_layer
    } else {
        per_layer * m.layers
    };
    Estimate {
        weights: w * states,
        gradients: g * states,
        optimizer: o * states,
        // Only the layers' term is calibrated: the logits' size is exact.
        activations: layers * calib + logits_bytes(m, s),
        context: CONTEXT_BYTES,
    }
}

/// The logits at the loss: see [`LOGIT_BYTES`].
fn logits_bytes(m: &ModelSpec, s: &Settings) -> f64 {
    let v = view(s, DEFAULT_SEQ);
    LOGIT_BYTES * m.vocab * v.micro * v.seq
}

/// Relative throughput of settings (1.0: the settings as given would run at
/// full speed): a small micro-batch uses the GPU less well, checkpointing
/// recomputes the forward pass (~30%), ZeRO-3 gathers parameters every step,
/// offload moves states over PCIe.
pub fn throughput(s: &Settings, default_seq: u64) -> f64 {
    let v = view(s, default_seq);
    let tokens = v.micro * v.seq;
    let mut t = tokens / (tokens + 1024.0);
    if v.gc {
        t *= 0.75;
    }
    if v.world > 1 {
        t *= match v.stage {
            0 | 1 => 1.0,
            2 => 0.97,
            _ => 0.85,
        };
    }
    if v.off_opt {
        t *= 0.6;
    }
    if v.off_param {
        t *= 0.6;
    }
    t
}

/// One candidate of `estimate`: settings, what they would use, whether they fit.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub settings: Settings,
    pub estimate: Estimate,
    pub throughput: f64,
    pub fits: Option<bool>,
    /// Predicted to fit the whole GPU, without the margin (never a failed one).
    #[serde(skip)]
    pub fits_without_margin: bool,
    /// Predicted within the model's error of the whole GPU ([`NEAR`]), never a failed one.
    #[serde(skip)]
    pub near: bool,
    /// The steps that lead here from the settings as given.
    pub steps: Vec<crate::policy::StepKind>,
}

/// Every settings the policy's steps can reach from `start` (any order, each
/// step to its floor), with their estimates.
pub fn candidates(
    policy: &crate::policy::Policy,
    start: &Settings,
    cal: &Calibrated,
) -> Vec<Candidate> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    let mut queue = vec![(start.clone(), Vec::new())];
    seen.insert(key(start));
    while let Some((s, path)) = queue.pop() {
        for (kind, next) in crate::policy::successors(policy, &s) {
            if seen.len() > 4096 || !seen.insert(key(&next)) {
                continue;
            }
            let mut p: Vec<_> = path.clone();
            p.push(kind);
            queue.push((next.clone(), p.clone()));
            out.push(Candidate {
                estimate: cal.estimate(&next),
                throughput: throughput(&next, DEFAULT_SEQ),
                fits: cal.fits(&next),
                fits_without_margin: cal.fits_whole_gpu(&next),
                near: cal.near(&next),
                settings: next,
                steps: p,
            });
        }
    }
    out
}

fn key(s: &Settings) -> String {
    s.knobs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The fastest candidate that fits, results first: a shorter sequence only
/// when no candidate with the sequence as given fits. `None` when the GPU's
/// size is unknown or nothing fits.
pub fn pick<'a>(cands: &'a [Candidate], start: &Settings) -> Option<&'a Candidate> {
    let seq0 = start.int(Knob::SeqLen);
    let best = |keep_seq: bool| {
        cands
            .iter()
            .filter(|c| c.fits == Some(true))
            .filter(|c| !keep_seq || c.settings.int(Knob::SeqLen) == seq0)
            .max_by(|a, b| {
                let sa = a.settings.int(Knob::SeqLen).unwrap_or(0);
                let sb = b.settings.int(Knob::SeqLen).unwrap_or(0);
                // The longest sequence first, then throughput, then fewer changes.
                sa.cmp(&sb)
                    .then(a.throughput.total_cmp(&b.throughput))
                    .then(b.steps.len().cmp(&a.steps.len()))
            })
    };
    // Results first, before the margin: when nothing with the sequence as given
    // fits with the margin, the one predicted to need least, if it fits the GPU
    // without it — or is within the model's error of it — comes before a
    // shorter sequence.
    let least = |ok: fn(&Candidate) -> bool| {
        cands
            .iter()
            .filter(|c| c.settings.int(Knob::SeqLen) == seq0 && ok(c))
            .min_by(|a, b| a.estimate.total().total_cmp(&b.estimate.total()))
    };
    best(true)
        .or_else(|| least(|c| c.fits_without_margin))
        .or_else(|| least(|c| c.near))
        .or_else(|| best(false))
}

/// Bytes as GiB with two decimals.
pub fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / GIB)
}

/// The decision after an OOM when a memory model is known: the fastest
/// settings the policy's steps can reach that the model, calibrated with this
/// OOM, says fit with the margin — results first (a shorter sequence only when
/// nothing with the sequence as given fits). `None` when the model cannot tell
/// (no GPU size, or nothing fits): the caller falls back to the ladder.
pub fn next_from_model(
    policy: &crate::policy::Policy,
    cur: &Settings,
    evidence: &crate::evidence::Evidence,
    cal: &Calibrated,
    keep: &dyn Fn(&Settings) -> bool,
) -> Option<crate::policy::Decision> {
    let cands = candidates(policy, cur, cal);
    // The fastest that fits among those `keep` accepts, else the pick of all.
    let kept: Vec<Candidate> = cands
        .iter()
        .filter(|c| keep(&c.settings))
        .cloned()
        .collect();
    let best = pick(&kept, cur)
        .filter(|c| c.fits == Some(true))
        .or_else(|| pick(&cands, cur))?;
    let changed: Vec<String> = best
        .settings
        .knobs
        .iter()
        .filter(|(k, v)| cur.knobs.get(k) != Some(v))
        .map(|(k, v)| {
            let was = cur.knobs.get(k).map(|v| v.to_string()).unwrap_or_default();
            format!("{k} {was} → {v}")
        })
        .collect();
    let gb = best
        .settings
        .global_batch()
        .map(|g| format!(", global batch {g} kept"))
        .unwrap_or_default();
    let n_fit = cands.iter().filter(|c| c.fits == Some(true)).count();
    let spike = match evidence.steps_done {
        Some(n) if n >= SPIKE_STEPS => format!(
            " after {n} good steps (a spike: the model is calibrated to need the OOM's figure at its peak, not a steady overflow)"
        ),
        _ => String::new(),
    };
    let why = if best.fits == Some(true) {
        format!(
            "the fastest of {n_fit} settings that fit with a {:.0}% margin",
            MARGIN * 100.0
        )
    } else if !best.fits_without_margin {
        format!(
            "nothing with the sequence as given is predicted to fit: the one that needs least, within the model's {:.0}% error of the GPU, before a shorter sequence",
            NEAR * 100.0
        )
    } else {
        format!(
            "none with the sequence as given fits with the {:.0}% margin: the one that needs least, which fits the GPU, before a shorter sequence",
            MARGIN * 100.0
        )
    };
    Some(crate::policy::Decision {
        step: *best.steps.last()?,
        before: cur.clone(),
        after: best.settings.clone(),
        reason: format!(
            "{evidence}{spike}: {}{gb}; the memory model ({}{}) predicts {} of {} per GPU, {why}",
            changed.join(", "),
            cal.model.source,
            cal.two_points
                .as_deref()
                .map(|t| format!(", {t}"))
                .unwrap_or_default(),
            gib(best.estimate.total()),
            gib(cal.gpu_total.unwrap_or(0.0)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::OomNumbers;
    use calibrate::{effective_total, needed_at_least};
    use std::collections::BTreeMap;

    fn settings(micro: u64, accum: u64, seq: u64, gc: bool, stage: u64, world: u64) -> Settings {
        let mut knobs = BTreeMap::new();
        knobs.insert(Knob::MicroBatch, Value::Int(micro));
        knobs.insert(Knob::GradAccum, Value::Int(accum));
        knobs.insert(Knob::SeqLen, Value::Int(seq));
        knobs.insert(Knob::GradCheckpointing, Value::Bool(gc));
        knobs.insert(Knob::ZeroStage, Value::Int(stage));
        knobs.insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
        knobs.insert(Knob::OffloadParam, Value::Offload(Offload::None));
        Settings {
            knobs,
            world_size: world,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        }
    }

    /// The ZeRO paper's per-GPU model states for mixed-precision Adam (K = 12):
    /// stage 0: 16Ψ; 1: 4Ψ + 12Ψ/Nd; 2: 2Ψ + 14Ψ/Nd; 3: 16Ψ/Nd bytes.
    #[test]
    fn model_states_match_deepspeeds_per_stage_formulas() {
        let psi = 7.5e9;
        let mixed = per_param(Optimizer::AdamW, 4.0, true);
        for nd in [1u64, 2, 8, 64] {
            let n = nd as f64;
            let expected = [
                16.0 * psi,
                4.0 * psi + 12.0 * psi / n,
                2.0 * psi + 14.0 * psi / n,
                16.0 * psi / n,
            ];
            for (stage, want) in expected.iter().enumerate() {
                let (w, g, o) = model_states(mixed, psi, stage as u64, nd, false, false);
                let got = w + g + o;
                assert!(
                    (got - want).abs() < 1.0,
                    "stage {stage} Nd {nd}: {got} vs {want}"
                );
            }
        }
        // The paper's example: 7.5B parameters on 64 GPUs at stage 3 is 1.9 GB.
        let (w, g, o) = model_states(mixed, psi, 3, 64, false, false);
        assert!(((w + g + o) / 1e9 - 1.875).abs() < 0.01);
        // Offload removes the optimizer (and at stage 3 the parameters) from the GPU.
        let (_, _, o) = model_states(mixed, psi, 2, 8, true, false);
        assert_eq!(o, 0.0);
        // Variants: a Trainer's --bf16 over fp32 weights 16 bytes (4 + 4 + 8), 8-bit
        // Adam 10, weights loaded in bf16 8 (Adam's states in bf16), SGD 12.
        let t = |opt, wb, ds| {
            let (w, g, o) = model_states(per_param(opt, wb, ds), 1.0, 0, 1, false, false);
            w + g + o
        };
        assert_eq!(t(Optimizer::AdamW, 4.0, false), 16.0);
        assert_eq!(t(Optimizer::Adam8bit, 4.0, false), 10.0);
        assert_eq!(t(Optimizer::Adam8bit, 4.0, true), 10.0);
        assert_eq!(t(Optimizer::AdamW, 2.0, false), 8.0);
        assert_eq!(t(Optimizer::Sgd, 4.0, false), 12.0);
    }

    /// FSDP's CPU offload held by the settings (`fsdp_offload`): on, the states
    /// leave the GPU, optimizer's with the parameters'; off (an offload the
    /// command had, undone after a host OOM), they are back, whatever the
    /// command said.
    #[test]
    fn fsdps_offload_knob_moves_the_states_and_the_optimizer_with_them() {
        let cfg = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
            "num_attention_heads": 32, "vocab_size": 32000, "model_type": "llama"}"#;
        let mut m = ModelSpec::from_config_json("x", cfg).unwrap();
        let mut s = settings(1, 8, 2048, true, 0, 4);
        s.knobs.remove(&Knob::ZeroStage);
        s.knobs.remove(&Knob::OffloadOptimizer);
        s.fsdp_offload = true;
        let states = |m: &ModelSpec, s: &Settings| {
            let e = estimate(m, s, 1.0);
            e.total() - e.activations
        };
        for offload_written in [false, true] {
            m.fsdp = Fsdp::from_strategy("full_shard auto_wrap", "fsdp".into());
            m.fsdp.as_mut().unwrap().offload = offload_written;
            let off = states(&m, &s);
            let mut on = s.clone();
            on.knobs
                .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
            let on = states(&m, &on);
            assert!(on < off / 3.0, "written {offload_written}: {on} vs {off}");
        }
    }

    #[test]
    fn a_llama_config_gives_its_parameter_count() {
        // Llama-2-7B: 6.74B parameters.
        let cfg = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "hidden_act": "silu", "model_type": "llama"}"#;
        let m = ModelSpec::from_config_json("x", cfg).unwrap();
        assert!((m.params / 1e9 - 6.74).abs() < 0.05, "{}", m.params);
        // Checkpointing keeps much less activation memory.
        let a = estimate(&m, &settings(4, 1, 4096, false, 0, 1), 1.0).activations;
        let b = estimate(&m, &settings(4, 1, 4096, true, 0, 1), 1.0).activations;
        assert!(b < a / 5.0, "{a} {b}");
    }

    /// The activations' precision as measured on an H200: bf16 weights keep
    /// fewer fp32 tensors than fp32 weights under autocast, LoRA keeps autocast's
    /// whatever its base, and fp32 without mixed precision keeps the most.
    #[test]
    fn the_activation_factor_follows_what_is_trained_and_how() {
        let cfg = r#"{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632,
            "num_attention_heads": 16, "vocab_size": 32000, "model_type": "llama"}"#;
        let m = ModelSpec::from_config_json("x", cfg).unwrap();
        let half = ModelSpec {
            weight_bytes: 2.0,
            frozen_bytes: 2.0,
            ..m.clone()
        };
        let lora_on_half = ModelSpec {
            trainable: 0.01,
            weight_bytes: 4.0,
            frozen_bytes: 2.0,
            ..m.clone()
        };
        let fp32 = ModelSpec {
            no_mixed_precision: true,
            ..m.clone()
        };
        let half_no_amp = ModelSpec {
            no_mixed_precision: true,
            ..half.clone()
        };
        assert_eq!(m.act_factor(), AMP_FACTOR);
        assert_eq!(half.act_factor(), HALF_FACTOR);
        assert_eq!(lora_on_half.act_factor(), AMP_FACTOR);
        assert_eq!(fp32.act_factor(), FP32_FACTOR);
        assert_eq!(half_no_amp.act_factor(), HALF_FACTOR);
        const { assert!(HALF_FACTOR < AMP_FACTOR && AMP_FACTOR < FP32_FACTOR) };
    }

    /// The step reached decides how hard an OOM calibrates: after many good steps
    /// it is a spike (the peak overflowed, the steps before fit), calibrated to the
    /// OOM's figure with a small allowance; at the first step the steady overflow
    /// gets the full one. Either way the failed settings never fit again.
    #[test]
    fn an_oom_after_many_good_steps_is_a_spike_and_calibrates_less() {
        let cfg = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
            "num_attention_heads": 32, "vocab_size": 32000, "hidden_act": "silu", "model_type": "llama"}"#;
        let m = ModelSpec::from_config_json("x", cfg).unwrap();
        // Predicted at 63 GiB of 80; the OOM says more than 80.
        let s = settings(8, 2, 512, false, 2, 4);
        let oom = OomNumbers {
            tried_to_allocate_bytes: Some(1 << 30),
            total_bytes: Some(80 << 30),
            free_bytes: Some(1 << 30),
            ..Default::default()
        };
        let policy = crate::policy::Policy::load("default").unwrap();
        let after = |steps: Option<u64>| {
            let mut c = Calibrated::new(m.clone(), Some(80.0 * GIB));
            c.learn(&s, Some(&oom), steps);
            assert_eq!(c.fits(&s), Some(false), "{steps:?}");
            assert!(c.estimate(&s).total() > 80.0 * GIB, "{steps:?}");
            let cands = candidates(&policy, &s, &c);
            let best = pick(&cands, &s).map(|b| (b.settings.clone(), b.throughput));
            (c.scale, best)
        };
        let (steady, steady_pick) = after(Some(0));
        let (unknown, _) = after(None);
        let (early, _) = after(Some(SPIKE_STEPS - 1));
        let (spike, spike_pick) = after(Some(500));
        assert_eq!(
            steady, unknown,
            "an unknown step is calibrated as a steady overflow"
        );
        assert_eq!(steady, early);
        // The uncalibrated model predicted it to fit: a failed prediction too.
        let ratio = (UNSEEN_DEFICIT * FAILED) / (SPIKE_DEFICIT * SPIKE_FAILED);
        assert!((steady / spike - ratio).abs() < 1e-9, "{steady} {spike}");
        // After a spike micro-batch 4 at ZeRO 2 is predicted to fit; after a steady
        // overflow it takes gradient checkpointing instead, which is slower.
        let (sp, st) = (spike_pick.unwrap(), steady_pick.unwrap());
        assert_eq!(
            (
                sp.0.int(Knob::MicroBatch),
                sp.0.bool(Knob::GradCheckpointing),
                sp.0.int(Knob::ZeroStage)
            ),
            (Some(4), Some(false), Some(2))
        );
        assert_eq!(
            (
                st.0.int(Knob::MicroBatch),
                st.0.bool(Knob::GradCheckpointing),
                st.0.int(Knob::ZeroStage)
            ),
            (Some(8), Some(true), Some(2))
        );
        assert!(sp.1 > st.1, "{sp:?} {st:?}");
        // A prediction that failed after a spike is scaled up by 10%, not 50%.
        let fits_after = |steps| {
            let mut c = Calibrated::new(m.clone(), Some(80.0 * GIB));
            let ok = settings(1, 16, 4096, true, 2, 4);
            assert_eq!(c.fits(&ok), Some(true));
            let before = c.scale;
            c.learn(&ok, None, steps);
            assert_eq!(c.fits(&ok), Some(false));
            c.scale / before
        };
        let (spiked, steady) = (fits_after(Some(100)), fits_after(Some(1)));
        assert!(spiked < steady, "{spiked} {steady}");
    }

    #[test]
    fn a_failed_prediction_is_never_made_again() {
        let m = ModelSpec::from_params(1.3e9);
        let mut c = Calibrated::new(m, Some(24.0 * GIB));
        let s = settings(8, 1, 2048, false, 0, 1);
        let oom = OomNumbers {
            tried_to_allocate_bytes: Some(1 << 30),
            total_bytes: Some(24 << 30),
            free_bytes: Some(512 << 20),
            ..Default::default()
        };
        let before = c.scale;
        c.learn(&s, Some(&oom), None);
        assert!(c.scale >= before);
        assert_eq!(c.fits(&s), Some(false));
        assert!(c.estimate(&s).total() > 24.0 * GIB);
    }

    #[test]
    fn a_per_process_cap_is_the_budget_not_the_gpus_total() {
        // What PyTorch prints under torch.cuda.set_per_process_memory_fraction.
        let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 \
            has a total capacity of 79.19 GiB of which 74.01 GiB is free. Including non-PyTorch \
            memory, this process has 5.17 GiB memory in use. 4.00 GiB allowed; Of the allocated \
            memory 3.20 GiB is allocated by PyTorch, and 312.00 MiB is reserved by PyTorch but \
            unallocated.";
        let f = crate::detect::classify_log(text.as_bytes());
        let n = &f.numbers;
        assert_eq!(n.allowed_bytes, Some(4 << 30));
        let total = effective_total(n).unwrap();
        assert!((total - (4.0 * GIB + CONTEXT_BYTES)).abs() < 1.0, "{total}");
        let need = needed_at_least(n).unwrap();
        assert!(need > 4.0 * GIB && need < 5.5 * GIB, "{need}");
        let mut c = Calibrated::new(ModelSpec::from_params(0.1e9), Some(80.0 * GIB));
        c.learn(&settings(32, 1, 512, false, 0, 1), Some(n), None);
        assert_eq!(c.gpu_total, Some(total));
    }
}
