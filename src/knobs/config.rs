//! Knobs that live in config files and `key=value` overrides.
//!
//! Theory of operation: `find_files` follows the command to every config file
//! it names — a DeepSpeed JSON (`--deepspeed`, `--deepspeed_config`, an
//! accelerate config's `deepspeed_config_file`, a YAML's `deepspeed:` key), an
//! accelerate config (`--config_file`, or the default one), a training YAML or
//! TOML (positional or `--config`), a nanoGPT config module — and `candidates`
//! lists, per knob, every place holding a value, most authoritative first:
//! override > flag > training file > DeepSpeed JSON > accelerate config. The
//! first place is the knob's binding; the others with a concrete value are its
//! mirrors, and every attempt writes the same value to all of them (one knob,
//! one source of truth). A DeepSpeed `"auto"` is filled by the trainer from its
//! flags, so it is neither binding nor mirror.
//!
//! The user's files are never written: a changed file is copied into the
//! attempt's folder under its own name and the reference to it (the argv
//! element, or the key in the file that names it) points at the copy.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::files::{Doc, FileError, Scalar};
use super::{Knob, Offload, Value};
use crate::command::{Command, FlagForm, LauncherKind};

/// What a config file is for; decides which keys are knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    DeepSpeed,
    Accelerate,
    /// A training recipe: axolotl, LLaMA-Factory, TRL / alignment-handbook, torchtitan, litgpt.
    Training,
    /// A nanoGPT-style Python config module.
    PythonModule,
    /// Named only by the user's `--knob NAME=FILE:KEY`.
    User,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::DeepSpeed => "deepspeed json",
            Role::Accelerate => "accelerate config",
            Role::Training => "config",
            Role::PythonModule => "python config",
            Role::User => "file",
        }
    }
}

/// How the command reaches a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ref {
    /// argv[index] is the path, after `prefix` (`--deepspeed=`), if any.
    Argv { index: usize, prefix: String },
    /// The value of `key` in another file.
    InFile { parent: usize, key: String },
    /// accelerate's default config: add `--config_file COPY` after `launch`.
    AccelerateDefault { launch_index: usize },
    /// An environment variable holds the path (set to the copy for the child).
    Env { var: String },
    /// Not named anywhere the command can be pointed at a copy (a module the
    /// script imports). Edited only with `--edit-in-place`.
    Unnamed,
    /// A config the tool finds by name in its own installation (torchtune's
    /// `--config llama3_2/1B_lora`): read for the knobs' current values, never
    /// copied; a changed knob is passed as a `key=value` override.
    Packaged,
}

/// One config file of the command.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub role: Role,
    /// As the user wrote it.
    pub shown: String,
    pub doc: Doc,
    pub reference: Ref,
}

/// A place holding a knob's value.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub knob: Knob,
    pub value: Value,
    pub site: Site,
    /// False when the key is absent and `value` is the framework's default
    /// (a DeepSpeed JSON without `zero_optimization` runs at stage 0).
    pub present: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// A key in `files[file]`.
    File { file: usize, key: String },
    /// A key of a packaged config ([`Ref::Packaged`]) `files[file]`, set by adding `key=value`.
    AddOverride { file: usize, key: String },
    /// `key=value` at argv[index], with its `+`/`++` prefix.
    Override {
        key: String,
        index: usize,
        prefix: String,
    },
}

/// Keys that are knobs in a training recipe (YAML or TOML), most specific first.
const TRAINING_KEYS: &[(Knob, &[&str])] = &[
    (
        Knob::MicroBatch,
        &[
            "per_device_train_batch_size",
            "micro_batch_size",
            "train_micro_batch_size_per_gpu",
            "device_train_microbatch_size",
            "training.local_batch_size",
            "train.micro_batch_size",
        ],
    ),
    (
        Knob::GradAccum,
        &["gradient_accumulation_steps", "accumulate_grad_batches"],
    ),
    (
        Knob::SeqLen,
        &[
            "max_seq_length",
            "max_length",
            "sequence_len",
            "cutoff_len",
            "max_seq_len",
            "model_max_length",
            "block_size",
            "training.seq_len",
            "train.max_seq_length",
            "variables.max_seq_len",
            "seq_length",
        ],
    ),
    (
        Knob::GradCheckpointing,
        &[
            "gradient_checkpointing",
            "enable_activation_checkpointing",
            "activation_checkpointing",
            "fsdp_config.activation_checkpointing",
            "model.enable_gradient_checkpointing",
            "checkpoint_activations",
        ],
    ),
];

