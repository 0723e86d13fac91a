//! Climb back: the start of a run of a command whose last run was shrunk (for
//! a spike, a long batch) and then fit, from what NVML measured of it.
//!
//! The last run's settings are remembered with their peak (`remember`). The
//! model is calibrated so that its prediction at those settings is the peak
//! it measured: the batch-independent part (model states, context, logits) as
//! the model says, the batch-dependent activations scaled to what is left
//! ([`at_peak`]). Between the remembered settings and the command's own — the
//! micro-batch on the divisors of the global batch (kept exactly), every other
//! knob the model reads at either end — the fastest settings it then predicts
//! to fit the GPU with the model's margin are the start, never ones that ran
//! out of memory in this command's runs (nor more of the same). When nothing
//! larger fits, the run starts at the remembered settings, as before.

use super::{Calibrated, MARGIN, gib, key, logits_bytes, throughput};
use crate::knobs::{Knob, Settings, Value};

/// The knobs the model reads other than the micro-batch and its accumulation:
/// each may climb back to the command's own value.
const CLIMBING: [Knob; 6] = [
    Knob::SeqLen,
    Knob::GradCheckpointing,
    Knob::ZeroStage,
    Knob::OffloadOptimizer,
    Knob::OffloadParam,
    Knob::Fsdp,
];

/// Most candidates looked at (the micro-batch's divisors times two values of
/// each other knob is far fewer for any real command).
const MAX_CANDIDATES: usize = 4096;

/// What was measured of the remembered settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The peak on the fullest GPU, bytes.
    pub peak: f64,
    /// That GPU's memory, bytes.
    pub total: f64,
}

/// The model calibrated so that it predicts `peak` for settings `s`: the
/// batch-independent part kept, the activations scaled. `None` when the peak
/// is not above the batch-independent part (the measurement or the model's
/// states are off: nothing to climb on) or the model has no activations.
pub fn at_peak(cal: &Calibrated, s: &Settings, m: Measured) -> Option<Calibrated> {
    let mut c = cal.clone();
    c.scale = 1.0;
    c.gpu_total = Some(m.total);
    let e = c.estimate(s);
    let logits = logits_bytes(&c.model, s);
    let layers = e.activations - logits;
    let fixed = e.total() - layers;
    if layers <= 0.0 || m.peak <= fixed {
        return None;
    }
    c.scale = (m.peak - fixed) / layers;
    Some(c)
}

/// The start climbed back to, and the line that says so.
#[derive(Debug, Clone, PartialEq)]
pub struct Climb {
    pub settings: Settings,
    pub line: String,
}

/// Where a run of `given` (the command's own settings) starts whose last run
/// fit at `remembered` with the peak `m`: `Ok` when larger settings are
/// predicted to fit, `Err` with the words that say why not (appended to the
/// line that says the run starts at the remembered settings). `failed`: the
/// settings that ran out of memory in the command's runs.
pub fn climb(
    given: &Settings,
    remembered: &Settings,
    failed: &[Settings],
    m: Measured,
    cal: &Calibrated,
) -> Result<Climb, String> {
    let measured = format!(
        "remembered peak {} of {} at {}",
        gib(m.peak).trim_end_matches(" GiB"),
        gib(m.total),
        short(remembered)
    );
    let Some(c) = at_peak(cal, remembered, m) else {
        return Err(format!(
            "{measured}: below what the memory model ({}) gives the batch-independent part, so it is not climbed on",
            cal.model.source
        ));
    };
    let base = throughput(remembered, super::DEFAULT_SEQ);
    let seq = |s: &Settings| s.int(Knob::SeqLen).unwrap_or(0);
    let best = between(given, remembered)
        .into_iter()
        .filter(|s| s != remembered && s.global_batch() == given.global_batch())
        .filter(|s| c.fits(s) == Some(true) && !failed.iter().any(|f| at_least(s, f)))
        .map(|s| (throughput(&s, super::DEFAULT_SEQ), s))
        .filter(|(t, s)| seq(s) > seq(remembered) || (seq(s) == seq(remembered) && *t > base))
        .max_by(|(ta, a), (tb, b)| {
            seq(a)
                .cmp(&seq(b))
                .then(ta.total_cmp(tb))
                .then_with(|| key(b).cmp(&key(a)))
        });
    let Some((_, best)) = best else {
        return Err(format!(
            "{measured} leaves no room for larger settings with the memory model's {:.0}% margin",
            MARGIN * 100.0
        ));
    };
    let gb = best
        .global_batch()
        .map(|g| format!(", global batch {g} kept"))
        .unwrap_or_default();
    let line = format!(
        "climbing back: {}{gb} ({measured}: {}; the memory model ({}), calibrated to it, predicts {} of {}); --fresh starts as written",
        short(&best),
        super::fit::changes(remembered, &best),
        cal.model.source,
        gib(c.estimate(&best).total()),
        gib(m.total),
    );
    Ok(Climb {
        settings: best,
        line,
    })
}

/// `micro_batch 8 × grad_accum 6`, or the micro-batch alone.
fn short(s: &Settings) -> String {
    match (s.int(Knob::MicroBatch), s.int(Knob::GradAccum)) {
        (Some(m), Some(a)) => format!("micro_batch {m} × grad_accum {a}"),
        (Some(m), None) => format!("micro_batch {m}"),
        _ => s.to_string(),
    }
}

