//! Policy: an ordered list of steps with floors, read from TOML, what each step
//! changes, and the ladder's next rung (which rule takes a step is `next`'s).
//!
//! Theory of operation: after every OOM the steps are tried in order and the
//! first one that can still change the settings is taken. A step can change the
//! settings while its knob is bound and above its floor, so a step "repeats"
//! until its floor before the next step gets a turn (a policy that wants
//! checkpointing before micro-batch 1 lists `halve_micro_batch` twice, with
//! floors 4 and 1, around `enable_grad_checkpointing`). Steps whose knob is not
//! bound are "not applicable" and say why; they are never silently skipped.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::evidence::Evidence;
use crate::knobs::{Discovery, Knob, Offload, Settings, Value};

/// Policies shipped in `policies/`, embedded in the binary.
pub const SHIPPED: &[(&str, &str)] = &[
    ("default", include_str!("../policies/default.toml")),
    (
        "keep-results",
        include_str!("../policies/keep-results.toml"),
    ),
    (
        "keep-micro-batch",
        include_str!("../policies/keep-micro-batch.toml"),
    ),
    (
        "smaller-batch",
        include_str!("../policies/smaller-batch.toml"),
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    HalveMicroBatch,
    EnableGradCheckpointing,
    ShortenSeq,
    RaiseZeroStage,
    OffloadOptimizer,
    OffloadParam,
    /// After a host (CPU) OOM, not a GPU one: halve the DataLoader's workers.
    /// oomguard takes it itself; a policy cannot list it (fewer workers do
    /// not fix a GPU OOM).
    HalveDataloaderWorkers,
    /// After a GPU OOM during evaluation: halve the evaluation batch. oomguard
    /// takes it itself; a policy cannot list it (it does not fix an OOM in
    /// training).
    HalveEvalBatch,
    /// After a GPU OOM while saving a checkpoint: stop gathering the full
    /// 16-bit weights on one rank (`gather_on_save` true → false). oomguard
    /// takes it itself; a policy cannot list it.
    NoGatherOnSave,
    /// On several GPUs without DeepSpeed or FSDP: shard the parameters,
    /// gradients and optimizer state with FSDP full-shard (`fsdp` false → true).
    FsdpFullShard,
}

impl StepKind {
    pub fn name(self) -> &'static str {
        match self {
            StepKind::HalveMicroBatch => "halve_micro_batch",
            StepKind::EnableGradCheckpointing => "enable_grad_checkpointing",
            StepKind::ShortenSeq => "shorten_seq",
            StepKind::RaiseZeroStage => "raise_zero_stage",
            StepKind::OffloadOptimizer => "offload_optimizer",
            StepKind::OffloadParam => "offload_param",
            StepKind::HalveDataloaderWorkers => "halve_dataloader_workers",
            StepKind::HalveEvalBatch => "halve_eval_batch",
            StepKind::NoGatherOnSave => "no_gather_on_save",
            StepKind::FsdpFullShard => "fsdp_full_shard",
        }
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One step as written in the TOML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    kind: toml::Spanned<StepKind>,
    /// halve_micro_batch: smallest micro-batch; shorten_seq: shortest sequence.
    min: Option<toml::Spanned<u64>>,
    /// shorten_seq: multiply the sequence length by this (0 < factor < 1).
    factor: Option<toml::Spanned<f64>>,
    /// shorten_seq: round the new length down to a multiple of this.
    multiple_of: Option<toml::Spanned<u64>>,
    /// raise_zero_stage: highest stage.
    max: Option<toml::Spanned<u64>>,
    /// offload_optimizer / offload_param: offload to NVMe at this path instead of CPU.
    nvme_path: Option<toml::Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    description: Option<String>,
    max_attempts: Option<toml::Spanned<u32>>,
    /// Keep micro × accum × world exactly; a halving that cannot is not applicable.
    keep_global_batch: Option<bool>,
    /// Decide from the memory model when the model is known (default true);
    /// false: always take the next step of the ladder.
    memory_model: Option<bool>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default, rename = "step")]
    steps: Vec<RawStep>,
    /// Checkpoint layout of a custom script (see checkpoint::CustomSpec).
    resume: Option<crate::checkpoint::CustomSpec>,
}

/// A validated step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub kind: StepKind,
    pub min: u64,
    pub factor: f64,
    pub multiple_of: u64,
    pub max: u64,
    /// Offload steps: NVMe path (device "nvme") instead of CPU.
    pub nvme_path: Option<String>,
}

