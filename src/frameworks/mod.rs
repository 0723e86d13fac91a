//! Trainer families: every fact that names one trainer or tool lives in its
//! file here, and [`FAMILIES`] lists them. The generic machinery (knob
//! discovery, config files, checkpoints, world size) reads the registry and
//! names no family; the "looked for …" notes are generated from it.
//!
//! Add a family: write `frameworks/NAME.rs` with one `pub static FAMILY:
//! Family = Family { ..Family::NONE }` and add one line to [`FAMILIES`]. A
//! field left at its default means "nothing of that kind".
//!
//! Order matters twice: spellings are searched in registry order (the first
//! key found in a file wins), and resume layouts are tried in registry order
//! (the first family whose `layout` answers wins), so specific families come
//! before the Hugging Face fallback.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::checkpoint::Layout;
use crate::command::{Command, LauncherKind};
use crate::files::{Doc, Scalar};
use crate::settings::{Knob, Offload, Value, World};

pub mod accelerate;
pub mod deepspeed;
mod fairseq;
pub mod hf;
mod hydra;
pub mod launchers;
pub mod lightning;
mod litgpt;
pub mod megatron;
pub mod nanogpt;
mod openrlhf;
mod oumi;
mod recipes;
mod torchtitan;
pub mod torchtune;

/// Spellings per knob.
pub type Spellings = &'static [(Knob, &'static [&'static str])];

/// The environment as oomguard sees it (overridable in tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// A tool's default config when the command names none, and the flag that
/// points the tool at a changed copy.
pub type DefaultConfig = (fn() -> Option<PathBuf>, &'static str);

/// A packaged config named by name: the name, and its path or why it was not found.
pub type Packaged = (String, Result<PathBuf, NotPackaged>);

/// Why a config named by name was not found in the tool's installation (said with
/// where it was looked for).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotPackaged {
    #[error("no `tune` on PATH")]
    NoTune,
    #[error("{} does not name its Python", .0.display())]
    NoPython(PathBuf),
    #[error("no prefix above {}", .0.display())]
    NoPrefix(PathBuf),
    #[error("looked in {}", .0.join(", "))]
    LookedIn(Vec<String>),
}

/// What a family's `layout` may read besides the command.
pub struct Ctx<'a> {
    /// The `output_dir` of a training recipe the command names, if any.
    pub recipe_output_dir: Option<&'a str>,
    /// Values of keys in the training recipes the command names (first file first).
    pub recipe_value: &'a dyn Fn(&str) -> Option<Scalar>,
}

/// One key of a config file that is a knob.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    pub knob: Knob,
    pub key: &'static str,
    /// The framework's value when the key is absent (DeepSpeed runs at ZeRO
    /// stage 0 without `zero_optimization`), or None when absent means unbound.
    pub absent: Option<AbsentValue>,
}

/// A default for an absent key (a `const`-friendly [`Value`]).
#[derive(Debug, Clone, Copy)]
pub enum AbsentValue {
    Int(u64),
    Bool(bool),
    /// Nothing offloaded.
    NoOffload,
}

impl AbsentValue {
    pub fn value(self) -> Value {
        match self {
            AbsentValue::Int(n) => Value::Int(n),
            AbsentValue::Bool(b) => Value::Bool(b),
            AbsentValue::NoOffload => Value::Offload(Offload::None),
        }
    }
}

