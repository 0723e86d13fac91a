//! Knobs bound to command-line flags (`--x 4`, `--x=4`, bare `--x`), and
//! environment variables named with `--knob NAME=env:VAR`.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::{
    Binding, Bound, Discovery, Knob, KnobError, Offload, ResumeArg, UserBinding, Value, World,
};
use crate::checkpoint::ResumeHow;

/// A global batch written next to a micro-batch: accumulation follows from it.
const GLOBAL: &[&str] = &["--global_batch_size", "--global-batch-size"];
/// Spellings that may be the global batch or the micro-batch: never guessed.
const AMBIGUOUS_BATCH: &[&str] = &[
    "--batch_size",
    "--batch-size",
    "--bs",
    "--train_batch_size",
    "--train-batch-size",
];

use crate::command::{Command, Flag as Occurrence, FlagForm};
use crate::frameworks;

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "on" => Some(true),
        "false" | "0" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// A checkpointing flag's value that names how it checkpoints, which is on: unsloth's
/// `--use_gradient_checkpointing unsloth` (checkpoints offloaded to the CPU), `full`,
/// `selective`; `none` is off.
fn checkpointing_mode(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "unsloth" | "full" | "selective" => Some(true),
        "none" => Some(false),
        _ => None,
    }
}

/// FSDP's sharding words, of which `--fsdp` takes one or more (with `auto_wrap`
/// and `offload`): a value without one is not FSDP's words (transformers 5's
/// `--fsdp true`, whose offload is `fsdp_config`'s `cpu_offload`).
const FSDP_SHARDING: &[&str] = &[
    "full_shard",
    "shard_grad_op",
    "hybrid_shard",
    "hybrid_shard_zero2",
];

/// Whether `v` is `--fsdp`'s words (`full_shard auto_wrap`).
fn fsdp_words(v: &str) -> bool {
    v.split_whitespace()
        .any(|w| FSDP_SHARDING.contains(&w.to_ascii_lowercase().as_str()))
}

/// FSDP's CPU offload on a flag: the `offload` word among `--fsdp`'s words,
/// or a bool (accelerate's `--fsdp_offload_params true`).
fn fsdp_offload(v: &str) -> Option<Offload> {
    let on = if fsdp_words(v) {
        v.split_whitespace()
            .any(|w| w.eq_ignore_ascii_case("offload"))
    } else {
        parse_bool(v)?
    };
    Some(if on { Offload::Cpu } else { Offload::None })
}

/// `--fsdp`'s words with the `offload` word added or taken out, the others
/// kept in their order.
fn with_offload_word(old: &str, on: bool) -> String {
    let mut words: Vec<&str> = old
        .split_whitespace()
        .filter(|w| !w.eq_ignore_ascii_case("offload"))
        .collect();
    if on {
        words.push("offload");
    }
    words.join(" ")
}

/// Switches that turn DeepSpeed's optimizer offload to the CPU on, bare
/// (`store_true`): OpenRLHF's `--adam_offload` / `--ds.adam_offload`,
/// DeepSpeed-Chat's `--offload`. Added bare, never given a device.
pub(crate) fn offload_switch(flag: &str) -> bool {
    matches!(flag, "--offload" | "--adam_offload" | "--ds.adam_offload")
}

fn parse_value(knob: Knob, occ: &Occurrence) -> Result<Value, (String, &'static str)> {
    if matches!(knob, Knob::OffloadOptimizer | Knob::OffloadParam) && occ.name.contains("fsdp") {
        const FSDP: &str =
            "FSDP's sharding words (full_shard auto_wrap, with offload or not), or true or false";
        return match occ.value.as_deref() {
            Some(v) => fsdp_offload(v)
                .map(Value::Offload)
                .ok_or((v.to_string(), FSDP)),
            None => Ok(Value::Offload(Offload::Cpu)),
        };
    }
    if matches!(knob, Knob::OffloadOptimizer | Knob::OffloadParam) && offload_switch(&occ.name) {
        return match occ.value.as_deref() {
            None => Ok(Value::Offload(Offload::Cpu)),
            Some(v) => parse_bool(v)
                .map(|on| Value::Offload(if on { Offload::Cpu } else { Offload::None }))
                .ok_or((v.to_string(), "a bare switch")),
        };
    }
    if matches!(knob, Knob::OffloadOptimizer | Knob::OffloadParam) {
        return match occ.value.as_deref() {
            Some(v) => Offload::parse(v)
                .map(Value::Offload)
                .ok_or((v.to_ascii_lowercase(), "none, cpu or nvme")),
            None => Err((String::new(), "none, cpu or nvme")),
        };
    }
    if knob.is_bool() {
        match &occ.value {
            None => Ok(Value::Bool(true)),
            Some(v) => parse_bool(v)
                .or_else(|| (knob == Knob::GradCheckpointing).then(|| checkpointing_mode(v))?)
                .map(Value::Bool)
                .ok_or((v.clone(), "true or false")),
        }
    } else {
        let v = occ.value.clone().unwrap_or_default();
        v.parse::<u64>()
            .ok()
            .filter(|n| *n > 0 || knob.allows_zero())
            .map(Value::Int)
            .ok_or((
                v,
                if knob.allows_zero() {
                    "a whole number"
                } else {
                    "a positive whole number"
                },
            ))
    }
}

/// Bind a knob to all occurrences of the first spelling found (last value wins,
/// as argparse does). Returns the spelling used.
fn bind_flag(
    knob: Knob,
    occs: &[Occurrence],
    spellings: &[&str],
) -> Result<Option<Bound>, KnobError> {
    let Some(first) = occs.iter().find(|o| spellings.contains(&o.name.as_str())) else {
        return Ok(None);
    };
    let flag = first.name.clone();
    let mine: Vec<&Occurrence> = occs.iter().filter(|o| o.name == flag).collect();
    let last = mine.last().expect("at least the first occurrence");
    // `--fsdp` holds the parameter offload only as FSDP's words: `--fsdp true`
    // (transformers 5), or a script's own bare `--fsdp`, does not.
    if flag == "--fsdp" && !last.value.as_deref().is_some_and(fsdp_words) {
        return Ok(None);
    }
    let value = parse_value(knob, last).map_err(|(value, expected)| KnobError::BadValue {
        knob,
        flag: flag.clone(),
        value,
        expected,
    })?;
    Ok(Some(Bound {
        value,
        binding: Binding::Flag {
            flag,
            at: mine.iter().map(|o| (o.index, o.form)).collect(),
        },
        mirrors: Vec::new(),
    }))
}

/// Sharding the command sets itself (DeepSpeed, FSDP, an accelerate config
/// that may hold either): FSDP is never added to it.
fn shards_already(cmd: &Command) -> bool {
    cmd.flags.iter().any(|o| {
        matches!(
            o.name.as_str(),
            "--deepspeed"
                | "--deepspeed_config"
                | "--deepspeed_config_file"
                | "--fsdp"
                | "--fsdp_config"
                | "--use_fsdp"
                | "--use_deepspeed"
                | "--config_file"
                | "--zero_stage"
                // accelerate's other distributed types, which --use_fsdp cannot join.
                | "--cpu"
                | "--tpu"
                | "--use_megatron_lm"
        )
    })
}

/// The value `--fsdp` takes when oomguard adds it.
pub const FSDP_FULL_SHARD: &str = "full_shard auto_wrap";

/// The added flag that stands for accelerate's FSDP flags
/// ([`frameworks::accelerate::FSDP_FLAGS`]), added before the script.
pub const ACCELERATE_FSDP: &str = "--use_fsdp";

fn default_for(knob: Knob) -> Option<Value> {
    match knob {
        Knob::GradAccum => Some(Value::Int(1)),
        Knob::GradCheckpointing => Some(Value::Bool(false)),
        _ => None,
    }
}

