//! The memory model: per-GPU estimate of weights, gradients, optimizer states,
//! activations and the CUDA context for given settings, calibrated by evidence,
//! and the choice of the fastest settings the policy allows that fit.
//!
//! Theory of operation: the model states (weights, gradients, optimizer) follow
//! from the parameter count, the optimizer and the ZeRO stage exactly as in the
//! ZeRO paper (mixed-precision Adam: 2Ψ + 2Ψ + 12Ψ bytes, sharded over the
//! world size by stage, removed from the GPU by offload). Activations follow
//! from the architecture (hidden size, layers, MLP width, vocabulary) per
//! sample per token, the one term that is hard to know ahead: an OOM's numbers
//! calibrate it. PyTorch names only the one allocation that failed, so an OOM
//! says the run needed at least `total - free + tried`; the activation term is
//! scaled up until the failed settings are predicted not to fit, and each further
//! OOM of a prediction scales it up again, so a failed prediction is never
//! made twice.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::command::Command;
use crate::detect::OomNumbers;
use crate::knobs::{Knob, Offload, Settings, Value};

pub const GIB: f64 = (1u64 << 30) as f64;
/// The CUDA context and NCCL buffers: about 500 MiB per process.
pub const CONTEXT_BYTES: f64 = 500.0 * (1u64 << 20) as f64;
/// After an OOM the activation term is scaled by this much beyond what the
/// message proves: PyTorch names only the allocation that failed, and the
/// allocations after it are unseen.
pub const UNSEEN_DEFICIT: f64 = 1.25;
/// A candidate fits when it is predicted to leave this share of the GPU free.
pub const MARGIN: f64 = 0.05;
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

/// How the optimizer keeps its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// fp16/bf16 weights and gradients, fp32 master weights, Adam m and v: 16 bytes/parameter.
    MixedAdam,
    /// bitsandbytes 8-bit Adam: fp32 master weights and 1-byte m and v.
    Adam8bit,
    /// bf16 weights, gradients and Adam states, no master weights: 8 bytes/parameter.
    Bf16Adam,
}

impl Optimizer {
    /// Bytes per trainable parameter: (weights, gradients, optimizer states).
    pub fn bytes(self) -> (f64, f64, f64) {
        match self {
            Optimizer::MixedAdam => (2.0, 2.0, 12.0),
            Optimizer::Adam8bit => (2.0, 2.0, 6.0),
            Optimizer::Bf16Adam => (2.0, 2.0, 4.0),
        }
    }
}

/// What the model is, as read from its config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Where it was read: a config.json path, or `--knob params=N`.
    pub source: String,
    pub params: f64,
    pub hidden: f64,
    pub layers: f64,
    pub intermediate: f64,
    pub vocab: f64,
    /// Trainable share of the parameters (LoRA adapters: about 1%).
    pub trainable: f64,
    /// Bytes per frozen weight (2; QLoRA 4-bit: 0.5).
    pub frozen_bytes: f64,
    pub optimizer: Optimizer,
}

