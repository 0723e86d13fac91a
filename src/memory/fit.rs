//! The start of a run whose settings the model says cannot fit: with `--fit`,
//! the fastest settings the policy can reach that fit (no OOM needed); without
//! it, one line that says so and what `--fit` would start at.
//!
//! Before any OOM the model is uncalibrated: it says "does not fit" only when
//! the settings as given are over the GPU by more than its own error
//! ([`FIT_ERROR`]), and `--fit` picks with activations allowed
//! [`FIT_ALLOWANCE`] more than predicted, so a start it picks is one that fits
//! on the runs it was not fitted to.

use super::{Calibrated, candidates, gib, pick};
use crate::knobs::Settings;
use crate::policy::Policy;

/// The model's own error before calibration: a run predicted within this of
/// the GPU's size is not said to be likely to OOM (GPU measurements: −3 … +8%
/// on the measured shapes; the sizing benchmark's hidden costs: more).
pub const FIT_ERROR: f64 = 0.10;

/// `--fit` picks as if the activations were this much more than predicted.
pub const FIT_ALLOWANCE: f64 = 1.3;

/// What the start looks like to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// With `--fit`: the settings to start at instead of the given ones.
    pub settings: Option<Settings>,
    /// The line said at the start (with or without `--fit`).
    pub line: Option<String>,
}

/// The start for settings `given` (before any OOM). `None` settings: start as
/// given. No line when the GPU's size is unknown or the given settings are
/// not predicted to OOM.
pub fn start(policy: &Policy, given: &Settings, cal: &Calibrated, fit: bool) -> Start {
    let none = Start {
        settings: None,
        line: None,
    };
    let Some(total) = cal.gpu_total else {
        return none;
    };
    let predicted = cal.estimate(given).total();
    if predicted <= total * (1.0 + FIT_ERROR) || !policy.memory_model {
        return none;
    }
    let mut careful = cal.clone();
    careful.scale *= FIT_ALLOWANCE;
    let cands = candidates(policy, given, &careful);
    let best = pick(&cands, given).filter(|c| c.fits == Some(true));
    let head = format!(
        "the memory model ({}) predicts {:.1} of {:.1} GiB per GPU for the settings as given: likely OOM",
        cal.model.source,
        predicted / super::GIB,
        total / super::GIB
    );
    let Some(best) = best else {
        return Start {
            settings: None,
            line: Some(format!(
                "{head}; nothing the policy can reach is predicted to fit (`oomguard estimate` shows the ways out)"
            )),
        };
    };
    let changes = changes(given, &best.settings);
    if fit {
        Start {
            settings: Some(best.settings.clone()),
            line: Some(format!(
                "{head}; --fit starts at {changes} (predicted {} with the activations {:.0}% over the model)",
                gib(careful.estimate(&best.settings).total()),
                (FIT_ALLOWANCE - 1.0) * 100.0
            )),
        }
    } else {
        Start {
            settings: None,
            line: Some(format!(
                "{head}; `--fit` would start at {changes}; starting as given"
            )),
        }
    }
}

/// `micro_batch 16 → 4, grad_accum 2 → 8`.
pub fn changes(from: &Settings, to: &Settings) -> String {
    to.knobs
        .iter()
        .filter(|(k, v)| from.knobs.get(k) != Some(v))
        .map(|(k, v)| {
            let was = from.knobs.get(k).map(|v| v.to_string()).unwrap_or_default();
            format!("{k} {was} → {v}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::{Knob, Value};
    use crate::memory::{GIB, ModelSpec};
    use std::collections::BTreeMap;

    fn given(micro: u64) -> Settings {
        let mut knobs = BTreeMap::new();
        knobs.insert(Knob::MicroBatch, Value::Int(micro));
        knobs.insert(Knob::GradAccum, Value::Int(2));
        knobs.insert(Knob::SeqLen, Value::Int(2048));
        knobs.insert(Knob::GradCheckpointing, Value::Bool(false));
        Settings {
            knobs,
            world_size: 1,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        }
    }

    #[test]
    fn a_start_predicted_over_the_gpu_is_said_and_fit_starts_where_it_fits() {
        let policy = Policy::load("default").unwrap();
        let cal = Calibrated::new(ModelSpec::from_params(1.3e9), Some(24.0 * GIB));
        // Far over: said, and --fit starts at settings predicted to fit with the allowance.
        let said = start(&policy, &given(16), &cal, false);
        assert_eq!(said.settings, None);
        let line = said.line.unwrap();
        assert!(
            line.contains("likely OOM; `--fit` would start at micro_batch 16 →"),
            "{line}"
        );
        let fit = start(&policy, &given(16), &cal, true);
        let s = fit.settings.unwrap();
        assert_eq!(s.global_batch(), given(16).global_batch());
        let mut careful = cal.clone();
        careful.scale *= FIT_ALLOWANCE;
        assert_eq!(careful.fits(&s), Some(true));
        assert!(fit.line.unwrap().contains("--fit starts at"));
        // Within the model's error of the GPU: nothing said, nothing changed.
        let near = Calibrated::new(
            ModelSpec::from_params(1.3e9),
            Some(cal.estimate(&given(16)).total() / (1.0 + FIT_ERROR / 2.0)),
        );
        assert_eq!(
            start(&policy, &given(16), &near, true),
            Start {
                settings: None,
                line: None
            }
        );
        // Without the GPU's size, nothing.
        let unknown = Calibrated::new(ModelSpec::from_params(1.3e9), None);
        assert_eq!(start(&policy, &given(16), &unknown, true).line, None);
    }
}
