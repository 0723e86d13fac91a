//! PyTorch Lightning: LightningCLI (`python cli.py fit --config c.yaml
//! --trainer.devices 2 --data.batch_size 8 --ckpt_path X`) and
//! lightning-hydra-template (`ckpt_path=X`); checkpoints are `*.ckpt` files.
//!
//! Where Lightning puts them, by its own rules (first that applies):
//! a `ModelCheckpoint`'s `dirpath` (in the `--config` YAML's
//! `trainer.callbacks`, or `--trainer.callbacks.dirpath` /
//! `--model_checkpoint.dirpath` on the command line); the logger's
//! `save_dir` (then `NAME/version_N/checkpoints` under it); else
//! `trainer.default_root_dir` (`lightning_logs/version_N/checkpoints` under
//! it), which defaults to the working directory. The step of a checkpoint is
//! its file name's `step=N`, else the `global_step` the file records (see
//! `checkpoint`), never its time.
//!
//! Without an outer launcher Lightning starts its ranks itself:
//! `trainer.devices` × `trainer.num_nodes` (devices as a count, a list or a
//! `"0,1"` string; `auto`/`-1` mean every visible GPU, one process on the CPU).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{AbsentValue, Ctx, Env, Family};
use crate::checkpoint::{Checkpoint, Format, Kind, Layout, ResumeHow, zip_complete};
use crate::command::Command;
use crate::files::Scalar;
use crate::settings::{Knob, World};

/// A LightningCLI command: a `fit` subcommand with LightningCLI's dotted
/// flags or a config, or a script that names LightningCLI; or a script that
/// runs `LightningCLI(run=False)` (see [`without_subcommand`]).
fn cli(cmd: &Command) -> bool {
    if cmd.script().is_none() && cmd.module().is_none() {
        return false;
    }
    let dotted = || {
        cmd.flags.iter().any(|f| {
            f.name == "-c"
                || ["--trainer.", "--model.", "--data.", "--config"]
                    .iter()
                    .any(|p| f.name.starts_with(p))
        })
    };
    if cmd.positionals().any(|(_, a)| a == "fit") {
        dotted() || cmd.has_flag(&["--ckpt_path"]) || super::script_mentions(cmd, &["LightningCLI"])
    } else {
        dotted() && without_subcommand(cmd)
    }
}

/// A script that builds `LightningCLI(run=False)` and calls the trainer itself
/// (`python train.py -c config.yaml`, as vocos does): LightningCLI's dotted flags
/// and `--config`, but no subcommand, and so no `--ckpt_path` (the script passes
/// its own, if any, to `fit`).
pub fn without_subcommand(cmd: &Command) -> bool {
    !cmd.positionals().any(|(_, a)| a == "fit")
        && super::script_mentions(cmd, &["LightningCLI"])
        && super::script_mentions(cmd, &["run=False", "run = False"])
}

fn recognise(cmd: &Command) -> bool {
    cli(cmd)
}

/// The YAML files a LightningCLI command names with `--config` (each may be given).
fn configs(cmd: &Command) -> Vec<PathBuf> {
    cmd.flags
        .iter()
        .filter(|f| f.name == "--config" || f.name == "-c")
        .filter_map(|f| f.value.as_deref())
        .map(PathBuf::from)
        .collect()
}

/// A trainer setting: the command line (`--trainer.KEY`), else the config
/// (`trainer.KEY`, or `fit.trainer.KEY` in a config given before `fit`).
fn trainer_setting(cmd: &Command, ctx: &Ctx, key: &str) -> Option<Scalar> {
    if let Some(v) = cmd.value(&[&format!("--trainer.{key}")]) {
        return Some(Scalar::Str(v.to_string()));
    }
    (ctx.recipe_value)(&format!("trainer.{key}"))
        .or_else(|| (ctx.recipe_value)(&format!("fit.trainer.{key}")))
}

