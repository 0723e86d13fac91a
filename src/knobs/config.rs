//! Knobs that live in config files and `key=value` overrides.
//!
//! Theory of operation: `find` follows the command to every config file it
//! names — the kinds of file the families declare (`frameworks::FileKind`:
//! named by a flag, by a key of another file, or a tool's default file), the
//! training recipes (a family's recipe flag, a positional YAML / TOML, an
//! environment variable, a packaged config found by name) and a Python config
//! module given to a Python script — and `places` lists, per knob, every place
//! holding a value, most authoritative first: override > flag > recipe >
//! other config files. The first place is the knob's binding; the others with
//! a concrete value are its mirrors, and every attempt writes the same value
//! to all of them (one knob, one source of truth). A value a tool fills itself
//! (DeepSpeed's `"auto"`) is neither binding nor mirror.
//!
//! The user's files are never written: a changed file is copied into the
//! attempt's folder under its own name and the reference to it (the argv
//! element, or the key in the file that names it) points at the copy.

use std::path::{Path, PathBuf};

use super::{Knob, Offload, Value};
use crate::command::{Command, FlagForm};
use crate::files::{Doc, FileError, Scalar};
use crate::frameworks::{self, AbsentValue, Env, FileKind};

/// What a config file is for; decides which keys are knobs.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    /// A kind of config file a family names (a DeepSpeed JSON, an accelerate config).
    Kind(&'static FileKind),
    /// A training recipe (YAML or TOML).
    Training,
    /// A Python config module given to a Python script (`train.py config/x.py`).
    PythonModule,
    /// Named only by the user's `--knob NAME=FILE:KEY`.
    User,
}

impl PartialEq for Role {
    fn eq(&self, other: &Role) -> bool {
        match (self, other) {
            (Role::Kind(a), Role::Kind(b)) => std::ptr::eq(*a, *b),
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Kind(k) => k.label,
            Role::Training => "config",
            Role::PythonModule => "python config",
            Role::User => "file",
        }
    }

    /// Training recipes and Python config modules: where a family's recipe keys are knobs.
    pub fn is_recipe(self) -> bool {
        matches!(self, Role::Training | Role::PythonModule)
    }
}

/// How the command reaches a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ref {
    /// argv[index] is the path, after `prefix` (`--deepspeed=`), if any.
    Argv { index: usize, prefix: String },
    /// The value of `key` in another file.
    InFile { parent: usize, key: String },
    /// A tool's default config (not named): `flag COPY` is inserted at argv index `at`.
    Default { flag: &'static str, at: usize },
    /// An environment variable holds the path (set to the copy for the child).
    Env { var: String },
    /// Not named anywhere the command can be pointed at a copy (a module the
    /// script imports). Edited only with `--edit-in-place`.
    Unnamed,
    /// A config the tool finds by name in its own installation (a packaged
    /// config named by name): read for the knobs' current values, never
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

pub fn scalar_to_value(knob: Knob, s: &Scalar) -> Option<Value> {
    match knob {
        Knob::GradCheckpointing | Knob::GatherOnSave => match s {
            Scalar::Bool(b) => Some(Value::Bool(*b)),
            Scalar::Str(x) => match x.to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                // FSDP's state dict type: a full state dict is gathered on one
                // rank to be saved; a sharded (or local) one is not.
                "full_state_dict" if knob == Knob::GatherOnSave => Some(Value::Bool(true)),
                "sharded_state_dict" | "local_state_dict" if knob == Knob::GatherOnSave => {
                    Some(Value::Bool(false))
                }
                _ => None,
            },
            _ => None,
        },
        Knob::OffloadOptimizer | Knob::OffloadParam => match s {
            // FSDP's CPU offload is a bool (`fsdp_offload_params: false`,
            // `fsdp_cpu_offload: True`); DeepSpeed's is a device.
            Scalar::Bool(b) => Some(Value::Offload(if *b {
                Offload::Cpu
            } else {
                Offload::None
            })),
            Scalar::Str(x) if matches!(x.to_ascii_lowercase().as_str(), "true" | "false") => {
                Some(Value::Offload(if x.eq_ignore_ascii_case("true") {
                    Offload::Cpu
                } else {
                    Offload::None
                }))
            }
            Scalar::Str(x) if x != "auto" => Some(Value::Offload(Offload::read(x))),
            Scalar::Null => Some(Value::Offload(Offload::None)),
            _ => None,
        },
        // A micro-batch, an accumulation or a sequence length of 0 cannot be a
        // starting point (nothing halves it); a ZeRO stage of 0 is a stage.
        _ => match s {
            Scalar::Str(x) => x.parse::<u64>().ok(),
            s => scalar_int(s).and_then(|n| u64::try_from(n).ok()),
        }
        .filter(|n| *n > 0 || knob.allows_zero())
        .map(Value::Int),
    }
}