/// A kind of config file a family's commands name (a DeepSpeed JSON, an
/// accelerate config): how the command names it and which keys are knobs.
pub struct FileKind {
    /// Shown in plan: "deepspeed json".
    pub label: &'static str,
    /// Commands in which the command can name it (accelerate's `--config_file`
    /// only in `accelerate launch`).
    pub when: fn(&Command) -> bool,
    /// Flags naming it (`--deepspeed ds.json`), and where they may stand:
    /// before the script only (a launcher's option) or anywhere.
    pub flags: &'static [&'static str],
    pub launcher_option_only: bool,
    /// A named path is this kind only when it looks like one (`.json`).
    pub accepts: fn(&str) -> bool,
    /// When the command names none: the file the tool reads by default, and
    /// the flag that points the tool at a changed copy (accelerate's
    /// `default_config.yaml`, `--config_file`).
    pub default: Option<DefaultConfig>,
    /// Whether its keys are knobs in this file (accelerate: only with
    /// `distributed_type: DEEPSPEED` and no `deepspeed_config_file`).
    pub applies: fn(&Doc) -> bool,
    pub keys: &'static [KeySpec],
    /// The key holding the global batch, rewritten as micro × accum × world.
    pub global_batch_key: Option<&'static str>,
    /// Keys of *other* files (any kind, or a training recipe) that name a file of this kind.
    pub named_in: &'static [&'static str],
    /// The world size written in it (accelerate's `num_processes`).
    pub world_key: Option<&'static str>,
}

impl std::fmt::Debug for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label)
    }
}

impl FileKind {
    pub const NONE: FileKind = FileKind {
        label: "",
        when: |_| true,
        flags: &[],
        launcher_option_only: false,
        accepts: |_| true,
        default: None,
        applies: |_| true,
        keys: &[],
        global_batch_key: None,
        named_in: &[],
        world_key: None,
    };
}

/// One trainer, launcher or tool convention.
pub struct Family {
    pub name: &'static str,
    /// Whether the command is this family's: its `own_*` spellings apply only then.
    pub recognise: fn(&Command) -> bool,
    /// Flags per knob, unambiguous in any command.
    pub flags: Spellings,
    /// Flags that are a knob only in this family's commands (a bare `--batch_size`).
    pub own_flags: Spellings,
    /// Keys of a training recipe per knob, in any recipe (most specific first).
    pub file_keys: Spellings,
    /// Keys that are a knob only in this family's recipes (`batch_size`).
    pub own_file_keys: Spellings,
    /// Override keys (`a.b=N`: the last segment) per knob, in any command.
    pub override_keys: Spellings,
    /// Override keys that are a knob only in this family's commands.
    pub own_override_keys: Spellings,
    /// Flags naming its training recipe (`--config x.yaml`, `-c`), after the script.
    pub config_flags: &'static [&'static str],
    /// Environment variables that name a training recipe.
    pub config_env: &'static [&'static str],
    /// Keys of its recipe that hold the global batch: accumulation follows
    /// from global / (micro × world) and is never written.
    pub global_batch_keys: &'static [&'static str],
    /// Its recipe's keys may be given as `--KEY V` flags, which win over the file.
    pub dotted_flags: bool,
    /// Missing knobs this family's commands accept as flags: added when the
    /// knob changes, starting from the given default.
    pub added_flags: &'static [(Knob, &'static str, AbsentValue)],
    /// Whether this command's program takes one of `added_flags` (default:
    /// all of them).
    pub accepts_added: fn(&Command, &str) -> bool,
    /// The program's own value for an absent knob, where it differs from
    /// `added_flags`' default (TRL's configs turn gradient checkpointing on):
    /// the settings, the policy and the memory model all start from it.
    pub absent_default: fn(&Command, Knob) -> Option<AbsentValue>,
    /// Config files other than training recipes.
    pub file_kinds: &'static [FileKind],
    /// Keys a training recipe may hold inline for this family's settings
    /// (GPT-NeoX's DeepSpeed keys): read only when `inline_when` is present.
    pub inline_keys: &'static [KeySpec],
    pub inline_when: Option<&'static str>,
    /// A config the tool finds by name in its installation
    /// (`--config llama3_2/1B_lora`): Some(Ok(path)), Some(Err(where it looked)), None.
    pub packaged_config: fn(&Command, Env) -> Option<Packaged>,
    /// Where its checkpoints are and how it resumes.
    pub layout: fn(&Command, &Ctx) -> Option<Layout>,
    /// For the "looked for" note: how its output folder is named.
    pub output_hint: &'static str,
    /// World size when the tool launches the ranks itself (`tune run --nproc_per_node 4`).
    pub world: fn(&Command, Env, &Ctx) -> Option<World>,
    /// Its accumulation counts the micro-batches of all ranks together.
    pub accum_covers_world: fn(&Command) -> bool,
    /// The smallest micro-batch the trainer takes, and why (fairseq's token budget
    /// cannot be below its longest sample): a halving stops there.
    pub micro_floor: fn(&Command) -> Option<(u64, String)>,
    /// How often it prints a log line for a step that names no step (the
    /// Hugging Face Trainer's log dicts), when the command says.
    pub logging: fn(&Command, &Ctx) -> Option<crate::progress::Logging>,
    /// What the step numbers its output prints count, when not the steps done.
    pub counting: Option<crate::progress::Counting>,
    /// Why the command saves no checkpoint while it trains (OpenRLHF's default
    /// `--ckpt.save_steps -1`, the Trainer's `--save_strategy no`), said before the
    /// run: after an OOM every relaunch starts from the beginning.
    pub saves_none: fn(&Command, &Ctx) -> Option<String>,
}