fn text(s: Option<Scalar>) -> Option<String> {
    match s? {
        Scalar::Str(s) if !s.is_empty() => Some(s),
        Scalar::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `dirpath:` of a ModelCheckpoint in a config's callbacks (a list the
/// config reader does not walk): the last one written.
fn config_dirpath(file: &Path) -> Option<String> {
    let text = crate::untrusted::read_config(file).ok()?;
    text.lines().rev().find_map(|l| {
        let l = l.trim_start().trim_start_matches("- ").trim_start();
        let v = l.strip_prefix("dirpath:")?;
        let v = v.split(" #").next()?.trim().trim_matches(['"', '\'']);
        (!v.is_empty() && v != "null" && v != "~").then(|| v.to_string())
    })
}

/// Where this command's checkpoints go, by Lightning's rules (see the module).
fn checkpoint_root(cmd: &Command, ctx: &Ctx) -> PathBuf {
    let flag_dirpath = cmd
        .flags
        .iter()
        .filter(|f| f.name.ends_with(".dirpath") || f.name == "--dirpath")
        .filter_map(|f| f.value.as_deref())
        .next_back()
        .map(str::to_string);
    if let Some(d) =
        flag_dirpath.or_else(|| configs(cmd).iter().rev().find_map(|c| config_dirpath(c)))
    {
        return PathBuf::from(d);
    }
    let logger_dir = cmd
        .value(&[
            "--trainer.logger.save_dir",
            "--trainer.logger.init_args.save_dir",
        ])
        .map(str::to_string)
        .or_else(|| text(trainer_setting(cmd, ctx, "logger.init_args.save_dir")))
        .or_else(|| text(trainer_setting(cmd, ctx, "logger.save_dir")));
    if let Some(d) = logger_dir {
        return PathBuf::from(d);
    }
    // Without a logger (`logger: false`) Lightning writes `ROOT/checkpoints`.
    let no_logger = match trainer_setting(cmd, ctx, "logger") {
        Some(Scalar::Bool(b)) => !b,
        Some(Scalar::Str(s)) => s.eq_ignore_ascii_case("false"),
        _ => false,
    };
    match text(trainer_setting(cmd, ctx, "default_root_dir")) {
        // `lightning_logs/version_N/checkpoints` under it (searched to depth 5).
        Some(d) => PathBuf::from(d),
        None if no_logger => PathBuf::from("checkpoints"),
        None => PathBuf::from("lightning_logs"),
    }
}

fn layout(cmd: &Command, ctx: &Ctx) -> Option<Layout> {
    let cli = cli(cmd) || cmd.has_flag(&["--ckpt_path"]);
    let hydra_ckpt = cmd.override_value(&["ckpt_path"]);
    if !cli && hydra_ckpt.is_none() {
        return None;
    }
    let (root, how, user) = if cli {
        (
            checkpoint_root(cmd, ctx),
            ResumeHow::Flag {
                flag: "--ckpt_path".into(),
                equals: true,
            },
            cmd.value(&["--ckpt_path"]),
        )
    } else {
        let root = cmd
            .override_value(&[
                "trainer.default_root_dir",
                "paths.output_dir",
                "paths.log_dir",
            ])
            .unwrap_or("logs");
        (
            PathBuf::from(root),
            ResumeHow::Override {
                key: "ckpt_path".into(),
                value: None,
            },
            hydra_ckpt,
        )
    };
    Some(Layout {
        kind: Kind::Format(&CHECKPOINTS),
        root,
        how,
        user_resume: user.map(PathBuf::from),
        own: None,
    })
}

/// How many processes `devices` starts on one node: Some((count, exact)).
pub(super) fn devices(v: &str, cpu: bool, env: Env) -> (u64, bool, String) {
    let v = v.trim().trim_matches(['"', '\'']);
    if let Ok(n) = v.parse::<i64>()
        && n > 0
    {
        return (n as u64, true, format!("trainer.devices {n}"));
    }
    // A list of device indices: `[0, 1]`, `0,1`.
    let list = v.trim_start_matches('[').trim_end_matches(']');
    if v.contains(',') || v.starts_with('[') {
        let n = list.split(',').filter(|s| !s.trim().is_empty()).count() as u64;
        return (n.max(1), true, format!("trainer.devices {v}"));
    }
    // `auto`, `-1`: every visible GPU, one process on the CPU.
    if cpu {
        return (1, true, format!("trainer.devices {v} on the CPU"));
    }
    match super::launchers::visible_gpus(env) {
        Some((n, why)) => (n, true, format!("trainer.devices {v}: {why}")),
        None => (
            1,
            false,
            format!(
                "trainer.devices {v} uses every visible GPU; count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1"
            ),
        ),
    }
}

/// The ranks Lightning starts itself when no launcher stands before it.
fn world(cmd: &Command, env: Env, ctx: &Ctx) -> Option<World> {
    if !cli(cmd) {
        return None;
    }
    // Under a launcher Lightning joins its ranks: the launcher says the world.
    if super::rank_launcher(cmd) {
        return None;
    }
    let accel = text(trainer_setting(cmd, ctx, "accelerator")).unwrap_or_default();
    let dev = text(trainer_setting(cmd, ctx, "devices"));
    let cpu = accel == "cpu";
    // Lightning's default is `devices: auto`.
    let (per_node, exact, source) = devices(dev.as_deref().unwrap_or("auto"), cpu, env);
    let nodes: u64 = text(trainer_setting(cmd, ctx, "num_nodes"))
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1);
    Some(World {
        size: per_node.saturating_mul(nodes),
        source: format!("Lightning starts its ranks: {source} × trainer.num_nodes {nodes}"),
        uncertain: !exact,
    })
}

/// Whether Lightning's progress bar shows each epoch's batches as its total:
/// not when it ends the run at `trainer.max_steps` with no `max_epochs` (then
/// the total is the smaller of the epoch's batches and the steps left).
pub fn bar_total_is_the_epoch(cmd: &Command, ctx: &Ctx) -> bool {
    let int = |key: &str| text(trainer_setting(cmd, ctx, key)).and_then(|v| v.parse::<i64>().ok());
    let capped_by_steps = int("max_steps").is_some_and(|s| s > 0);
    let epochs_set = int("max_epochs").is_some_and(|e| e != -1);
    epochs_set || !capped_by_steps
}

pub static FAMILY: Family = Family {
    name: "lightning",
    recognise,
    flags: &[
        (
            Knob::GradAccum,
            &[
                "--accumulate_grad_batches",
                "--trainer.accumulate_grad_batches",
            ],
        ),
        // A LightningDataModule's sequence length, in the spellings data modules use.
        (
            Knob::SeqLen,
            &[
                "--data.seq_len",
                "--data.max_seq_len",
                "--data.seq_length",
                "--data.max_seq_length",
                "--data.sequence_length",
                "--data.max_length",
                "--data.block_size",
                "--data.context_length",
                "--data.init_args.seq_len",
                "--data.init_args.max_seq_len",
                "--data.init_args.seq_length",
                "--data.init_args.max_seq_length",
                "--data.init_args.sequence_length",
                "--data.init_args.max_length",
                "--data.init_args.block_size",
                "--data.init_args.context_length",
            ],
        ),
        // A LightningDataModule's (and LitGPT's data modules') workers.
        (
            Knob::DataloaderWorkers,
            &["--data.num_workers", "--data.init_args.num_workers"],
        ),
        // A LightningDataModule's validation batch.
        (
            Knob::EvalBatch,
            &[
                "--data.val_batch_size",
                "--data.eval_batch_size",
                "--data.init_args.val_batch_size",
                "--data.init_args.eval_batch_size",
            ],
        ),
    ],
    // A LightningDataModule's batch is its DataLoader's, per process under
    // Lightning's DDP: the micro-batch, in LightningCLI commands only (a
    // `data.batch_size` elsewhere may be global).
    own_flags: &[(
        Knob::MicroBatch,
        &[
            "--data.batch_size",
            "--data.init_args.batch_size",
            "--data.train_batch_size",
            "--data.init_args.train_batch_size",
        ],
    )],
    own_file_keys: &[(
        Knob::MicroBatch,
        &[
            "data.batch_size",
            "data.init_args.batch_size",
            "data.train_batch_size",
            "data.init_args.train_batch_size",
            "fit.data.batch_size",
            "fit.data.init_args.batch_size",
        ],
    )],
    file_keys: &[
        (
            Knob::GradAccum,
            &[
                "trainer.accumulate_grad_batches",
                "fit.trainer.accumulate_grad_batches",
                "accumulate_grad_batches",
            ],
        ),
        (
            Knob::SeqLen,
            &[
                "data.seq_len",
                "data.max_seq_len",
                "data.seq_length",
                "data.max_seq_length",
                "data.sequence_length",
                "data.max_length",
                "data.block_size",
                "data.context_length",
                "data.init_args.seq_len",
                "data.init_args.max_seq_len",
                "data.init_args.seq_length",
                "data.init_args.max_seq_length",
                "data.init_args.sequence_length",
                "data.init_args.max_length",
                "data.init_args.block_size",
                "data.init_args.context_length",
                "fit.data.seq_len",
                "fit.data.init_args.seq_len",
            ],
        ),
        (
            Knob::DataloaderWorkers,
            &["data.num_workers", "data.init_args.num_workers"],
        ),
        (
            Knob::EvalBatch,
            &["data.val_batch_size", "data.eval_batch_size"],
        ),
    ],
    // LightningCLI takes every Trainer argument as `--trainer.NAME`.
    added_flags: &[(
        Knob::GradAccum,
        "--trainer.accumulate_grad_batches",
        AbsentValue::Int(1),
    )],
    accepts_added: |cmd, _| cli(cmd),
    // LightningCLI's `--config` / `-c` YAML (several may be given).
    config_flags: &["--config", "-c"],
    layout,
    world,
    // Whether the bar's total is the epoch's batches is told by `epoch_total`
    // (see `frameworks::counting_in`); not known here.
    counting: Some(crate::progress::Counting::Batches {
        accum: 1,
        epoch_total: false,
    }),
    output_hint: "--ckpt_path, ckpt_path=, ModelCheckpoint dirpath, --trainer.default_root_dir",
    ..Family::NONE
};

// ---------------------------------------------------------------- checkpoints

/// Lightning checkpoints: `*.ckpt` files, each whole when it ends with its zip directory.
pub static CHECKPOINTS: Format = Format {
    id: "lightning",
    label: "lightning *.ckpt",
    candidates: |root| (candidates(root), Vec::new()),
    complete: |_, p| zip_complete(p),
    stepped: false,
    recorded_step: None,
    unannounced: |p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("last"))
    },
};