pub const DS_MICRO: &str = "train_micro_batch_size_per_gpu";
pub const DS_ACCUM: &str = "gradient_accumulation_steps";
pub const DS_GLOBAL: &str = "train_batch_size";
pub const DS_STAGE: &str = "zero_optimization.stage";
pub const DS_OFFLOAD_OPT: &str = "zero_optimization.offload_optimizer.device";
pub const DS_OFFLOAD_PARAM: &str = "zero_optimization.offload_param.device";

const ACC_KEYS: &[(Knob, &str)] = &[
    (
        Knob::GradAccum,
        "deepspeed_config.gradient_accumulation_steps",
    ),
    (Knob::ZeroStage, "deepspeed_config.zero_stage"),
    (
        Knob::OffloadOptimizer,
        "deepspeed_config.offload_optimizer_device",
    ),
    (Knob::OffloadParam, "deepspeed_config.offload_param_device"),
];

/// Override keys (the last dotted segment) for each knob.
const OVERRIDE_KEYS: &[(Knob, &[&str])] = &[
    (
        Knob::MicroBatch,
        &[
            "per_device_train_batch_size",
            "micro_batch_size",
            "micro_batch_size_per_gpu",
            "ppo_micro_batch_size_per_gpu",
            "train_micro_batch_size_per_gpu",
            "device_train_microbatch_size",
            "local_batch_size",
        ],
    ),
    (
        Knob::GradAccum,
        &["gradient_accumulation_steps", "accumulate_grad_batches"],
    ),
    (
        Knob::SeqLen,
        &[
            "max_seq_length",
            "max_seq_len",
            "max_length",
            "cutoff_len",
            "sequence_len",
            "seq_len",
            "block_size",
        ],
    ),
    (
        Knob::GradCheckpointing,
        &[
            "gradient_checkpointing",
            "enable_activation_checkpointing",
            "activation_checkpointing",
            "enable_gradient_checkpointing",
        ],
    ),
];

pub fn scalar_to_value(knob: Knob, s: &Scalar) -> Option<Value> {
    match knob {
        Knob::GradCheckpointing => match s {
            Scalar::Bool(b) => Some(Value::Bool(*b)),
            Scalar::Str(x) => match x.to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            _ => None,
        },
        Knob::OffloadOptimizer | Knob::OffloadParam => match s {
            Scalar::Str(x) if x != "auto" => Some(Value::Offload(Offload::read(x))),
            Scalar::Null => Some(Value::Offload(Offload::None)),
            _ => None,
        },
        _ => match s {
            Scalar::Int(n) if *n >= 0 => Some(Value::Int(*n as u64)),
            Scalar::Str(x) => x.parse::<u64>().ok().map(Value::Int),
            _ => None,
        },
    }
}

/// The scalar to write for a knob's value, in the style of the value it replaces.
pub fn value_to_scalar(v: &Value, old: Option<&Scalar>) -> Scalar {
    match v {
        Value::Int(n) => match old {
            Some(Scalar::Str(_)) => Scalar::Str(n.to_string()),
            _ => Scalar::Int(*n as i64),
        },
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Offload(o) => Scalar::Str(o.to_string()),
    }
}

/// Everything found in files and overrides.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub files: Vec<ConfigFile>,
    pub places: Vec<Place>,
    /// World size from an accelerate config's `num_processes`.
    pub accelerate_processes: Option<u64>,
    pub notes: Vec<String>,
    /// `x.batch_size=N` overrides: global or per-device, not guessed.
    pub ambiguous_overrides: Vec<String>,
}

fn os(a: &OsString) -> &str {
    a.to_str().unwrap_or("")
}

/// `--name P` or `--name=P` occurrences before argv index `end`: (index of the
/// path, prefix to keep, path).
fn flag_paths(cmd: &Command, names: &[&str], end: usize) -> Vec<(usize, String, String)> {
    cmd.flags
        .iter()
        .filter(|f| f.index < end && names.contains(&f.name.as_str()))
        .filter_map(|f| match (f.form, &f.value) {
            (FlagForm::Space, Some(v)) if !v.starts_with('-') => {
                Some((f.index + 1, String::new(), v.clone()))
            }
            (FlagForm::Equals, Some(v)) => Some((f.index, format!("{}=", f.name), v.clone())),
            _ => None,
        })
        .collect()
}