/// A validated policy.
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    pub name: String,
    pub description: String,
    pub max_attempts: u32,
    pub keep_global_batch: bool,
    /// Decide from the memory model when there is one (`memory_model = false`: the ladder only).
    pub memory_model: bool,
    /// Environment defaults (merged into the user's, never overriding).
    pub env: BTreeMap<String, String>,
    pub steps: Vec<Step>,
    pub resume: Option<crate::checkpoint::CustomSpec>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "policy '{0}' is neither a shipped policy (default, keep-results, keep-micro-batch, smaller-batch) nor a file: {1}"
    )]
    NotFound(String, std::io::Error),
    #[error("--policy {}: {why}", .file.display())]
    Unreadable { file: PathBuf, why: String },
    #[error("{file}:{line}: {key}: {message}")]
    Invalid {
        file: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

/// The most a policy file may hold: a policy is a short TOML file, and a bigger
/// one (or `/dev/zero`) must not be read without limit.
const MAX_POLICY_BYTES: u64 = 1 << 20;

/// Read a policy file: a regular file (not a FIFO, a device or a directory, which
/// could block or never end) of at most [`MAX_POLICY_BYTES`], in UTF-8.
fn read_policy_file(path: &Path) -> Result<String, PolicyError> {
    use std::io::Read;
    let unreadable = |why: String| PolicyError::Unreadable {
        file: path.to_path_buf(),
        why,
    };
    // Opened non-blocking: opening a FIFO for reading would otherwise wait for a writer.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    }
    .map_err(|e| PolicyError::NotFound(path.display().to_string(), e))?;
    let meta = file
        .metadata()
        .map_err(|e| unreadable(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(unreadable(
            "not a regular file; give a policy TOML file or a shipped name (default, keep-results, keep-micro-batch, smaller-batch)".into(),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_POLICY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_POLICY_BYTES {
        return Err(unreadable(format!(
            "larger than {} KiB; a policy is a short TOML file",
            MAX_POLICY_BYTES >> 10
        )));
    }
    String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8 text".into()))
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Policy {
    /// A shipped name or a path to a TOML file.
    pub fn load(name_or_file: &str) -> Result<Policy, PolicyError> {
        if let Some((name, text)) = SHIPPED.iter().find(|(n, _)| *n == name_or_file) {
            return Policy::parse(name, Path::new(&format!("policies/{name}.toml")), text);
        }
        let path = Path::new(name_or_file);
        let text = read_policy_file(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| name_or_file.to_string());
        Policy::parse(&name, path, &text)
    }

    pub fn parse(name: &str, file: &Path, text: &str) -> Result<Policy, PolicyError> {
        let src = PolicyText { file, text };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
        let steps = raw
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| src.step(i, s))
            .collect::<Result<Vec<_>, _>>()?;
        if steps.is_empty() {
            return Err(src.invalid(
                0,
                "step",
                "the policy has no [[step]] tables; add at least one, e.g. [[step]] kind = \"halve_micro_batch\"".into(),
            ));
        }
        if let Some(r) = &raw.resume {
            src.check_resume(r)?;
        }
        src.check_env(&raw.env)?;
        let max_attempts = match &raw.max_attempts {
            Some(m) if *m.get_ref() == 0 => {
                return Err(src.invalid(
                    m.span().start,
                    "max_attempts",
                    "must be at least 1".into(),
                ));
            }
            Some(m) => *m.get_ref(),
            None => 8,
        };
        Ok(Policy {
            name: name.to_string(),
            description: raw.description.unwrap_or_default(),
            max_attempts,
            keep_global_batch: raw.keep_global_batch.unwrap_or(true),
            memory_model: raw.memory_model.unwrap_or(true),
            env: raw.env,
            steps,
            resume: raw.resume,
        })
    }
}

/// A policy file being validated: errors name the file, the line and the key.
struct PolicyText<'a> {
    file: &'a Path,
    text: &'a str,
}

impl PolicyText<'_> {
    /// The error for `key`, on the line of byte `offset`.
    fn invalid(&self, offset: usize, key: &str, message: String) -> PolicyError {
        PolicyError::Invalid {
            file: self.file.to_path_buf(),
            line: line_of(self.text, offset),
            key: key.to_string(),
            message,
        }
    }

    /// A TOML syntax or type error, located.
    fn toml_error(&self, e: &toml::de::Error) -> PolicyError {
        let text = self.text;
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        // The key is the last `word =` before the error on its line, if any.
        let line_start = text[..offset.min(text.len())]
            .rfind('\n')
            .map_or(0, |p| p + 1);
        let line_text = text[line_start..].lines().next().unwrap_or("");
        let key = line_text
            .split_once('=')
            .map(|(k, _)| k)
            .unwrap_or(line_text)
            .trim()
            .trim_matches(|c| c == '[' || c == ']')
            .to_string();
        self.invalid(offset, &key, e.message().trim().to_string())
    }

    /// The `i`-th `[[step]]` table, validated: each kind takes only its own
    /// fields, within their ranges; the others get their defaults.
    fn step(&self, i: usize, s: &RawStep) -> Result<Step, PolicyError> {
        let kind = *s.kind.get_ref();
        let at = StepText {
            src: self,
            i,
            kind,
            raw: s,
        };
        let mut step = Step {
            kind,
            min: 1,
            factor: 0.5,
            multiple_of: 1,
            max: 3,
            nvme_path: None,
        };
        match kind {
            StepKind::HalveMicroBatch => at.halve_micro_batch(&mut step)?,
            StepKind::ShortenSeq => at.shorten_seq(&mut step)?,
            StepKind::RaiseZeroStage => at.raise_zero_stage(&mut step)?,
            StepKind::EnableGradCheckpointing
            | StepKind::FsdpFullShard
            | StepKind::OffloadOptimizer
            | StepKind::OffloadParam => at.switch(&mut step)?,
            StepKind::HalveDataloaderWorkers => {
                return Err(at.invalid(
                    s.kind.span().start,
                    "kind",
                    "halve_dataloader_workers is not a policy step: oomguard halves the DataLoader's workers itself after a host (CPU) OOM, and fewer workers do not fix a GPU OOM".into(),
                ));
            }
            StepKind::HalveEvalBatch => {
                return Err(at.invalid(
                    s.kind.span().start,
                    "kind",
                    "halve_eval_batch is not a policy step: oomguard halves the evaluation batch itself after an OOM during evaluation, before any step of the policy, and a smaller evaluation batch does not fix an OOM in training".into(),
                ));
            }
            StepKind::NoGatherOnSave => {
                return Err(at.invalid(
                    s.kind.span().start,
                    "kind",
                    "no_gather_on_save is not a policy step: oomguard turns the 16-bit gather off itself after an OOM while saving a checkpoint, and it does not fix an OOM in training".into(),
                ));
            }
        }
        if kind != StepKind::ShortenSeq
            && let Some(m) = &s.multiple_of
        {
            return Err(at.not_for("multiple_of", m.span()));
        }
        Ok(step)
    }

    /// The `[resume]` table: a pattern with `{step}`, and where the checkpoints are.
    fn check_resume(&self, r: &crate::checkpoint::CustomSpec) -> Result<(), PolicyError> {
        let at = self.text.find("[resume]").unwrap_or(0);
        if !r.pattern.contains("{step}") {
            return Err(self.invalid(
                at,
                "resume.pattern",
                format!(
                    "{:?} has no {{step}}: write the folder name with the step number as {{step}}, e.g. \"step_{{step}}\"",
                    r.pattern
                ),
            ));
        }
        // The table is read from a file that may be shared or downloaded: it
        // names files inside a checkpoint folder, never a way out of it.
        // The line that sets `key` in the table (not `dir_flag` for `flag`).
        let key_at = |key: &str| {
            let mut off = at;
            for line in self.text[at..].split_inclusive('\n') {
                let rest = line.trim_start().strip_prefix(key).map(str::trim_start);
                if rest.is_some_and(|r| r.starts_with('=')) {
                    return off;
                }
                off += line.len();
            }
            at
        };
        if r.flag.trim().is_empty() {
            return Err(self.invalid(
                key_at("flag"),
                "resume.flag",
                "is empty: name the flag that tells the script where to resume from, e.g. \"--resume_from\"".into(),
            ));
        }
        if let Some(m) = r.complete_when.iter().find(|m| {
            let p = Path::new(m.as_str());
            m.is_empty()
                || p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
        }) {
            return Err(self.invalid(
                key_at("complete_when"),
                "resume.complete_when",
                format!("{m:?} is not a file inside the checkpoint folder: write a path relative to it, without `..`, e.g. \"model.safetensors\""),
            ));
        }
        if r.dir.is_none() && r.dir_flag.is_none() {
            return Err(self.invalid(
                at,
                "resume.dir",
                "say where the checkpoints are: dir = \"outputs/run\" or dir_flag = \"--output_dir\"".into(),
            ));
        }
        Ok(())
    }

    /// A policy may only set the variables that tune memory and threading: a
    /// shared or downloaded policy must not be able to make the command load
    /// code (LD_PRELOAD, PYTHONPATH, PATH, BASH_ENV ...).
    /// Names and values must also be ones an environment can hold: no `=` or NUL
    /// in a name, no NUL in a value (the launch would fail with exit 126).
    fn check_env(&self, env: &BTreeMap<String, String>) -> Result<(), PolicyError> {
        for (name, value) in env {
            let why = if name.is_empty() || name.contains(['=', '\0']) {
                Some(format!(
                    "{name:?} cannot be an environment variable's name (empty, or holds `=` or a NUL byte)"
                ))
            } else if !env_allowed(name) {
                Some(format!(
                    "a policy may set only {ENV_ALLOWED_DESC}; set {name} yourself in the environment if you mean it"
                ))
            } else if value.contains('\0') {
                Some("the value holds a NUL byte, which no environment variable can hold".into())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(self.invalid(self.env_line(name), &format!("env.{name}"), why));
            }
        }
        Ok(())
    }

    /// Where `name` is set in the `[env]` table (written bare or quoted): the start of
    /// its line, or 0 when it cannot be found.
    fn env_line(&self, name: &str) -> usize {
        let table = self.text.find("[env]").unwrap_or(0);
        self.text[table..]
            .lines()
            .scan(table, |off, l| {
                let start = *off;
                *off += l.len() + 1;
                Some((start, l))
            })
            .find(|(_, l)| {
                let l = l.trim_start().trim_start_matches(['"', '\'']);
                l.starts_with(name)
            })
            .map_or(0, |(o, _)| o)
    }
}

/// One `[[step]]` table being validated: errors name its key as `step[i].field`.
struct StepText<'a> {
    src: &'a PolicyText<'a>,
    i: usize,
    kind: StepKind,
    raw: &'a RawStep,
}

impl StepText<'_> {
    /// The error for this step's `field`, on the line of byte `offset`.
    fn invalid(&self, offset: usize, field: &str, message: String) -> PolicyError {
        self.src
            .invalid(offset, &format!("step[{}].{field}", self.i), message)
    }

    /// `field` was given to a kind that does not take it.
    fn not_for(&self, field: &str, sp: std::ops::Range<usize>) -> PolicyError {
        self.invalid(
            sp.start,
            field,
            format!("{} does not take {field}", self.kind),
        )
    }

    /// halve_micro_batch: `min` (at least 1).
    fn halve_micro_batch(&self, step: &mut Step) -> Result<(), PolicyError> {
        let s = self.raw;
        if let Some(f) = &s.factor {
            return Err(self.not_for("factor", f.span()));
        }
        if let Some(m) = &s.max {
            return Err(self.not_for("max", m.span()));
        }
        if let Some(m) = &s.min {
            if *m.get_ref() == 0 {
                return Err(self.invalid(
                    m.span().start,
                    "min",
                    "the smallest micro-batch is 1".into(),
                ));
            }
            step.min = *m.get_ref();
        }
        Ok(())
    }

    /// shorten_seq: `factor` (between 0 and 1), `min` (default 128) and
    /// `multiple_of` (default 8).
    fn shorten_seq(&self, step: &mut Step) -> Result<(), PolicyError> {
        let s = self.raw;
        if let Some(m) = &s.max {
            return Err(self.not_for("max", m.span()));
        }
        if let Some(f) = &s.factor {
            let v = *f.get_ref();
            if !(v > 0.0 && v < 1.0) {
                return Err(self.invalid(
                    f.span().start,
                    "factor",
                    format!("must be between 0 and 1 (exclusive), found {v}"),
                ));
            }
            step.factor = v;
        }
        if let Some(m) = &s.multiple_of
            && *m.get_ref() == 0
        {
            return Err(self.invalid(
                m.span().start,
                "multiple_of",
                "must be at least 1 (1: any length)".into(),
            ));
        }
        step.min = s.min.as_ref().map_or(128, |m| *m.get_ref()).max(1);
        step.multiple_of = s.multiple_of.as_ref().map_or(8, |m| *m.get_ref());
        Ok(())
    }

    /// raise_zero_stage: `max` (a stage, 1 to 3).
    fn raise_zero_stage(&self, step: &mut Step) -> Result<(), PolicyError> {
        if let Some(m) = &self.raw.max {
            let v = *m.get_ref();
            if !(1..=3).contains(&v) {
                return Err(self.invalid(
                    m.span().start,
                    "max",
                    format!("ZeRO stages are 1 to 3, found {v}"),
                ));
            }
            step.max = v;
        }
        Ok(())
    }

    /// enable_grad_checkpointing, offload_optimizer, offload_param: no numbers;
    /// the offloads may take an absolute `nvme_path`.
    fn switch(&self, step: &mut Step) -> Result<(), PolicyError> {
        let s = self.raw;
        if let Some(p) = &s.nvme_path {
            if matches!(
                self.kind,
                StepKind::EnableGradCheckpointing | StepKind::FsdpFullShard
            ) {
                return Err(self.not_for("nvme_path", p.span()));
            }
            if !p.get_ref().starts_with('/') {
                return Err(self.invalid(
                    p.span().start,
                    "nvme_path",
                    format!("{:?} is not an absolute path", p.get_ref()),
                ));
            }
            step.nvme_path = Some(p.get_ref().clone());
        }
        for (field, sp) in [
            ("min", s.min.as_ref().map(|x| x.span())),
            ("factor", s.factor.as_ref().map(|x| x.span())),
            ("max", s.max.as_ref().map(|x| x.span())),
        ] {
            if let Some(sp) = sp {
                return Err(self.not_for(field, sp));
            }
        }
        Ok(())
    }
}

const ENV_ALLOWED_PREFIXES: &[&str] = &["PYTORCH_", "NCCL_", "TORCH_NCCL_", "CUDA_"];
const ENV_ALLOWED: &[&str] = &[
    "TOKENIZERS_PARALLELISM",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
];
const ENV_ALLOWED_DESC: &str = "PYTORCH_*, NCCL_*, TORCH_NCCL_*, CUDA_*, TOKENIZERS_PARALLELISM, PYTHONUNBUFFERED, OMP_NUM_THREADS and MKL_NUM_THREADS";

fn env_allowed(name: &str) -> bool {
    ENV_ALLOWED.contains(&name) || ENV_ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The step chosen after an outcome, with settings before and after, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub step: StepKind,
    pub before: Settings,
    pub after: Settings,
    pub reason: String,
}

/// Why a step cannot be used for this command (shown by `plan`).
#[derive(Debug, Clone, Serialize)]
pub struct NotApplicable {
    pub step: StepKind,
    pub why: String,
}

/// Largest divisor of `n` that is at most `limit` (≥ 1).
fn largest_divisor_at_most(n: u64, limit: u64) -> u64 {
    // Divisors come in pairs (d, n/d) with d ≤ √n: O(√n), not O(limit) — a
    // micro-batch of 10^12 (a typo) must not hang the plan.
    let mut best = 1;
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            for c in [d, n / d] {
                if c <= limit && c > best {
                    best = c;
                }
            }
        }
        d += 1;
    }
    best
}

