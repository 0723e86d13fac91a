//! The vocabulary every stage shares: knobs, their values, one attempt's
//! settings and the world size.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One adjustable training setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    MicroBatch,
    GradAccum,
    SeqLen,
    GradCheckpointing,
    ZeroStage,
    OffloadOptimizer,
    OffloadParam,
    /// The DataLoader's worker processes: host memory, not GPU memory. Halved
    /// after a host OOM; never changes what the model sees.
    DataloaderWorkers,
    /// The evaluation batch per device (`per_device_eval_batch_size`,
    /// `eval_batch_size`, `val_batch_size`): halved after an OOM during
    /// evaluation; never changes the training or the global batch.
    EvalBatch,
    /// Whether a ZeRO-3 save gathers the full 16-bit weights on one rank
    /// (DeepSpeed's `stage3_gather_16bit_weights_on_model_save`, accelerate's
    /// `zero3_save_16bit_model`): turned off after an OOM while saving; never
    /// changes the training.
    GatherOnSave,
    /// Whether the Hugging Face Trainer shards the model with FSDP
    /// (`--fsdp "full_shard auto_wrap"`): added by oomguard, false → true, to a
    /// run on several GPUs with no DeepSpeed or FSDP setting; the updates are
    /// the same (full-shard gathers the weights for each layer's step).
    Fsdp,
}

impl Knob {
    pub const ALL: [Knob; 11] = [
        Knob::MicroBatch,
        Knob::GradAccum,
        Knob::SeqLen,
        Knob::GradCheckpointing,
        Knob::ZeroStage,
        Knob::OffloadOptimizer,
        Knob::OffloadParam,
        Knob::DataloaderWorkers,
        Knob::EvalBatch,
        Knob::GatherOnSave,
        Knob::Fsdp,
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
            Knob::DataloaderWorkers => "dataloader_workers",
            Knob::EvalBatch => "eval_batch",
            Knob::GatherOnSave => "gather_on_save",
            Knob::Fsdp => "fsdp",
        }
    }

    /// 0 is a value it can start from (ZeRO stage 0, no DataLoader workers);
    /// for the others 0 is no starting point (nothing halves it).
    pub fn allows_zero(self) -> bool {
        matches!(self, Knob::ZeroStage | Knob::DataloaderWorkers)
    }

    /// A knob oomguard adds itself where it applies (FSDP on several GPUs),
    /// never one a command is expected to have: not listed as "not found".
    pub fn only_added(self) -> bool {
        matches!(self, Knob::Fsdp)
    }

    pub fn is_bool(self) -> bool {
        matches!(
            self,
            Knob::GradCheckpointing | Knob::GatherOnSave | Knob::Fsdp
        )
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

/// Where DeepSpeed keeps optimizer states or parameters (`offload_*.device`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offload {
    None,
    Cpu,
    /// NVMe; `path` (a policy step's `nvme_path`) goes in the sibling
    /// `nvme_path` key of the config file.
    Nvme {
        path: Option<String>,
    },
    /// A device DeepSpeed does not know, as a config file has it (lowercased):
    /// shown as written, never chosen by a policy.
    Other(String),
}

impl Offload {
    /// The device as DeepSpeed spells it: `none`, `cpu` or `nvme`.
    pub fn device(&self) -> &str {
        match self {
            Offload::None => "none",
            Offload::Cpu => "cpu",
            Offload::Nvme { .. } => "nvme",
            Offload::Other(d) => d,
        }
    }

    /// A device name given on the command line (any case); `None` for
    /// anything but `none`, `cpu` and `nvme`.
    pub fn parse(device: &str) -> Option<Offload> {
        match Offload::read(device) {
            Offload::Other(_) => None,
            o => Some(o),
        }
    }

    /// A device name as a config file has it (any case).
    pub fn read(device: &str) -> Offload {
        match device.to_ascii_lowercase().as_str() {
            "none" => Offload::None,
            "cpu" => Offload::Cpu,
            "nvme" => Offload::Nvme { path: None },
            other => Offload::Other(other.to_string()),
        }
    }
}

/// `none`, `cpu`, `nvme`, or `nvme:PATH` when the NVMe path is known: the text
/// the journal, `plan` and the summary table have always shown for it.
impl fmt::Display for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Offload::Nvme { path: Some(p) } => write!(f, "nvme:{p}"),
            o => f.write_str(o.device()),
        }
    }
}

impl Serialize for Offload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The text [`Display`](fmt::Display) writes, read back (a journal's settings).
impl<'de> Deserialize<'de> for Offload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.strip_prefix("nvme:") {
            Some(path) => Offload::Nvme {
                path: Some(path.to_string()),
            },
            None => Offload::read(&s),
        })
    }
}

/// A knob's value in one settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Int(u64),
    Bool(bool),
    /// offload_optimizer, offload_param.
    Offload(Offload),
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
    pub fn as_offload(&self) -> Option<&Offload> {
        match self {
            Value::Offload(o) => Some(o),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Offload(o) => o.fmt(f),
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
    /// The smallest micro-batch the trainer takes (0: none but the policy's own):
    /// a halving stops there (see `frameworks::Family::micro_floor`).
    #[serde(skip)]
    pub micro_floor: u64,
    /// The parameter offload is FSDP's (`CPUOffload`: the `offload` word of
    /// `--fsdp`, accelerate's `fsdp_offload_params`, a recipe's
    /// `fsdp_cpu_offload`): it needs no ZeRO stage, takes the gradients and
    /// the optimizer step to the CPU with the parameters, and has no NVMe.
    #[serde(skip)]
    pub fsdp_offload: bool,
}

/// "micro_batch=4 grad_accum=8 seq_len=1024", as `plan` and the messages show it.
impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.knobs.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
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
    "unknown knob '{0}': expected one of micro_batch, grad_accum, seq_len, grad_checkpointing, zero_stage, offload_optimizer, offload_param, dataloader_workers, eval_batch"
)]
pub struct UnknownKnob(pub String);