/// Every `*.ckpt` under `root` (depth ≤ 5), the latest step first (the
/// `step=N` of Lightning's file name, else the `global_step` the file
/// records), `last.ckpt` before its peers at the same step; files whose step
/// cannot be told come after, newest first. The step is never the file's time.
fn candidates(root: &Path) -> Vec<Checkpoint> {
    let mut files: Vec<(u64, bool, SystemTime, PathBuf)> = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() && depth < 5 {
                stack.push((p, depth + 1));
            } else if md.is_file() && p.extension().is_some_and(|x| x == "ckpt") {
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let last = stem.starts_with("last");
                let step = name_step(&stem)
                    .or_else(|| crate::torch_save::top_level_int(&p, "global_step"))
                    .unwrap_or(0);
                let t = md.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((step, last, t, p));
            }
        }
    }
    files.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    // A file whose step cannot be told (cut off mid-write, a name without
    // one) is tried first when it is newer than every file with a step, last
    // otherwise: its check then says why it is passed over.
    let newest_known = files.iter().filter(|f| f.0 > 0).map(|f| f.2).max();
    let (mut unknown, known): (Vec<_>, Vec<_>) = files.into_iter().partition(|f| f.0 == 0);
    unknown.sort_by_key(|f| std::cmp::Reverse(f.2));
    let (newer, older): (Vec<_>, Vec<_>) = unknown
        .into_iter()
        .partition(|f| newest_known.is_none_or(|t| f.2 > t));
    newer
        .into_iter()
        .chain(known)
        .chain(older)
        .map(|(step, _, _, path)| Checkpoint { path, step })
        .collect()
}