pub fn discover(
    cmd: &Command,
    user: &[(Knob, UserBinding)],
    env: &dyn Fn(&str) -> Option<OsString>,
    world: World,
) -> Result<Discovery, KnobError> {
    let occs = &cmd.flags[..];
    let mut knobs: BTreeMap<Knob, Bound> = BTreeMap::new();
    let mut notes = Vec::new();

    // 1. What the user told us wins.
    for (knob, ub) in user {
        if let Some(bound) = user_bound(*knob, ub, occs, env, &mut notes)? {
            knobs.insert(*knob, bound);
        }
    }

    // 2. Known spellings (the families' flags for this command).
    for knob in Knob::ALL {
        if knobs.contains_key(&knob) {
            continue;
        }
        if let Some(b) = spelled(cmd, knob, &mut notes)? {
            knobs.insert(knob, b);
        }
    }

    // One knob in several role-prefixed flags.
    if let std::collections::btree_map::Entry::Vacant(e) = knobs.entry(Knob::GradCheckpointing)
        && let Some(b) = role_prefixed_checkpointing(occs)
    {
        e.insert(b);
    }

    // A family whose commands take missing knobs as flags (the Hugging Face
    // Trainer's): those spellings are the script's own.
    let added = frameworks::added_flags(cmd);
    // FSDP alone (accelerate's launcher flags) says nothing of the script's spellings.
    let hf_style = added.iter().any(|(k, _, _)| *k != Knob::Fsdp);

    // 3. A global batch next to a micro-batch: accumulation is derived from it.
    if !knobs.contains_key(&Knob::GradAccum) && knobs.contains_key(&Knob::MicroBatch) {
        let global_spellings: Vec<&str> = GLOBAL
            .iter()
            .chain(if hf_style { &[][..] } else { AMBIGUOUS_BATCH })
            .copied()
            .collect();
        let micro_flag = match &knobs[&Knob::MicroBatch].binding {
            Binding::Flag { flag, .. } => Some(flag.clone()),
            _ => None,
        };
        if let Some(o) = occs.iter().rev().find(|o| {
            global_spellings.contains(&o.name.as_str()) && Some(&o.name) != micro_flag.as_ref()
        }) {
            let micro = knobs[&Knob::MicroBatch].value.as_int().unwrap_or(1);
            if let Some(global) = o.value.as_ref().and_then(|v| v.parse::<u64>().ok()) {
                let per_step = micro.saturating_mul(world.size);
                if per_step > 0 && global % per_step == 0 {
                    knobs.insert(
                        Knob::GradAccum,
                        Bound {
                            value: Value::Int(global / per_step),
                            binding: Binding::DerivedFromGlobalBatch {
                                flag: o.name.clone(),
                                global,
                            },
                            mirrors: Vec::new(),
                        },
                    );
                    notes.push(format!(
                        "grad_accum: derived from {} {global} (global batch) / micro-batch {micro} / world size {}; the global batch flag is left as it is",
                        o.name, world.size
                    ));
                } else {
                    notes.push(format!(
                        "grad_accum: {} {global} is not a multiple of micro-batch {micro} × world size {}; cannot derive accumulation",
                        o.name, world.size
                    ));
                }
            }
        }
    }

    // 4. Missing knobs the family's commands take as flags: added when they change.
    // Only where the program accepts the flag: a script whose argparse parser its
    // source shows whole gets the first of the family's spellings it has, or none.
    let source = cmd
        .script()
        .and_then(|s| super::accepts::source(std::path::Path::new(s)));
    let script_options = source.as_deref().and_then(super::accepts::parse);
    let script = cmd.script().zip(script_options.as_ref());
    let mut not_accepted = Vec::new();
    for (knob, flag, default) in added {
        let std::collections::btree_map::Entry::Vacant(e) = knobs.entry(knob) else {
            continue;
        };
        if knob == Knob::Fsdp && (world.size <= 1 || shards_already(cmd)) {
            continue;
        }
        let accelerate_fsdp = flag == ACCELERATE_FSDP;
        if accelerate_fsdp && frameworks::accelerate::default_config_shards(env) {
            continue;
        }
        let flag = match &script {
            // accelerate's FSDP flags are the launcher's, not the script's.
            _ if accelerate_fsdp => flag.to_string(),
            None => flag.to_string(),
            Some((name, opts)) => {
                let spellings = std::iter::once(flag.to_string())
                    .chain(frameworks::flag_spellings(knob, cmd))
                    .find(|f| opts.accepts(f));
                match spellings {
                    Some(f) => f,
                    None => {
                        let why = format!(
                            "{name}'s argparse parser has no {flag} (read from its source), so oomguard never adds it"
                        );
                        notes.push(format!(
                            "{knob}: {why}; if the script has another option for it, bind that with --knob {knob}=--ITS_FLAG"
                        ));
                        not_accepted.push((knob, why));
                        continue;
                    }
                }
            }
        };
        if accelerate_fsdp {
            notes.push(format!(
                "{knob}: {} GPUs under accelerate launch and no DeepSpeed or FSDP setting in the command: where the memory model says sharding fits and keeps the most throughput, oomguard adds accelerate's {} before the script{} (parameters, gradients and optimizer state sharded over the GPUs; the updates are the same)",
                world.size,
                frameworks::accelerate::FSDP_FLAGS.join(" "),
                if cmd.flags.iter().any(|o| o.name == "--multi_gpu") {
                    ", in place of --multi_gpu (accelerate takes one distributed type at a time)"
                } else {
                    ""
                }
            ));
        } else if knob == Knob::Fsdp {
            notes.push(format!(
                "{knob}: {} GPUs and no DeepSpeed or FSDP setting in the command: where the memory model says sharding fits and keeps the most throughput, oomguard adds {flag} \"{FSDP_FULL_SHARD}\" (parameters, gradients and optimizer state sharded over the GPUs; the updates are the same)",
                world.size
            ));
        }
        if knob == Knob::GradCheckpointing && default == Value::Bool(true) {
            notes.push(format!(
                "{knob}: on by the program's own default though the command does not set it (TRL's configs, LLaMA-Factory): never offered as a fix, and counted in the memory estimate"
            ));
        }
        e.insert(Bound {
            value: default,
            binding: Binding::AddFlag { flag },
            mirrors: Vec::new(),
        });
    }

    // A script of no family that adds flags (diffusers' examples, a plain argparse
    // loop, DeepSpeed-Chat) whose whole parser its source shows: the micro-batch,
    // accumulation, the sequence length and checkpointing are added where the parser
    // has them, from the default it gives them (the value the run has without them).
    if let (Some((name, opts)), Some(src)) = (&script, &source) {
        for knob in [
            Knob::MicroBatch,
            Knob::GradAccum,
            Knob::SeqLen,
            Knob::GradCheckpointing,
            Knob::ZeroStage,
            Knob::OffloadOptimizer,
        ] {
            if knobs.contains_key(&knob) || not_accepted.iter().any(|(k, _)| *k == knob) {
                continue;
            }
            // DeepSpeed-Chat's `--offload` (store_true) turns on the offload of the
            // ZeRO config it builds; only beside a ZeRO stage it takes.
            let spellings = if knob == Knob::OffloadOptimizer {
                if !knobs.contains_key(&Knob::ZeroStage) || !opts.accepts("--offload") {
                    continue;
                }
                // Given already: the offload is on, as written.
                if let Some(b) = bind_flag(knob, occs, &["--offload"])? {
                    knobs.insert(knob, b);
                    continue;
                }
                vec!["--offload".to_string()]
            } else {
                frameworks::flag_spellings(knob, cmd)
            };
            let Some(flag) = spellings.into_iter().find(|f| opts.accepts(f)) else {
                continue;
            };
            use super::accepts::ArgDefault;
            let value = match (knob, super::accepts::default_of(src, &flag)) {
                (Knob::MicroBatch | Knob::GradAccum | Knob::SeqLen, Some(ArgDefault::Int(n)))
                    if n > 0 =>
                {
                    Value::Int(n)
                }
                (Knob::GradCheckpointing, Some(ArgDefault::StoreTrue)) => Value::Bool(false),
                (Knob::ZeroStage, Some(ArgDefault::Int(n))) if n <= 3 => Value::Int(n),
                (Knob::OffloadOptimizer, Some(ArgDefault::StoreTrue)) => {
                    Value::Offload(Offload::None)
                }
                _ => continue,
            };
            notes.push(format!(
                "{knob}: {name}'s argparse parser has {flag} (default {value}, read from its source), which the command leaves out: oomguard adds it when it changes"
            ));
            knobs.insert(
                knob,
                Bound {
                    value,
                    binding: Binding::AddFlag { flag },
                    mirrors: Vec::new(),
                },
            );
        }
    }

    let mut ambiguous_batch = occs
        .iter()
        .find(|o| {
            AMBIGUOUS_BATCH.contains(&o.name.as_str()) && !frameworks::claims_flag(&o.name, cmd)
        })
        .map(|o| o.name.clone());
    // A flag the script's own help says is per device (diffusers' `--train_batch_size`:
    // "Batch size (per device) for the training dataloader.") is the micro-batch.
    if let (Some(flag), Some(src), Some(script)) = (&ambiguous_batch, &source, cmd.script())
        && !knobs.contains_key(&Knob::MicroBatch)
        && let Some(help) = super::accepts::help_of(src, flag)
        && super::accepts::batch_help_per_device(&help) == Some(true)
        && let Some(b) = bind_flag(Knob::MicroBatch, occs, &[flag.as_str()])?
    {
        notes.push(format!(
            "micro_batch: {flag} is the per-device micro-batch: {script}'s parser says so ({:?})",
            help.split_whitespace().collect::<Vec<_>>().join(" ")
        ));
        knobs.insert(Knob::MicroBatch, b);
        ambiguous_batch = None;
    }

    Ok(Discovery {
        knobs,
        world,
        hf_style,
        accum_covers_world: false,
        micro_floor: 0,
        families: Vec::new(),
        notes,
        warnings: Vec::new(),
        ambiguous_batch,
        not_accepted,
        script_options,
        config: Default::default(),
    })
}