impl Family {
    pub const NONE: Family = Family {
        name: "",
        recognise: |_| false,
        flags: &[],
        own_flags: &[],
        file_keys: &[],
        own_file_keys: &[],
        override_keys: &[],
        own_override_keys: &[],
        config_flags: &[],
        config_env: &[],
        global_batch_keys: &[],
        dotted_flags: false,
        added_flags: &[],
        accepts_added: |_, _| true,
        absent_default: |_, _| None,
        file_kinds: &[],
        inline_keys: &[],
        inline_when: None,
        packaged_config: |_, _| None,
        layout: |_, _| None,
        output_hint: "",
        world: |_, _, _| None,
        accum_covers_world: |_| false,
        micro_floor: |_| None,
        logging: |_, _| None,
        counting: None,
        saves_none: |_, _| None,
    };
}

/// Every family, in the order their layouts are tried.
pub static FAMILIES: &[&Family] = &[
    &openrlhf::FAMILY,
    &torchtune::FAMILY,
    &megatron::FAMILY,
    &lightning::FAMILY,
    &nanogpt::FAMILY,
    &oumi::FAMILY,
    &litgpt::FAMILY,
    &recipes::FAMILY,
    &hf::FAMILY,
    &deepspeed::FAMILY,
    &accelerate::FAMILY,
    &hydra::FAMILY,
    &torchtitan::FAMILY,
    &fairseq::FAMILY,
];

/// The families that claim this command.
pub fn recognised(cmd: &Command) -> impl Iterator<Item = &'static Family> + '_ {
    FAMILIES.iter().copied().filter(move |f| (f.recognise)(cmd))
}

fn union(
    knob: Knob,
    pick: impl Fn(&Family) -> Spellings,
    families: &mut dyn Iterator<Item = &'static Family>,
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for f in families {
        for (k, names) in pick(f) {
            if *k == knob {
                for n in *names {
                    if !out.contains(n) {
                        out.push(n);
                    }
                }
            }
        }
    }
    out
}

/// Flag spellings of a knob in this command (the families' `flags`, plus a
/// recognised family's recipe keys as `--KEY` when it takes them so).
pub fn flag_spellings(knob: Knob, cmd: &Command) -> Vec<String> {
    let mut out: Vec<String> = union(knob, |f| f.flags, &mut FAMILIES.iter().copied())
        .into_iter()
        .chain(union(knob, |f| f.own_flags, &mut recognised(cmd)))
        .map(str::to_string)
        .collect();
    out.dedup();
    for f in recognised(cmd).filter(|f| f.dotted_flags) {
        for key in union(knob, |f| f.file_keys, &mut std::iter::once(f))
            .into_iter()
            .chain(union(knob, |f| f.own_file_keys, &mut std::iter::once(f)))
        {
            let flag = format!("--{key}");
            if !out.contains(&flag) {
                out.push(flag);
            }
        }
    }
    out
}

