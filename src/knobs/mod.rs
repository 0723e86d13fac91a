//! Knobs, settings and bindings: `discover` reads them from the user's command,
//! `materialize` writes one attempt's settings back into an argv and environment.
//!
//! Discovery never guesses: an ambiguous spelling (a bare `--batch_size` may be
//! the global batch) is reported as a note saying how to bind it with `--knob`.

pub mod accepts;
mod config;
pub mod drift;
use crate::command::parse_override;
use crate::files;
mod flags;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::command::Command;
pub use crate::command::FlagForm;
use crate::frameworks;
pub use crate::settings::{Knob, Offload, Settings, Value, World};

/// Where a knob lives in the user's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// A command-line flag, at these argv positions (every occurrence is rewritten).
    Flag {
        flag: String,
        at: Vec<(usize, FlagForm)>,
    },
    /// Absent from the command; the flag is appended when the value changes.
    AddFlag { flag: String },
    /// An environment variable.
    Env { var: String, present: bool },
    /// No direct setting: follows from a global-batch flag divided by the micro-batch.
    DerivedFromGlobalBatch { flag: String, global: u64 },
    /// A key in a config file (`Discovery::config.files[file]`).
    Config {
        file: usize,
        shown: String,
        role: &'static str,
        key: String,
    },
    /// A `key=value` override on the command line (Hydra and OmegaConf dot-lists).
    Override {
        key: String,
        index: usize,
        prefix: String,
    },
    /// Absent; `{prefix}{key}=N` is appended when the value changes.
    /// `from`: the packaged config whose value it starts from, if any.
    AddOverride {
        key: String,
        prefix: String,
        from: Option<String>,
    },
}

impl Binding {
    /// Whether the place is FSDP's: its name says so (`--fsdp`,
    /// `fsdp_config.fsdp_offload_params`, `fsdp_cpu_offload`,
    /// `actor.fsdp_config.param_offload`); no DeepSpeed setting is spelled so.
    pub fn names_fsdp(&self) -> bool {
        let name = match self {
            Binding::Flag { flag, .. } | Binding::AddFlag { flag } => flag,
            Binding::Env { var, .. } => var,
            Binding::DerivedFromGlobalBatch { flag, .. } => flag,
            Binding::Config { key, .. }
            | Binding::Override { key, .. }
            | Binding::AddOverride { key, .. } => key,
        };
        name.to_ascii_lowercase().contains("fsdp")
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Binding::Flag { flag, .. } => write!(f, "flag {flag}"),
            Binding::AddFlag { flag } if flag == "--fsdp" => {
                write!(f, "absent; would add --fsdp \"{}\"", flags::FSDP_FULL_SHARD)
            }
            Binding::AddFlag { flag } if flag == flags::ACCELERATE_FSDP => write!(
                f,
                "absent; would add {} before the script",
                crate::frameworks::accelerate::FSDP_FLAGS.join(" ")
            ),
            Binding::AddFlag { flag } => write!(f, "absent; would add {flag}"),
            Binding::Env { var, present: true } => write!(f, "env {var}"),
            Binding::Env {
                var,
                present: false,
            } => write!(f, "env {var} (unset; would set it)"),
            Binding::DerivedFromGlobalBatch { flag, global } => {
                write!(f, "derived: {flag} {global} / micro-batch / world size")
            }
            Binding::Config {
                shown, role, key, ..
            } => write!(f, "{role} {shown}: {key}"),
            Binding::Override { key, prefix, .. } => write!(f, "override {prefix}{key}="),
            Binding::AddOverride {
                key,
                prefix,
                from: None,
            } => write!(f, "absent; would add {prefix}{key}="),
            Binding::AddOverride {
                key,
                prefix,
                from: Some(file),
            } => write!(
                f,
                "packaged config {file}: {key} (changed with {prefix}{key}=)"
            ),
        }
    }
}

/// One knob found in the command: its value there and where it lives.
#[derive(Debug, Clone)]
pub struct Bound {
    pub value: Value,
    pub binding: Binding,
    /// Other places holding the same knob; every attempt writes the same value
    /// to all of them (one knob, one source of truth).
    pub mirrors: Vec<Binding>,
}

impl Bound {
    /// "flag --x (also deepspeed json ds.json: y)".
    pub fn describe(&self) -> String {
        let mut s = self.binding.to_string();
        if !self.mirrors.is_empty() {
            let m: Vec<String> = self.mirrors.iter().map(|b| b.to_string()).collect();
            s.push_str(&format!(" (also {})", m.join(", ")));
        }
        s
    }
}

/// Everything `discover` learned from the command.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub knobs: BTreeMap<Knob, Bound>,
    pub world: World,
    /// Command family: "hf" when the command looks like a Hugging Face `Trainer` script.
    pub hf_style: bool,
    /// See [`Settings::accum_covers_world`].
    pub accum_covers_world: bool,
    /// See [`Settings::micro_floor`].
    pub micro_floor: u64,
    /// The families that recognise the command (`frameworks::FAMILIES`).
    pub families: Vec<&'static str>,
    /// Things the user should know: ambiguous spellings, knobs not found and how to bind them.
    pub notes: Vec<String>,
    /// Things that may break the run as written (one knob with different values
    /// in two places): printed on every run, not only with -v.
    pub warnings: Vec<String>,
    /// A batch flag that may be global or per-device (`--batch_size`), if any.
    pub ambiguous_batch: Option<String>,
    /// Knobs a family would add as a flag that the script's own parser does not
    /// accept (read from its source, `accepts`), with why: not bound, never added.
    pub not_accepted: Vec<(Knob, String)>,
    /// The options of the script's argparse parser, where its source shows it whole
    /// (`accepts::parse` of `accepts::source`, read once): what oomguard may add to the command.
    pub script_options: Option<accepts::ScriptOptions>,
    /// Config files the command names, and knobs found in files and overrides.
    pub config: config::Found,
}