/// A knob the user bound to a flag or an environment variable (files and
/// overrides are bound elsewhere: `None`).
fn user_bound(
    knob: Knob,
    ub: &UserBinding,
    occs: &[Occurrence],
    env: &dyn Fn(&str) -> Option<OsString>,
    notes: &mut Vec<String>,
) -> Result<Option<Bound>, KnobError> {
    let bound = match ub {
        UserBinding::Flag { flag, default } => match bind_flag(knob, occs, &[flag.as_str()])? {
            Some(b) => b,
            None => {
                let given = match default {
                    Some(d) => {
                        let occ = Occurrence {
                            name: flag.clone(),
                            index: 0,
                            form: FlagForm::Equals,
                            value: Some(d.clone()),
                        };
                        Some(parse_value(knob, &occ).map_err(|(value, expected)| {
                            KnobError::BadValue {
                                knob,
                                flag: flag.clone(),
                                value,
                                expected,
                            }
                        })?)
                    }
                    None => default_for(knob),
                };
                match given {
                    Some(value) => {
                        notes.push(format!(
                                    "{knob}: {flag} is not in the command; it will be added when {knob} changes (assumed {value} now)"
                                ));
                        Bound {
                            value,
                            binding: Binding::AddFlag { flag: flag.clone() },
                            mirrors: Vec::new(),
                        }
                    }
                    None => {
                        return Err(KnobError::FlagNotInCommand {
                            knob,
                            flag: flag.clone(),
                        });
                    }
                }
            }
        },
        UserBinding::File { .. } | UserBinding::Override(_) | UserBinding::AddOverride { .. } => {
            return Ok(None);
        }
        UserBinding::Env(var) => {
            let raw = env(var);
            let value = match (&raw, default_for(knob)) {
                (None, Some(d)) => d,
                (None, None) => {
                    return Err(KnobError::EnvUnset {
                        knob,
                        var: var.clone(),
                    });
                }
                (Some(v), _) => {
                    let s = v.to_string_lossy().trim().to_string();
                    // Read as a flag's value would be (a number, a boolean, an offload device).
                    let occ = Occurrence {
                        name: var.clone(),
                        index: 0,
                        form: FlagForm::Equals,
                        value: Some(s.clone()),
                    };
                    parse_value(knob, &occ).map_err(|(value, expected)| KnobError::BadEnvValue {
                        knob,
                        var: var.clone(),
                        value,
                        expected,
                    })?
                }
            };
            Bound {
                value,
                binding: Binding::Env {
                    var: var.clone(),
                    present: raw.is_some(),
                },
                mirrors: Vec::new(),
            }
        }
    };
    Ok(Some(bound))
}

/// A knob bound by one of the spellings the families know for this command.
/// Several sequence-length flags, or a value that is not a number, leave it
/// unbound with a note.
fn spelled(cmd: &Command, knob: Knob, notes: &mut Vec<String>) -> Result<Option<Bound>, KnobError> {
    let occs = &cmd.flags[..];
    let spellings = frameworks::flag_spellings(knob, cmd);
    let spellings: Vec<&str> = spellings.iter().map(String::as_str).collect();
    let spellings = &spellings[..];
    if knob == Knob::SeqLen {
        let mut found: Vec<&str> = occs
            .iter()
            .map(|o| o.name.as_str())
            .filter(|n| spellings.contains(n))
            .collect();
        found.dedup();
        found.sort_unstable();
        found.dedup();
        if found.len() > 1 {
            notes.push(format!(
                    "seq_len: several sequence-length flags ({}); not guessed. Bind the one to shorten with --knob seq_len=FLAG",
                    found.join(", ")
                ));
            return Ok(None);
        }
    }
    let found = match bind_flag(knob, occs, spellings) {
        Ok(b) => b,
        // Found on its own (not named by --knob): a value that is not a
        // number (`$ZERO_STAGE`, `auto`) leaves the knob unbound, with a note.
        Err(KnobError::BadValue {
            flag,
            value,
            expected,
            ..
        }) => {
            notes.push(format!(
                    "{knob}: {flag} {value:?} is not {expected}, so oomguard leaves it alone (a shell variable the shell did not expand?). Give it a value, or bind {knob} elsewhere with --knob"
                ));
            None
        }
        Err(e) => return Err(e),
    };
    Ok(found)
}

/// Checkpointing in role-prefixed flags (`--actor_gradient_checkpointing
/// --critic_gradient_checkpointing`): one knob, every flag a mirror.
fn role_prefixed_checkpointing(occs: &[Occurrence]) -> Option<Bound> {
    let mut prefixed = occs.iter().filter(|o| {
        o.name.starts_with("--")
            && (o.name.ends_with("_gradient_checkpointing")
                || o.name.ends_with("-gradient-checkpointing"))
    });
    let first = prefixed.next()?;
    let mut b = bind_flag(Knob::GradCheckpointing, occs, &[first.name.as_str()]).ok()??;
    for o in prefixed {
        if let Ok(Some(m)) = bind_flag(Knob::GradCheckpointing, occs, &[o.name.as_str()])
            && !b.mirrors.contains(&m.binding)
            && m.binding != b.binding
        {
            b.mirrors.push(m.binding);
        }
    }
    Some(b)
}

/// Render a value the way the user wrote the old one (`True` vs `true`).
fn render(new: &Value, old: Option<&str>) -> String {
    match new {
        Value::Int(n) => n.to_string(),
        // FSDP's offload: a word of `--fsdp`'s, or a bool as the flag had it.
        Value::Offload(o) if old.is_some_and(fsdp_words) => {
            with_offload_word(old.unwrap_or_default(), *o != Offload::None)
        }
        Value::Offload(o) if old.and_then(parse_bool).is_some() => {
            render(&Value::Bool(*o != Offload::None), old)
        }
        // An offload device on a flag: the NVMe path has no place there.
        Value::Offload(o) => o.device().to_string(),
        Value::Bool(b) => {
            let s = if *b { "true" } else { "false" };
            match old {
                Some(o) if o.chars().next().is_some_and(|c| c.is_ascii_uppercase()) => {
                    let mut c = s.chars();
                    let first = c.next().map(|f| f.to_ascii_uppercase()).unwrap_or('T');
                    format!("{first}{}", c.as_str())
                }
                Some(o) if o == "1" || o == "0" => (if *b { "1" } else { "0" }).into(),
                _ => s.into(),
            }
        }
    }
}

