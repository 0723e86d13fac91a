//! Calibration: what the run showed corrects the model, the batch-independent
//! model states apart from the batch-dependent activations.
//!
//! An OOM's message is a lower bound on the whole: PyTorch names only the one
//! allocation that failed, so the attempt needed at least `total - free +
//! tried`, and more than the GPU. Its "allocated by PyTorch" figure is an upper
//! bound on what was allocated before the failure: the weights at least (all
//! the model states after a completed step). So an error in the states is
//! corrected in the states — never by inflating the activations, which would
//! shrink every smaller batch for it — and the rest of the deficit is the
//! activations'.

use serde::Serialize;

use super::{
    CONTEXT_BYTES, Estimate, FAILED, MARGIN, ModelSpec, SPIKE_DEFICIT, SPIKE_FAILED, SPIKE_STEPS,
    UNSEEN_DEFICIT, estimate_scaled, logits_bytes,
};
use crate::detect::OomNumbers;
use crate::knobs::Settings;

/// The states are never scaled below this by an OOM's allocated figure (an OOM
/// while the weights were still loading allocates less than the weights).
const STATES_FLOOR: f64 = 0.7;

/// How far the model states may be short of an OOM's allocated figure: the
/// buffers, padding and fragmentation no formula counts (the sizing benchmark's
/// hidden state costs are up to 10% over the formulas).
const STATES_ERROR: f64 = 1.10;

/// When the states were predicted to fit and did not, they grow by this much
/// beyond what the OOM proves (their error is a few buffers, not the batch's
/// unseen tensors: the OOM's own figure is already 2% over the GPU).
const STATES_DEFICIT: f64 = 1.02;

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

/// The model with what the run showed: the GPU's size and the two scales.
#[derive(Debug, Clone, Serialize)]
pub struct Calibrated {
    pub model: ModelSpec,
    /// Bytes of the GPU (from an OOM message, NVML or `--gpu-memory`).
    pub gpu_total: Option<f64>,
    /// Multiplies the activation term (batch-dependent); 1.0 until an OOM says otherwise.
    pub scale: f64,
    /// Multiplies the model states (batch-independent); 1.0 until evidence says otherwise.
    pub state_scale: f64,
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
            state_scale: 1.0,
            failed: Vec::new(),
        }
    }

    pub fn estimate(&self, s: &Settings) -> Estimate {
        estimate_scaled(&self.model, s, self.scale, self.state_scale)
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

    /// Within the model's error ([`super::NEAR`]) of the whole GPU, and never failed.
    pub fn near(&self, s: &Settings) -> bool {
        self.gpu_total.is_some_and(|t| {
            self.estimate(s).total() <= t * (1.0 + super::NEAR) && !self.failed.contains(s)
        })
    }

    pub fn fits(&self, s: &Settings) -> Option<bool> {
        let b = self.budget()?;
        Some(self.estimate(s).total() <= b && !self.failed.contains(s))
    }

    /// Learn from an OOM of settings `s` after `steps_done` good steps of the
    /// attempt: the model states shrink to the OOM's allocated figure where
    /// they were over it; the activation term grows until `s` needs more than
    /// the GPU and more than the OOM showed, times an allowance for the part of
    /// the deficit no message shows; a prediction that failed is scaled up
    /// further each time it fails again.
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
        // The states: what was allocated when the allocation failed holds the
        // weights (after a completed step, every model state) — never less. And
        // states predicted below it may be short by up to their own error
        // ([`STATES_ERROR`]): the figure cannot tell states from the activations
        // allocated before the failure, so no more than that.
        if let Some(alloc) = oom.and_then(|o| o.allocated_bytes).map(|a| a as f64) {
            let e = self.estimate(s);
            let states = e.weights + e.gradients + e.optimizer;
            let held = if steps_done.unwrap_or(0) >= 1 {
                states
            } else {
                e.weights
            };
            if held > alloc && held > 0.0 {
                self.state_scale *= (alloc / held).max(STATES_FLOOR);
            } else if states > 0.0 && alloc > states {
                self.state_scale *= (alloc / states).min(STATES_ERROR);
            }
        }
        let mut need = oom.and_then(needed_at_least).unwrap_or(0.0);
        if let Some(t) = self.gpu_total {
            // It did not fit: it needed more than the whole GPU (PyTorch names
            // only the one allocation that failed, not the whole deficit).
            need = need.max(t * 1.02);
        }
        let allowance = if spike { SPIKE_DEFICIT } else { UNSEEN_DEFICIT };
        let e = self.estimate(s);
        let logits = logits_bytes(&self.model, s);
        let states = e.weights + e.gradients + e.optimizer;
        let act = (e.activations - logits).max(1.0);
        // The deficit goes to the term that dominates the failed settings: a
        // small batch that OOMs says the states are short (raising the
        // activations for it would shrink every batch for nothing); a large
        // one, the activations.
        if states > act && states > 0.0 {
            let rest = e.total() - states;
            // Only a deficit the model did not predict says the states are short.
            if need > e.total() {
                self.state_scale *= (need - rest) / states;
            }
            if predicted_fit {
                self.state_scale *= STATES_DEFICIT;
            }
            return;
        }
        let fixed = e.total() - e.activations + logits;
        if need > e.total() {
            self.scale *= (need - fixed).max(act) / act;
        }
        // The deficit is only known from below: allow for the rest of it.
        self.scale *= allowance;
        if predicted_fit {
            self.scale *= if spike { SPIKE_FAILED } else { FAILED };
        }
    }
}