/// Read the config files the command names, and where each knob lives in them.
/// Environment variables that launcher scripts read a config file path from
/// (torchtitan's `run_train.sh`: `CONFIG_FILE=... ./run_train.sh`).
const CONFIG_ENV: &[&str] = &["CONFIG_FILE"];

pub fn find(
    cmd: &Command,
    env: &dyn Fn(&str) -> Option<OsString>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Found, FileError> {
    let argv = &cmd.argv[..];
    let mut found = Found::default();
    // Where the launcher options end: the script, module or tool.
    let script = cmd.target_index();
    let prog = cmd.tool().unwrap_or("").to_string();
    let load = |shown: &str| -> Result<Doc, FileError> { Doc::load(&resolve(Path::new(shown))) };

    // accelerate config: `accelerate launch --config_file X`, or the default one.
    if let Some(launch) = cmd.launcher(LauncherKind::Accelerate) {
        let named = flag_paths(cmd, &["--config_file", "--config-file"], launch.opts.end);
        if let Some((index, prefix, p)) = named.last() {
            let doc = load(p)?;
            found.files.push(ConfigFile {
                role: Role::Accelerate,
                shown: p.clone(),
                doc,
                reference: Ref::Argv {
                    index: *index,
                    prefix: prefix.clone(),
                },
            });
        } else if let Some(default) = default_accelerate_config()
            && let Ok(doc) = Doc::load(&default)
        {
            found.files.push(ConfigFile {
                role: Role::Accelerate,
                shown: default.display().to_string(),
                doc,
                reference: Ref::AccelerateDefault {
                    launch_index: launch.opts.start - 1,
                },
            });
        }
    }

    // DeepSpeed JSON named on the command line.
    for (index, prefix, p) in flag_paths(
        cmd,
        &[
            "--deepspeed",
            "--deepspeed_config",
            "--deepspeed-config",
            "--deepspeed_config_file",
        ],
        argv.len(),
    ) {
        if p.ends_with(".json") || p.ends_with(".conf") || resolve(Path::new(&p)).is_file() {
            let doc = load(&p)?;
            found.files.push(ConfigFile {
                role: Role::DeepSpeed,
                shown: p,
                doc,
                reference: Ref::Argv { index, prefix },
            });
        }
    }

    // Training recipe: `--config X.yaml`, or a positional YAML / TOML; a
    // nanoGPT-style config module `train.py config/x.py`.
    let mut training: Vec<(usize, String, String)> =
        flag_paths(cmd, &["--config", "--job.config_file"], argv.len())
            .into_iter()
            .filter(|(i, _, p)| {
                // torchtune's `--config llama2/7B_lora` names a built-in recipe, not a file.
                *i > script
                    && ([".yaml", ".yml", ".toml"].iter().any(|x| p.ends_with(x))
                        || resolve(Path::new(p)).is_file())
            })
            .collect();
    for (i, a) in argv.iter().enumerate().skip(script.max(1)) {
        let s = os(a);
        if s.starts_with('-') || training.iter().any(|(j, _, _)| *j == i) {
            continue;
        }
        if [".yaml", ".yml", ".toml"].iter().any(|x| s.ends_with(x)) {
            training.push((i, String::new(), s.to_string()));
        } else if cmd.python_config_module().is_some_and(|(j, _)| j == i)
            && resolve(Path::new(s)).is_file()
        {
            let doc = load(s)?;
            found.files.push(ConfigFile {
                role: Role::PythonModule,
                shown: s.to_string(),
                doc,
                reference: Ref::Argv {
                    index: i,
                    prefix: String::new(),
                },
            });
        }
    }
    training.sort();
    for (index, prefix, p) in training {
        let doc = load(&p)?;
        found.files.push(ConfigFile {
            role: Role::Training,
            shown: p,
            doc,
            reference: Ref::Argv { index, prefix },
        });
    }

    // torchtune: `tune run RECIPE --config NAME`, NAME a config packaged with torchtune.
    if prog == "tune" && cmd.subcommand() == Some("run") {
        let named = flag_paths(cmd, &["--config"], argv.len());
        if let Some((_, _, name)) = named.last()
            && !found.files.iter().any(|f| f.shown == *name)
        {
            match torchtune_packaged_config(name, env) {
                Ok(path) => {
                    let doc = Doc::load(&path)?;
                    found.files.push(ConfigFile {
                        role: Role::Training,
                        shown: path.display().to_string(),
                        doc,
                        reference: Ref::Packaged,
                    });
                }
                Err(looked) => found.notes.push(format!(
                    "--config {name}: not a file, and not found among torchtune's packaged configs ({looked}); the knobs it sets (batch_size, gradient_accumulation_steps, ...) are unknown. Pass them as overrides (gradient_accumulation_steps=N with the config's value), or `tune cp` the config and name the copy"
                )),
            }
        }
    }

    for var in CONFIG_ENV {
        if let Some(p) = env(var).and_then(|v| v.into_string().ok()) {
            let known = [".yaml", ".yml", ".toml"].iter().any(|x| p.ends_with(x));
            if known && resolve(Path::new(&p)).is_file() {
                let doc = load(&p)?;
                found.files.push(ConfigFile {
                    role: Role::Training,
                    shown: p,
                    doc,
                    reference: Ref::Env {
                        var: var.to_string(),
                    },
                });
            }
        }
    }

    // Files named inside files: accelerate's deepspeed_config_file, a recipe's `deepspeed:`.
    let mut i = 0;
    while i < found.files.len() {
        let key = match found.files[i].role {
            Role::Accelerate => Some("deepspeed_config.deepspeed_config_file"),
            Role::Training => Some("deepspeed"),
            _ => None,
        };
        if let Some(key) = key
            && let Ok(Some(Scalar::Str(p))) = found.files[i].doc.get(key)
        {
            let already = found.files.iter().any(|f| f.role == Role::DeepSpeed);
            let is_json = p.ends_with(".json") || p.ends_with(".conf");
            if is_json && !already {
                match load(&p) {
                    Ok(doc) => found.files.push(ConfigFile {
                        role: Role::DeepSpeed,
                        shown: p.clone(),
                        doc,
                        reference: Ref::InFile {
                            parent: i,
                            key: key.to_string(),
                        },
                    }),
                    Err(e) => found.notes.push(format!(
                        "{} names the DeepSpeed config {p} ({key}), which cannot be read: {e}",
                        found.files[i].shown
                    )),
                }
            }
        }
        i += 1;
    }

    let mut ambiguous = Vec::new();
    found.places = places(cmd, &found.files, &prog, &mut ambiguous);
    found.ambiguous_overrides = ambiguous;
    if let Some(acc) = found.files.iter().find(|f| f.role == Role::Accelerate)
        && let Ok(Some(Scalar::Int(n))) = acc.doc.get("num_processes")
    {
        found.accelerate_processes = u64::try_from(n).ok().filter(|n| *n > 0);
    }
    Ok(found)
}

/// Where torchtune keeps a packaged config: `recipes/configs/NAME.yaml` next to
/// the `torchtune` package of the Python that runs `tune` (its shebang).
/// The error says where it looked.
fn torchtune_packaged_config(
    name: &str,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<PathBuf, String> {
    let path = env("PATH").unwrap_or_default();
    let which = |prog: &str| {
        std::env::split_paths(&path)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    };
    let tune = which("tune").ok_or("no `tune` on PATH")?;
    let first = std::fs::read_to_string(&tune)
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
        .unwrap_or_default();
    let interp = first.strip_prefix("#!").map(str::trim).unwrap_or("");
    let mut words = interp.split_whitespace();
    let python = match words.next() {
        Some(e) if e.ends_with("/env") => words.next().and_then(which),
        Some(p) => Some(PathBuf::from(p)),
        None => None,
    }
    .ok_or_else(|| format!("{} does not name its Python", tune.display()))?;
    // bin/python → the environment's prefix → lib/pythonX.Y/site-packages.
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("no prefix above {}", python.display()))?;
    let file = if name.ends_with(".yaml") {
        name.to_string()
    } else {
        format!("{name}.yaml")
    };
    let mut looked = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python"))
            })
            .collect();
        dirs.sort();
        for d in dirs {
            let configs = d.join("site-packages/recipes/configs");
            let candidate = configs.join(&file);
            if candidate.is_file() {
                return Ok(candidate);
            }
            looked.push(configs.display().to_string());
        }
    }
    if looked.is_empty() {
        looked.push(format!("{}/lib/python*/site-packages", prefix.display()));
    }
    Err(format!("looked in {}", looked.join(", ")))
}