/// Point the command at a checkpoint, the way its framework expects.
pub(super) fn apply_resume(
    out: &mut [OsString],
    inserts: &mut Vec<(usize, OsString)>,
    append: &mut Vec<OsString>,
    r: &ResumeArg,
) {
    let (flag, value, equals) = match &r.how {
        ResumeHow::Automatic => return,
        ResumeHow::Switch { flag } => {
            if !Command::parse(out).has_flag(&[flag.as_str()]) {
                append.push(flag.into());
            }
            return;
        }
        ResumeHow::Flag { flag, equals } => (flag.as_str(), r.path.clone(), *equals),
        ResumeHow::Const {
            flag,
            value,
            equals,
        } => (flag.as_str(), OsString::from(value), *equals),
        ResumeHow::Override { key, value } => {
            let val = value.clone().map(OsString::from).unwrap_or(r.path.clone());
            let pos = out.iter().rposition(|a| {
                a.to_str().is_some_and(|s| {
                    !s.starts_with('-')
                        && s.trim_start_matches('+')
                            .split_once('=')
                            .is_some_and(|(k, _)| k == key)
                })
            });
            match pos {
                Some(i) => {
                    let s = out[i].to_str().unwrap_or_default().to_string();
                    let plus = &s[..s.len() - s.trim_start_matches('+').len()];
                    let mut v = OsString::from(format!("{plus}{key}="));
                    v.push(&val);
                    out[i] = v;
                }
                None => {
                    let mut v = OsString::from(format!("{key}="));
                    v.push(&val);
                    append.push(v);
                }
            }
            return;
        }
    };
    let occ = Command::parse(out)
        .flags
        .into_iter()
        .rfind(|o| o.name == flag);
    match occ {
        Some(o) => match o.form {
            FlagForm::Space => out[o.index + 1] = value,
            FlagForm::Equals => {
                let mut v = OsString::from(format!("{flag}="));
                v.push(&value);
                out[o.index] = v;
            }
            FlagForm::Bare => inserts.push((o.index, value)),
        },
        None if equals => {
            let mut v = OsString::from(format!("{flag}="));
            v.push(&value);
            append.push(v);
        }
        None => {
            append.push(flag.into());
            append.push(value);
        }
    }
}