/// Keys of a training recipe that are this knob for this command.
pub fn recipe_keys(knob: Knob, cmd: &Command) -> Vec<&'static str> {
    let mut v = union(knob, |f| f.file_keys, &mut FAMILIES.iter().copied());
    for k in union(knob, |f| f.own_file_keys, &mut recognised(cmd)) {
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// Override keys (last dotted segment, or the whole key for a family's own) for this command.
pub fn override_matches(knob: Knob, key: &str, cmd: &Command) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    union(knob, |f| f.override_keys, &mut FAMILIES.iter().copied()).contains(&last)
        || union(knob, |f| f.own_override_keys, &mut recognised(cmd)).contains(&key)
}

/// Whether a recognised family claims this override key for some knob
/// (so an otherwise ambiguous `batch_size=` is not reported as ambiguous).
pub fn claims_override(key: &str, cmd: &Command) -> bool {
    recognised(cmd).any(|f| {
        f.own_override_keys
            .iter()
            .any(|(_, keys)| keys.contains(&key))
    })
}

/// Whether a recognised family claims this flag for some knob (so an otherwise
/// ambiguous `--batch_size` is not reported as ambiguous).
pub fn claims_flag(flag: &str, cmd: &Command) -> bool {
    recognised(cmd).any(|f| f.own_flags.iter().any(|(_, names)| names.contains(&flag)))
}

/// Flags naming a training recipe, after the script.
pub fn recipe_flags(cmd: &Command) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for f in FAMILIES {
        for n in f.config_flags {
            // A family's short flag (`-c`) counts only in its own commands.
            let own = n.starts_with("--") || (f.recognise)(cmd);
            if own && !v.contains(n) {
                v.push(n);
            }
        }
    }
    v
}

/// Every environment variable that names a training recipe.
pub fn recipe_env() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().flat_map(|f| f.config_env.iter().copied())
}

/// Global-batch keys of recipes for this command.
pub fn global_batch_keys(cmd: &Command) -> Vec<&'static str> {
    recognised(cmd)
        .flat_map(|f| f.global_batch_keys.iter().copied())
        .collect()
}

/// Every kind of config file besides training recipes.
pub fn file_kinds() -> impl Iterator<Item = &'static FileKind> {
    FAMILIES.iter().flat_map(|f| f.file_kinds.iter())
}

/// Inline key groups of a training recipe: (the key that must be present, keys).
pub fn inline_keys() -> impl Iterator<Item = (&'static str, &'static [KeySpec])> {
    FAMILIES
        .iter()
        .filter_map(|f| f.inline_when.map(|w| (w, f.inline_keys)))
}

/// Flags to add when a knob is absent, for the recognised families.
pub fn added_flags(cmd: &Command) -> Vec<(Knob, &'static str, Value)> {
    recognised(cmd)
        .flat_map(|f| {
            f.added_flags
                .iter()
                .filter(move |(_, flag, _)| (f.accepts_added)(cmd, flag))
        })
        .map(|(k, flag, v)| (*k, *flag, absent_default(cmd, *k).unwrap_or(*v).value()))
        .collect()
}

/// The command's program's own value for knob `k` when the command does not
/// set it, where a recognised family knows one that differs from the usual.
pub fn absent_default(cmd: &Command, k: Knob) -> Option<AbsentValue> {
    recognised(cmd).find_map(|f| (f.absent_default)(cmd, k))
}

/// Whether the command's Python script (as the launchers run it, relative to
/// the working directory) holds one of `words`. `false` when there is no
/// script (`-m module`, a tool) or it cannot be read; its first
/// [`MAX_SCRIPT_BYTES`](crate::knobs::accepts::MAX_SCRIPT_BYTES) are looked at
/// ([`script_head`](crate::knobs::accepts::script_head)).
pub fn script_mentions(cmd: &Command, words: &[&str]) -> bool {
    use crate::knobs::accepts::{MAX_SCRIPT_BYTES, script_head};
    let Some(mut text) = cmd
        .script()
        .and_then(|s| script_head(std::path::Path::new(s)))
    else {
        return false;
    };
    text.truncate(MAX_SCRIPT_BYTES as usize);
    words
        .iter()
        .any(|w| memchr::memmem::find(&text, w.as_bytes()).is_some())
}