/// A whole number as a config file writes it: an integer, or an integral float
/// (DeepSpeed JSON files written by Python say `16.0` or `2e0`), read as the integer.
pub fn scalar_int(s: &Scalar) -> Option<i64> {
    match s {
        Scalar::Int(n) => Some(*n),
        // Below 2^53 every integer is exact as an f64.
        Scalar::Float(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 => {
            Some(*x as i64)
        }
        _ => None,
    }
}

/// The scalar to write for a knob's value, in the style of the value it replaces
/// (a float stays a float: `16.0` becomes `8.0`).
pub fn value_to_scalar(v: &Value, old: Option<&Scalar>) -> Scalar {
    match v {
        Value::Int(n) => match old {
            Some(Scalar::Str(_)) => Scalar::Str(n.to_string()),
            Some(Scalar::Float(_)) => Scalar::Float(*n as f64),
            _ => Scalar::Int(*n as i64),
        },
        // An FSDP state dict type stays one: the gather off is a sharded state dict.
        Value::Bool(b) => match old {
            Some(Scalar::Str(s)) if s.to_ascii_uppercase().ends_with("_STATE_DICT") => Scalar::Str(
                if *b {
                    "FULL_STATE_DICT"
                } else {
                    "SHARDED_STATE_DICT"
                }
                .into(),
            ),
            _ => Scalar::Bool(*b),
        },
        // An FSDP offload stays a bool.
        Value::Offload(o) => match old {
            Some(Scalar::Bool(_)) => Scalar::Bool(*o != Offload::None),
            Some(Scalar::Str(s)) if matches!(s.to_ascii_lowercase().as_str(), "true" | "false") => {
                let on = if *o != Offload::None { "true" } else { "false" };
                let upper = s.starts_with(|c: char| c.is_ascii_uppercase());
                Scalar::Str(if upper {
                    on[..1].to_ascii_uppercase() + &on[1..]
                } else {
                    on.to_string()
                })
            }
            _ => Scalar::Str(o.to_string()),
        },
    }
}

/// Everything found in files and overrides.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub files: Vec<ConfigFile>,
    pub places: Vec<Place>,
    /// World size written in a config file (accelerate's `num_processes`): (value, where).
    pub file_world: Option<(u64, String)>,
    pub notes: Vec<String>,
    /// `x.batch_size=N` overrides: global or per-device, not guessed.
    pub ambiguous_overrides: Vec<String>,
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
pub fn find(
    cmd: &Command,
    env: Env,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Found, FileError> {
    let mut found = Found::default();
    kind_files(cmd, resolve, &mut found)?;
    recipe_files(cmd, resolve, &mut found)?;
    packaged_and_env_recipes(cmd, env, resolve, &mut found)?;
    files_named_in_files(resolve, &mut found);
    let mut ambiguous = Vec::new();
    found.places = places(cmd, &found.files, &mut ambiguous);
    found.ambiguous_overrides = ambiguous;
    found.file_world = found.files.iter().find_map(|f| match f.role {
        Role::Kind(k) => {
            let key = k.world_key?;
            match f.doc.get(key) {
                Ok(Some(Scalar::Int(n))) if n > 0 => {
                    Some((n as u64, format!("{} {key}: {n}", k.label)))
                }
                _ => None,
            }
        }
        _ => None,
    });
    Ok(found)
}

fn load_from(resolve: &dyn Fn(&Path) -> PathBuf, shown: &str) -> Result<Doc, FileError> {
    Doc::load(&resolve(Path::new(shown)))
}

/// Config files of the kinds families name (DeepSpeed JSON, accelerate config),
/// by flag or, when none is named, the tool's default file.
fn kind_files(
    cmd: &Command,
    resolve: &dyn Fn(&Path) -> PathBuf,
    found: &mut Found,
) -> Result<(), FileError> {
    let argv = &cmd.argv[..];
    let script = cmd.target_index();
    let load = |shown: &str| load_from(resolve, shown);
    for kind in frameworks::file_kinds().filter(|k| (k.when)(cmd)) {
        let end = if kind.launcher_option_only {
            script
        } else {
            argv.len()
        };
        let named: Vec<_> = flag_paths(cmd, kind.flags, end)
            .into_iter()
            .filter(|(_, _, p)| (kind.accepts)(p) || resolve(Path::new(p)).is_file())
            .collect();
        // A launcher option names one file: the last one counts.
        let named = if kind.launcher_option_only {
            named.into_iter().last().into_iter().collect()
        } else {
            named
        };
        if named.is_empty()
            && let Some((default, flag)) = kind.default
            && let Some(path) = default()
            && let Ok(doc) = Doc::load(&path)
        {
            found.files.push(ConfigFile {
                role: Role::Kind(kind),
                shown: path.display().to_string(),
                doc,
                reference: Ref::Default {
                    flag,
                    at: script.min(argv.len()),
                },
            });
        }
        for (index, prefix, p) in named {
            let doc = load(&p)?;
            found.files.push(ConfigFile {
                role: Role::Kind(kind),
                shown: p,
                doc,
                reference: Ref::Argv { index, prefix },
            });
        }
    }

    Ok(())
}

/// Training recipes: named by a family's recipe flag after the script, or
/// positional YAML / TOML; a Python config module given to a Python script.
fn recipe_files(
    cmd: &Command,
    resolve: &dyn Fn(&Path) -> PathBuf,
    found: &mut Found,
) -> Result<(), FileError> {
    let argv = &cmd.argv[..];
    let script = cmd.target_index();
    let load = |shown: &str| load_from(resolve, shown);
    let mut training: Vec<(usize, String, String)> =
        flag_paths(cmd, &frameworks::recipe_flags(cmd), argv.len())
            .into_iter()
            .filter(|(i, _, p)| {
                *i > script
                    && ([".yaml", ".yml", ".toml"].iter().any(|x| p.ends_with(x))
                        || resolve(Path::new(p)).is_file())
            })
            .collect();
    for (i, s) in cmd.positionals() {
        if training.iter().any(|(j, _, _)| *j == i) {
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

    Ok(())
}

/// A config the tool finds by name in its own installation, and recipes
/// named by an environment variable.
fn packaged_and_env_recipes(
    cmd: &Command,
    env: Env,
    resolve: &dyn Fn(&Path) -> PathBuf,
    found: &mut Found,
) -> Result<(), FileError> {
    let load = |shown: &str| load_from(resolve, shown);
    if let Some((name, located)) = frameworks::packaged_config(cmd, env) {
        match located {
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
                "--config {name}: not a file, and not found among the tool's packaged configs ({looked}); the knobs it sets are unknown. Pass them as overrides (gradient_accumulation_steps=N with the config's value), or copy the config and name the copy"
            )),
        }
    }

    for var in frameworks::recipe_env() {
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

    Ok(())
}

/// Files named inside files (an accelerate config's deepspeed_config_file,
/// a recipe's `deepspeed:`): one of each kind.
fn files_named_in_files(resolve: &dyn Fn(&Path) -> PathBuf, found: &mut Found) {
    let load = |shown: &str| load_from(resolve, shown);
    let mut i = 0;
    while i < found.files.len() {
        for kind in frameworks::file_kinds() {
            let already = found.files.iter().any(|f| f.role == Role::Kind(kind));
            if already {
                continue;
            }
            for key in kind.named_in {
                let Ok(Some(Scalar::Str(p))) = found.files[i].doc.get(key) else {
                    continue;
                };
                if !(kind.accepts)(&p) {
                    continue;
                }
                match load(&p) {
                    Ok(doc) => found.files.push(ConfigFile {
                        role: Role::Kind(kind),
                        shown: p.clone(),
                        doc,
                        reference: Ref::InFile {
                            parent: i,
                            key: key.to_string(),
                        },
                    }),
                    Err(e) => found.notes.push(format!(
                        "{} names the {} {p} ({key}), which cannot be read: {e}",
                        found.files[i].shown, kind.label
                    )),
                }
                break;
            }
        }
        i += 1;
    }
}

/// Every place holding a knob, most authoritative first (overrides, then
/// recipes, then other config files). Flags are added by the caller between
/// overrides and files.
fn places(cmd: &Command, files: &[ConfigFile], ambiguous: &mut Vec<String>) -> Vec<Place> {
    let mut out = override_places(cmd, ambiguous);
    // Recipes first, then the other kinds in registry order.
    let recipes = files.iter().enumerate().filter(|(_, f)| f.role.is_recipe());
    let others = files
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.role, Role::Kind(_)));
    for (fi, f) in recipes.chain(others) {
        file_places(cmd, fi, f, &mut out);
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

/// `key=value` overrides that are knobs; `x.batch_size=` that no family claims is ambiguous.
fn override_places(cmd: &Command, ambiguous: &mut Vec<String>) -> Vec<Place> {
    let mut out = Vec::new();
    for o in &cmd.overrides {
        let last = o.key.rsplit('.').next().unwrap_or(&o.key);
        if last == "batch_size" && !frameworks::claims_override(&o.key, cmd) {
            ambiguous.push(o.key.clone());
        }
        for knob in Knob::ALL {
            if !frameworks::override_matches(knob, &o.key, cmd) {
                continue;
            }
            if let Some(value) = scalar_to_value(knob, &yaml_like(&o.value)) {
                out.push(Place {
                    knob,
                    value,
                    site: Site::Override {
                        key: o.key.clone(),
                        index: o.index,
                        prefix: o.prefix.clone(),
                    },
                    present: true,
                });
            }
        }
    }
    out
}

/// The knobs in one config file (`files[fi]`).
fn file_places(cmd: &Command, fi: usize, f: &ConfigFile, out: &mut Vec<Place>) {
    let packaged = f.reference == Ref::Packaged;
    let site = |key: &str| {
        let key = key.to_string();
        if packaged {
            Site::AddOverride { file: fi, key }
        } else {
            Site::File { file: fi, key }
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
    match f.role {
        Role::Training | Role::PythonModule => {
            for knob in Knob::ALL {
                // The first spelling holding a usable value (`max_seq_len:
                // ${variables.max_seq_len}` is an interpolation, not a value).
                let keys = frameworks::recipe_keys(knob, cmd);
                if let Some(k) = keys.iter().find(
                    |k| matches!(f.doc.get(k), Ok(Some(s)) if scalar_to_value(knob, &s).is_some()),
                ) {
                    add(knob, k, None);
                }
            }
            // Settings of another kind written inline (ZeRO keys in a training YAML).
            for (when, keys) in frameworks::inline_keys() {
                if matches!(f.doc.get(when), Ok(Some(_))) {
                    for k in keys {
                        add(k.knob, k.key, k.absent.map(AbsentValue::value));
                    }
                }
            }
        }
        Role::Kind(kind) => {
            if (kind.applies)(&f.doc) {
                for k in kind.keys {
                    add(k.knob, k.key, k.absent.map(AbsentValue::value));
                }
            }
        }
        Role::User => {}
    }
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
        // The device only: an NVMe path has no place in an override.
        Value::Offload(o) => o.device().to_string(),
    }
}

/// Read a file the user named with `--knob NAME=FILE:KEY`.
pub fn user_file(
    found: &mut Found,
    cmd: &Command,
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
            let reference = cmd
                .find_value(|v| v == path || Path::new(v) == real)
                .map(|(index, prefix)| Ref::Argv { index, prefix })
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