impl ModelSpec {
    /// From a Hugging Face `config.json`'s text.
    pub fn from_config_json(source: &str, text: &str) -> Option<ModelSpec> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let v = v.get("text_config").filter(|t| t.is_object()).unwrap_or(&v);
        let num = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| v.get(*k).and_then(|x| x.as_f64()))
                .filter(|x| *x > 0.0)
        };
        let hidden = num(&["hidden_size", "n_embd", "d_model", "dim"])?;
        let layers = num(&["num_hidden_layers", "n_layer", "num_layers", "n_layers"])?;
        let vocab = num(&["vocab_size"]).unwrap_or(32000.0);
        let intermediate =
            num(&["intermediate_size", "n_inner", "ffn_dim", "d_ff"]).unwrap_or(4.0 * hidden);
        let gated =
            intermediate < 4.0 * hidden * 0.99 || v.get("hidden_act").is_some_and(|a| a == "silu");
        let heads = num(&["num_attention_heads", "n_head"]).unwrap_or(hidden / 128.0);
        let kv = num(&["num_key_value_heads"]).unwrap_or(heads);
        let head_dim = hidden / heads.max(1.0);
        // Attention: q and o are h×h, k and v h×(kv·head_dim); MLP: 3 (gated) or 2 matrices.
        let attn = 2.0 * hidden * hidden + 2.0 * hidden * kv * head_dim;
        let mlp = if gated { 3.0 } else { 2.0 } * hidden * intermediate;
        let tied = v
            .get("tie_word_embeddings")
            .and_then(|t| t.as_bool())
            .unwrap_or(false);
        let embed = vocab * hidden * if tied { 1.0 } else { 2.0 };
        let params = layers * (attn + mlp) + embed;
        Some(ModelSpec {
            source: source.to_string(),
            params,
            hidden,
            layers,
            intermediate,
            vocab,
            trainable: 1.0,
            frozen_bytes: 2.0,
            optimizer: Optimizer::MixedAdam,
        })
    }

    /// From a parameter count alone (`--knob params=7e9`): a Llama-shaped
    /// architecture of that size.
    pub fn from_params(params: f64) -> ModelSpec {
        // Llama's shape: 12·h² per layer with about h/128 layers.
        let hidden = ((params * 128.0 / 12.0).cbrt() / 128.0).round().max(1.0) * 128.0;
        let layers = (params / (12.0 * hidden * hidden)).round().max(1.0);
        ModelSpec {
            source: format!("--knob params={params:e}"),
            params,
            hidden,
            layers,
            intermediate: 8.0 / 3.0 * hidden,
            vocab: 32000.0,
            trainable: 1.0,
            frozen_bytes: 2.0,
            optimizer: Optimizer::MixedAdam,
        }
    }
}

/// Where the command's model config is: a local `--model_name_or_path`
/// folder, a hub name in the Hugging Face cache, or a recipe's `base_model`.
pub fn find_model(
    cmd: &Command,
    recipe_values: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<ModelSpec> {
    let mut names: Vec<String> = cmd
        .value(&[
            "--model_name_or_path",
            "--model_name",
            "--model",
            "--base_model",
            "--model.model_name",
        ])
        .map(str::to_string)
        .into_iter()
        .collect();
    names.extend(recipe_values.iter().cloned());
    let mut spec = names.iter().find_map(|n| config_for(n, env))?;
    // The common variants, from the command's own words.
    let words = cmd.args.join(" ").to_ascii_lowercase();
    if words.contains("adamw_8bit")
        || words.contains("adamw_bnb_8bit")
        || words.contains("paged_adamw_8bit")
    {
        spec.optimizer = Optimizer::Adam8bit;
    }
    if words.contains("pure_bf16") {
        spec.optimizer = Optimizer::Bf16Adam;
    }
    if words.contains("--use_peft") || words.contains("lora") {
        spec.trainable = 0.01;
    }
    if words.contains("load_in_4bit") || words.contains("qlora") {
        spec.trainable = 0.01;
        spec.frozen_bytes = 0.5;
    }
    Some(spec)
}

/// The models a recipe names (`base_model:`, `model_name_or_path:`), read from
/// the config files the command names.
pub fn recipe_models<'a>(files: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let Ok(text) = crate::untrusted::read_config(Path::new(f)) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            for key in [
                "base_model",
                "model_name_or_path",
                "pretrained_model_name_or_path",
            ] {
                if let Some(rest) = line
                    .strip_prefix(key)
                    .and_then(|r| r.trim_start().strip_prefix(':'))
                {
                    let v = rest.trim().trim_matches(['"', '\'']);
                    if !v.is_empty() {
                        out.push(v.to_string());
                    }
                }
            }
        }
    }
    out
}