/// A packaged config the command names by name, if a recognised family has one.
pub fn packaged_config(cmd: &Command, env: Env) -> Option<Packaged> {
    recognised(cmd).find_map(|f| (f.packaged_config)(cmd, env))
}

/// The checkpoint layout of the first family that answers.
pub fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    FAMILIES.iter().find_map(|f| (f.layout)(cmd, ctx))
}

/// The world size: a tool that launches its own ranks says it, else the launchers' options;
/// for a batch, the data-parallel ranks among them (see [`data_parallel`]).
pub fn world(cmd: &Command, env: Env, ctx: &Ctx) -> World {
    let w = match recognised(cmd).find_map(|f| (f.world)(cmd, env, ctx)) {
        Some(w) => launchers::with_tasks(cmd, env, w, 1),
        None => launchers::world_size(cmd, env),
    };
    data_parallel(cmd, w)
}

/// Megatron's model parallelism: ranks that split one model (`--tensor-model-parallel-size`,
/// `--pipeline-model-parallel-size`, `--context-parallel-size`) see the same batch, so the
/// global batch is micro-batch × accumulation × the data-parallel ranks, the world divided
/// by their product, and so is the accumulation Megatron derives from `--global-batch-size`.
fn data_parallel(cmd: &Command, w: World) -> World {
    // Megatron's flags, or NeMo's Hydra overrides of the same names
    // (`model.tensor_model_parallel_size=2`).
    let degree = |names: &[&str], key: &str| {
        cmd.value(names)
            .or_else(|| {
                cmd.overrides
                    .iter()
                    .rfind(|o| o.key.rsplit('.').next() == Some(key))
                    .map(|o| o.value.as_str())
            })
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| (1..=1 << 20).contains(n))
            .unwrap_or(1)
    };
    let tp = degree(
        &[
            "--tensor-model-parallel-size",
            "--tensor_model_parallel_size",
        ],
        "tensor_model_parallel_size",
    );
    let pp = degree(
        &[
            "--pipeline-model-parallel-size",
            "--pipeline_model_parallel_size",
        ],
        "pipeline_model_parallel_size",
    );
    let cp = degree(
        &["--context-parallel-size", "--context_parallel_size"],
        "context_parallel_size",
    );
    let split = tp * pp * cp;
    if split <= 1 || w.size < split || !w.size.is_multiple_of(split) {
        return w;
    }
    let mut parts = vec![format!("tensor {tp}"), format!("pipeline {pp}")];
    if cp > 1 {
        parts.push(format!("context {cp}"));
    }
    World {
        size: w.size / split,
        source: format!(
            "{} ranks ({}) ÷ model parallelism ({}) = {} data-parallel rank{}",
            w.size,
            w.source,
            parts.join(" × "),
            w.size / split,
            if w.size / split == 1 { "" } else { "s" }
        ),
        uncertain: w.uncertain,
    }
}

/// Whether a launcher that starts the ranks (torchrun, srun, mpirun, accelerate,
/// deepspeed) stands before the program: a trainer that would start its own
/// (Lightning, fairseq) then joins the launcher's, which says the world.
fn rank_launcher(cmd: &Command) -> bool {
    cmd.launchers.iter().any(|l| {
        matches!(
            l.kind,
            LauncherKind::Torchrun
                | LauncherKind::Srun
                | LauncherKind::Mpirun
                | LauncherKind::Accelerate
                | LauncherKind::DeepSpeed
        )
    })
}

/// Whether the command's accumulation counts all ranks together.
pub fn accum_covers_world(cmd: &Command) -> bool {
    recognised(cmd).any(|f| (f.accum_covers_world)(cmd))
}

/// The smallest micro-batch the command's trainer takes, and why: the first
/// family that says.
pub fn micro_floor(cmd: &Command) -> Option<(u64, String)> {
    recognised(cmd).find_map(|f| (f.micro_floor)(cmd))
}