impl Discovery {
    /// Knobs that live in files the command does not name (a module the script
    /// imports): changing them means editing the file in place.
    pub fn unnamed_files(&self) -> Vec<(Knob, String)> {
        self.knobs
            .iter()
            .flat_map(|(k, b)| {
                std::iter::once(&b.binding)
                    .chain(&b.mirrors)
                    .map(move |x| (k, x))
            })
            .filter_map(|(k, b)| match b {
                Binding::Config { file, shown, .. }
                    if self.config.files[*file].reference == config::Ref::Unnamed =>
                {
                    Some((*k, shown.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The files a run may edit in place (`--edit-in-place`): each once, as
    /// (as the notes show it, path, the text read at start).
    pub fn in_place_files(&self) -> Vec<(&str, &Path, &str)> {
        let mut seen: Vec<usize> = Vec::new();
        for b in self
            .knobs
            .values()
            .flat_map(|b| std::iter::once(&b.binding).chain(&b.mirrors))
        {
            if let Binding::Config { file, .. } = b
                && self.config.files[*file].reference == config::Ref::Unnamed
                && !seen.contains(file)
            {
                seen.push(*file);
            }
        }
        seen.iter()
            .map(|&i| {
                let f = &self.config.files[i];
                (f.shown.as_str(), f.doc.path(), f.doc.original())
            })
            .collect()
    }

    pub fn settings(&self) -> Settings {
        Settings {
            knobs: self
                .knobs
                .iter()
                .map(|(k, b)| (*k, b.value.clone()))
                .collect(),
            world_size: self.world.size,
            accum_covers_world: self.accum_covers_world,
            micro_floor: self.micro_floor,
            fsdp_offload: self
                .knobs
                .get(&Knob::OffloadParam)
                .is_some_and(|b| b.binding.names_fsdp()),
        }
    }
}

/// Errors in what the user told us about knobs. All are usage errors (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    #[error(transparent)]
    UnknownKnob(#[from] crate::settings::UnknownKnob),
    #[error(
        "--knob '{0}' is not NAME=WHERE: write it like --knob micro_batch=--bs, micro_batch=env:MICRO_BS, micro_batch=config.yaml:training.micro_batch_size or micro_batch=data.batch_size (an override)"
    )]
    BadSpec(String),
    #[error(
        "--knob grad_accum={place}: {place} is a global batch, not an accumulation count: bound as grad_accum it would be doubled each time the micro-batch is halved. oomguard derives accumulation from a global batch it knows (--global-batch-size, --global_batch_size, an override such as model.global_batch_size=256, a recipe's global batch key); for one it does not know, bind micro_batch alone and run with --policy smaller-batch: a trainer that derives its accumulation from its global batch (NeMo, Megatron) then keeps that batch, though oomguard's summary cannot say so"
    )]
    GlobalBatchAsAccum { place: String },
    #[error(transparent)]
    File(#[from] files::FileError),
    #[error(
        "--knob {knob}={key}: the command has no {key}=N override. Add `{key}=N` to the command (N its current value) so oomguard can change it"
    )]
    OverrideNotInCommand { knob: Knob, key: String },
    #[error(
        "--knob {knob}={flag}: the command has no {flag} flag. Check the spelling, add `{flag} N` to the command, or give its current value with --knob {knob}={flag}=N (the flag is then added when {knob} changes)"
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
    #[error("--knob {knob}={place}: the starting value {value:?} is not {expected}")]
    BadStart {
        knob: Knob,
        place: String,
        value: String,
        expected: &'static str,
    },
    #[error("no command given: write it after the options, e.g. `oomguard python train.py ...`")]
    NoCommand,
}

/// What a knob's value must be, in words.
fn expected_value(knob: Knob) -> &'static str {
    match knob {
        Knob::OffloadOptimizer | Knob::OffloadParam => "none, cpu or nvme",
        Knob::ZeroStage | Knob::DataloaderWorkers => "a whole number",
        k if k.is_bool() => "true or false",
        _ => "a positive whole number",
    }
}

/// A user's `--knob NAME=WHERE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserBinding {
    /// `--flag`, or `--flag=N`: added with N as its current value when the
    /// command does not have it.
    Flag {
        flag: String,
        default: Option<String>,
    },
    Env(String),
    /// `FILE:key.path`
    File {
        path: String,
        key: String,
    },
    /// `key.path` of a `key.path=N` override
    Override(String),
    /// `+key.path=N` / `++key.path=N`: an override to add when the value changes
    /// (the config only has a default, N).
    AddOverride {
        prefix: String,
        key: String,
        default: String,
    },
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
                match place.split_once('=') {
                    Some((flag, default)) if !default.is_empty() => UserBinding::Flag {
                        flag: flag.to_string(),
                        default: Some(default.to_string()),
                    },
                    Some(_) => return Err(KnobError::BadSpec(s.clone())),
                    None => UserBinding::Flag {
                        flag: place.to_string(),
                        default: None,
                    },
                }
            } else if place.starts_with('+') {
                match parse_override(place) {
                    // Hydra rejects `+key=` when the config already has the key
                    // ("An item is already at ..."); `++key=` adds or overrides.
                    Some((_, key, default)) => UserBinding::AddOverride {
                        prefix: "++".into(),
                        key,
                        default,
                    },
                    None => return Err(KnobError::BadSpec(s.clone())),
                }
            } else if let Some((path, key)) = place.rsplit_once(':') {
                if path.is_empty() || key.is_empty() {
                    return Err(KnobError::BadSpec(s.clone()));
                }
                UserBinding::File {
                    path: path.to_string(),
                    key: key.to_string(),
                }
            } else if !place.is_empty()
                && place
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
            {
                UserBinding::Override(place.to_string())
            } else {
                return Err(KnobError::BadSpec(s.clone()));
            };
            if knob == Knob::GradAccum && names_a_global_batch(place) {
                return Err(KnobError::GlobalBatchAsAccum {
                    place: place.to_string(),
                });
            }
            Ok((knob, b))
        })
        .collect()
}

/// Whether a binding's place names a global batch (`model.global_batch_size`,
/// `--global-batch-size=256`, `env:GLOBAL_BATCH`, `cfg.yaml:train.global_batch_size`).
fn names_a_global_batch(place: &str) -> bool {
    let name = place.split('=').next().unwrap_or(place);
    let last = name
        .rsplit(['.', ':'])
        .next()
        .unwrap_or(name)
        .trim_start_matches(['-', '+'])
        .to_ascii_lowercase()
        .replace('-', "_");
    last.contains("global_batch") || last == "globalbatch"
}

