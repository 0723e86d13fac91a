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
//!
//! With two points — an OOM at one batch and the NVML peak of an attempt that
//! ran at another ([`Calibrated::learn_peak`]) — the two terms are solved for
//! apart: the line goes through the measured peak, its slope is what the OOM
//! proves (never below the slope known before: the OOM's figure is a lower
//! bound), and an error that is the same at both batches moves the constant.

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

/// How far an OOM may raise states that dominate the failed settings; a
/// deficit beyond this is the activations'.
const STATES_CAP: f64 = 1.15;

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
    /// Boxed: a verdict carries the calibrated model, and the spec is most of it.
    pub model: Box<ModelSpec>,
    /// Bytes of the GPU (from an OOM message, NVML or `--gpu-memory`).
    pub gpu_total: Option<f64>,
    /// Multiplies the activation term (batch-dependent); 1.0 until an OOM says otherwise.
    pub scale: f64,
    /// Multiplies the model states (batch-independent); 1.0 until evidence says otherwise.
    pub state_scale: f64,
    /// Settings that OOMed: never predicted to fit again.
    #[serde(skip)]
    pub failed: Vec<Settings>,
    /// Peaks measured (NVML, per GPU) of attempts that ran without an OOM:
    /// the second point of a two-point calibration ([`Calibrated::learn`]).
    #[serde(skip)]
    pub measured: Vec<(Settings, f64)>,
    /// The activations' slope two points proved (1.0 until then): the least a
    /// later two-point solve takes, the OOM's figure being a lower bound.
    #[serde(skip)]
    slope_floor: f64,
    /// The measured point the last OOM was solved with, said in its decision.
    #[serde(skip)]
    pub two_points: Option<String>,
}

/// One settings' estimate in the calibration's terms: the model states
/// (scaled by `state_scale`), the layers' activations (scaled by `scale`),
/// and what neither scales (the logits, the context). Unscaled.
#[derive(Debug, Clone, Copy)]
struct Terms {
    states: f64,
    layers: f64,
    fixed: f64,
}

impl Calibrated {
    pub fn new(model: ModelSpec, gpu_total: Option<f64>) -> Calibrated {
        Calibrated {
            model: Box::new(model),
            gpu_total,
            scale: 1.0,
            state_scale: 1.0,
            failed: Vec::new(),
            measured: Vec::new(),
            slope_floor: 1.0,
            two_points: None,
        }
    }

    fn terms(&self, s: &Settings) -> Terms {
        let e = estimate_scaled(&self.model, s, 1.0, 1.0);
        let logits = logits_bytes(&self.model, s);
        Terms {
            states: e.weights + e.gradients + e.optimizer,
            layers: (e.activations - logits).max(0.0),
            fixed: logits + e.context,
        }
    }

    /// Learn from the peak an attempt at settings `s` reached without an OOM
    /// (NVML's, per GPU, context included). Alone it is one point: where it
    /// is over the prediction, the batch-independent constant moves up to it
    /// (an under-prediction that no batch explains better); it is kept as the
    /// second point for the next OOM ([`Calibrated::learn`]).
    pub fn learn_peak(&mut self, s: &Settings, peak: f64) {
        if peak <= 0.0 {
            return;
        }
        let t = self.terms(s);
        let predicted = self.estimate(s).total();
        if peak > predicted && t.states > 0.0 {
            self.state_scale += (peak - predicted) / t.states;
        }
        self.measured.retain(|(m, _)| m != s);
        self.measured.push((s.clone(), peak));
    }