/// Steps that cannot apply to this command at all, whatever the settings.
pub fn not_applicable(policy: &Policy, disc: &Discovery) -> Vec<NotApplicable> {
    let mut out = Vec::new();
    // Why a flag the family would add is not: the script's parser lacks it.
    let refused = |k: Knob| {
        disc.not_accepted
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, why)| why.as_str())
    };
    for s in &policy.steps {
        let why = match s.kind {
            StepKind::HalveMicroBatch if !disc.knobs.contains_key(&Knob::MicroBatch) => {
                Some("micro_batch is not bound (see the notes for how to bind it)".to_string())
            }
            StepKind::HalveMicroBatch
                if policy.keep_global_batch && !disc.knobs.contains_key(&Knob::GradAccum) =>
            {
                Some(match refused(Knob::GradAccum) {
                    Some(why) => format!("{why}: halving the micro-batch would change the global batch (bind an accumulation option the script has with --knob grad_accum=--ITS_FLAG=1 before the command, or accept a smaller global batch with --policy smaller-batch)"),
                    None => "grad_accum is not bound, so halving the micro-batch would change the global batch (bind it with --knob grad_accum=FLAG, or accept a smaller global batch with --policy smaller-batch)".to_string(),
                })
            }
            StepKind::EnableGradCheckpointing
                if !disc.knobs.contains_key(&Knob::GradCheckpointing) =>
            {
                Some(match refused(Knob::GradCheckpointing) {
                    Some(why) => format!("{why} (bind a checkpointing option the script has with --knob grad_checkpointing=--ITS_FLAG)"),
                    None => "grad_checkpointing is not bound (--knob grad_checkpointing=FLAG)".into(),
                })
            }
            StepKind::FsdpFullShard if !disc.knobs.contains_key(&Knob::Fsdp) => Some(
                "FSDP is added only to a Hugging Face Trainer script on several GPUs, or to a script that goes through accelerate (an Accelerator or a Trainer) under `accelerate launch` on several GPUs, whose command sets no DeepSpeed or FSDP".into(),
            ),
            StepKind::ShortenSeq if !disc.knobs.contains_key(&Knob::SeqLen) => {
                Some("seq_len is not bound (--knob seq_len=FLAG)".into())
            }
            StepKind::OffloadOptimizer if disc.settings().fsdp_offload => Some(
                "FSDP has no optimizer-only offload: its CPU offload takes the optimizer step with the parameters (offload_param)".into(),
            ),
            StepKind::RaiseZeroStage | StepKind::OffloadOptimizer
                if !disc.knobs.contains_key(&Knob::ZeroStage) =>
            {
                Some(format!(
                    "no ZeRO setting in the command (looked for {})",
                    crate::frameworks::zero_hints()
                ))
            }
            StepKind::OffloadOptimizer if !disc.knobs.contains_key(&Knob::OffloadOptimizer) => {
                Some("the ZeRO stage is a flag, with no config file to offload in".into())
            }
            StepKind::OffloadParam if !disc.knobs.contains_key(&Knob::OffloadParam) => Some(
                "no DeepSpeed config in the command to offload parameters in (offload_param needs ZeRO stage 3), and no FSDP offload setting (the Trainer's FSDP words such as full_shard, accelerate's fsdp_offload_params, a recipe's fsdp_config.offload_params or fsdp_cpu_offload)".into(),
            ),
            _ => None,
        };
        if let Some(why) = why
            && !out.iter().any(|n: &NotApplicable| n.step == s.kind)
        {
            out.push(NotApplicable { step: s.kind, why });
        }
    }
    out
}