/// Read the knobs and world size from a command, its config files and overrides.
///
/// `resolve` maps a path as written in the command to the file to read (the
/// identity, relative to the working directory, except in tests).
pub fn discover(
    cmd: &Command,
    user: &[(Knob, UserBinding)],
    env: &dyn Fn(&str) -> Option<OsString>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Discovery, KnobError> {
    if cmd.argv.is_empty() {
        return Err(KnobError::NoCommand);
    }
    let mut found = config::find(cmd, env, resolve)?;
    let world = with_recipes(&found, |ctx| frameworks::world(cmd, env, ctx));
    let user = user.to_vec();
    let user = &user[..];
    let mut d = flags::discover(cmd, user, env, world)?;

    // What the user bound to files and overrides.
    let (user_places, add_overrides) =
        user_file_and_override_places(cmd, user, &mut found, resolve)?;

    if d.world.uncertain
        && let Some((n, source)) = found.file_world.clone()
    {
        d.world = World {
            size: n,
            source,
            uncertain: false,
        };
    }

    let rank = Ranking {
        cmd,
        found: &found,
        user,
        user_places: &user_places,
        add_overrides: &add_overrides,
    };
    for knob in Knob::ALL {
        let flag = d.knobs.remove(&knob);
        let cands = rank.candidates(knob, flag.as_ref());
        if let Some(bound) = choose(knob, cands, &mut d.warnings) {
            d.knobs.insert(knob, bound);
        }
    }

    derive_accumulation(cmd, &found, &mut d);
    d.families = frameworks::recognised(cmd).map(|f| f.name).collect();
    d.notes.extend(found.notes.iter().cloned());
    if d.ambiguous_batch.is_none() {
        d.ambiguous_batch = found.ambiguous_overrides.first().cloned();
    }
    missing_notes(&mut d, !found.files.is_empty());
    d.config = found;
    Ok(d)
}

/// What is still missing, and how to bind it.
fn missing_notes(d: &mut Discovery, has_files: bool) {
    let where_ = if has_files {
        "flags, overrides or config files"
    } else {
        "flags"
    };
    if !d.knobs.contains_key(&Knob::MicroBatch) {
        match &d.ambiguous_batch {
            Some(flag) => d.notes.push(format!(
                "micro_batch: {flag} may be the global batch or the per-device micro-batch, so oomguard does not guess. If it is the per-device micro-batch: --knob micro_batch={flag}"
            )),
            None => d.notes.push(format!(
                "micro_batch: not found in the command's {where_} (looked for {}). Bind it with --knob micro_batch=FLAG, =FILE:KEY, =OVERRIDE.KEY or =env:VAR",
                frameworks::looked_for(Knob::MicroBatch)
            )),
        }
    }
    // A knob whose flag the script's parser lacks has its own note (flags.rs), which says
    // so: the generic one would offer to add that flag.
    let refused = |d: &Discovery, k: Knob| d.not_accepted.iter().any(|(n, _)| *n == k);
    if !d.knobs.contains_key(&Knob::GradAccum) && !refused(d, Knob::GradAccum) {
        d.notes.push(
            "grad_accum: not found; the global batch cannot be kept when the micro-batch is halved. Bind it with --knob grad_accum=FLAG (added with value 1 when absent) or =FILE:KEY".into(),
        );
    }
    if !d.knobs.contains_key(&Knob::SeqLen) && !d.notes.iter().any(|n| n.starts_with("seq_len")) {
        d.notes.push(format!(
            "seq_len: not found in the command's {where_} (looked for {}). Bind it with --knob seq_len=FLAG to let the policy shorten it",
            frameworks::looked_for(Knob::SeqLen)
        ));
    }
    if !d.knobs.contains_key(&Knob::GradCheckpointing) && !refused(d, Knob::GradCheckpointing) {
        d.notes.push(
            "grad_checkpointing: not found. Bind it with --knob grad_checkpointing=FLAG (added bare when absent) or =FILE:KEY".into(),
        );
    }
}

/// Where to resume from, and how the framework is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeArg {
    pub how: crate::checkpoint::ResumeHow,
    pub path: OsString,
}

/// A changed copy of one of the user's config files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// As the command named it.
    pub shown: String,
    pub original: PathBuf,
    /// Where the copy goes (inside the attempt's folder).
    pub dest: PathBuf,
    pub text: String,
    /// Unified diff original → copy.
    pub diff: String,
    /// The file is not named by the command: `dest` is the original, edited in
    /// place (only with `--edit-in-place`).
    pub in_place: bool,
}

/// One attempt's command: argv, the environment variables the knobs set, and
/// the changed config files it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Materialized {
    pub argv: Vec<OsString>,
    pub env: Vec<(String, String)>,
    pub files: Vec<Derived>,
}

/// What `materialize` adds to the command for `settings`: each knob whose value
/// changed and lives in an absent flag or override, with the flag
/// (`--gradient_accumulation_steps`) or the override's `PREFIX KEY`
/// (`++trainer.accumulate_grad_batches`) as it is put in argv, without its value.
/// A program that refuses one of them refuses oomguard's doing
/// (`evidence::refused`).
pub fn added(disc: &Discovery, settings: &Settings) -> Vec<(Knob, String)> {
    let mut out = Vec::new();
    for (knob, bound) in &disc.knobs {
        if settings.knobs.get(knob).is_none_or(|v| *v == bound.value) {
            continue;
        }
        for b in std::iter::once(&bound.binding).chain(&bound.mirrors) {
            match b {
                Binding::AddFlag { flag } => out.push((*knob, flag.clone())),
                Binding::AddOverride { key, prefix, .. } => {
                    out.push((*knob, format!("{prefix}{key}")))
                }
                _ => {}
            }
        }
    }
    out
}

