//! Knobs, settings and bindings: `discover` reads them from the user's command,
//! `materialize` writes one attempt's settings back into an argv and environment.
//!
//! Discovery never guesses: an ambiguous spelling (a bare `--batch_size` may be
//! the global batch) is reported as a note saying how to bind it with `--knob`.

pub mod files;
mod flags;
mod world;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

pub use flags::FlagForm;

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

    fn is_bool(self) -> bool {
        matches!(self, Knob::GradCheckpointing)
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Knob {
    type Err = KnobError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Knob::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| KnobError::UnknownKnob(s.to_string()))
    }
}

/// A knob's value in one settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(u64),
    Bool(bool),
}

impl Value {
    pub fn as_int(&self) -> Option<u64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Bool(_) => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(_) => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// Where a knob lives in the user's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// A command-line flag, at these argv positions (every occurrence is rewritten).
    Flag { flag: String, at: Vec<(usize, FlagForm)> },
    /// Absent from the command; the flag is appended when the value changes.
    AddFlag { flag: String },
    /// An environment variable.
    Env { var: String, present: bool },
    /// No direct setting: follows from a global-batch flag divided by the micro-batch.
    DerivedFromGlobalBatch { flag: String, global: u64 },
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Binding::Flag { flag, .. } => write!(f, "flag {flag}"),
            Binding::AddFlag { flag } => write!(f, "absent; would add {flag}"),
            Binding::Env { var, present: true } => write!(f, "env {var}"),
            Binding::Env { var, present: false } => write!(f, "env {var} (unset; would set it)"),
            Binding::DerivedFromGlobalBatch { flag, global } => {
                write!(f, "derived: {flag} {global} / micro-batch / world size")
            }
        }
    }
}

/// One knob found in the command: its value there and where it lives.
#[derive(Debug, Clone)]
pub struct Bound {
    pub value: Value,
    pub binding: Binding,
}

/// The values of all knobs for one attempt, plus the read-only world size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub knobs: BTreeMap<Knob, Value>,
    pub world_size: u64,
}

impl Settings {
    pub fn int(&self, k: Knob) -> Option<u64> {
        self.knobs.get(&k).and_then(Value::as_int)
    }
    pub fn bool(&self, k: Knob) -> Option<bool> {
        self.knobs.get(&k).and_then(Value::as_bool)
    }
    /// micro × accum × world, when micro and accum are known.
    pub fn global_batch(&self) -> Option<u64> {
        Some(self.int(Knob::MicroBatch)? * self.int(Knob::GradAccum)? * self.world_size)
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

/// Everything `discover` learned from the command.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub knobs: BTreeMap<Knob, Bound>,
    pub world: World,
    /// Command family: "hf" when the command looks like a Hugging Face `Trainer` script.
    pub hf_style: bool,
    /// Things the user should know: ambiguous spellings, knobs not found and how to bind them.
    pub notes: Vec<String>,
}

impl Discovery {
    pub fn settings(&self) -> Settings {
        Settings {
            knobs: self
                .knobs
                .iter()
                .map(|(k, b)| (*k, b.value.clone()))
                .collect(),
            world_size: self.world.size,
        }
    }
}

/// Errors in what the user told us about knobs. All are usage errors (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    #[error(
        "unknown knob '{0}': expected one of micro_batch, grad_accum, seq_len, grad_checkpointing, zero_stage, offload_optimizer, offload_param"
    )]
    UnknownKnob(String),
    #[error(
        "--knob '{0}' is not NAME=WHERE: write it like --knob micro_batch=--bs or --knob micro_batch=env:MICRO_BS"
    )]
    BadSpec(String),
    #[error(
        "--knob {knob}={flag}: the command has no {flag} flag. Check the spelling, or add `{flag} N` to the command so oomguard can change it"
    )]
    FlagNotInCommand { knob: Knob, flag: String },
    #[error(
        "--knob {knob}={flag}: the value {value:?} after {flag} is not {expected}. Bind a flag whose value is {expected}"
    )]
    BadValue {
        knob: Knob,
        flag: String,
        value: String,
        expected: &'static str,
    },
    #[error("--knob {knob}=env:{var}: ${var} is {value:?}, not {expected}")]
    BadEnvValue {
        knob: Knob,
        var: String,
        value: String,
        expected: &'static str,
    },
    #[error(
        "--knob {knob}=env:{var}: ${var} is not set and {knob} has no default; set it (e.g. {var}=8) so oomguard knows the starting value"
    )]
    EnvUnset { knob: Knob, var: String },
    #[error("no command given: write it after the options, e.g. `oomguard python train.py ...`")]
    NoCommand,
}

/// A user's `--knob NAME=WHERE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserBinding {
    Flag(String),
    Env(String),
}

pub fn parse_user_bindings(specs: &[String]) -> Result<Vec<(Knob, UserBinding)>, KnobError> {
    specs
        .iter()
        .map(|s| {
            let (name, place) = s
                .split_once('=')
                .ok_or_else(|| KnobError::BadSpec(s.clone()))?;
            let knob: Knob = name.trim().parse()?;
            let place = place.trim();
            let b = if let Some(var) = place.strip_prefix("env:") {
                if var.is_empty() {
                    return Err(KnobError::BadSpec(s.clone()));
                }
                UserBinding::Env(var.to_string())
            } else if place.starts_with('-') && place.len() > 1 {
                UserBinding::Flag(place.to_string())
            } else {
                return Err(KnobError::BadSpec(s.clone()));
            };
            Ok((knob, b))
        })
        .collect()
}

/// Read the knobs, world size and resume position from a command.
pub fn discover(
    argv: &[OsString],
    user: &[(Knob, UserBinding)],
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Discovery, KnobError> {
    if argv.is_empty() {
        return Err(KnobError::NoCommand);
    }
    let world = world::world_size(argv, env);
    flags::discover(argv, user, env, world)
}

/// One attempt's command: argv and the environment variables the knobs set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Materialized {
    pub argv: Vec<OsString>,
    pub env: Vec<(String, String)>,
}

/// Where to resume from, and how the framework is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeArg {
    pub how: crate::checkpoint::ResumeHow,
    pub path: OsString,
}

/// Write `settings` into the user's argv (and environment). Knobs whose value did
/// not change are left exactly as the user wrote them.
pub fn materialize(
    argv: &[OsString],
    disc: &Discovery,
    settings: &Settings,
    resume: Option<&ResumeArg>,
) -> Materialized {
    flags::materialize(argv, disc, settings, resume)
}