/// Apply one step to `cur`; `None` when it cannot change anything (unbound or at its floor).
fn apply(step: &Step, policy: &Policy, cur: &Settings) -> Option<(Settings, String)> {
    match step.kind {
        StepKind::HalveMicroBatch => halve_micro_batch(step, policy.keep_global_batch, cur),
        StepKind::EnableGradCheckpointing => enable_grad_checkpointing(cur),
        StepKind::ShortenSeq => shorten_seq(step, cur),
        StepKind::RaiseZeroStage => raise_zero_stage(step, cur),
        StepKind::OffloadOptimizer => offload_optimizer(step, cur),
        StepKind::OffloadParam => offload_param(step, cur),
        StepKind::FsdpFullShard => fsdp_full_shard(cur),
        // Rejected when the policy is read.
        StepKind::HalveDataloaderWorkers | StepKind::HalveEvalBatch | StepKind::NoGatherOnSave => {
            None
        }
    }
}

/// Halve the micro-batch down to the step's floor. Where accumulation is bound, only
/// to a divisor of micro × accum, raising the accumulation to match: the global batch
/// is kept whatever `keep_global_batch` says. Where it is not, the micro-batch is
/// halved alone, and the global batch shrinks with it, only when `keep_global_batch`
/// is false (the `smaller-batch` policy).
fn halve_micro_batch(
    step: &Step,
    keep_global_batch: bool,
    cur: &Settings,
) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    let micro = cur.int(Knob::MicroBatch)?;
    let accum = cur.int(Knob::GradAccum);
    let min = step.min.max(cur.micro_floor);
    if micro <= min {
        return None;
    }
    let target = (micro / 2).max(min);
    match accum {
        Some(accum) => {
            // Keep micro × accum exactly: the new micro-batch divides the product.
            let product = micro.checked_mul(accum)?;
            let m = largest_divisor_at_most(product, target);
            if m < min || m >= micro {
                return None;
            }
            next.knobs.insert(Knob::MicroBatch, Value::Int(m));
            next.knobs.insert(Knob::GradAccum, Value::Int(product / m));
            let gb = next
                .global_batch()
                .map(|g| format!(", global batch {g} kept"))
                .unwrap_or_default();
            Some((
                next,
                format!(
                    "micro-batch {micro} → {m}, accumulation {accum} → {}{gb}",
                    product / m
                ),
            ))
        }
        None if keep_global_batch => None,
        _ => {
            next.knobs.insert(Knob::MicroBatch, Value::Int(target));
            Some((
                next,
                format!(
                    "micro-batch {micro} → {target}, no accumulation to double: the global batch shrinks with it (keep_global_batch = false)"
                ),
            ))
        }
    }
}