    /// Two points at different batches: the OOM's `need` at `s` (at least;
    /// `total - free + tried`) and a measured peak. Solves for the states'
    /// constant and the activations' slope apart: the line passes through the
    /// measured peak (exact), and its slope is what the OOM proves — never
    /// less than the scale before, since the OOM's figure is only a lower
    /// bound on what the failed batch needed. An error in the states moves
    /// the constant, never the activations. `false` when no measured point
    /// makes a second point (same batch, or a solution out of bounds).
    fn learn_two_points(&mut self, s: &Settings, need: f64) -> bool {
        let t1 = self.terms(s);
        let Some((t2, peak, at)) = self
            .measured
            .iter()
            .rev()
            .map(|(m, p)| (self.terms(m), *p, m))
            .find(|(t2, _, _)| {
                // Points whose activations differ by under a tenth tell the
                // two terms apart too poorly.
                t2.layers > 0.0 && (t1.layers / t2.layers - 1.0).abs() > 0.1 && t2.states > 0.0
            })
        else {
            return false;
        };
        // c·S1 + a·L1 = need − X1;  c·S2 + a·L2 = peak − X2.
        let (y1, y2) = (need - t1.fixed, peak - t2.fixed);
        let det = t1.states * t2.layers - t2.states * t1.layers;
        if det.abs() < 1e-9 * t1.states.max(1.0) * t2.layers.max(1.0) {
            return false;
        }
        let a_solved = (t1.states * y2 - t2.states * y1) / det;
        // The OOM's figure is at least what the failed batch needed: above the
        // measured batch the slope is at least `a_solved` (below, at most).
        let a = if t1.layers > t2.layers {
            a_solved.max(self.slope_floor)
        } else {
            a_solved.min(self.slope_floor)
        };
        let c = (y2 - a * t2.layers) / t2.states;
        if !(0.3..=3.0).contains(&a) || !(STATES_FLOOR..=2.0).contains(&c) {
            return false;
        }
        self.scale = a;
        self.state_scale = c;
        self.slope_floor = a;
        self.two_points = Some(format!(
            "solved on two points, this OOM and the peak measured at {} ({}): model states ×{c:.2}, activations ×{a:.2}",
            at.knobs
                .iter()
                .filter(|(k, v)| s.knobs.get(k) != Some(v))
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            super::gib(peak)
        ));
        true
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
        self.two_points = None;
        // A measured peak at another batch: two points, the terms apart.
        if let Some(need) = oom.and_then(needed_at_least) {
            let need = need.max(self.gpu_total.map_or(0.0, |t| t * 1.02));
            if self.learn_two_points(s, need) {
                return;
            }
        }
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
            } else if states > 0.0 && alloc > states + e.activations {
                // Up to the whole predicted activations of what was allocated
                // may be the batch's (an OOM in the forward pass holds part of
                // them): only a figure beyond states and activations both says
                // the states are short. (Charging the states with the partial
                // activations made a Qwen2 run of benches/sizing.py, seed 7,
                // take checkpointing at micro-batch 1 where micro-batch 1 fit.)
                let short = alloc - e.activations;
                self.state_scale *= (short / states).min(STATES_ERROR);
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
        let mut deficit = (need - e.total()).max(0.0);
        // Where the states dominate the failed settings (a small batch, a large
        // model) the deficit is theirs first, up to their own error
        // ([`STATES_CAP`]): raising the activations for it would shrink every
        // batch for nothing. What is left, and any deficit where the
        // activations dominate (a large batch), is the activations'.
        if states > act && states > 0.0 {
            let to_states = deficit.min(states * (STATES_CAP - 1.0));
            self.state_scale *= (states + to_states) / states;
            deficit -= to_states;
            if deficit <= 0.0 {
                if predicted_fit {
                    self.state_scale *= STATES_DEFICIT;
                }
                return;
            }
        }
        self.scale *= (act + deficit) / act;
        // The deficit is only known from below: allow for the rest of it.
        self.scale *= allowance;
        if predicted_fit {
            self.scale *= if spike { SPIKE_FAILED } else { FAILED };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::{Knob, Value};
    use crate::memory::GIB;
    use std::collections::BTreeMap;

    fn settings(micro: u64, gc: bool) -> Settings {
        let mut knobs = BTreeMap::new();
        knobs.insert(Knob::MicroBatch, Value::Int(micro));
        knobs.insert(Knob::GradAccum, Value::Int(64 / micro));
        knobs.insert(Knob::SeqLen, Value::Int(2048));
        knobs.insert(Knob::GradCheckpointing, Value::Bool(gc));
        Settings {
            knobs,
            world_size: 1,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        }
    }

    fn oom(total_gib: u64, allocated: f64) -> OomNumbers {
        OomNumbers {
            tried_to_allocate_bytes: Some(256 << 20),
            total_bytes: Some(total_gib << 30),
            free_bytes: Some(100 << 20),
            allocated_bytes: Some(allocated as u64),
            ..Default::default()
        }
    }

    /// A small batch that OOMs by a little says the states are short: they
    /// grow, the activations do not (else every smaller batch would shrink for
    /// nothing). A large batch's OOM is the activations'.
    #[test]
    fn the_deficit_goes_to_the_term_that_dominates() {
        let m = ModelSpec::from_params(1.3e9);
        let small = settings(1, true);
        let mut c = Calibrated::new(m.clone(), None);
        let e = c.estimate(&small);
        // A GPU a little larger than the prediction: the OOM shows a deficit.
        let gpu = (e.total() * 1.03 / GIB).ceil() as u64;
        c.learn(&small, Some(&oom(gpu, e.weights)), Some(0));
        assert_eq!(c.scale, 1.0, "activations untouched");
        assert!(c.state_scale > 1.0 && c.state_scale <= STATES_CAP * STATES_DEFICIT);
        assert!(c.estimate(&small).total() > (gpu << 30) as f64);

        let large = settings(64, false);
        let mut c = Calibrated::new(m, None);
        let e = c.estimate(&large);
        c.learn(&large, Some(&oom(24, e.weights)), Some(0));
        assert_eq!(c.state_scale, 1.0, "states untouched");
        assert!(c.scale >= UNSEEN_DEFICIT);
    }

    /// The OOM's allocated figure holds the weights: weights predicted above it
    /// were over, and the states come down to it.
    #[test]
    fn states_over_the_ooms_allocated_figure_come_down() {
        let m = ModelSpec::from_params(1.3e9);
        let s = settings(64, false);
        let mut c = Calibrated::new(m, None);
        let w = c.estimate(&s).weights;
        c.learn(&s, Some(&oom(24, 0.8 * w)), Some(0));
        assert!((c.state_scale - 0.8).abs() < 1e-9, "{}", c.state_scale);
    }
    /// A hidden truth: the model's own terms with the states times `cs` and
    /// the layers' activations times `ca`.
    fn truth(c: &Calibrated, s: &Settings, cs: f64, ca: f64) -> f64 {
        let t = c.terms(s);
        cs * t.states + ca * t.layers + t.fixed
    }

    /// An OOM at `s` whose `total - free + tried` is `need`, on a GPU of `gpu` bytes.
    fn oom_needing(gpu: f64, need: f64) -> OomNumbers {
        let free = 64u64 << 20;
        OomNumbers {
            tried_to_allocate_bytes: Some((need - gpu + free as f64) as u64),
            total_bytes: Some(gpu as u64),
            free_bytes: Some(free),
            ..Default::default()
        }
    }

    /// Two points — an OOM at micro-batch 16, a measured peak at 4 — against
    /// hidden truths: an error in the states moves the constant and leaves
    /// the activations; an error in the activations moves the slope and
    /// leaves the constant; either way the next prediction (micro-batch 8) is
    /// within ±10% of the truth.
    #[test]
    fn two_points_find_the_term_that_is_wrong() {
        let m = ModelSpec::from_params(1.3e9);
        // (states' hidden factor, activations' hidden factor, the OOM's figure
        // as a share of what micro-batch 16 needed: 1.0 when it failed at the
        // last allocation, less when earlier).
        let table = [
            (1.2, 1.0, 1.0),
            (0.9, 1.0, 1.0),
            (1.0, 1.3, 1.0),
            (1.0, 0.85, 1.0),
            (1.1, 1.25, 1.0),
            (1.08, 1.15, 0.97),
        ];
        for (cs, ca, seen) in table {
            let mut c = Calibrated::new(m.clone(), None);
            let (b1, b2, b3) = (settings(16, false), settings(4, false), settings(8, false));
            let need = truth(&c, &b1, cs, ca);
            let gpu = need / 1.1;
            c.gpu_total = Some(gpu);
            c.learn_peak(&b2, truth(&c, &b2, cs, ca));
            c.learn(&b1, Some(&oom_needing(gpu, need * seen)), Some(0));
            let case = format!("states x{cs}, activations x{ca}, OOM figure x{seen}");
            if ca == 1.0 && seen == 1.0 {
                assert!(
                    (c.scale - 1.0).abs() < 1e-6,
                    "{case}: activations moved to {}",
                    c.scale
                );
                assert!(
                    (c.state_scale - cs).abs() < 1e-6,
                    "{case}: states {}",
                    c.state_scale
                );
            }
            if cs == 1.0 && ca > 1.0 {
                assert!(
                    (c.state_scale - 1.0).abs() < 1e-6,
                    "{case}: states moved to {}",
                    c.state_scale
                );
                assert!(
                    (c.scale - ca).abs() < 1e-6,
                    "{case}: activations {}",
                    c.scale
                );
            }
            let (p, t) = (c.estimate(&b3).total(), truth(&c, &b3, cs, ca));
            assert!(
                (p / t - 1.0).abs() <= 0.10,
                "{case}: predicted {p:.3e}, truth {t:.3e}"
            );
            // The measured point is met exactly; the failed batch never fits.
            let p2 = c.estimate(&b2).total();
            assert!((p2 / truth(&c, &b2, cs, ca) - 1.0).abs() < 1e-6, "{case}");
            assert!(c.estimate(&b1).total() >= need * seen * 0.999, "{case}");
            assert!(c.failed.contains(&b1));
        }
    }

    /// A measured peak alone: over the prediction, the constant moves up to it
    /// (the activations stay); under it, nothing moves.
    #[test]
    fn a_measured_peak_alone_moves_the_constant_up_only() {
        let m = ModelSpec::from_params(1.3e9);
        let s = settings(4, false);
        let mut c = Calibrated::new(m, Some(80.0 * GIB));
        let p = c.estimate(&s).total();
        c.learn_peak(&s, p * 1.1);
        assert_eq!(c.scale, 1.0);
        assert!((c.estimate(&s).total() / (p * 1.1) - 1.0).abs() < 1e-9);
        let before = c.state_scale;
        c.learn_peak(&s, p * 0.5);
        assert_eq!(c.state_scale, before);
        assert_eq!(c.measured.len(), 1, "one point per settings");
    }
}