/// Write `new` into a flag, added flag or environment binding. Returns false
/// for bindings that live elsewhere (files, overrides).
pub(super) fn apply_binding(
    argv: &[OsString],
    out: &mut [OsString],
    append: &mut Vec<OsString>,
    env: &mut Vec<(String, String)>,
    binding: &Binding,
    new: &Value,
) -> bool {
    match binding {
        Binding::Flag { flag, at } => {
            for (idx, form) in at {
                match form {
                    FlagForm::Space => {
                        let old = argv[idx + 1].to_str();
                        out[idx + 1] = render(new, old).into();
                    }
                    FlagForm::Equals => {
                        let old = argv[*idx]
                            .to_str()
                            .and_then(|s| s.split_once('='))
                            .map(|(_, v)| v);
                        out[*idx] = format!("{flag}={}", render(new, old)).into();
                    }
                    FlagForm::Bare => {
                        if new.as_bool() != Some(true) {
                            // A bare switch turned off: say it explicitly.
                            out[*idx] = format!("{flag}={}", render(new, Some("False"))).into();
                        }
                    }
                }
            }
            true
        }
        Binding::AddFlag { flag } => {
            match new {
                Value::Bool(true) if flag == "--fsdp" => {
                    append.push(flag.into());
                    append.push(FSDP_FULL_SHARD.into());
                }
                Value::Bool(true) => append.push(flag.into()),
                Value::Bool(false) => append.push(format!("{flag}=False").into()),
                Value::Int(n) => {
                    append.push(flag.into());
                    append.push(n.to_string().into());
                }
                // A switch: bare when on, left out when off.
                Value::Offload(o) if offload_switch(flag) => {
                    if *o != Offload::None {
                        append.push(flag.into());
                    }
                }
                // The device only: an NVMe path has no place in a flag.
                Value::Offload(o) => {
                    append.push(flag.into());
                    append.push(o.device().into());
                }
            }
            true
        }
        Binding::Env { var, .. } => {
            env.push((var.clone(), render(new, None)));
            true
        }
        Binding::DerivedFromGlobalBatch { .. } => true,
        Binding::AddOverride { key, prefix, .. } => {
            append.push(format!("{prefix}{key}={}", render(new, Some("true"))).into());
            true
        }
        Binding::Config { .. } | Binding::Override { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::{Discovery, Materialized, Settings};

    fn discover_all(
        a: &[OsString],
        user: &[(Knob, UserBinding)],
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Discovery, KnobError> {
        crate::knobs::discover(&Command::parse(a), user, env, &|p| p.to_path_buf())
    }

    fn mat(a: &[OsString], d: &Discovery, s: &Settings, r: Option<&ResumeArg>) -> Materialized {
        crate::knobs::materialize(a, d, s, r, &[], std::path::Path::new("/tmp/oomguard-test"))
            .expect("materialize")
    }

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }
    fn no_env(_: &str) -> Option<OsString> {
        None
    }
    fn strs(v: &[OsString]) -> String {
        v.iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn hf_flags_space_and_equals() {
        let a = argv(
            "torchrun --nproc_per_node=2 train.py --per_device_train_batch_size=8 --per_device_eval_batch_size 32 --gradient_accumulation_steps 4 --max_seq_length 2048 --output_dir out",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        let s = d.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(8));
        assert_eq!(s.int(Knob::GradAccum), Some(4));
        assert_eq!(s.int(Knob::SeqLen), Some(2048));
        assert_eq!(s.bool(Knob::GradCheckpointing), Some(false));
        assert_eq!(s.global_batch(), Some(64));
        assert!(d.hf_style);

        let mut next = s.clone();
        next.knobs.insert(Knob::MicroBatch, Value::Int(4));
        next.knobs.insert(Knob::GradAccum, Value::Int(8));
        next.knobs
            .insert(Knob::GradCheckpointing, Value::Bool(true));
        let m = mat(&a, &d, &next, Some(&hf_resume("out/checkpoint-10")));
        assert_eq!(
            strs(&m.argv),
            "torchrun --nproc_per_node=2 train.py --per_device_train_batch_size=4 --per_device_eval_batch_size 32 --gradient_accumulation_steps 8 --max_seq_length 2048 --output_dir out --gradient_checkpointing --resume_from_checkpoint out/checkpoint-10"
        );
    }

    #[test]
    fn eval_batch_is_never_the_micro_batch() {
        let a = argv("python t.py --per_device_eval_batch_size 8 --output_dir o");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(!d.knobs.contains_key(&Knob::MicroBatch));
    }

    #[test]
    fn ambiguous_batch_size_is_not_guessed() {
        let a = argv("python train.py --batch_size=12 --max_iters 100");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(!d.knobs.contains_key(&Knob::MicroBatch));
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("--knob micro_batch=--batch_size")),
            "{:?}",
            d.notes
        );
        // Bound by the user, it works, and the equals form is kept.
        let user = parse_user_bindings_ok("micro_batch=--batch_size");
        let d = discover_all(&a, &user, &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::MicroBatch), Some(12));
        let mut s = d.settings();
        s.knobs.insert(Knob::MicroBatch, Value::Int(6));
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python train.py --batch_size=6 --max_iters 100"
        );
    }

    fn hf_resume(p: &str) -> ResumeArg {
        ResumeArg {
            how: ResumeHow::Flag {
                flag: "--resume_from_checkpoint".into(),
                equals: false,
            },
            path: p.into(),
        }
    }

    #[test]
    fn resume_forms_of_each_framework() {
        let a = argv("python train.py --init_from=scratch --batch_size=4");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let r = ResumeArg {
            how: ResumeHow::Const {
                flag: "--init_from".into(),
                value: "resume".into(),
                equals: true,
            },
            path: "out/ckpt.pt".into(),
        };
        assert_eq!(
            strs(&mat(&a, &d, &d.settings(), Some(&r)).argv),
            "python train.py --init_from=resume --batch_size=4"
        );
        let a = argv("tune run lora --config c batch_size=8 +resume_from_checkpoint=False");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let r = ResumeArg {
            how: ResumeHow::Override {
                key: "resume_from_checkpoint".into(),
                value: Some("True".into()),
            },
            path: "o/epoch_1".into(),
        };
        assert_eq!(
            strs(&mat(&a, &d, &d.settings(), Some(&r)).argv),
            "tune run lora --config c batch_size=8 +resume_from_checkpoint=True"
        );
        let a = argv("python src/train.py data.batch_size=64");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let r = ResumeArg {
            how: ResumeHow::Override {
                key: "ckpt_path".into(),
                value: None,
            },
            path: "logs/last.ckpt".into(),
        };
        assert_eq!(
            strs(&mat(&a, &d, &d.settings(), Some(&r)).argv),
            "python src/train.py data.batch_size=64 ckpt_path=logs/last.ckpt"
        );
        let a = argv("python cli.py fit --data.batch_size=2");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let r = ResumeArg {
            how: ResumeHow::Flag {
                flag: "--ckpt_path".into(),
                equals: true,
            },
            path: "l/last.ckpt".into(),
        };
        assert_eq!(
            strs(&mat(&a, &d, &d.settings(), Some(&r)).argv),
            "python cli.py fit --data.batch_size=2 --ckpt_path=l/last.ckpt"
        );
    }

    fn parse_user_bindings_ok(s: &str) -> Vec<(Knob, UserBinding)> {
        crate::knobs::parse_user_bindings(&[s.to_string()]).unwrap()
    }

    #[test]
    fn global_batch_next_to_micro_derives_accum() {
        // alpaca-lora: --batch_size is the global batch when --micro_batch_size is present.
        let a = argv("python finetune.py --batch_size 128 --micro_batch_size 4 --cutoff_len 512");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::GradAccum), Some(32));
        assert!(matches!(
            d.knobs[&Knob::GradAccum].binding,
            Binding::DerivedFromGlobalBatch { .. }
        ));
        let mut s = d.settings();
        s.knobs.insert(Knob::MicroBatch, Value::Int(2));
        s.knobs.insert(Knob::GradAccum, Value::Int(64));
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python finetune.py --batch_size 128 --micro_batch_size 2 --cutoff_len 512"
        );
    }

    #[test]
    fn user_flag_missing_is_an_error_with_advice() {
        let a = argv("python t.py --bs 4");
        let e = discover_all(
            &a,
            &parse_user_bindings_ok("micro_batch=--batchsz"),
            &no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the command has no --batchsz flag"), "{e}");
    }

    #[test]
    fn bad_value_names_the_flag() {
        // Found on its own: left unbound with a note naming the flag.
        let a = argv("python t.py --per_device_train_batch_size $MICRO --output_dir o");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(!d.knobs.contains_key(&Knob::MicroBatch));
        assert!(
            d.notes.iter().any(|n| n.contains(
                "--per_device_train_batch_size \"$MICRO\" is not a positive whole number"
            )),
            "{:?}",
            d.notes
        );
        // Named by the user: an error.
        let e = discover_all(
            &a,
            &parse_user_bindings_ok("micro_batch=--per_device_train_batch_size"),
            &no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--per_device_train_batch_size") && e.contains("\"$MICRO\""),
            "{e}"
        );
    }

    #[test]
    fn env_binding() {
        let a = argv("python t.py");
        let env = |k: &str| (k == "MICRO_BS").then(|| OsString::from("16"));
        let d = discover_all(
            &a,
            &parse_user_bindings_ok("micro_batch=env:MICRO_BS"),
            &env,
        )
        .unwrap();
        let mut s = d.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(16));
        s.knobs.insert(Knob::MicroBatch, Value::Int(8));
        let m = mat(&a, &d, &s, None);
        assert_eq!(m.argv, a);
        assert_eq!(m.env, vec![("MICRO_BS".to_string(), "8".to_string())]);
    }

    #[test]
    fn bool_values_keep_their_style() {
        let a = argv("python t.py --gradient_checkpointing False --per_device_train_batch_size 2");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let mut s = d.settings();
        assert_eq!(s.bool(Knob::GradCheckpointing), Some(false));
        s.knobs.insert(Knob::GradCheckpointing, Value::Bool(true));
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python t.py --gradient_checkpointing True --per_device_train_batch_size 2"
        );
    }

    #[test]
    fn resume_replaces_earlier_value() {
        let a = argv("python t.py --per_device_train_batch_size 2 --resume_from_checkpoint=old");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let m = mat(&a, &d, &d.settings(), Some(&hf_resume("o/checkpoint-5")));
        assert_eq!(
            strs(&m.argv),
            "python t.py --per_device_train_batch_size 2 --resume_from_checkpoint=o/checkpoint-5"
        );
    }

    #[test]
    fn non_utf8_arguments_pass_through() {
        use std::os::unix::ffi::OsStringExt;
        let mut a = argv("python t.py --per_device_train_batch_size 8");
        a.push(OsString::from_vec(vec![0xff, 0xfe, b'x']));
        let d = discover_all(&a, &[], &no_env).unwrap();
        let mut s = d.settings();
        s.knobs.insert(Knob::MicroBatch, Value::Int(4));
        let m = mat(&a, &d, &s, None);
        assert_eq!(m.argv[4], a[4]);
        assert_eq!(m.argv[3], OsString::from("4"));
    }

    /// torchtitan (and flame, built on it): a `--section.key V` flag wins over the TOML's
    /// key, so the flag is the knob and a change is written to it; the file's other value
    /// is not a conflict to warn about. The older per-rank `training.batch_size` and
    /// flame's `training.gradient_accumulation_steps` are knobs too.
    #[test]
    fn torchtitans_dotted_flags_win_over_its_toml() {
        let t = tempfile::tempdir().unwrap();
        let toml = t.path().join("fla.toml");
        std::fs::write(
            &toml,
            "[training]\nbatch_size = 32\nseq_len = 2048\ngradient_accumulation_steps = 1\n",
        )
        .unwrap();
        let cmd = format!(
            "bash train.sh --job.config_file {} --training.batch_size 2 --training.seq_len 65536 --training.gradient_accumulation_steps 1 --training.steps 20480",
            toml.display()
        );
        let a = argv(&cmd);
        let d = discover_all(&a, &[], &no_env).unwrap();
        let s = d.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(2), "{:?}", d.knobs);
        assert_eq!(s.int(Knob::SeqLen), Some(65536));
        assert_eq!(s.int(Knob::GradAccum), Some(1));
        assert!(
            !d.warnings.iter().any(|w| w.contains("two values")),
            "{:?}",
            d.warnings
        );
        let mut next = s.clone();
        next.knobs.insert(Knob::SeqLen, Value::Int(49152));
        next.knobs.insert(Knob::MicroBatch, Value::Int(1));
        next.knobs.insert(Knob::GradAccum, Value::Int(2));
        let out = strs(&mat(&a, &d, &next, None).argv);
        for written in [
            "--training.seq_len 49152",
            "--training.batch_size 1",
            "--training.gradient_accumulation_steps 2",
        ] {
            assert!(out.contains(written), "{written:?} in {out}");
        }
        // Without the flags, the TOML's keys are the knobs.
        let a = argv(&format!(
            "torchrun train.py --job.config_file {}",
            toml.display()
        ));
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::SeqLen), Some(2048));
        assert_eq!(d.settings().int(Knob::MicroBatch), Some(32));
        // torchtitan's global batch: accumulation follows from it.
        let global = t.path().join("llama.toml");
        std::fs::write(
            &global,
            "[training]\nlocal_batch_size = 2\nglobal_batch_size = 32\nseq_len = 8192\n",
        )
        .unwrap();
        let a = argv(&format!(
            "torchrun --nproc_per_node 4 train.py --job.config_file {}",
            global.display()
        ));
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::GradAccum), Some(4), "{:?}", d.knobs);
        assert_eq!(d.settings().global_batch(), Some(32));
    }

    /// unsloth's `--use_gradient_checkpointing unsloth` is checkpointing on (offloaded to
    /// the CPU): the enabling step is not taken and the value is left as written. Before,
    /// the value read as no checkpointing flag at all.
    #[test]
    fn a_checkpointing_mode_is_checkpointing_on() {
        for (cmd, on) in [
            (
                "python unsloth-cli.py --per_device_train_batch_size 2 --use_gradient_checkpointing unsloth",
                true,
            ),
            (
                "python unsloth-cli.py --per_device_train_batch_size 2 --use_gradient_checkpointing False",
                false,
            ),
            (
                "python t.py --per_device_train_batch_size 2 --gradient_checkpointing full",
                true,
            ),
            (
                "python t.py --per_device_train_batch_size 2 --gradient_checkpointing none",
                false,
            ),
        ] {
            let d = discover_all(&argv(cmd), &[], &no_env).unwrap();
            assert_eq!(
                d.settings().knobs.get(&Knob::GradCheckpointing),
                Some(&Value::Bool(on)),
                "{cmd}: {:?}",
                d.knobs
            );
        }
    }

    /// A script that runs `LightningCLI(run=False)` and calls `fit` itself (vocos:
    /// `python train.py -c config.yaml`) is LightningCLI's without a `fit` subcommand: its
    /// ranks are Lightning's, accumulation goes in `--trainer.accumulate_grad_batches`, and
    /// it is never given `--ckpt_path`, which it has no place for. A script that names
    /// LightningCLI with its subcommands still needs `fit` to be one.
    #[test]
    fn a_lightning_cli_without_subcommands_is_lightnings_and_takes_no_ckpt_path() {
        let t = tempfile::tempdir().unwrap();
        let script = t.path().join("train.py");
        std::fs::write(
            &script,
            "from pytorch_lightning.cli import LightningCLI\n\nif __name__ == \"__main__\":\n    cli = LightningCLI(run=False)\n    cli.trainer.fit(model=cli.model, datamodule=cli.datamodule)\n",
        )
        .unwrap();
        let cfg = t.path().join("c.yaml");
        std::fs::write(&cfg, "trainer:\n  max_steps: 100\n").unwrap();
        let a = argv(&format!(
            "python {} -c {} --trainer.devices 2 --data.batch_size 8",
            script.display(),
            cfg.display()
        ));
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.world.size, 2, "{}", d.world.source);
        assert_eq!(
            d.knobs.get(&Knob::GradAccum).map(|b| &b.binding),
            Some(&Binding::AddFlag {
                flag: "--trainer.accumulate_grad_batches".into()
            }),
            "{:?}",
            d.knobs
        );
        let cmd = Command::parse(&a);
        let layout = super::super::layout(&cmd, &d, None).expect("a Lightning layout");
        let why = super::super::resume_refused(&cmd, &d, &layout).unwrap_or_default();
        assert!(why.contains("LightningCLI(run=False)"), "{why}");
        // The devices as a list in the config, flow or block: that many ranks (they read
        // as `auto`, every visible GPU, before).
        for devices in ["[0, 1, 2]", "\n    - 0\n    - 1\n    - 2"] {
            std::fs::write(
                &cfg,
                format!("trainer:\n  devices: {devices}\n  max_steps: 100\n"),
            )
            .unwrap();
            let a = argv(&format!(
                "python {} -c {} --data.batch_size 8",
                script.display(),
                cfg.display()
            ));
            let d = discover_all(&a, &[], &no_env).unwrap();
            assert_eq!(
                (d.world.size, d.world.uncertain),
                (3, false),
                "{devices}: {}",
                d.world.source
            );
        }
        // With its subcommands (no run=False), a command without `fit` is not LightningCLI's.
        std::fs::write(
            &script,
            "from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n",
        )
        .unwrap();
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(!d.knobs.contains_key(&Knob::GradAccum), "{:?}", d.knobs);
    }

    /// fairseq-train: the micro-batch is `--max-tokens` (a token budget per GPU),
    /// accumulation `--update-freq` (added when absent), and fairseq starts a rank per
    /// visible GPU itself; a halving keeps the tokens per update. Before, none of it was
    /// found and the world read as one process.
    #[test]
    fn fairseq_halves_its_token_budget_and_doubles_update_freq() {
        let four = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "0,1,2,3".into());
        let a = argv(
            "fairseq-train data-bin/wikitext-103 --task language_modeling --arch transformer_lm --max-tokens 4096 --update-freq 16 --save-dir ckpt",
        );
        let d = discover_all(&a, &[], &four).unwrap();
        assert_eq!(
            (d.world.size, d.world.uncertain),
            (4, false),
            "{}",
            d.world.source
        );
        let s = d.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(4096), "{:?}", d.knobs);
        assert_eq!(s.int(Knob::GradAccum), Some(16));
        assert_eq!(s.global_batch(), Some(4096 * 16 * 4));
        let mut next = s.clone();
        next.knobs.insert(Knob::MicroBatch, Value::Int(2048));
        next.knobs.insert(Knob::GradAccum, Value::Int(32));
        let out = strs(&mat(&a, &d, &next, None).argv);
        assert!(out.contains("--max-tokens 2048 --update-freq 32"), "{out}");
        // Sentences, no accumulation flag, its own world size.
        let a = argv(
            "python fairseq_cli/train.py data --arch transformer --batch-size 32 --distributed-world-size 2",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(
            (d.world.size, d.world.uncertain),
            (2, false),
            "{}",
            d.world.source
        );
        let mut next = d.settings();
        next.knobs.insert(Knob::MicroBatch, Value::Int(16));
        next.knobs.insert(Knob::GradAccum, Value::Int(2));
        let out = strs(&mat(&a, &d, &next, None).argv);
        assert!(
            out.contains("--batch-size 16") && out.ends_with("--update-freq 2"),
            "{out}"
        );
        // The visible GPUs unknown: said, not a silent 1.
        let a = argv("fairseq-train data --max-tokens 4096");
        assert!(discover_all(&a, &[], &no_env).unwrap().world.uncertain);
    }

    /// fairseq's token budget is whole samples: a halving stops at the longest sample
    /// the command sets (its largest --tokens-per-sample, --max-source-positions, ...;
    /// fairseq's default 1024 when it sets none), where fairseq would stop at its
    /// assertion ("exceeds max_tokens limit"), and the ladder goes on to checkpointing.
    /// Before, --max-tokens was halved down to 1. A budget in sentences has no floor.
    #[test]
    fn fairseqs_token_budget_is_not_halved_below_the_longest_sample() {
        let p = crate::policy::Policy::load("default").unwrap();
        let ladder = |cmd: &str| -> (Vec<u64>, Vec<String>, Vec<String>) {
            let d = discover_all(&argv(cmd), &[], &no_env).unwrap();
            let mut s = d.settings();
            let mut micros = vec![s.int(Knob::MicroBatch).unwrap()];
            let mut steps = vec![];
            let oom = crate::evidence::Evidence::cuda_oom(None);
            while let Some(dec) = crate::policy::next_rung(&p, &s, &oom) {
                steps.push(dec.step.to_string());
                s = dec.after;
                micros.push(s.int(Knob::MicroBatch).unwrap());
            }
            micros.dedup();
            (micros, steps, d.notes)
        };
        let (m, steps, notes) = ladder(
            "fairseq-train data-bin/wmt --task translation --arch transformer --max-tokens 4096 --update-freq 2 --max-source-positions 512 --max-target-positions 1024",
        );
        assert_eq!(m, [4096, 2048, 1024], "{steps:?}");
        assert!(steps.contains(&"enable_grad_checkpointing".to_string()));
        assert!(
            notes.iter().any(|n| n.contains("not halved below 1024")
                && n.contains("--max-target-positions 1024")),
            "{notes:?}"
        );
        // No length given: fairseq's default, said so.
        let (m, _, notes) = ladder("fairseq-train data --arch transformer_lm --max-tokens 8192");
        assert_eq!(m, [8192, 4096, 2048, 1024]);
        assert!(
            notes.iter().any(|n| n.contains("fairseq's default, 1024")),
            "{notes:?}"
        );
        // wav2vec's crops: 1,400,000 samples of audio, crops of 250,000.
        let (m, _, _) = ladder(
            "fairseq-train manifest --task audio_pretraining --arch wav2vec2 --max-tokens 1400000 --max-sample-size 250000",
        );
        assert_eq!(m, [1400000, 700000, 350000]);
        // Sentences: down to 1.
        let (m, _, _) = ladder("fairseq-train data --arch transformer --batch-size 8");
        assert_eq!(m, [8, 4, 2, 1]);
    }

    /// NeMo's Hydra overrides: the global batch `model.global_batch_size=256` is one the
    /// trainer derives its accumulation from over the data-parallel ranks (the world
    /// less `model.tensor_model_parallel_size` × `model.pipeline_model_parallel_size`);
    /// a halving writes the micro-batch only, and the global batch stays as written.
    /// Before, accumulation was "not found" and the micro-batch could not be halved.
    #[test]
    fn a_global_batch_override_derives_accumulation_over_the_data_parallel_ranks() {
        let a = argv(
            "python megatron_gpt_pretraining.py --config-path=conf --config-name=megatron_gpt_config trainer.devices=8 trainer.num_nodes=2 model.micro_batch_size=4 ++model.global_batch_size=256 model.tensor_model_parallel_size=2 model.pipeline_model_parallel_size=2",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.world.size, 4, "{}", d.world.source);
        let s = d.settings();
        assert_eq!(s.int(Knob::GradAccum), Some(16), "{:?}", d.knobs);
        assert_eq!(s.global_batch(), Some(256));
        let mut next = s.clone();
        next.knobs.insert(Knob::MicroBatch, Value::Int(2));
        next.knobs.insert(Knob::GradAccum, Value::Int(32));
        let out = strs(&mat(&a, &d, &next, None).argv);
        assert!(
            out.contains("model.micro_batch_size=2 ++model.global_batch_size=256 "),
            "{out}"
        );
        assert!(!out.contains("accumulate_grad_batches"), "{out}");
        // llm-foundry's spelling; a global batch that does not divide: said, not derived.
        let a = argv("composer train.py device_train_microbatch_size=4 global_train_batch_size=64");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::GradAccum), Some(16), "{:?}", d.knobs);
        let a = argv("python train.py model.micro_batch_size=3 model.global_batch_size=64");
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(
            d.notes.iter().any(|n| n.contains("not a multiple")),
            "{:?}",
            d.notes
        );
    }

    /// Every family's spelling of the DataLoader's workers is found (0 included:
    /// it is a value, not a missing one), and a halving is written where it was.
    #[test]
    fn dataloader_workers_are_found_in_each_familys_spelling_and_halved_there() {
        let t = tempfile::tempdir().unwrap();
        let recipe = t.path().join("recipe.yaml");
        std::fs::write(
            &recipe,
            "model_name_or_path: m\nper_device_train_batch_size: 4\ndataloader_num_workers: 8 # host RAM\n",
        )
        .unwrap();
        let litgpt = t.path().join("litgpt.yaml");
        std::fs::write(
            &litgpt,
            "data:\n  class_path: litgpt.data.Alpaca2k\n  init_args:\n    num_workers: 4\n",
        )
        .unwrap();
        let cases = [
            ("python train.py --per_device_train_batch_size 4 --dataloader_num_workers 8 --output_dir o".to_string(), 8, "--dataloader_num_workers 4"),
            ("python train.py --per_device_train_batch_size 4 --dataloader_num_workers=0 --output_dir o".to_string(), 0, ""),
            ("python train.py --batch-size 4 --num-workers 6".to_string(), 6, "--num-workers 3"),
            ("torchrun pretrain_gpt.py --micro-batch-size 4 --num-workers 2 --save ckpt".to_string(), 2, "--num-workers 1"),
            ("python cli.py fit --data.batch_size 8 --data.num_workers 8".to_string(), 8, "--data.num_workers 4"),
            ("python train.py data.micro_batch_size_per_gpu=4 data.num_workers=8".to_string(), 8, "data.num_workers=4"),
            (format!("accelerate launch sft.py --config {}", recipe.display()), 8, "dataloader_num_workers: 4 # host RAM"),
            (format!("litgpt finetune_lora m --config {}", litgpt.display()), 4, "    num_workers: 2"),
        ];
        for (cmd, start, written) in cases {
            let a = argv(&cmd);
            let d = discover_all(&a, &[], &no_env).unwrap();
            let s = d.settings();
            assert_eq!(s.int(Knob::DataloaderWorkers), Some(start), "{cmd}");
            if start == 0 {
                continue;
            }
            let mut next = s.clone();
            next.knobs
                .insert(Knob::DataloaderWorkers, Value::Int(start / 2));
            let m = mat(&a, &d, &next, None);
            let out = match m.files.first() {
                Some(f) => f.text.clone(),
                None => strs(&m.argv),
            };
            assert!(out.contains(written), "{cmd}: {written:?} in {out}");
        }
        // No spelling in the command: not bound (a host OOM stops with advice).
        let d = discover_all(
            &argv("python train.py --per_device_train_batch_size 4"),
            &[],
            &no_env,
        )
        .unwrap();
        assert!(!d.knobs.contains_key(&Knob::DataloaderWorkers));
    }

    /// Every family's spelling of the evaluation batch is found and a halving
    /// written where it was; the Trainer's `--per_device_eval_batch_size` is
    /// added (from its default 8) only to a script that parses the Trainer's
    /// arguments, never to a plain argparse script that would refuse it.
    #[test]
    fn eval_batch_is_found_in_each_familys_spelling_and_added_only_where_accepted() {
        let t = tempfile::tempdir().unwrap();
        let recipe = t.path().join("recipe.yaml");
        std::fs::write(
            &recipe,
            "model_name_or_path: m\nper_device_train_batch_size: 4\nper_device_eval_batch_size: 16 # eval\n",
        )
        .unwrap();
        let hf = t.path().join("hf.py");
        std::fs::write(
            &hf,
            "from transformers import HfArgumentParser, TrainingArguments\n",
        )
        .unwrap();
        let plain = t.path().join("plain.py");
        std::fs::write(&plain, "import argparse\n").unwrap();
        let (hf, plain) = (hf.display(), plain.display());
        let cases = [
            (
                format!(
                    "python {plain} --per_device_train_batch_size 4 --per_device_eval_batch_size 8 --output_dir o"
                ),
                8,
                "--per_device_eval_batch_size 4",
            ),
            (
                format!("python {plain} --batch-size 4 --eval-batch-size 6"),
                6,
                "--eval-batch-size 3",
            ),
            (
                format!("python {plain} --batch_size 4 --val_batch_size=16"),
                16,
                "--val_batch_size=8",
            ),
            (
                "python cli.py fit --data.batch_size 8 --data.val_batch_size 8".to_string(),
                8,
                "--data.val_batch_size 4",
            ),
            (
                "python train.py data.micro_batch_size_per_gpu=4 data.val_batch_size=8".to_string(),
                8,
                "data.val_batch_size=4",
            ),
            (
                format!("accelerate launch sft.py --config {}", recipe.display()),
                16,
                "per_device_eval_batch_size: 8 # eval",
            ),
            (
                format!("python {hf} --per_device_train_batch_size 4 --output_dir o"),
                8,
                "--per_device_eval_batch_size 4",
            ),
        ];
        for (cmd, start, written) in cases {
            let a = argv(&cmd);
            let d = discover_all(&a, &[], &no_env).unwrap();
            let s = d.settings();
            assert_eq!(s.int(Knob::EvalBatch), Some(start), "{cmd}");
            let mut next = s.clone();
            next.knobs.insert(Knob::EvalBatch, Value::Int(start / 2));
            let m = mat(&a, &d, &next, None);
            let out = match m.files.first() {
                Some(f) => f.text.clone(),
                None => strs(&m.argv),
            };
            assert!(out.contains(written), "{cmd}: {written:?} in {out}");
            // The training batch is written as it was.
            assert_eq!(next.int(Knob::MicroBatch), s.int(Knob::MicroBatch), "{cmd}");
        }
        // A plain argparse script that spells the Trainer's training batch: not
        // added (it would refuse the flag), so not bound; nor for `-m module`.
        for cmd in [
            format!("python {plain} --per_device_train_batch_size 4 --output_dir o"),
            "python -m trainer --per_device_train_batch_size 4 --output_dir o".to_string(),
        ] {
            let d = discover_all(&argv(&cmd), &[], &no_env).unwrap();
            assert!(!d.knobs.contains_key(&Knob::EvalBatch), "{cmd}");
        }
    }

    #[test]
    fn nvme_offload_writes_device_and_path_in_a_copy() {
        let t = tempfile::tempdir().unwrap();
        let ds = t.path().join("ds.json");
        let text = "{\n  \"train_micro_batch_size_per_gpu\": \"auto\",\n  \"zero_optimization\": {\n    \"stage\": 2\n  }\n}\n";
        std::fs::write(&ds, text).unwrap();
        let a = argv(&format!(
            "python t.py --deepspeed {} --per_device_train_batch_size 4",
            ds.display()
        ));
        let d = discover_all(&a, &[], &no_env).unwrap();
        let mut s = d.settings();
        assert_eq!(
            s.knobs[&Knob::OffloadOptimizer],
            Value::Offload(Offload::None)
        );
        s.knobs.insert(
            Knob::OffloadOptimizer,
            Value::Offload(Offload::Nvme {
                path: Some("/local_nvme".into()),
            }),
        );
        let m = mat(&a, &d, &s, None);
        let copy: serde_json::Value = serde_json::from_str(&m.files[0].text).unwrap();
        assert_eq!(
            copy["zero_optimization"]["offload_optimizer"]["device"],
            "nvme"
        );
        assert_eq!(
            copy["zero_optimization"]["offload_optimizer"]["nvme_path"],
            "/local_nvme"
        );
        assert_eq!(
            std::fs::read_to_string(&ds).unwrap(),
            text,
            "original untouched"
        );
    }

    #[test]
    fn hydra_override_added_when_the_knob_only_has_a_default() {
        let a = argv("python src/train.py trainer=ddp trainer.max_epochs=20");
        let user = parse_user_bindings_ok("micro_batch=+data.batch_size=64");
        let d = discover_all(&a, &user, &no_env).unwrap();
        assert_eq!(d.settings().int(Knob::MicroBatch), Some(64));
        assert_eq!(
            d.knobs[&Knob::MicroBatch].binding.to_string(),
            "absent; would add ++data.batch_size="
        );
        let mut s = d.settings();
        s.knobs.insert(Knob::MicroBatch, Value::Int(32));
        // `++`: Hydra rejects `+key=` when the config has the key already.
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python src/train.py trainer=ddp trainer.max_epochs=20 ++data.batch_size=32"
        );
        // Already given on the command line: changed where it is.
        let a = argv("python src/train.py ++data.batch_size=16");
        let d = discover_all(&a, &user, &no_env).unwrap();
        let mut s = d.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(16));
        s.knobs.insert(Knob::MicroBatch, Value::Int(8));
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python src/train.py ++data.batch_size=8"
        );
    }

    #[test]
    fn an_nvme_path_never_leaks_into_a_flag_env_or_override_value() {
        let nvme = Value::Offload(Offload::Nvme {
            path: Some("/local_nvme".into()),
        });
        // An environment variable bound by the user.
        let a = argv("python t.py");
        let env = |k: &str| (k == "OFFLOAD").then(|| OsString::from("cpu"));
        let d = discover_all(
            &a,
            &parse_user_bindings_ok("offload_optimizer=env:OFFLOAD"),
            &env,
        )
        .unwrap();
        let mut s = d.settings();
        s.knobs.insert(Knob::OffloadOptimizer, nvme.clone());
        assert_eq!(
            mat(&a, &d, &s, None).env,
            vec![("OFFLOAD".to_string(), "nvme".to_string())]
        );
        // A flag added when absent.
        let d = discover_all(
            &a,
            &parse_user_bindings_ok("offload_optimizer=--offload_device=none"),
            &no_env,
        )
        .unwrap();
        let mut s = d.settings();
        s.knobs.insert(Knob::OffloadOptimizer, nvme.clone());
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python t.py --offload_device nvme"
        );
        // An override.
        let a = argv("python t.py ds.offload_optimizer_device=cpu");
        let d = discover_all(
            &a,
            &parse_user_bindings_ok("offload_optimizer=ds.offload_optimizer_device"),
            &no_env,
        )
        .unwrap();
        let mut s = d.settings();
        s.knobs.insert(Knob::OffloadOptimizer, nvme);
        assert_eq!(
            strs(&mat(&a, &d, &s, None).argv),
            "python t.py ds.offload_optimizer_device=nvme"
        );
    }

    /// `--fsdp`'s words hold FSDP's CPU offload: the word `offload` added and
    /// taken out, the others kept; the settings say the offload is FSDP's.
    /// `--fsdp true` (transformers 5) and a script's own bare `--fsdp` hold
    /// none, and are no error.
    #[test]
    fn fsdp_words_hold_the_cpu_offload() {
        let mut a = argv(
            "torchrun --nproc_per_node=4 train.py --per_device_train_batch_size 1 --fsdp X --output_dir out",
        );
        a[6] = "full_shard auto_wrap".into();
        let d = discover_all(&a, &[], &no_env).unwrap();
        let s = d.settings();
        assert_eq!(s.knobs[&Knob::OffloadParam], Value::Offload(Offload::None));
        assert!(s.fsdp_offload);
        let mut on = s.clone();
        on.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
        let m = mat(&a, &d, &on, None);
        assert_eq!(m.argv[6], "full_shard auto_wrap offload");

        a[6] = "full_shard offload auto_wrap".into();
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(
            d.settings().knobs[&Knob::OffloadParam],
            Value::Offload(Offload::Cpu)
        );
        let mut off = d.settings();
        off.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::None));
        assert_eq!(mat(&a, &d, &off, None).argv[6], "full_shard auto_wrap");

        for other in [
            "train.py --per_device_train_batch_size 1 --fsdp true",
            "train.py --per_device_train_batch_size 1 --fsdp",
        ] {
            let d = discover_all(&argv(other), &[], &no_env).unwrap();
            assert!(
                !d.knobs.contains_key(&Knob::OffloadParam),
                "{other}: {:?}",
                d.knobs.get(&Knob::OffloadParam)
            );
            assert!(!d.settings().fsdp_offload);
        }
    }

    /// accelerate's `--fsdp_offload_params false` is FSDP's offload, written back
    /// as a bool; DeepSpeed's `--offload_param_device none` stays a device.
    #[test]
    fn accelerates_fsdp_offload_flag_is_a_bool() {
        let a = argv(
            "accelerate launch --use_fsdp --fsdp_offload_params false train.py --per_device_train_batch_size 1",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        let s = d.settings();
        assert!(s.fsdp_offload);
        let mut on = s.clone();
        on.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
        assert_eq!(
            strs(&mat(&a, &d, &on, None).argv),
            "accelerate launch --use_fsdp --fsdp_offload_params true train.py --per_device_train_batch_size 1"
        );
        let a = argv(
            "accelerate launch --use_deepspeed --zero_stage 3 --offload_param_device none train.py --per_device_train_batch_size 1",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert!(!d.settings().fsdp_offload);
        let mut on = d.settings();
        on.knobs
            .insert(Knob::OffloadParam, Value::Offload(Offload::Cpu));
        assert!(strs(&mat(&a, &d, &on, None).argv).contains("--offload_param_device cpu"));
    }

    /// An optimizer offload switch the command gives (OpenRLHF's
    /// `--ds.adam_offload`) is the offload on; absent, it is added bare.
    #[test]
    fn an_offload_switch_is_on_when_given_and_added_bare() {
        let a = argv(
            "deepspeed --module openrlhf.cli.train_sft --train.micro_batch_size 1 --ds.adam_offload",
        );
        let d = discover_all(&a, &[], &no_env).unwrap();
        assert_eq!(
            d.settings().knobs[&Knob::OffloadOptimizer],
            Value::Offload(Offload::Cpu)
        );
        let a = argv("deepspeed --module openrlhf.cli.train_sft --micro_train_batch_size 1");
        let d = discover_all(&a, &[], &no_env).unwrap();
        let mut on = d.settings();
        assert_eq!(
            on.knobs[&Knob::OffloadOptimizer],
            Value::Offload(Offload::None)
        );
        on.knobs
            .insert(Knob::OffloadOptimizer, Value::Offload(Offload::Cpu));
        assert!(strs(&mat(&a, &d, &on, None).argv).ends_with(" --adam_offload"));
    }
}