/// Turn gradient checkpointing on, if it is off.
fn enable_grad_checkpointing(cur: &Settings) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    if cur.bool(Knob::GradCheckpointing)? {
        return None;
    }
    next.knobs
        .insert(Knob::GradCheckpointing, Value::Bool(true));
    Some((
        next,
        "gradient checkpointing on: activations recomputed in backward instead of stored".into(),
    ))
}

/// Multiply the sequence length by the step's factor, rounded down to its
/// multiple. The new length is always a multiple of `multiple_of` and at least
/// `min`: below the floor it is the smallest such length instead, and when no
/// such length is shorter than the current one the step does not apply.
fn shorten_seq(step: &Step, cur: &Settings) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    let seq = cur.int(Knob::SeqLen)?;
    if seq <= step.min {
        return None;
    }
    let multiple = step.multiple_of.max(1);
    let raw = ((seq as f64) * step.factor).floor() as u64;
    let rounded = raw / multiple * multiple;
    let new = if rounded >= step.min {
        rounded
    } else {
        // The smallest multiple at or above the floor.
        step.min.div_ceil(multiple).checked_mul(multiple)?
    };
    if new >= seq || new == 0 {
        return None;
    }
    next.knobs.insert(Knob::SeqLen, Value::Int(new));
    Some((
        next,
        format!("sequence length {seq} → {new} (this changes what the model sees)"),
    ))
}

/// Raise the ZeRO stage by one useful step, up to the step's highest stage.
/// FSDP full-shard, where the command has the `fsdp` knob (bound only on
/// several GPUs with no DeepSpeed or FSDP setting) and it is off.
fn fsdp_full_shard(cur: &Settings) -> Option<(Settings, String)> {
    if cur.bool(Knob::Fsdp) != Some(false) || cur.world_size <= 1 {
        return None;
    }
    let mut next = cur.clone();
    next.knobs.insert(Knob::Fsdp, Value::Bool(true));
    Some((
        next,
        format!(
            "FSDP full-shard over {} GPUs (parameters, gradients and optimizer state sharded; the updates are the same)",
            cur.world_size
        ),
    ))
}

fn raise_zero_stage(step: &Step, cur: &Settings) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    let stage = cur.int(Knob::ZeroStage)?;
    // One rank has nothing to shard over: stages 1-3 save no memory there (the
    // offload steps raise the stage they need themselves).
    if stage >= step.max || cur.world_size <= 1 {
        return None;
    }
    // 0 and 1 shard little; the next useful stage is 2, then 3.
    let new = if stage < 2 {
        2.min(step.max)
    } else {
        stage + 1
    };
    if new <= stage {
        return None;
    }
    next.knobs.insert(Knob::ZeroStage, Value::Int(new));
    Some((
        next,
        format!(
            "ZeRO stage {stage} → {new}: {}",
            if new == 3 {
                "parameters sharded across ranks too"
            } else {
                "gradients and optimizer states sharded across ranks"
            }
        ),
    ))
}

/// Offload the optimizer states (ZeRO stage 1 or higher), if not offloaded yet.
pub(crate) fn offload_optimizer(step: &Step, cur: &Settings) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    let dev = cur.knobs.get(&Knob::OffloadOptimizer)?.as_offload()?;
    let stage = cur.int(Knob::ZeroStage).unwrap_or(0);
    if *dev != Offload::None {
        return None;
    }
    // ZeRO-Offload needs a ZeRO stage. At world size 1 raise_zero_stage never
    // applies (sharding saves nothing), so the offload raises it to 2 itself.
    let raised = if stage == 0 {
        if cur.world_size > 1 || !cur.knobs.contains_key(&Knob::ZeroStage) {
            return None;
        }
        next.knobs.insert(Knob::ZeroStage, Value::Int(2));
        ", with ZeRO stage 0 → 2 (which offload needs)"
    } else {
        ""
    };
    let (v, to) = offload_target(step);
    next.knobs.insert(Knob::OffloadOptimizer, v);
    Some((
        next,
        format!("optimizer states offloaded to {to}{raised} (slower steps, much less GPU memory)"),
    ))
}

/// Offload the parameters (ZeRO stage 3 only), if not offloaded yet.
pub(crate) fn offload_param(step: &Step, cur: &Settings) -> Option<(Settings, String)> {
    let mut next = cur.clone();
    let dev = cur.knobs.get(&Knob::OffloadParam)?.as_offload()?;
    if *dev != Offload::None {
        return None;
    }
    // FSDP's CPUOffload: with any sharding, to the CPU only, the gradients and
    // the optimizer step going with the parameters.
    if cur.fsdp_offload {
        next.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
        let nvme = if step.nvme_path.is_some() {
            "; FSDP has no NVMe offload, so the policy's nvme_path is not used"
        } else {
            ""
        };
        return Some((
            next,
            format!(
                "parameters offloaded to CPU with FSDP's CPU offload (their gradients and the optimizer step too; slower steps{nvme})"
            ),
        ));
    }
    let stage = cur.int(Knob::ZeroStage)?;
    // As for the optimizer: at world size 1 the offload raises the stage to 3 itself.
    let raised = if stage != 3 {
        if cur.world_size > 1 {
            return None;
        }
        next.knobs.insert(Knob::ZeroStage, Value::Int(3));
        format!(", with ZeRO stage {stage} → 3 (which parameter offload needs)")
    } else {
        String::new()
    };
    let (v, to) = offload_target(step);
    next.knobs.insert(Knob::OffloadParam, v);
    Some((
        next,
        format!("parameters offloaded to {to}{raised} (ZeRO-3 only)"),
    ))
}