/// Why the command saves no checkpoint while it trains: the first recognised family
/// that says.
pub fn saves_none(cmd: &Command, ctx: &Ctx) -> Option<String> {
    recognised(cmd).find_map(|f| (f.saves_none)(cmd, ctx))
}

/// How often the command's trainer prints a log line per step that names no
/// step (see `progress`): the first family that knows.
pub fn logging(cmd: &Command, ctx: &Ctx) -> Option<crate::progress::Logging> {
    FAMILIES.iter().find_map(|f| (f.logging)(cmd, ctx))
}

/// What the step numbers the command's trainer prints count: the first
/// recognised family that says, else the steps done.
pub fn counting(cmd: &Command) -> crate::progress::Counting {
    recognised(cmd).find_map(|f| f.counting).unwrap_or_default()
}

/// [`counting`], with what the command's config files say about it (whether
/// Lightning's bar total is each epoch's batches).
pub fn counting_in(cmd: &Command, ctx: &Ctx) -> crate::progress::Counting {
    match counting(cmd) {
        crate::progress::Counting::Batches { accum, .. } => crate::progress::Counting::Batches {
            accum,
            epoch_total: lightning::bar_total_is_the_epoch(cmd, ctx),
        },
        c => c,
    }
}

/// "--a, --b, key:, ..." — the spellings oomguard looks for, for notes.
pub fn looked_for(knob: Knob) -> String {
    let mut items: Vec<String> = Vec::new();
    for f in FAMILIES {
        let flag = f
            .flags
            .iter()
            .find(|(k, _)| *k == knob)
            .and_then(|(_, n)| n.first());
        if let Some(n) = flag
            && !items.iter().any(|i| i == n)
        {
            items.push(n.to_string());
        }
    }
    for f in FAMILIES {
        let key = f
            .file_keys
            .iter()
            .chain(f.own_file_keys)
            .find(|(k, _)| *k == knob)
            .and_then(|(_, n)| n.first());
        if let Some(k) = key {
            let item = format!("{k}:");
            if !items.contains(&item) {
                items.push(item);
            }
        }
    }
    for kind in file_kinds() {
        if let Some(s) = kind.keys.iter().find(|s| s.knob == knob) {
            let item = format!("{} {}", kind.label, s.key);
            if !items.contains(&item) {
                items.push(item);
            }
        }
    }
    items.truncate(8);
    items.push("...".into());
    items.join(", ")
}

/// Why a command has no evaluation batch knob, and how to give it one: where
/// it was looked for, and for a Hugging Face-style command the rule for
/// adding the Trainer's flag (`families`: the command's, as discovered).
pub fn no_eval_batch(families: &[&str]) -> String {
    let hf = if families.contains(&hf::FAMILY.name) {
        "; oomguard adds --per_device_eval_batch_size only to a script that parses the Trainer's arguments (HfArgumentParser, TrlParser) or names the flag"
    } else {
        ""
    };
    format!(
        "no evaluation batch setting in the command (looked for {}{hf}; bind yours with --knob eval_batch=FLAG, or eval_batch=FLAG=N to add it starting from N)",
        looked_for(Knob::EvalBatch)
    )
}

/// What lowers the peak of loading a checkpoint, for a run oomguard stopped
/// after an OOM while loading one (`families`: the command's, as discovered):
/// each family's own way first, then what holds for any.
pub fn load_advice(families: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let has = |f: &str| families.contains(&f);
    if has(deepspeed::FAMILY.name) || has(accelerate::FAMILY.name) {
        out.push("DeepSpeed: offload the optimizer's state (zero_optimization.offload_optimizer.device: cpu; bind it with --knob offload_optimizer=FILE:KEY) or shard it over more GPUs (a higher ZeRO stage)".into());
    }
    if has(accelerate::FAMILY.name) {
        out.push("accelerate FSDP: fsdp_cpu_ram_efficient_loading: true loads the weights on rank 0's CPU only".into());
    }
    if has(hf::FAMILY.name) {
        out.push("Hugging Face Trainer: transformers 4.27 or newer loads the optimizer's state on the CPU first (upgrade an older one); resuming from a checkpoint without optimizer.pt (saved with --save_only_model) loads the weights only".into());
    }
    if has(lightning::FAMILY.name) {
        out.push("Lightning: load the checkpoint with map_location=\"cpu\" (torch.load on the CPU) before the trainer moves it".into());
    }
    out.push("load the checkpoint on the CPU (torch.load(path, map_location=\"cpu\")) and drop the loaded dict once it is copied (del it, then torch.cuda.empty_cache()); free the GPU of other processes".into());
    out.push("a smaller batch does not help here: the OOM happens before any batch runs".into());
    out
}