/// The `config.json` of a local folder or of a hub name in the HF cache.
fn config_for(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<ModelSpec> {
    let local = Path::new(name).join("config.json");
    if let Ok(t) = crate::untrusted::read_config(&local) {
        return ModelSpec::from_config_json(&local.display().to_string(), &t);
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
    dirs.iter().rev().find_map(|d| {
        let p = d.join("config.json");
        let t = crate::untrusted::read_config(&p).ok()?;
        ModelSpec::from_config_json(&p.display().to_string(), &t)
    })
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

/// Per-GPU bytes of weights, gradients and optimizer states (the ZeRO paper's
/// model states) for `params` trainable parameters at `stage` over `world` ranks.
pub fn model_states(
    opt: Optimizer,
    params: f64,
    stage: u64,
    world: u64,
    offload_opt: bool,
    offload_param: bool,
) -> (f64, f64, f64) {
    let n = world.max(1) as f64;
    let (w, g, o) = opt.bytes();
    let shard = |s: u64| if stage >= s { n } else { 1.0 };
    let weights = if offload_param {
        0.0
    } else {
        w * params / shard(3)
    };
    let grads = g * params / shard(2);
    let optim = if offload_opt {
        0.0
    } else {
        o * params / shard(1)
    };
    (weights, grads, optim)
}

/// Activation bytes per layer per token: Korthikanti et al.'s bf16 count with
/// flash attention (no s² term), 16·h for attention and norms and 4.5·I for the
/// MLP, times [`AMP_FACTOR`].
fn act_per_layer_token(m: &ModelSpec) -> f64 {
    AMP_FACTOR * (16.0 * m.hidden + 4.5 * m.intermediate)
}

/// Measured, not derived: a Hugging Face Trainer run with `--bf16` keeps fp32 weights
/// and autocasts only the matrix products, so the residual stream, norms and
/// activation functions keep fp32 tensors. On an H100 (torch 2.11, transformers
/// 5.17, Llama-shaped models of 0.17B and 0.95B, sdpa attention) the peak fitted
/// 1.95× the bf16 count per layer and 13.2 bytes per vocabulary entry per token
/// (`examples/gpu_checks.sh`, `tests/real/gpu_estimate_check.py`).
const AMP_FACTOR: f64 = 1.9;

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
        stage: s.int(Knob::ZeroStage).unwrap_or(0),
        off_opt: off(Knob::OffloadOptimizer),
        off_param: off(Knob::OffloadParam),
        world: s.world_size.max(1),
    }
}

/// The sequence length assumed when the command binds none.
pub const DEFAULT_SEQ: u64 = 2048;

/// Estimate per GPU for settings `s`; `calib` scales the activation term.
pub fn estimate(m: &ModelSpec, s: &Settings, calib: f64) -> Estimate {
    let v = view(s, DEFAULT_SEQ);
    let trainable = m.params * m.trainable;
    let (mut w, g, o) = model_states(
        m.optimizer,
        trainable,
        v.stage,
        v.world,
        v.off_opt,
        v.off_param,
    );
    // Frozen weights (LoRA's base model) are sharded only by ZeRO-3.
    let frozen = m.params - trainable;
    if frozen > 0.0 && !v.off_param {
        w += frozen * m.frozen_bytes / if v.stage >= 3 { v.world as f64 } else { 1.0 };
    }
    if v.off_param {
        // Two layers' weights gathered at a time.
        w = 2.0 * 2.0 * m.params / m.layers.max(1.0);
    }
    let tokens = v.micro * v.seq;
    let per_layer = act_per_layer_token(m) * tokens;
    let layers = if v.gc {
        // Each layer's input is kept; one layer's activations are recomputed at a time.
        2.0 * m.hidden * tokens * m.layers + per_layer
    } else {
        per_layer * m.layers
    };
    Estimate {
        weights: w,
        gradients: g,
        optimizer: o,
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

/// What an OOM says the attempt needed at least, in bytes: everything in use on
/// the GPU plus the allocation that failed (`total - free + tried`), or `None`
/// when the message lacks the numbers.
pub fn needed_at_least(o: &OomNumbers) -> Option<f64> {
    let tried = o.tried_to_allocate_bytes? as f64;
    if o.allowed_bytes.is_some() {
        // Under a per-process cap the GPU's free memory says nothing of this
        // process: what its allocator held, plus the allocation, plus the context.
        return o.allocated_bytes.map(|a| {
            a as f64 + o.reserved_unallocated_bytes.unwrap_or(0) as f64 + CONTEXT_BYTES + tried
        });
    }
    match (o.total_bytes, o.free_bytes) {
        (Some(t), Some(f)) => Some(t as f64 - f as f64 + tried),
        _ => o.allocated_bytes.map(|a| {
            a as f64 + o.reserved_unallocated_bytes.unwrap_or(0) as f64 + CONTEXT_BYTES + tried
        }),
    }
}

/// The memory this process may use, by an OOM message: the GPU's total, or under a
/// per-process cap (`"4.00 GiB allowed;"`) the cap plus the CUDA context it leaves out.
pub fn effective_total(o: &OomNumbers) -> Option<f64> {
    match (o.allowed_bytes, o.total_bytes) {
        (Some(a), Some(t)) => Some((a as f64 + CONTEXT_BYTES).min(t as f64)),
        (Some(a), None) => Some(a as f64 + CONTEXT_BYTES),
        (None, t) => t.map(|t| t as f64),
    }
}

/// The model with what the run showed: the GPU's size and the activation scale.
#[derive(Debug, Clone, Serialize)]
pub struct Calibrated {
    pub model: ModelSpec,
    /// Bytes of the GPU (from an OOM message, NVML or `--gpu-memory`).
    pub gpu_total: Option<f64>,
    /// Multiplies the activation term; 1.0 until an OOM says otherwise.
    pub scale: f64,
    /// Settings that OOMed: never predicted to fit again.
    #[serde(skip)]
    pub failed: Vec<Settings>,
}

impl Calibrated {
    pub fn new(model: ModelSpec, gpu_total: Option<f64>) -> Calibrated {
        Calibrated {
            model,
            gpu_total,
            scale: 1.0,
            failed: Vec::new(),
        }
    }

    pub fn estimate(&self, s: &Settings) -> Estimate {
        estimate(&self.model, s, self.scale)
    }

    /// The most a candidate may be predicted to use.
    pub fn budget(&self) -> Option<f64> {
        self.gpu_total.map(|t| t * (1.0 - MARGIN))
    }

    /// Fits the whole GPU, without the margin, and never failed.
    pub fn fits_whole_gpu(&self, s: &Settings) -> bool {
        self.gpu_total
            .is_some_and(|t| self.estimate(s).total() <= t && !self.failed.contains(s))
    }

    pub fn fits(&self, s: &Settings) -> Option<bool> {
        let b = self.budget()?;
        Some(self.estimate(s).total() <= b && !self.failed.contains(s))
    }

    /// Learn from an OOM of settings `s` after `steps_done` good steps of the
    /// attempt: the activation term grows until `s` needs more than the GPU and
    /// more than the OOM showed, times an allowance for the part of the
    /// deficit no message shows; a prediction that failed is scaled up further
    /// each time it fails again.
    ///
    /// The rule for the step reached: an OOM before [`SPIKE_STEPS`] good steps
    /// (or with the step unknown) is a steady overflow: every step needs more
    /// than the GPU, by an unknown amount — the allowance is a quarter
    /// ([`UNSEEN_DEFICIT`]) and a failed prediction half again ([`FAILED`]).
    /// After [`SPIKE_STEPS`] or more, the steps before it fit: the run needs the
    /// OOM's figure only at its peak (the model's activations are those of the
    /// longest sequence, the peak's), so the term is scaled only to that figure,
    /// with 15% ([`SPIKE_DEFICIT`]) for the unseen rest and 10% ([`SPIKE_FAILED`])
    /// for a failed prediction. The failed settings are never predicted to fit
    /// again either way.
    pub fn learn(&mut self, s: &Settings, oom: Option<&OomNumbers>, steps_done: Option<u64>) {
        let spike = steps_done.is_some_and(|n| n >= SPIKE_STEPS);
        if let Some(t) = oom.and_then(effective_total) {
            self.gpu_total = Some(t);
        }
        let predicted_fit = self.fits(s) == Some(true);
        self.failed.push(s.clone());
        let e = self.estimate(s);
        let logits = logits_bytes(&self.model, s);
        let fixed = e.total() - e.activations + logits;
        let act = (e.activations - logits).max(1.0);
        let mut need = oom.and_then(needed_at_least).unwrap_or(0.0);
        if let Some(t) = self.gpu_total {
            // It did not fit: it needed more than the whole GPU (PyTorch names
            // only the one allocation that failed, not the whole deficit).
            need = need.max(t * 1.02);
        }
        if need > e.total() {
            self.scale *= (need - fixed).max(act) / act;
        }
        // The deficit is only known from below: allow for the rest of it.
        self.scale *= if spike { SPIKE_DEFICIT } else { UNSEEN_DEFICIT };
        if predicted_fit {
            self.scale *= if spike { SPIKE_FAILED } else { FAILED };
        }
    }
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
    // without it, comes before a shorter sequence.
    let tight = || {
        cands
            .iter()
            .filter(|c| c.settings.int(Knob::SeqLen) == seq0 && c.fits_without_margin)
            .min_by(|a, b| a.estimate.total().total_cmp(&b.estimate.total()))
    };
    best(true).or_else(tight).or_else(|| best(false))
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
) -> Option<crate::policy::Decision> {
    let cands = candidates(policy, cur, cal);
    let best = pick(&cands, cur)?;
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
            "{evidence}{spike}: {}{gb}; the memory model ({}) predicts {} of {} per GPU, {why}",
            changed.join(", "),
            cal.model.source,
            gib(best.estimate.total()),
            gib(cal.gpu_total.unwrap_or(0.0)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        }
    }

    /// The ZeRO paper's per-GPU model states for mixed-precision Adam (K = 12):
    /// stage 0: 16Ψ; 1: 4Ψ + 12Ψ/Nd; 2: 2Ψ + 14Ψ/Nd; 3: 16Ψ/Nd bytes.
    #[test]
    fn model_states_match_deepspeeds_per_stage_formulas() {
        let psi = 7.5e9;
        for nd in [1u64, 2, 8, 64] {
            let n = nd as f64;
            let expected = [
                16.0 * psi,
                4.0 * psi + 12.0 * psi / n,
                2.0 * psi + 14.0 * psi / n,
                16.0 * psi / n,
            ];
            for (stage, want) in expected.iter().enumerate() {
                let (w, g, o) =
                    model_states(Optimizer::MixedAdam, psi, stage as u64, nd, false, false);
                let got = w + g + o;
                assert!(
                    (got - want).abs() < 1.0,
                    "stage {stage} Nd {nd}: {got} vs {want}"
                );
            }
        }
        // The paper's example: 7.5B parameters on 64 GPUs at stage 3 is 1.9 GB.
        let (w, g, o) = model_states(Optimizer::MixedAdam, psi, 3, 64, false, false);
        assert!(((w + g + o) / 1e9 - 1.875).abs() < 0.01);
        // Offload removes the optimizer (and at stage 3 the parameters) from the GPU.
        let (_, _, o) = model_states(Optimizer::MixedAdam, psi, 2, 8, true, false);
        assert_eq!(o, 0.0);
        // Variants: 8-bit Adam 10 bytes, bf16 without master weights 8 bytes.
        let t = |opt| {
            let (w, g, o) = model_states(opt, 1.0, 0, 1, false, false);
            w + g + o
        };
        assert_eq!(t(Optimizer::Adam8bit), 10.0);
        assert_eq!(t(Optimizer::Bf16Adam), 8.0);
    }

    #[test]
    fn a_llama_config_gives_its_parameter_count() {
        // Llama-2-7B: 6.74B parameters.
        let cfg = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "hidden_act": "silu"}"#;
        let m = ModelSpec::from_config_json("x", cfg).unwrap();
        assert!((m.params / 1e9 - 6.74).abs() < 0.05, "{}", m.params);
        // Checkpointing keeps much less activation memory.
        let a = estimate(&m, &settings(4, 1, 4096, false, 0, 1), 1.0).activations;
        let b = estimate(&m, &settings(4, 1, 4096, true, 0, 1), 1.0).activations;
        assert!(b < a / 5.0, "{a} {b}");
    }

    /// The step reached decides how hard an OOM calibrates: after many good steps
    /// it is a spike (the peak overflowed, the steps before fit), calibrated to the
    /// OOM's figure with a small allowance; at the first step the steady overflow
    /// gets the full one. Either way the failed settings never fit again.
    #[test]
    fn an_oom_after_many_good_steps_is_a_spike_and_calibrates_less() {
        let cfg = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
            "num_attention_heads": 32, "vocab_size": 32000, "hidden_act": "silu"}"#;
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