/// CPU, or NVMe when the step names an NVMe path (materialize writes the
/// device and the path).
fn offload_target(step: &Step) -> (Value, String) {
    match &step.nvme_path {
        Some(p) => (
            Value::Offload(Offload::Nvme {
                path: Some(p.clone()),
            }),
            format!("NVMe at {p}"),
        ),
        None => (Value::Offload(Offload::Cpu), "CPU memory".into()),
    }
}

/// Each step of the policy applied once to `cur`: what it would lead to.
pub fn successors(policy: &Policy, cur: &Settings) -> Vec<(StepKind, Settings)> {
    policy
        .steps
        .iter()
        .filter_map(|step| apply(step, policy, cur).map(|(s, _)| (step.kind, s)))
        .collect()
}

/// The ladder's next rung after the OOM `evidence` shows: the first step that
/// can still change `cur`, or `None` when the policy has run out of steps (the
/// rule that takes it is `next`'s). The reason starts with the evidence's own words
/// ("OOM (tried to allocate 2.00 GiB on GPU 0, ...)", "assumed OOM").
pub fn next_rung(policy: &Policy, cur: &Settings, evidence: &Evidence) -> Option<Decision> {
    next_rung_where(policy, cur, evidence, &|_| true)
}

/// [`next_rung`], among the steps whose settings `keep` accepts.
pub fn next_rung_where(
    policy: &Policy,
    cur: &Settings,
    evidence: &Evidence,
    keep: &dyn Fn(&Settings) -> bool,
) -> Option<Decision> {
    policy.steps.iter().find_map(|step| {
        let (after, what) = apply(step, policy, cur).filter(|(after, _)| keep(after))?;
        Some(Decision {
            step: step.kind,
            before: cur.clone(),
            after,
            reason: format!("{evidence}: {what}"),
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn oom() -> Evidence {
        Evidence::cuda_oom(None)
    }

    /// Settings of a test: micro-batch, accumulation, sequence, checkpointing; 2 GPUs.
    pub(crate) fn settings(micro: u64, accum: u64, seq: Option<u64>, gc: bool) -> Settings {
        let mut knobs = BTreeMap::new();
        knobs.insert(Knob::MicroBatch, Value::Int(micro));
        knobs.insert(Knob::GradAccum, Value::Int(accum));
        if let Some(s) = seq {
            knobs.insert(Knob::SeqLen, Value::Int(s));
        }
        knobs.insert(Knob::GradCheckpointing, Value::Bool(gc));
        Settings {
            knobs,
            world_size: 2,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        }
    }

    /// The policy's ladder never touches the evaluation batch, and no policy
    /// file may list halve_eval_batch (oomguard takes it itself).
    #[test]
    fn the_ladder_never_changes_the_eval_batch_and_no_policy_lists_it() {
        let p = Policy::load("default").unwrap();
        let mut s = settings(8, 2, Some(2048), false);
        s.knobs.insert(Knob::EvalBatch, Value::Int(8));
        while let Some(d) = next_rung(&p, &s, &oom()) {
            assert_eq!(d.after.int(Knob::EvalBatch), Some(8), "{}", d.step);
            s = d.after;
        }
        let err = Policy::parse(
            "p",
            Path::new("p.toml"),
            "[[step]]\nkind = \"halve_eval_batch\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("halve_eval_batch is not a policy step"),
            "{err}"
        );
    }

    #[test]
    fn shipped_policies_parse() {
        for (name, _) in SHIPPED {
            let p = Policy::load(name).unwrap();
            assert!(!p.steps.is_empty(), "{name}");
        }
    }

    #[test]
    fn default_ladder_keeps_global_batch_exactly() {
        let p = Policy::load("default").unwrap();
        let mut s = settings(6, 1, Some(2048), false);
        let gb = s.global_batch().unwrap();
        let mut steps = vec![];
        while let Some(d) = next_rung(&p, &s, &oom()) {
            steps.push(d.step);
            s = d.after;
            assert_eq!(s.global_batch().unwrap(), gb);
        }
        // 6 → 3 → 1 (divisors of 6), then checkpointing, then the sequence.
        assert_eq!(steps[0], StepKind::HalveMicroBatch);
        assert_eq!(steps[1], StepKind::HalveMicroBatch);
        assert_eq!(steps[2], StepKind::EnableGradCheckpointing);
        assert_eq!(s.int(Knob::MicroBatch), Some(1));
        assert_eq!(s.int(Knob::GradAccum), Some(6));
        assert!(steps.contains(&StepKind::ShortenSeq));
    }

    /// `smaller-batch` halves the batch of a command without accumulation alone, and
    /// keeps the global batch of one that has it, as `default` does (its file and
    /// docs/how-it-decides.md say so; the ladder used to halve the micro-batch alone
    /// there too, shrinking the global batch of a Trainer script for nothing).
    #[test]
    fn the_smaller_batch_policy_keeps_the_global_batch_where_accumulation_is_bound() {
        let p = Policy::load("smaller-batch").unwrap();
        assert!(!p.keep_global_batch);
        let s = settings(8, 2, Some(2048), false);
        let d = next_rung(&p, &s, &oom()).unwrap();
        assert_eq!(d.step, StepKind::HalveMicroBatch);
        assert_eq!(
            (d.after.int(Knob::MicroBatch), d.after.int(Knob::GradAccum)),
            (Some(4), Some(4))
        );
        assert_eq!(d.after.global_batch(), s.global_batch());
        assert!(d.reason.contains("global batch 32 kept"), "{}", d.reason);

        let mut alone = s.clone();
        alone.knobs.remove(&Knob::GradAccum);
        let d = next_rung(&p, &alone, &oom()).unwrap();
        assert_eq!(d.after.int(Knob::MicroBatch), Some(4));
        assert_eq!(d.after.int(Knob::GradAccum), None);
        assert!(
            d.reason.contains("the global batch shrinks with it"),
            "{}",
            d.reason
        );
        // The default policy does not halve it alone.
        let default = Policy::load("default").unwrap();
        let d = next_rung(&default, &alone, &oom()).unwrap();
        assert_ne!(d.step, StepKind::HalveMicroBatch);
    }

    /// FSDP's CPU offload (no ZeRO knob, the offload FSDP's): after the batch and
    /// checkpointing, at any world size, to the CPU even where the policy names
    /// an NVMe path (FSDP has none), and before any shorter sequence.
    #[test]
    fn an_fsdp_run_offloads_to_the_cpu_after_the_batch_and_checkpointing() {
        for world in [1, 4] {
            let mut s = settings(2, 2, Some(2048), false);
            s.world_size = world;
            s.fsdp_offload = true;
            s.knobs
                .insert(Knob::OffloadParam, Value::Offload(Offload::None));
            let p = Policy::load("default").unwrap();
            let mut steps = vec![];
            let mut cur = s.clone();
            while let Some(d) = next_rung(&p, &cur, &oom()) {
                steps.push(d.step);
                cur = d.after;
            }
            assert_eq!(
                &steps[..4],
                &[
                    StepKind::HalveMicroBatch,
                    StepKind::EnableGradCheckpointing,
                    StepKind::OffloadParam,
                    StepKind::ShortenSeq,
                ],
                "world {world}"
            );
            assert_eq!(cur.knobs[&Knob::OffloadParam], Value::Offload(Offload::Cpu));

            let nvme = Step {
                kind: StepKind::OffloadParam,
                min: 0,
                factor: 0.5,
                multiple_of: 1,
                max: 0,
                nvme_path: Some("/nvme".into()),
            };
            let (after, what) = offload_param(&nvme, &s).unwrap();
            assert_eq!(
                after.knobs[&Knob::OffloadParam],
                Value::Offload(Offload::Cpu)
            );
            assert!(what.contains("FSDP has no NVMe offload"), "{what}");
            // A DeepSpeed offload at the same settings needs its stage.
            let mut ds = s.clone();
            ds.fsdp_offload = false;
            assert_eq!(offload_param(&nvme, &ds), None);
        }
    }

    /// Results first: every results-preserving step (micro-batch, checkpointing,
    /// ZeRO, offload) comes before the first shorter sequence.
    #[test]
    fn default_ladder_shortens_the_sequence_only_when_nothing_else_is_left() {
        let p = Policy::load("default").unwrap();
        for world in [1, 4] {
            let mut s = settings(4, 2, Some(2048), false);
            s.world_size = world;
            s.knobs.insert(Knob::ZeroStage, Value::Int(0));
            s.knobs
                .insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
            s.knobs
                .insert(Knob::OffloadParam, Value::Offload(Offload::None));
            let mut steps = vec![];
            while let Some(d) = next_rung(&p, &s, &oom()) {
                steps.push(d.step);
                s = d.after;
            }
            let first_short = steps
                .iter()
                .position(|k| *k == StepKind::ShortenSeq)
                .unwrap();
            assert!(
                steps[first_short..]
                    .iter()
                    .all(|k| *k == StepKind::ShortenSeq),
                "world {world}: {steps:?}"
            );
            let expected: &[StepKind] = if world == 1 {
                // No ZeRO raise at world size 1: the offloads raise the stage they need.
                &[
                    StepKind::HalveMicroBatch,
                    StepKind::HalveMicroBatch,
                    StepKind::EnableGradCheckpointing,
                    StepKind::OffloadOptimizer,
                    StepKind::OffloadParam,
                ]
            } else {
                &[
                    StepKind::HalveMicroBatch,
                    StepKind::HalveMicroBatch,
                    StepKind::EnableGradCheckpointing,
                    StepKind::RaiseZeroStage,
                    StepKind::RaiseZeroStage,
                    StepKind::OffloadOptimizer,
                    StepKind::OffloadParam,
                ]
            };
            assert_eq!(&steps[..first_short], expected, "world {world}");
            assert_eq!(s.int(Knob::ZeroStage), Some(3));
            assert_eq!(s.knobs[&Knob::OffloadParam], Value::Offload(Offload::Cpu));
        }
    }

    #[test]
    fn keep_results_never_shortens() {
        let p = Policy::load("keep-results").unwrap();
        let mut s = settings(8, 1, Some(1024), false);
        while let Some(d) = next_rung(&p, &s, &oom()) {
            assert_ne!(d.step, StepKind::ShortenSeq);
            s = d.after;
        }
        assert_eq!(s.int(Knob::SeqLen), Some(1024));
    }

    #[test]
    fn malformed_policy_names_file_line_and_key() {
        let text = "max_attempts = 3\n\n[[step]]\nkind = \"halve_micro_batch\"\nmin = 1\n\n[[step]]\nkind = \"shorten_seq\"\nfactor = 1.5\n";
        let e = Policy::parse("x", Path::new("my.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("my.toml:9: step[1].factor:"), "{e}");

        let text = "[[step]]\nkind = \"halve_the_batch\"\n";
        let e = Policy::parse("x", Path::new("p.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:2: kind:"), "{e}");
        assert!(e.contains("halve_micro_batch"), "{e}");

        let text = "[[step]]\nkind = \"halve_micro_batch\"\nminimum = 2\n";
        let e = Policy::parse("x", Path::new("p.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:3: minimum:"), "{e}");
    }

    #[test]
    fn resume_table_is_validated() {
        let text = "[[step]]\nkind = \"halve_micro_batch\"\n\n[resume]\nflag = \"--resume_from\"\ndir = \"outputs\"\npattern = \"step_N\"\n";
        let e = Policy::parse("x", Path::new("p.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:4: resume.pattern:"), "{e}");
        let ok = text.replace("step_N", "step_{step}");
        let p = Policy::parse("x", Path::new("p.toml"), &ok).unwrap();
        assert_eq!(p.resume.unwrap().flag, "--resume_from");
    }

    #[test]
    fn zero_ladder_raises_then_offloads() {
        let p = Policy::load("keep-micro-batch").unwrap();
        let mut s = settings(4, 2, None, false);
        s.knobs.insert(Knob::ZeroStage, Value::Int(1));
        s.knobs
            .insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
        s.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::None));
        let mut steps = vec![];
        while let Some(d) = next_rung(&p, &s, &oom()) {
            steps.push(d.step);
            s = d.after;
        }
        assert_eq!(
            steps[..5],
            [
                StepKind::RaiseZeroStage,
                StepKind::RaiseZeroStage,
                StepKind::EnableGradCheckpointing,
                StepKind::OffloadOptimizer,
                StepKind::OffloadParam
            ]
        );
        assert_eq!(s.int(Knob::ZeroStage), Some(3));
        assert_eq!(s.int(Knob::MicroBatch), Some(1));
        assert_eq!(s.knobs[&Knob::OffloadParam], Value::Offload(Offload::Cpu));
    }

    #[test]
    fn offload_to_nvme_when_the_policy_gives_a_path() {
        let text = "[[step]]\nkind = \"offload_optimizer\"\nnvme_path = \"/local_nvme\"\n";
        let p = Policy::parse("x", Path::new("p.toml"), text).unwrap();
        let mut s = settings(4, 2, None, false);
        s.knobs.insert(Knob::ZeroStage, Value::Int(2));
        s.knobs
            .insert(Knob::OffloadOptimizer, Value::Offload(Offload::None));
        let d = next_rung(&p, &s, &oom()).unwrap();
        let after = &d.after.knobs[&Knob::OffloadOptimizer];
        assert_eq!(
            *after,
            Value::Offload(Offload::Nvme {
                path: Some("/local_nvme".into())
            })
        );
        // Shown and journaled as before the value was typed.
        assert_eq!(after.to_string(), "nvme:/local_nvme");
        assert_eq!(serde_json::json!(after), "nvme:/local_nvme");
        let bad = "[[step]]\nkind = \"offload_param\"\nnvme_path = \"nvme\"\n";
        let e = Policy::parse("x", Path::new("p.toml"), bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:3: step[0].nvme_path:"), "{e}");
    }

    #[test]
    fn a_policy_cannot_set_code_loading_variables() {
        for name in ["LD_PRELOAD", "PYTHONPATH", "PATH", "BASH_ENV"] {
            let text = format!(
                "[env]\nPYTHONUNBUFFERED = \"1\"\n{name} = \"/tmp/x\"\n\n[[step]]\nkind = \"halve_micro_batch\"\n"
            );
            let e = Policy::parse("x", Path::new("p.toml"), &text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("p.toml:3: env.{name}:")), "{e}");
        }
        let ok = "[env]\nPYTORCH_CUDA_ALLOC_CONF = \"expandable_segments:True\"\nNCCL_DEBUG = \"WARN\"\n\n[[step]]\nkind = \"halve_micro_batch\"\n";
        assert!(Policy::parse("x", Path::new("p.toml"), ok).is_ok());
    }

    #[test]
    fn divisors_are_found_fast_even_for_absurd_values() {
        assert_eq!(largest_divisor_at_most(12, 5), 4);
        assert_eq!(largest_divisor_at_most(12, 12), 12);
        assert_eq!(largest_divisor_at_most(13, 6), 1);
        assert_eq!(largest_divisor_at_most(1_000_000, 999), 800);
        let t = std::time::Instant::now();
        assert_eq!(largest_divisor_at_most(1 << 40, 1 << 39), 1 << 39);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn odd_micro_batches_stay_exact() {
        let p = Policy::load("default").unwrap();
        let s = settings(5, 2, None, true);
        let d = next_rung(&p, &s, &oom()).unwrap();
        assert_eq!(d.after.int(Knob::MicroBatch), Some(2));
        assert_eq!(d.after.int(Knob::GradAccum), Some(5));
    }

    #[test]
    fn the_reason_starts_with_the_evidence() {
        let p = Policy::load("default").unwrap();
        let s = settings(12, 1, None, false);
        let d = next_rung(&p, &s, &Evidence::assumed()).unwrap();
        assert_eq!(
            d.reason,
            "assumed OOM: micro-batch 12 → 6, accumulation 1 → 2, global batch 24 kept"
        );
        let numbers = crate::detect::OomNumbers {
            tried_to_allocate_bytes: Some(3 << 30),
            device: Some(1),
            ..Default::default()
        };
        let d = next_rung(&p, &s, &Evidence::cuda_oom(Some(numbers))).unwrap();
        assert!(
            d.reason
                .starts_with("OOM (tried to allocate 3.00 GiB on GPU 1): micro-batch 12 → 6"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn env_names_and_values_must_fit_an_environment() {
        for (text, key) in [
            (
                "[env]\nPYTORCH_NO_CUDA_MEMORY_CACHING = \"0\\u0000x\"\n",
                "env.PYTORCH_NO_CUDA_MEMORY_CACHING",
            ),
            ("[env]\n\"PYTORCH_A=B\" = \"1\"\n", "env.PYTORCH_A=B"),
        ] {
            let text = format!("[[step]]\nkind = \"halve_micro_batch\"\n{text}");
            let e = Policy::parse("x", Path::new("p.toml"), &text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("p.toml:4: {key}:")), "{e}");
        }
    }

    #[test]
    fn a_policy_file_is_a_small_regular_file() {
        let e = Policy::load("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("/dev/zero: not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, "#".repeat((MAX_POLICY_BYTES + 1) as usize)).unwrap();
        let e = Policy::load(big.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("larger than 1024 KiB"), "{e}");
        let e = Policy::load(dir.path().to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn multiple_of_zero_is_refused() {
        let text = "[[step]]\nkind = \"shorten_seq\"\nmultiple_of = 0\n";
        let e = Policy::parse("x", Path::new("p.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.toml:3: step[0].multiple_of:"), "{e}");
    }

    #[test]
    fn a_shortened_sequence_is_a_multiple_at_or_above_the_floor() {
        let step = |multiple_of, min| Step {
            kind: StepKind::ShortenSeq,
            min,
            factor: 0.5,
            multiple_of,
            max: 3,
            nvme_path: None,
        };
        let seq = |s: &Step, len: u64| {
            shorten_seq(s, &settings(1, 1, Some(len), true)).map(|(n, _)| n.int(Knob::SeqLen))
        };
        // No multiple of 4096 that is at least 10 is shorter than 1000.
        assert_eq!(seq(&step(4096, 10), 1000), None);
        // 500 → 256 is below the floor 600: the smallest multiple above it, 768.
        assert_eq!(seq(&step(256, 600), 1000), Some(Some(768)));
        assert_eq!(seq(&step(256, 600), 768), None);
        assert_eq!(seq(&step(8, 128), 1000), Some(Some(496)));
        assert_eq!(seq(&step(8, 128), 248), Some(Some(128)));
    }
}