/// The bare flags of `flags` that the command `cmd` does not have.
fn added_flags<'a>(cmd: &Command, flags: &'a [String]) -> impl Iterator<Item = &'a String> {
    flags.iter().filter(|f| !cmd.has_flag(&[f.as_str()]))
}

/// The arguments `materialize` adds to the command `argv` to tell it where to resume
/// (`resume`) and the bare `flags` a relaunch carries, as they are put in argv without
/// a value: the resume flag, or an override's key, when the user's command does not
/// already have it (a value the user wrote is only replaced, and their parser took
/// it), then each flag it lacks. A program that refuses one refuses oomguard's doing
/// (`evidence::refused`).
pub fn resume_added(
    argv: &[OsString],
    resume: Option<&ResumeArg>,
    flags: &[String],
) -> Vec<String> {
    use crate::checkpoint::ResumeHow;
    let cmd = Command::parse(argv);
    let arg = resume.and_then(|r| match &r.how {
        ResumeHow::Flag { flag, .. }
        | ResumeHow::Const { flag, .. }
        | ResumeHow::Switch { flag } => (!cmd.has_flag(&[flag.as_str()])).then(|| flag.clone()),
        ResumeHow::Override { key, .. } => cmd
            .override_value(&[key.as_str()])
            .is_none()
            .then(|| key.clone()),
        ResumeHow::Automatic => None,
    });
    arg.into_iter()
        .chain(added_flags(&cmd, flags).cloned())
        .collect()
}

/// Write `settings` into the user's argv, environment and copies of their
/// config files (under `dir`), with where to resume (`resume`) and the bare
/// flags a relaunch carries (`flags`, added where the command lacks them).
/// Knobs whose value did not change are left exactly as the user wrote them.
/// Nothing is written to disk here: the caller writes `files` (the plan shows
/// them instead).
pub fn materialize(
    argv: &[OsString],
    disc: &Discovery,
    settings: &Settings,
    resume: Option<&ResumeArg>,
    flags: &[String],
    dir: &Path,
) -> Result<Materialized, KnobError> {
    let mut out: Vec<OsString> = argv.to_vec();
    let mut inserts: Vec<(usize, OsString)> = Vec::new();
    let mut append: Vec<OsString> = Vec::new();
    let mut env = Vec::new();
    let mut docs: Vec<files::Doc> = disc.config.files.iter().map(|f| f.doc.clone()).collect();

    for (knob, bound) in &disc.knobs {
        let Some(new) = settings.knobs.get(knob) else {
            continue;
        };
        if *new == bound.value {
            continue; // unchanged: leave the user's text exactly as written
        }
        for b in std::iter::once(&bound.binding).chain(&bound.mirrors) {
            // accelerate's FSDP flags are the launcher's: before the script.
            if matches!(b, Binding::AddFlag { flag } if flag == flags::ACCELERATE_FSDP) {
                if new.as_bool() == Some(true) {
                    let cmd = Command::parse(argv);
                    let script = cmd.args_start().saturating_sub(1);
                    let fsdp = crate::frameworks::accelerate::FSDP_FLAGS;
                    // accelerate refuses `--multi_gpu` beside `--use_fsdp` (one
                    // distributed type at a time): FSDP takes its place.
                    let multi = cmd
                        .flags
                        .iter()
                        .find(|o| o.name == "--multi_gpu" && o.index < script)
                        .map(|o| o.index);
                    let (at, rest) = match multi {
                        Some(i) => {
                            out[i] = fsdp[0].into();
                            (i, &fsdp[1..])
                        }
                        None => (script.saturating_sub(1), fsdp),
                    };
                    // Inserted after `at`, one by one: the last pushed lands first.
                    for f in rest.iter().rev() {
                        inserts.push((at, (*f).into()));
                    }
                }
                continue;
            }
            if flags::apply_binding(argv, &mut out, &mut append, &mut env, b, new) {
                continue;
            }
            match b {
                Binding::Config { file, key, .. } => {
                    // NVMe with a path: the device is "nvme", and the path goes in
                    // the sibling key (`...offload_optimizer.nvme_path`,
                    // `deepspeed_config.offload_optimizer_nvme_path`).
                    if let Some(Offload::Nvme { path: Some(path) }) = new.as_offload() {
                        docs[*file].set(key, &files::Scalar::Str("nvme".into()))?;
                        let sibling = match key.strip_suffix(".device") {
                            Some(base) => format!("{base}.nvme_path"),
                            None => key.replace("_device", "_nvme_path"),
                        };
                        docs[*file].set(&sibling, &files::Scalar::Str(path.clone()))?;
                        continue;
                    }
                    let old = docs[*file].get(key).ok().flatten();
                    docs[*file].set(key, &config::value_to_scalar(new, old.as_ref()))?;
                }
                Binding::Override { key, index, prefix } => {
                    let old = argv[*index]
                        .to_str()
                        .and_then(|s| s.split_once('='))
                        .map(|(_, v)| v.to_string())
                        .unwrap_or_default();
                    out[*index] =
                        format!("{prefix}{key}={}", config::override_text(new, &old)).into();
                }
                _ => {}
            }
        }
    }

    // A global batch key that the tool checks against micro × accum × world
    // (DeepSpeed's train_batch_size), where it is a number. The world size may be
    // unknown here (`deepspeed` without --num_gpus, a launcher's WORLD_SIZE), so the
    // key is never computed from it: the user's value stays as written while
    // micro × accum stays (halving the micro-batch doubles the accumulation), and
    // is scaled by the same ratio when micro × accum changes.
    if let Some(ratio) = per_rank_ratio(&disc.settings(), settings) {
        for (i, f) in disc.config.files.iter().enumerate() {
            if let config::Role::Kind(kind) = f.role
                && let Some(key) = kind.global_batch_key
                && let Ok(Some(old)) = docs[i].get(key)
                && let Some(n) = config::scalar_int(&old)
                && let Some(new) = ratio.scale(n)
                && new != n
            {
                let value = Value::Int(new as u64);
                docs[i].set(key, &config::value_to_scalar(&value, Some(&old)))?;
            }
        }
    }

    if let Some(r) = resume {
        flags::apply_resume(&mut out, &mut inserts, &mut append, r);
    }
    let cmd = Command::parse(argv);
    for f in added_flags(&cmd, flags) {
        append.push(f.into());
    }

    let (derived, default_ref) = copies(disc, &mut docs, dir, &mut out, &mut env)?;

    inserts.sort_by_key(|i| std::cmp::Reverse(i.0));
    for (idx, v) in inserts {
        out.insert(idx + 1, v);
    }
    out.extend(append);
    if let Some((flag, at, p)) = default_ref {
        // `accelerate launch --config_file COPY ...` instead of the default config.
        out.insert(at, flag.into());
        out.insert(at + 1, p.into_os_string());
    }
    Ok(Materialized {
        argv: out,
        env,
        files: derived,
    })
}