fn default_accelerate_config() -> Option<PathBuf> {
    let base = std::env::var_os("HF_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("huggingface"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface"))
        })?;
    let p = base.join("accelerate").join("default_config.yaml");
    p.is_file().then_some(p)
}

/// Every place holding a knob, most authoritative first (overrides, then files
/// in role order). Flags are added by the caller between overrides and files.
fn places(
    cmd: &Command,
    files: &[ConfigFile],
    prog: &str,
    ambiguous: &mut Vec<String>,
) -> Vec<Place> {
    let mut out = Vec::new();
    for o in &cmd.overrides {
        let (prefix, key, val, index) = (&o.prefix, &o.key, &o.value, o.index);
        let last = key.rsplit('.').next().unwrap_or(key);
        if last == "batch_size" && prog != "tune" {
            ambiguous.push(key.clone());
        }
        for (knob, keys) in OVERRIDE_KEYS {
            let torchtune_batch =
                prog == "tune" && *knob == Knob::MicroBatch && key == "batch_size";
            if keys.contains(&last) || torchtune_batch {
                let s = yaml_like(val);
                if let Some(value) = scalar_to_value(*knob, &s) {
                    out.push(Place {
                        knob: *knob,
                        value,
                        site: Site::Override {
                            key: key.clone(),
                            index,
                            prefix: prefix.clone(),
                        },
                        present: true,
                    });
                }
            }
        }
    }
    let order = [
        Role::Training,
        Role::PythonModule,
        Role::DeepSpeed,
        Role::Accelerate,
    ];
    for role in order {
        for (fi, f) in files.iter().enumerate().filter(|(_, f)| f.role == role) {
            let packaged = f.reference == Ref::Packaged;
            let site = |key: &str| {
                if packaged {
                    Site::AddOverride {
                        file: fi,
                        key: key.to_string(),
                    }
                } else {
                    Site::File {
                        file: fi,
                        key: key.to_string(),
                    }
                }
            };
            let mut add = |knob: Knob, key: &str, absent: Option<Value>| match f.doc.get(key) {
                // A packaged config's key given as an override: the override holds it.
                _ if packaged && cmd.overrides.iter().any(|o| o.key == key) => {}
                Ok(Some(s)) => {
                    if let Some(value) = scalar_to_value(knob, &s) {
                        out.push(Place {
                            knob,
                            value,
                            site: site(key),
                            present: true,
                        });
                    }
                }
                Ok(None) => {
                    if let Some(value) = absent {
                        out.push(Place {
                            knob,
                            value,
                            site: site(key),
                            present: false,
                        });
                    }
                }
                Err(_) => {}
            };
            match role {
                Role::Training | Role::PythonModule => {
                    for (knob, keys) in TRAINING_KEYS {
                        // The first spelling holding a usable value (`max_seq_len:
                        // ${variables.max_seq_len}` is an interpolation, not a value).
                        if let Some(k) = keys.iter().find(|k| {
                            matches!(f.doc.get(k), Ok(Some(s)) if scalar_to_value(*knob, &s).is_some())
                        }) {
                            add(*knob, k, None);
                        }
                    }
                    // GPT-NeoX style: DeepSpeed settings inline in the training YAML.
                    if matches!(f.doc.get(DS_STAGE), Ok(Some(_))) {
                        add(Knob::ZeroStage, DS_STAGE, None);
                        add(
                            Knob::OffloadOptimizer,
                            DS_OFFLOAD_OPT,
                            Some(Value::Offload(Offload::None)),
                        );
                        add(
                            Knob::OffloadParam,
                            DS_OFFLOAD_PARAM,
                            Some(Value::Offload(Offload::None)),
                        );
                    }
                    if role == Role::PythonModule || prog == "tune" {
                        // nanoGPT's and torchtune's `batch_size` is the per-GPU micro-batch.
                        add(Knob::MicroBatch, "batch_size", None);
                    }
                    if prog == "tune" {
                        add(Knob::SeqLen, "tokenizer.max_seq_len", None);
                    }
                }
                Role::DeepSpeed => {
                    add(Knob::MicroBatch, DS_MICRO, None);
                    add(Knob::GradAccum, DS_ACCUM, None);
                    add(Knob::ZeroStage, DS_STAGE, Some(Value::Int(0)));
                    add(
                        Knob::OffloadOptimizer,
                        DS_OFFLOAD_OPT,
                        Some(Value::Offload(Offload::None)),
                    );
                    add(
                        Knob::OffloadParam,
                        DS_OFFLOAD_PARAM,
                        Some(Value::Offload(Offload::None)),
                    );
                }
                Role::Accelerate => {
                    let uses_file = matches!(
                        f.doc.get("deepspeed_config.deepspeed_config_file"),
                        Ok(Some(_))
                    );
                    let is_ds = matches!(f.doc.get("distributed_type"), Ok(Some(Scalar::Str(s))) if s == "DEEPSPEED");
                    if is_ds && !uses_file {
                        for (knob, key) in ACC_KEYS {
                            add(*knob, key, None);
                        }
                    }
                }
                Role::User => {}
            }
        }
    }
    // A knob found twice in one file under different spellings: keep the first.
    let mut seen: Vec<(Knob, Site)> = Vec::new();
    out.retain(|p| {
        let dup = seen.iter().any(|(k, s)| *k == p.knob && *s == p.site);
        seen.push((p.knob, p.site.clone()));
        !dup
    });
    out
}