/// What lowers the peak of saving a checkpoint, for a run oomguard stopped
/// after an OOM while saving one.
pub fn save_advice(families: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let has = |f: &str| families.contains(&f);
    if has(deepspeed::FAMILY.name) || has(accelerate::FAMILY.name) || has(hf::FAMILY.name) {
        out.push("DeepSpeed ZeRO-3: stage3_gather_16bit_weights_on_model_save: false (accelerate: zero3_save_16bit_model: false) saves each rank's shard instead of gathering the full weights on one GPU; oomguard turns it off itself when the config sets it (--knob gather_on_save=FILE:KEY binds another place)".into());
        out.push("FSDP: save a sharded state dict (fsdp_state_dict_type: SHARDED_STATE_DICT in the accelerate config, state_dict_type in --fsdp_config) instead of FULL_STATE_DICT".into());
    }
    if has(hf::FAMILY.name) {
        out.push("Hugging Face Trainer: --save_only_model leaves the optimizer's state out of each checkpoint (a relaunch then cannot resume it)".into());
    }
    if has(lightning::FAMILY.name) {
        out.push("Lightning: ModelCheckpoint(save_weights_only=True), or a sharded checkpoint with FSDPStrategy(state_dict_type=\"sharded\")".into());
    }
    out.push("move the state dict to the CPU as it is gathered (FSDP: offload_to_cpu=True, rank0_only=True) and free the GPU of other processes".into());
    out.push("a smaller batch does not help here: a save's peak is the weights and optimizer state, not the activations".into());
    out
}

/// "--output_dir, --save, ..." — where oomguard looks for a checkpoint folder.
pub fn output_hints() -> String {
    let mut v: Vec<&str> = Vec::new();
    for h in FAMILIES.iter().map(|f| f.output_hint) {
        if !h.is_empty() && !v.contains(&h) {
            v.push(h);
        }
    }
    v.join(", ")
}

/// "--deepspeed X.json, accelerate --config_file ..." — where the ZeRO settings are looked for.
pub fn zero_hints() -> String {
    let mut v: Vec<String> = file_kinds()
        .filter(|k| k.keys.iter().any(|s| s.knob == Knob::ZeroStage))
        .map(|k| match k.flags.first() {
            Some(f) => format!("{} ({f} FILE)", k.label),
            None => k.label.to_string(),
        })
        .collect();
    for k in file_kinds() {
        for key in k.named_in {
            let item = format!("a recipe's {key}: key");
            if k.keys.iter().any(|s| s.knob == Knob::ZeroStage) && !v.contains(&item) {
                v.push(item);
            }
        }
    }
    for f in FAMILIES {
        if let Some((_, flags)) = f.flags.iter().find(|(k, _)| *k == Knob::ZeroStage) {
            v.extend(flags.iter().take(1).map(|s| s.to_string()));
        }
    }
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_name_and_names_are_unique() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        assert!(names.iter().all(|n| !n.is_empty()));
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate family names");
    }

    #[test]
    fn notes_are_generated_from_the_registry() {
        let micro = looked_for(Knob::MicroBatch);
        assert!(micro.contains("--per_device_train_batch_size"), "{micro}");
        assert!(micro.contains("train_micro_batch_size_per_gpu"), "{micro}");
        let out = output_hints();
        for h in ["--output_dir", "--save", "--out_dir"] {
            assert!(out.contains(h), "{out}");
        }
        assert!(zero_hints().contains("--deepspeed"), "{}", zero_hints());
    }
}
