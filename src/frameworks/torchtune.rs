//! torchtune: `tune run [torchrun options] RECIPE --config NAME|FILE key=value ...`.
//! A packaged config (`--config llama3_2/1B_lora_single_device`) is read from
//! the torchtune that `tune` runs; its knobs change with `key=N` overrides.
//! Checkpoints are `epoch_N/` folders with `recipe_state.pt`, resumed with
//! `resume_from_checkpoint=True`.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Ctx, Env, Family, NotPackaged};
use crate::checkpoint::{
    Checkpoint, Format, Kind, Layout, NotComplete, ResumeHow, no_temporaries, numbered_dirs,
    zip_complete,
};
use crate::command::Command;
use crate::settings::{Knob, World};

fn recognise(cmd: &Command) -> bool {
    cmd.tool() == Some("tune") && cmd.subcommand() == Some("run")
}

/// `tune run`'s own torchrun options: between `run` and the recipe.
fn run_options(cmd: &Command) -> std::ops::Range<usize> {
    let start = cmd.args_start() + 1;
    let recipe = cmd
        .positionals()
        .map(|(i, _)| i)
        .find(|i| *i >= start)
        .unwrap_or(cmd.args.len());
    start..recipe
}

fn world(cmd: &Command, _: Env, _: &Ctx) -> Option<World> {
    let opts = run_options(cmd);
    let per_node: u64 = cmd
        .value_in(opts.clone(), &["--nproc_per_node", "--nproc-per-node"])?
        .parse()
        .ok()?;
    let nodes: u64 = cmd
        .value_in(opts, &["--nnodes"])
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    Some(World {
        size: per_node.saturating_mul(nodes),
        source: format!("tune run --nproc_per_node {per_node} × --nnodes {nodes}"),
        uncertain: false,
    })
}

fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    if !recognise(cmd) {
        return None;
    }
    let root = cmd
        .override_value(&["output_dir", "checkpointer.output_dir"])
        .or(ctx.recipe_output_dir)?;
    Some(Layout {
        kind: Kind::Format(&CHECKPOINTS),
        root: PathBuf::from(root),
        how: ResumeHow::Override {
            key: "resume_from_checkpoint".into(),
            value: Some("True".into()),
        },
        user_resume: None,
        own: None,
    })
}

/// `recipes/configs/NAME.yaml` next to the `torchtune` package of the Python
/// that runs `tune` (its shebang): torchtune resolves names the same way.
fn packaged_config(cmd: &Command, env: Env) -> Option<super::Packaged> {
    let name = cmd.value_in(cmd.args_start()..cmd.args.len(), &["--config"])?;
    if name.ends_with(".yaml") || name.ends_with(".yml") || Path::new(name).is_file() {
        return None; // a file: an ordinary recipe
    }
    Some((name.to_string(), find_packaged(name, env)))
}

fn find_packaged(name: &str, env: Env) -> Result<PathBuf, NotPackaged> {
    let path = env("PATH").unwrap_or_default();
    let which = |prog: &str| {
        std::env::split_paths(&path)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    };
    let tune = which("tune").ok_or(NotPackaged::NoTune)?;
    let first = crate::untrusted::read_config(&tune)
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
        .unwrap_or_default();
    let mut words = first.strip_prefix("#!").unwrap_or("").split_whitespace();
    let python = match words.next() {
        Some(e) if e.ends_with("/env") => words.next().and_then(which),
        Some(p) => Some(PathBuf::from(p)),
        None => None,
    }
    .ok_or_else(|| NotPackaged::NoPython(tune.clone()))?;
    // bin/python → the environment's prefix → lib/pythonX.Y/site-packages.
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| NotPackaged::NoPrefix(python.clone()))?;
    let file = format!("{name}.yaml");
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
            if configs.join(&file).is_file() {
                return Ok(configs.join(&file));
            }
            looked.push(configs.display().to_string());
        }
    }
    if looked.is_empty() {
        looked.push(format!("{}/lib/python*/site-packages", prefix.display()));
    }
    Err(NotPackaged::LookedIn(looked))
}

pub static FAMILY: Family = Family {
    name: "torchtune",
    recognise,
    own_file_keys: &[
        (Knob::MicroBatch, &["batch_size"]),
        (Knob::SeqLen, &["tokenizer.max_seq_len"]),
    ],
    own_override_keys: &[
        (Knob::MicroBatch, &["batch_size"]),
        // FSDP's CPU offload in the distributed recipes (`fsdp_cpu_offload=True`).
        (Knob::OffloadParam, &["fsdp_cpu_offload"]),
    ],
    packaged_config,
    layout,
    output_hint: "output_dir=",
    world,
    ..Family::NONE
};

// ---------------------------------------------------------------- checkpoints

/// torchtune checkpoints: `epoch_N` / `step_N` folders with a `recipe_state.pt`.
pub static CHECKPOINTS: Format = Format {
    id: "torchtune",
    label: "torchtune output_dir with recipe_state.pt",
    candidates: |root| (candidates(root), Vec::new()),
    complete,
    stepped: false,
    recorded_step: None,
    unannounced: |_| false,
};

/// torchtune's epoch_N and step_N folders, newest first.
fn candidates(root: &Path) -> Vec<Checkpoint> {
    let mut c = numbered_dirs(root, "epoch_", "");
    c.extend(numbered_dirs(root, "step_", ""));
    c.sort_by_key(|c| std::cmp::Reverse(c.step));
    c
}

/// Why torchtune's folder `p` (under `root`) is not complete, or Ok: a
/// complete recipe_state.pt, no temporaries, and non-empty model weights.
fn complete(root: &Path, p: &Path) -> Result<(), NotComplete> {
    let rs = [
        root.join("recipe_state").join("recipe_state.pt"),
        root.join("recipe_state.pt"),
        p.join("recipe_state.pt"),
    ];
    let Some(r) = rs.iter().find(|r| r.exists()) else {
        return Err("no recipe_state.pt (the recipe writes it with every checkpoint)".into());
    };
    zip_complete(r).map_err(|w| format!("recipe_state.pt {w}"))?;
    no_temporaries(p)?;
    let has_weights = fs::read_dir(p).into_iter().flatten().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        (n.ends_with(".safetensors") || n.ends_with(".pt") || n.ends_with(".bin"))
            && e.metadata().map(|m| m.len() > 0).unwrap_or(false)
    });
    if has_weights {
        Ok(())
    } else {
        Err("no model weights".into())
    }
}