/// Every settings between `remembered` and `given`: the micro-batch on the
/// divisors of micro × accumulation between the two (the accumulation to
/// match), each knob of [`CLIMBING`] at either value; the rest as remembered.
fn between(given: &Settings, remembered: &Settings) -> Vec<Settings> {
    let mut out = vec![remembered.clone()];
    if let (Some(lo), Some(hi), Some(accum)) = (
        remembered.int(Knob::MicroBatch),
        given.int(Knob::MicroBatch),
        remembered.int(Knob::GradAccum),
    ) && lo < hi
        && let Some(product) = lo.checked_mul(accum)
    {
        out = (lo..=hi.min(product))
            .filter(|m| product % m == 0)
            .map(|m| {
                let mut s = remembered.clone();
                s.knobs.insert(Knob::MicroBatch, Value::Int(m));
                s.knobs.insert(Knob::GradAccum, Value::Int(product / m));
                s
            })
            .collect();
    }
    for k in CLIMBING {
        let (Some(r), Some(g)) = (remembered.knobs.get(&k), given.knobs.get(&k)) else {
            continue;
        };
        if r == g || out.len() * 2 > MAX_CANDIDATES {
            continue;
        }
        let mut more = Vec::with_capacity(out.len());
        for s in &out {
            let mut t = s.clone();
            t.knobs.insert(k, g.clone());
            more.push(t);
        }
        out.extend(more);
    }
    out
}

/// Does `s` need at least what `failed` needed: the same settings but for a
/// micro-batch no smaller (and accumulation to match)?
fn at_least(s: &Settings, failed: &Settings) -> bool {
    let rest = |x: &Settings| {
        let mut x = x.knobs.clone();
        x.remove(&Knob::MicroBatch);
        x.remove(&Knob::GradAccum);
        x
    };
    rest(s) == rest(failed) && s.int(Knob::MicroBatch) >= failed.int(Knob::MicroBatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GIB, ModelSpec};
    use std::collections::BTreeMap;

    fn settings(micro: u64, accum: u64, gc: bool) -> Settings {
        let mut knobs = BTreeMap::new();
        knobs.insert(Knob::MicroBatch, Value::Int(micro));
        knobs.insert(Knob::GradAccum, Value::Int(accum));
        knobs.insert(Knob::SeqLen, Value::Int(1024));
        knobs.insert(Knob::GradCheckpointing, Value::Bool(gc));
        Settings {
            knobs,
            world_size: 1,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        }
    }

    /// The sizing tests' 1.3B Llama-shaped model.
    fn cal() -> Calibrated {
        let cfg = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5504, "num_attention_heads": 16, "vocab_size": 32000, "hidden_act": "silu"}"#;
        Calibrated::new(ModelSpec::from_config_json("model", cfg).unwrap(), None)
    }

    fn measured(peak_gib: f64) -> Measured {
        Measured {
            peak: peak_gib * GIB,
            total: 64.0 * GIB,
        }
    }

    /// Calibrated at the measured peak, the model predicts exactly it there;
    /// the states are the model's, only the activations scale.
    #[test]
    fn calibrated_at_the_peak_it_predicts_the_peak() {
        let s = settings(8, 6, false);
        let c = at_peak(&cal(), &s, measured(44.16)).unwrap();
        assert!((c.estimate(&s).total() / GIB - 44.16).abs() < 1e-6);
        assert_eq!(c.state_scale, 1.0);
        let plain = cal().estimate(&s);
        let e = c.estimate(&s);
        assert_eq!(e.weights + e.optimizer, plain.weights + plain.optimizer);
        // A peak below the model's states: nothing to climb on.
        assert!(at_peak(&cal(), &s, measured(10.0)).is_none());
    }

    /// Rows: shrunk from 16 × 3 to 8 × 6 (and checkpointing), 16 failed; the
    /// measured peak at 8 decides how far back the start climbs.
    #[test]
    fn the_start_climbs_back_as_far_as_the_measured_peak_allows() {
        let given = settings(16, 3, false);
        let failed = [settings(16, 3, false)];
        let rows: [(Settings, f64, Option<Settings>); 4] = [
            // Room for 12 (16 failed): 12 × 4.
            (settings(8, 6, false), 44.16, Some(settings(12, 4, false))),
            // No room: stays at 8.
            (settings(8, 6, false), 58.0, None),
            // Measured with checkpointing, far below the GPU: checkpointing off
            // again (faster than 12 with it), at the micro-batch that fits so.
            (settings(8, 6, true), 26.0, Some(settings(8, 6, false))),
            // A peak below the model's own states: not climbed on.
            (settings(8, 6, false), 12.0, None),
        ];
        for (remembered, peak, want) in rows {
            let got = climb(&given, &remembered, &failed, measured(peak), &cal());
            match (&want, &got) {
                (Some(w), Ok(c)) => {
                    assert_eq!(&c.settings, w, "{peak}: {}", c.line);
                    let head = format!("climbing back: {}", short(w));
                    assert!(c.line.starts_with(&head), "{}", c.line);
                    assert!(c.line.contains("global batch 48 kept"), "{}", c.line);
                    assert!(
                        c.line
                            .contains(&format!("remembered peak {peak:.2} of 64.00 GiB"))
                    );
                }
                (None, Err(why)) => assert!(why.contains("remembered peak"), "{why}"),
                _ => panic!("peak {peak} at {remembered}: want {want:?}, got {got:?}"),
            }
        }
        // Without the failure on record, room enough climbs to the command's own.
        let c = climb(&given, &settings(8, 6, false), &[], measured(30.0), &cal()).unwrap();
        assert_eq!(c.settings, given);
    }
}