/// The `step=N` of a Lightning checkpoint's name (`epoch=0-step=40`,
/// `model-step=40-val_loss=0.2`, `step40`), if it says one.
fn name_step(stem: &str) -> Option<u64> {
    let at = stem.find("step")?;
    let rest = stem[at + 4..].trim_start_matches(['=', '_']);
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    fn none(_: &str) -> Option<Scalar> {
        None
    }

    fn ctx<'a>(f: &'a dyn Fn(&str) -> Option<Scalar>) -> Ctx<'a> {
        Ctx {
            recipe_output_dir: None,
            recipe_value: f,
        }
    }

    #[test]
    fn lightnings_own_launcher_says_the_world() {
        let no_env = |_: &str| None;
        let w = |s: &str, f: &dyn Fn(&str) -> Option<Scalar>| world(&argv(s), &no_env, &ctx(f));
        let a = w(
            "python cli.py fit --trainer.accelerator cpu --trainer.devices 2",
            &none,
        )
        .unwrap();
        assert_eq!((a.size, a.uncertain), (2, false), "{}", a.source);
        let b = w(
            "python cli.py fit --trainer.devices 4 --trainer.num_nodes 2",
            &none,
        )
        .unwrap();
        assert_eq!(b.size, 8);
        let c = w("python cli.py fit --trainer.devices [0,1,2]", &none).unwrap();
        assert_eq!(c.size, 3);
        // In the config.
        let cfg = |k: &str| match k {
            "trainer.devices" => Some(Scalar::Int(2)),
            "trainer.accelerator" => Some(Scalar::Str("cpu".into())),
            _ => None,
        };
        let d = w("python cli.py fit --config c.yaml", &cfg).unwrap();
        assert_eq!(d.size, 2);
        // `auto` on a GPU machine: every visible GPU.
        let four = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "0,1,2,3".into());
        let e = world(
            &argv("python cli.py fit --trainer.devices auto"),
            &four,
            &ctx(&none),
        )
        .unwrap();
        assert_eq!((e.size, e.uncertain), (4, false));
        let f = w("python cli.py fit --trainer.devices auto", &none).unwrap();
        assert!(f.uncertain, "{}", f.source);
        // Under an outer launcher, the launcher says it.
        assert!(
            w(
                "torchrun --nproc_per_node 2 cli.py fit --trainer.devices 2",
                &none
            )
            .is_none()
        );
    }

    #[test]
    fn the_bar_total_is_the_epoch_unless_max_steps_alone_ends_the_run() {
        let total =
            |s: &str, f: &dyn Fn(&str) -> Option<Scalar>| bar_total_is_the_epoch(&argv(s), &ctx(f));
        assert!(total("python cli.py fit", &none));
        assert!(total("python cli.py fit --trainer.max_epochs 3", &none));
        assert!(!total("python cli.py fit --trainer.max_steps 100", &none));
        assert!(total(
            "python cli.py fit --trainer.max_steps 100 --trainer.max_epochs 5",
            &none
        ));
        assert!(!total(
            "python cli.py fit --trainer.max_steps 100 --trainer.max_epochs -1",
            &none
        ));
        // In the config.
        let cfg = |k: &str| match k {
            "trainer.max_steps" => Some(Scalar::Int(14)),
            _ => None,
        };
        assert!(!total("python cli.py fit --config c.yaml", &cfg));
        assert!(total(
            "python cli.py fit --config c.yaml --trainer.max_epochs 4",
            &cfg
        ));
    }

    #[test]
    fn the_checkpoint_folder_follows_lightnings_rules() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("c.yaml");
        std::fs::write(
            &cfg,
            "trainer:\n  default_root_dir: runs\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n      init_args:\n        dirpath: \"ckpts/x\"  # here\n        every_n_train_steps: 2\n",
        )
        .unwrap();
        let root =
            |s: &str, f: &dyn Fn(&str) -> Option<Scalar>| layout(&argv(s), &ctx(f)).map(|l| l.root);
        let c = format!("python cli.py fit --config {}", cfg.display());
        assert_eq!(root(&c, &none), Some(PathBuf::from("ckpts/x")));
        let short = format!("python -m proj.cli fit -c {}", cfg.display());
        assert_eq!(root(&short, &none), Some(PathBuf::from("ckpts/x")));
        assert_eq!(
            root(&format!("{c} --trainer.callbacks.dirpath=other"), &none),
            Some(PathBuf::from("other"))
        );
        let dflt = |k: &str| (k == "trainer.default_root_dir").then(|| Scalar::Str("runs".into()));
        assert_eq!(
            root("python cli.py fit --trainer.max_steps 4", &dflt),
            Some(PathBuf::from("runs"))
        );
        assert_eq!(
            root("python cli.py fit --trainer.default_root_dir r2", &dflt),
            Some(PathBuf::from("r2"))
        );
        assert_eq!(
            root("python cli.py fit --trainer.max_steps 4", &none),
            Some(PathBuf::from("lightning_logs"))
        );
        assert_eq!(
            root("python cli.py fit --trainer.logger false", &none),
            Some(PathBuf::from("checkpoints"))
        );
        assert_eq!(
            root("python train.py ckpt_path=x.ckpt paths.output_dir=o", &none),
            Some(PathBuf::from("o"))
        );
    }
}