/// micro × accum of `now` over that of `first`, reduced: how a global batch
/// written in a file must scale. `None` when either product is unknown or zero.
fn per_rank_ratio(first: &Settings, now: &Settings) -> Option<Ratio> {
    let product = |s: &Settings| {
        s.int(Knob::MicroBatch)?
            .checked_mul(s.int(Knob::GradAccum).unwrap_or(1))
    };
    let (a, b) = (product(now)?, product(first)?);
    if a == 0 || b == 0 {
        return None;
    }
    let g = gcd(a, b);
    Some(Ratio {
        num: a / g,
        den: b / g,
    })
}

/// A positive fraction `num / den`, in lowest terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ratio {
    num: u64,
    den: u64,
}

impl Ratio {
    /// `n` scaled by the ratio, when the result is a positive whole number.
    fn scale(self, n: i64) -> Option<i64> {
        let n = u64::try_from(n).ok().filter(|n| *n > 0)?;
        let scaled = n.checked_mul(self.num)?;
        if !scaled.is_multiple_of(self.den) {
            return None;
        }
        i64::try_from(scaled / self.den).ok()
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The global batch written in a config file, for this command: (where, value).
fn global_batch(cmd: &Command, found: &config::Found) -> Option<(String, u64)> {
    for f in &found.files {
        let keys: Vec<&str> = match f.role {
            config::Role::Kind(kind) => kind.global_batch_key.into_iter().collect(),
            r if r.is_recipe() => frameworks::global_batch_keys(cmd),
            _ => Vec::new(),
        };
        for key in keys {
            if let Ok(Some(v)) = f.doc.get(key)
                && let Some(g) = config::scalar_int(&v)
                && g > 0
            {
                return Some((format!("{}: {key}", f.shown), g as u64));
            }
        }
    }
    // The same key given as a flag (`--train.global_batch_size 64`).
    for key in frameworks::global_batch_keys(cmd) {
        if let Some(g) = cmd
            .value(&[&format!("--{key}")])
            .and_then(|v| v.parse().ok())
        {
            return Some((format!("--{key}"), g));
        }
    }
    // A global batch given as an override (NeMo's `model.global_batch_size=256`,
    // llm-foundry's `global_train_batch_size=256`): the trainer derives its
    // accumulation from it, as Megatron does from --global-batch-size.
    cmd.overrides.iter().rev().find_map(|o| {
        let last = o.key.rsplit('.').next().unwrap_or(&o.key);
        let g: u64 = o.value.trim().parse().ok()?;
        (GLOBAL_BATCH_OVERRIDES.contains(&last) && g > 0)
            .then(|| (format!("override {}{}", o.prefix, o.key), g))
    })
}

/// The last segments of an override's key that name a global batch the trainer
/// derives its accumulation from.
const GLOBAL_BATCH_OVERRIDES: &[&str] = &["global_batch_size", "global_train_batch_size"];

/// Where the command keeps its checkpoints: the policy's `[resume]` table, or
/// the first family that knows (reading the recipes the command names).
pub fn layout(
    cmd: &Command,
    disc: &Discovery,
    custom: Option<&crate::checkpoint::CustomSpec>,
) -> Option<crate::checkpoint::Layout> {
    if let Some(spec) = custom {
        return Some(crate::checkpoint::custom_layout(cmd, spec));
    }
    let recipes = || disc.config.files.iter().filter(|f| f.role.is_recipe());
    let recipe_value = |key: &str| recipes().find_map(|f| f.doc.scalar_or_list(key));
    let output_dir = recipes().find_map(|f| match f.doc.get("output_dir") {
        Ok(Some(files::Scalar::Str(s))) => Some(s),
        _ => None,
    });
    let ctx = frameworks::Ctx {
        recipe_output_dir: output_dir.as_deref(),
        recipe_value: &recipe_value,
    };
    frameworks::layout(cmd, &ctx)
}

/// Why the command cannot be told where to resume: the script's argparse parser, read
/// from its source, lacks the flag the layout's family adds (`--resume_from_checkpoint`
/// of a script that builds its own `TrainingArguments`, as unsloth-cli.py does), so
/// adding it would end the relaunch in argparse's "unrecognized arguments". A policy's
/// `[resume]` table is the user's word and is not checked.
pub fn resume_refused(
    cmd: &Command,
    disc: &Discovery,
    layout: &crate::checkpoint::Layout,
) -> Option<String> {
    use crate::checkpoint::{Kind, ResumeHow};
    if matches!(layout.kind, Kind::Custom(_)) {
        return None;
    }
    let flag = match &layout.how {
        ResumeHow::Flag { flag, .. }
        | ResumeHow::Const { flag, .. }
        | ResumeHow::Switch { flag } => flag,
        _ => return None,
    };
    if matches!(layout.kind, Kind::Format(f) if f.id == frameworks::hf::CHECKPOINTS.id)
        && let Some(why) = frameworks::hf::resume_ignored(cmd)
    {
        return Some(why);
    }
    let script = cmd.script()?;
    if flag == "--ckpt_path" && frameworks::lightning::without_subcommand(cmd) {
        return Some(format!(
            "{script} runs LightningCLI(run=False), which takes no --ckpt_path (the script calls the trainer's fit itself)"
        ));
    }
    let opts = disc.script_options.as_ref()?;
    (!opts.accepts(flag)).then(|| {
        let name = std::path::Path::new(script)
            .file_name()
            .map_or(script.into(), |n| n.to_string_lossy());
        format!("{name}'s argparse parser has no {flag} (read from its source)")
    })
}

/// How often the command's trainer prints its per-step log dicts (see
/// `progress`), from its flags and the recipes it names.
pub fn logging(cmd: &Command, disc: &Discovery) -> Option<crate::progress::Logging> {
    with_recipes(&disc.config, |ctx| frameworks::logging(cmd, ctx))
}

/// `f` given the values of the recipes in `found` (no output folder).
fn with_recipes<R>(found: &config::Found, f: impl FnOnce(&frameworks::Ctx<'_>) -> R) -> R {
    let recipe_value = |key: &str| {
        found
            .files
            .iter()
            .filter(|f| f.role.is_recipe())
            .find_map(|f| f.doc.scalar_or_list(key))
    };
    f(&frameworks::Ctx {
        recipe_output_dir: None,
        recipe_value: &recipe_value,
    })
}

/// Why the command saves no checkpoint while it trains, with its recipes read
/// (see `frameworks::saves_none`).
pub fn saves_none(cmd: &Command, disc: &Discovery) -> Option<String> {
    with_recipes(&disc.config, |ctx| frameworks::saves_none(cmd, ctx))
}

/// What the step numbers the command's trainer prints count, with its config
/// files read (see `frameworks::counting_in`).
pub fn counting(cmd: &Command, disc: &Discovery) -> crate::progress::Counting {
    with_recipes(&disc.config, |ctx| frameworks::counting_in(cmd, ctx))
}

/// A knob to add as `{prefix}{key}=N` when it changes: (knob, its current value, key, prefix).
type AddedOverride = (Knob, Value, String, String);

/// The places the user bound with `--knob NAME=FILE:KEY`, `=KEY` and `=+KEY=N`.
fn user_file_and_override_places(
    cmd: &Command,
    user: &[(Knob, UserBinding)],
    found: &mut config::Found,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<(Vec<config::Place>, Vec<AddedOverride>), KnobError> {
    let mut user_places: Vec<config::Place> = Vec::new();
    let mut add_overrides: Vec<(Knob, Value, String, String)> = Vec::new();
    for (knob, ub) in user {
        match ub {
            UserBinding::File { path, key } => {
                let place = config::user_file(found, cmd, path, key, *knob, resolve)?;
                user_places.push(place);
            }
            UserBinding::AddOverride {
                prefix,
                key,
                default,
            } => {
                let value = config::scalar_to_value(*knob, &config::yaml_like(default))
                    .ok_or_else(|| KnobError::BadStart {
                        knob: *knob,
                        place: format!("+{key}={default}"),
                        value: default.clone(),
                        expected: expected_value(*knob),
                    })?;
                add_overrides.push((*knob, value, key.clone(), prefix.clone()));
            }
            UserBinding::Override(key) => {
                let place = cmd.overrides.iter().find_map(|o| {
                    if o.key != *key {
                        return None;
                    }
                    Some(config::Place {
                        knob: *knob,
                        value: config::scalar_to_value(*knob, &config::yaml_like(&o.value))?,
                        site: config::Site::Override {
                            key: o.key.clone(),
                            index: o.index,
                            prefix: o.prefix.clone(),
                        },
                        present: true,
                    })
                });
                match place {
                    Some(p) => user_places.push(p),
                    None => {
                        return Err(KnobError::OverrideNotInCommand {
                            knob: *knob,
                            key: key.clone(),
                        });
                    }
                }
            }
            _ => {}
        }
    }

    Ok((user_places, add_overrides))
}

/// Accumulation that follows from a global batch (a config file's or a flag's),
/// and accumulation that counts all ranks together.
fn derive_accumulation(cmd: &Command, found: &config::Found, d: &mut Discovery) {
    // Accumulation that follows from a global batch written in a config file
    // (DeepSpeed's numeric train_batch_size, a recipe's global batch key).
    if !d.knobs.contains_key(&Knob::GradAccum)
        && let Some(micro) = d
            .knobs
            .get(&Knob::MicroBatch)
            .and_then(|b| b.value.as_int())
        && let Some((shown, global)) = global_batch(cmd, found)
    {
        let per_step = micro.saturating_mul(d.world.size);
        if per_step > 0 && global.is_multiple_of(per_step) {
            d.knobs.insert(
                Knob::GradAccum,
                Bound {
                    value: Value::Int(global / per_step),
                    binding: Binding::DerivedFromGlobalBatch {
                        flag: shown.clone(),
                        global,
                    },
                    mirrors: Vec::new(),
                },
            );
            d.notes.push(format!(
                "grad_accum: derived from {shown} {global} (global batch) / micro-batch {micro} / world size {}; the global batch is left as it is",
                d.world.size
            ));
        } else {
            d.notes.push(format!(
                "grad_accum: {shown} {global} is not a multiple of micro-batch {micro} × world size {}; cannot derive accumulation",
                d.world.size
            ));
        }
    }

    // A micro-batch the trainer refuses below a floor (fairseq's token budget).
    if let Some(m) = d
        .knobs
        .get(&Knob::MicroBatch)
        .and_then(|b| b.value.as_int())
        && let Some((floor, why)) = frameworks::micro_floor(cmd)
    {
        d.micro_floor = floor;
        d.notes.push(if m < floor {
            format!("micro_batch: {m} is below {floor}, and is never halved: {why}")
        } else {
            format!("micro_batch: not halved below {floor}: {why}")
        });
    }

    // Accumulation that counts all ranks together: the global batch is micro × accum.
    if d.knobs.contains_key(&Knob::GradAccum) && frameworks::accum_covers_world(cmd) {
        d.accum_covers_world = true;
        if let Some(a) = d.knobs[&Knob::GradAccum].value.as_int()
            && d.world.size > 1
        {
            d.notes.push(if a.is_multiple_of(d.world.size) {
                format!(
                    "grad_accum: {a} counts all {} ranks ({} each), so the global batch is micro-batch × {a}",
                    d.world.size,
                    a / d.world.size
                )
            } else {
                format!(
                    "grad_accum: {a} is not a multiple of the world size {}: the script will stop at its assert",
                    d.world.size
                )
            });
        }
    }
}

/// Where a changed copy of a tool's default config is passed: (flag, argv index, copy).
type DefaultRef = (&'static str, usize, PathBuf);

/// Changed files become copies in `dir`; what names them (an argv element, a
/// key of the parent file, an environment variable) points at the copy.
/// Children come after their parents in `files`, so go from the end.
fn copies(
    disc: &Discovery,
    docs: &mut [files::Doc],
    dir: &Path,
    out: &mut [OsString],
    env: &mut Vec<(String, String)>,
) -> Result<(Vec<Derived>, Option<DefaultRef>), KnobError> {
    let mut derived = Vec::new();
    let mut used: Vec<PathBuf> = Vec::new();
    let mut default_ref: Option<DefaultRef> = None;
    for i in (0..docs.len()).rev() {
        if !docs[i].changed() {
            continue;
        }
        let f = &disc.config.files[i];
        let name = Path::new(&f.shown)
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("config-{i}")));
        let mut dest = dir.join(&name);
        if used.contains(&dest) {
            dest = dir.join(format!("{i}")).join(&name);
        }
        used.push(dest.clone());
        let dest_abs = std::path::absolute(&dest).unwrap_or_else(|_| dest.clone());
        match &f.reference {
            config::Ref::Argv { index, prefix } => {
                let mut v = OsString::from(prefix);
                v.push(&dest_abs);
                out[*index] = v;
            }
            config::Ref::InFile { parent, key } => {
                docs[*parent].set(key, &files::Scalar::Str(dest_abs.display().to_string()))?;
            }
            config::Ref::Default { flag, at } => default_ref = Some((*flag, *at, dest_abs.clone())),
            config::Ref::Env { var } => env.push((var.clone(), dest_abs.display().to_string())),
            // Only bound with --edit-in-place (see Discovery::unnamed_files).
            config::Ref::Unnamed => dest = docs[i].path().to_path_buf(),
            // Never changed: its knobs are set with overrides.
            config::Ref::Packaged => continue,
        }
        derived.push(Derived {
            in_place: f.reference == config::Ref::Unnamed,
            shown: f.shown.clone(),
            original: docs[i].path().to_path_buf(),
            diff: files::unified_diff(
                &f.shown,
                &dest.display().to_string(),
                docs[i].original(),
                docs[i].text(),
            ),
            text: docs[i].text().to_string(),
            dest,
        });
    }
    derived.reverse();

    Ok((derived, default_ref))
}

/// One place a knob's value could come from: (value, binding, written there).
type Candidate = (Value, Binding, bool);

/// What ranks the places of one knob: the user's bindings and what discovery found.
struct Ranking<'a> {
    cmd: &'a Command,
    found: &'a config::Found,
    user: &'a [(Knob, UserBinding)],
    user_places: &'a [config::Place],
    add_overrides: &'a [AddedOverride],
}

impl Ranking<'_> {
    fn binding_of(&self, p: &config::Place) -> Binding {
        match &p.site {
            config::Site::File { file, key } => Binding::Config {
                file: *file,
                shown: self.found.files[*file].shown.clone(),
                role: self.found.files[*file].role.label(),
                key: key.clone(),
            },
            config::Site::Override { key, index, prefix } => Binding::Override {
                key: key.clone(),
                index: *index,
                prefix: prefix.clone(),
            },
            config::Site::AddOverride { file, key } => Binding::AddOverride {
                key: key.clone(),
                prefix: String::new(),
                from: Some(self.found.files[*file].shown.clone()),
            },
        }
    }

    /// Every place of `knob`, most authoritative first: the user's word,
    /// overrides, flags, files, defaults. `flag` is what flag discovery bound.
    fn candidates(&self, knob: Knob, flag: Option<&Bound>) -> Vec<Candidate> {
        let by_user = self.user.iter().any(|(k, _)| *k == knob);
        let adds = flag.is_some_and(|b| matches!(b.binding, Binding::AddFlag { .. }));
        // Most authoritative first: the user's word, overrides, flags, files, defaults.
        let mut cands: Vec<(Value, Binding, bool)> = Vec::new();
        for p in self.user_places.iter().filter(|p| p.knob == knob) {
            cands.push((p.value.clone(), self.binding_of(p), true));
        }
        for (_, value, key, prefix) in self.add_overrides.iter().filter(|a| a.0 == knob) {
            // Already on the command line: change it there.
            let existing = self.cmd.overrides.iter().find(|o| o.key == *key);
            let existing = existing.and_then(|o| {
                let value = config::scalar_to_value(knob, &config::yaml_like(&o.value))?;
                Some((value, o.index, o.prefix.clone()))
            });
            match existing {
                Some((value, index, prefix)) => cands.push((
                    value,
                    Binding::Override {
                        key: key.clone(),
                        index,
                        prefix,
                    },
                    true,
                )),
                None => cands.push((
                    value.clone(),
                    Binding::AddOverride {
                        key: key.clone(),
                        prefix: prefix.clone(),
                        from: None,
                    },
                    true,
                )),
            }
        }
        if let (true, Some(b)) = (by_user && !adds, flag) {
            cands.push((b.value.clone(), b.binding.clone(), true));
            cands.extend(b.mirrors.iter().map(|m| (b.value.clone(), m.clone(), true)));
        }
        let is_override = |p: &&config::Place| matches!(p.site, config::Site::Override { .. });
        for p in self
            .found
            .places
            .iter()
            .filter(|p| p.knob == knob)
            .filter(is_override)
        {
            cands.push((p.value.clone(), self.binding_of(p), true));
        }
        if let (false, Some(b)) = (by_user || adds, flag) {
            cands.push((b.value.clone(), b.binding.clone(), true));
            cands.extend(b.mirrors.iter().map(|m| (b.value.clone(), m.clone(), true)));
        }
        for p in self
            .found
            .places
            .iter()
            .filter(|p| p.knob == knob && !is_override(p))
        {
            cands.push((p.value.clone(), self.binding_of(p), p.present));
        }
        if let (true, Some(b)) = (adds, flag) {
            cands.push((b.value.clone(), b.binding.clone(), false));
        }
        cands
    }
}

/// The knob's binding (the first place with a written value) and its mirrors;
/// two written values that differ are a warning.
fn choose(knob: Knob, mut cands: Vec<Candidate>, warnings: &mut Vec<String>) -> Option<Bound> {
    cands.dedup_by(|a, b| a.1 == b.1);
    // A value written somewhere beats a default.
    if let Some(first_present) = cands.iter().position(|c| c.2) {
        let c = cands.remove(first_present);
        cands.insert(0, c);
    }
    let mut it = cands.into_iter();
    let (value, binding, _) = it.next()?;
    let mut mirrors = Vec::new();
    for (v, b, present) in it {
        if matches!(b, Binding::AddFlag { .. }) {
            continue;
        }
        // `--a.b V` beside a config's `a.b` key: the flag overrides the file by the
        // program's own rule (torchtitan, litgpt, LightningCLI), not by mistake.
        let overrides_file = matches!(
            (&binding, &b),
            (Binding::Flag { flag, .. }, Binding::Config { key, .. })
                if flag.strip_prefix("--") == Some(key.as_str())
        );
        if present && v != value && !overrides_file {
            warnings.push(format!(
                "{knob} has two values: {binding} says {value}, {b} says {v}. oomguard takes {value} and writes the same new value to both when {knob} changes; if the trainer checks them against each other (the Hugging Face DeepSpeed integration does), make them agree before the run"
                ));
        }
        if present || matches!(b, Binding::Config { .. }) {
            mirrors.push(b);
        }
    }
    Some(Bound {
        value,
        binding,
        mirrors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A global batch bound as accumulation would be doubled at every halving: refused,
    /// with the way that keeps it (NeMo's `model.global_batch_size` was bound so in a
    /// published command's check).
    #[test]
    fn a_global_batch_is_refused_as_grad_accum() {
        for place in [
            "model.global_batch_size",
            "++model.global_batch_size=256",
            "--global-batch-size",
            "cfg.yaml:train.global_batch_size",
            "env:GLOBAL_BATCH_SIZE",
        ] {
            let err = parse_user_bindings(&[format!("grad_accum={place}")]).unwrap_err();
            assert!(
                matches!(err, KnobError::GlobalBatchAsAccum { .. }),
                "{place}: {err}"
            );
            assert!(err.to_string().contains("--policy smaller-batch"), "{err}");
        }
        for place in [
            "--gradient_accumulation_steps",
            "trainer.accumulate_grad_batches",
        ] {
            assert!(
                parse_user_bindings(&[format!("grad_accum={place}")]).is_ok(),
                "{place}"
            );
        }
        assert!(parse_user_bindings(&["micro_batch=model.micro_batch_size".into()]).is_ok());
    }

    #[test]
    fn offload_devices_parse_show_and_serialize_as_strings() {
        assert_eq!(Offload::parse("CPU"), Some(Offload::Cpu));
        assert_eq!(Offload::parse("none"), Some(Offload::None));
        assert_eq!(Offload::parse("nvme"), Some(Offload::Nvme { path: None }));
        assert_eq!(Offload::parse("auto"), None);
        assert_eq!(Offload::read("GPU"), Offload::Other("gpu".into()));
        assert_eq!(Offload::read("GPU").to_string(), "gpu");
        let nvme = Value::Offload(Offload::Nvme {
            path: Some("/local_nvme".into()),
        });
        assert_eq!(nvme.to_string(), "nvme:/local_nvme");
        assert_eq!(nvme.as_offload().map(Offload::device), Some("nvme"));
        assert_eq!(
            serde_json::to_string(&nvme).unwrap(),
            "\"nvme:/local_nvme\""
        );
        assert_eq!(
            serde_json::to_string(&Value::Offload(Offload::None)).unwrap(),
            "\"none\""
        );
    }

    #[test]
    fn a_global_batch_in_a_file_scales_only_with_micro_times_accum() {
        let s = |micro: u64, accum: u64| Settings {
            knobs: [
                (Knob::MicroBatch, Value::Int(micro)),
                (Knob::GradAccum, Value::Int(accum)),
            ]
            .into_iter()
            .collect(),
            // The world size is never used: it may be wrong.
            world_size: 1,
            accum_covers_world: false,
            micro_floor: 0,
            fsdp_offload: false,
        };
        let first = s(8, 4);
        let same = per_rank_ratio(&first, &s(8, 4)).unwrap();
        assert_eq!(same.scale(64), Some(64), "attempt 1 runs as given");
        let halved = per_rank_ratio(&first, &s(4, 8)).unwrap();
        assert_eq!(halved.scale(64), Some(64), "micro × accum kept: unchanged");
        let smaller = per_rank_ratio(&first, &s(4, 4)).unwrap();
        assert_eq!(smaller.scale(64), Some(32));
        assert_eq!(per_rank_ratio(&first, &s(3, 4)).unwrap().scale(10), None);
    }

    #[test]
    fn integral_floats_are_knob_values_and_zero_is_not_a_starting_point() {
        use config::{scalar_to_value, value_to_scalar};
        use files::Scalar;
        assert_eq!(
            scalar_to_value(Knob::MicroBatch, &Scalar::Float(16.0)),
            Some(Value::Int(16))
        );
        assert_eq!(scalar_to_value(Knob::MicroBatch, &Scalar::Float(2.5)), None);
        assert_eq!(scalar_to_value(Knob::MicroBatch, &Scalar::Int(0)), None);
        assert_eq!(
            scalar_to_value(Knob::SeqLen, &Scalar::Str("0".into())),
            None
        );
        assert_eq!(
            scalar_to_value(Knob::ZeroStage, &Scalar::Int(0)),
            Some(Value::Int(0))
        );
        assert_eq!(
            value_to_scalar(&Value::Int(8), Some(&Scalar::Float(16.0))),
            Scalar::Float(8.0)
        );
        assert_eq!(
            value_to_scalar(&Value::Int(8), Some(&Scalar::Int(16))),
            Scalar::Int(8)
        );
    }
}
