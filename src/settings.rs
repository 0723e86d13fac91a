//! The vocabulary every stage shares: knobs, their values, one attempt's
//! settings and the world size.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// One adjustable training setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    MicroBatch,
    GradAccum,
    SeqLen,
    GradCheckpointing,
    ZeroStage,
    OffloadOptimizer,
    OffloadParam,
}

impl Knob {
    pub const ALL: [Knob; 7] = [
        Knob::MicroBatch,
        Knob::GradAccum,
        Knob::SeqLen,
        Knob::GradCheckpointing,
        Knob::ZeroStage,
        Knob::OffloadOptimizer,
        Knob::OffloadParam,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Knob::MicroBatch => "micro_batch",
            Knob::GradAccum => "grad_accum",
            Knob::SeqLen => "seq_len",
            Knob::GradCheckpointing => "grad_checkpointing",
            Knob::ZeroStage => "zero_stage",
            Knob::OffloadOptimizer => "offload_optimizer",
            Knob::OffloadParam => "offload_param",
        }
    }

    pub fn is_bool(self) -> bool {
        matches!(self, Knob::GradCheckpointing)
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Knob {
    type Err = UnknownKnob;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Knob::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownKnob(s.to_string()))
    }
}

/// A knob's value in one settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(u64),
    Bool(bool),
    /// Offload devices: `none`, `cpu`, `nvme`.
    Str(String),
}

impl Value {
    pub fn as_int(&self) -> Option<u64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

/// The values of all knobs for one attempt, plus the read-only world size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub knobs: BTreeMap<Knob, Value>,
    pub world_size: u64,
    /// grad_accum counts the micro-batches of all ranks together (a script
    /// divides its `gradient_accumulation_steps` by the world size), so the
    /// global batch is micro × accum.
    #[serde(skip)]
    pub accum_covers_world: bool,
}

impl Settings {
    pub fn int(&self, k: Knob) -> Option<u64> {
        self.knobs.get(&k).and_then(Value::as_int)
    }
    pub fn bool(&self, k: Knob) -> Option<bool> {
        self.knobs.get(&k).and_then(Value::as_bool)
    }
    /// micro × accum × world (micro × accum when accum covers the world),
    /// when micro and accum are known.
    pub fn global_batch(&self) -> Option<u64> {
        let per_rank_steps = self
            .int(Knob::MicroBatch)?
            .checked_mul(self.int(Knob::GradAccum)?)?;
        if self.accum_covers_world {
            Some(per_rank_steps)
        } else {
            per_rank_steps.checked_mul(self.world_size)
        }
    }
}

/// How the world size was found.
#[derive(Debug, Clone, Serialize)]
pub struct World {
    pub size: u64,
    pub source: String,
    /// True when the size could not be read exactly (elastic ranges, `auto` without GPUs).
    pub uncertain: bool,
}

/// A knob name that is not one of [`Knob::ALL`].
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown knob '{0}': expected one of micro_batch, grad_accum, seq_len, grad_checkpointing, zero_stage, offload_optimizer, offload_param"
)]
pub struct UnknownKnob(pub String);