/// An override value read the way Hydra / OmegaConf read it.
pub fn yaml_like(v: &str) -> Scalar {
    let t = v.trim().trim_matches('"').trim_matches('\'');
    if let Ok(n) = t.parse::<i64>() {
        return Scalar::Int(n);
    }
    match t.to_ascii_lowercase().as_str() {
        "true" => Scalar::Bool(true),
        "false" => Scalar::Bool(false),
        "null" | "~" => Scalar::Null,
        _ => Scalar::Str(t.to_string()),
    }
}

/// Render a value for an override token.
pub fn override_text(v: &Value, old: &str) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        Value::Bool(b) => {
            let s = if *b { "true" } else { "false" };
            if old.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                let mut c = s.chars();
                let f = c.next().map(|f| f.to_ascii_uppercase()).unwrap_or('T');
                format!("{f}{}", c.as_str())
            } else {
                s.into()
            }
        }
        Value::Offload(o) => o.to_string(),
    }
}

/// Read a file the user named with `--knob NAME=FILE:KEY`.
pub fn user_file(
    found: &mut Found,
    argv: &[OsString],
    path: &str,
    key: &str,
    knob: Knob,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Place, FileError> {
    let real = resolve(Path::new(path));
    let idx = match found
        .files
        .iter()
        .position(|f| f.doc.path() == real.as_path())
    {
        Some(i) => i,
        None => {
            let doc = Doc::load(&real)?;
            let reference = argv
                .iter()
                .enumerate()
                .skip(1)
                .find_map(|(i, a)| {
                    let s = os(a);
                    if s == path || Path::new(s) == real {
                        Some(Ref::Argv {
                            index: i,
                            prefix: String::new(),
                        })
                    } else {
                        s.split_once('=')
                            .filter(|(_, v)| *v == path)
                            .map(|(f, _)| Ref::Argv {
                                index: i,
                                prefix: format!("{f}="),
                            })
                    }
                })
                .unwrap_or(Ref::Unnamed);
            found.files.push(ConfigFile {
                role: Role::User,
                shown: path.to_string(),
                doc,
                reference,
            });
            found.files.len() - 1
        }
    };
    let s = found.files[idx].doc.require(key)?;
    let value = scalar_to_value(knob, &s).ok_or_else(|| FileError::Unsupported {
        path: real.clone(),
        key: key.to_string(),
        why: format!("{s} is not a value oomguard can change for {knob}"),
    })?;
    Ok(Place {
        knob,
        value,
        site: Site::File {
            file: idx,
            key: key.to_string(),
        },
        present: true,
    })
}
