//! The target: what oomguard learns about the command before the first
//! launch (the command parsed, discovery, world, checkpoint layout, job, model,
//! what runs inside it), inspected once by [`Target::inspect`] and never
//! edited after. `run`, `plan` and `estimate` all read the same target, so
//! what `plan` prints is what a run does; a knob that cannot be bound is a
//! usage error here, before anything runs.
//!
//! Inspection reads the environment and the GPUs only through what it is
//! given ([`Env`], [`GpuFacts`]): the live GPU watch is opened by the
//! subcommand's entry, and a test inspects a command without NVML.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::checkpoint;
use crate::command::{Command, LauncherKind};
use crate::gpuwatch::GpuWatch;
use crate::knobs::{self, Discovery};
use crate::memory;
use crate::options::{ConfigError, Options};

/// The environment inspection reads (`std::env::var_os` in a run).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// What the GPUs say, read once from the live watch before inspection.
#[derive(Debug, Clone, Default)]
pub struct GpuFacts {
    /// `CUDA_VISIBLE_DEVICES` chosen by `--gpus auto:N`.
    pub cuda_visible: Option<String>,
    /// How many GPUs NVML sees for the run (0 without NVML).
    pub count: usize,
    /// The run's GPUs, model and memory, for remembering what fits.
    pub identity: Option<String>,
    /// The smallest of the run's GPUs, in bytes.
    pub total_bytes: Option<u64>,
}

impl GpuFacts {
    pub fn of(gw: &GpuWatch) -> GpuFacts {
        GpuFacts {
            cuda_visible: gw.cuda_visible.clone(),
            count: gw.gpus.len(),
            identity: gw.identity.clone(),
            total_bytes: gw.total_bytes,
        }
    }
}

/// `ray job submit ... --no-wait ... -- ENTRYPOINT`: ray's own `--no-wait`, before the
/// `--` that starts the job's entrypoint.
fn ray_submit_no_wait(argv: &[OsString]) -> bool {
    let ray: Vec<&str> = argv
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .take_while(|a| *a != "--")
        .collect();
    ray.starts_with(&["job", "submit"]) && ray.contains(&"--no-wait")
}

/// What oomguard learned about the command. Built once; never edited after.
#[derive(Debug, Clone)]
pub struct Target {
    /// The command parsed once (launchers, script, flags, overrides).
    pub cmd: Command,
    pub disc: Discovery,
    pub layout: Option<checkpoint::Layout>,
    /// Why the command cannot be told where to resume (see `knobs::resume_refused`).
    pub resume_refused: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` chosen by `--gpus auto:N`.
    pub cuda_visible: Option<String>,
    /// The memory model's view of the command's model (`None`: no model config
    /// found and no `--knob params=N`: decisions follow the policy's ladder).
    pub model: Option<memory::ModelSpec>,
    /// Where the settings that fit are remembered for this command on these GPUs
    /// (the file and the key); `None` without NVML or a state folder.
    pub remember: Option<(PathBuf, String)>,
    /// What fit the last run of this command: its knob values, their measured
    /// peak, the settings that failed (`None` with `--fresh`).
    pub remembered: Option<crate::remember::Remembered>,
    /// `--gpu-memory GIB`, else the smallest of the run's GPUs from NVML, in bytes.
    pub gpu_memory: Option<f64>,
    /// This copy's place when the run is supervised by several (see `job`): the
    /// place only; `supervise` opens its folder.
    pub job: Option<crate::job::Job>,
    /// torchrun's elastic range (`--nnodes` / `PET_NNODES` `MIN:MAX`): the world
    /// sizes at its two ends (the world is sized for the first).
    pub elastic: Option<(u64, u64)>,
    /// The fewest DataLoader workers a host OOM halves to (see [`workers_floor`]).
    pub workers_floor: u64,
    /// How often the trainer prints its per-step log dicts, when the command says.
    pub logging: Option<crate::progress::Logging>,
    /// What the step numbers the trainer prints count (see `progress::Counting`).
    pub counting: crate::progress::Counting,
    /// The files srun writes its tasks' output to (`srun --output=logs/%j-%t.out`),
    /// read as the step runs; `None` when the output comes through srun.
    pub task_files: Option<crate::launch::TaskFiles>,
    /// What runs inside the command: a shell script, torchrun's own restarts, an
    /// in-process batch-size finder (its notes are in `disc.notes` too).
    pub inside: crate::inside::Inside,
}

/// 1 when the command sets a DataLoader prefetch factor or persistent workers
/// (on its command line or in a config file it names): PyTorch's DataLoader
/// and the Hugging Face Trainer refuse either with 0 workers, so a relaunch at 0
/// would fail before training. Else 0.
fn workers_floor(argv: &[OsString], disc: &Discovery) -> u64 {
    let needs_workers = |t: &str| {
        let t = t.replace('-', "_");
        t.contains("prefetch_factor") || t.contains("persistent_workers")
    };
    let in_argv = argv.iter().any(|a| needs_workers(&a.to_string_lossy()));
    let in_files = disc
        .config
        .files
        .iter()
        .any(|f| needs_workers(f.doc.text()));
    u64::from(in_argv || in_files)
}

/// When oomguard runs `srun` and srun sends its tasks' output to files
/// (`--output`/`--error`, `SLURM_STDOUTMODE`/`SLURM_STDERRMODE`): those files, read
/// as the step runs, said in a note; output srun throws away, said in a warning.
fn task_files(
    cmd: &Command,
    env: &dyn Fn(&str) -> Option<OsString>,
    disc: &mut Discovery,
) -> Option<crate::launch::TaskFiles> {
    let l = cmd
        .launchers
        .first()
        .filter(|l| l.kind == LauncherKind::Srun)?;
    // `-ologs/%t.out`: getopt's attached form, whatever the value starts with.
    let attached = |short: &str| {
        cmd.args[l.opts.clone()]
            .iter()
            .rev()
            .find_map(|a| a.strip_prefix(short).filter(|v| !v.is_empty()))
    };
    let output = cmd
        .launcher_option(l, &["-o"], &["--output"])
        .or_else(|| attached("-o"));
    let error = cmd
        .launcher_option(l, &["-e"], &["--error"])
        .or_else(|| attached("-e"));
    let (patterns, lost) = crate::launch::task_files_of_srun(output, error, env);
    disc.warnings.extend(lost);
    if patterns.is_empty() {
        return None;
    }
    disc.notes.push(format!(
        "srun writes the tasks' output to {}: oomguard reads those files as the step runs (relative to this folder; %j and %s once the step is known, any task, node or job name)",
        patterns.join(" and ")
    ));
    Some(crate::launch::TaskFiles {
        patterns,
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        job: env("SLURM_JOB_ID").and_then(|v| v.into_string().ok()),
    })
}

impl Target {
    /// Inspect the command of `opts`: discovery, then what discovery leaves to
    /// the launchers, the job and the model. `env` is the process's
    /// environment; `gpu`, what NVML said.
    pub fn inspect(opts: &Options, gpu: &GpuFacts, env: Env) -> Result<Target, ConfigError> {
        // `--gpus auto:N` sets CUDA_VISIBLE_DEVICES, and the world size follows it.
        let picked = gpu.cuda_visible.clone();
        // Tools that start one process per GPU (accelerate and LLaMA-Factory
        // without a count, torchrun `--nproc_per_node gpu`) count what NVML sees
        // when CUDA_VISIBLE_DEVICES is unset.
        let nvml_gpus = (gpu.count > 0).then(|| OsString::from(gpu.count.to_string()));
        let run_env = move |name: &str| match (&picked, name) {
            (Some(v), "CUDA_VISIBLE_DEVICES") => Some(OsString::from(v)),
            (_, crate::frameworks::launchers::NVML_GPUS) => nvml_gpus.clone(),
            _ => env(name),
        };
        let cmd = Command::parse(&opts.argv);
        let program = cmd.args.first().map(|a| crate::command::base_name(a));
        if program == Some("sbatch") {
            return Err(ConfigError::Sbatch);
        }
        if program == Some("ray") && ray_submit_no_wait(&opts.argv) {
            return Err(ConfigError::RayNoWait);
        }
        let mut disc = knobs::discover(&cmd, &opts.user, &run_env, &|p| p.to_path_buf())?;
        for (knob, file) in disc.unnamed_files() {
            if opts.edit_in_place {
                disc.notes.push(format!(
                    "{knob}: {file} is not named on the command line, so it will be edited in place (--edit-in-place); the original is kept in the run folder and restored when the run ends, or with `oomguard restore RUN_DIR` after a hard kill"
                ));
            } else {
                disc.knobs.remove(&knob);
                disc.notes.push(format!(
                    "{knob}: {file} is not named on the command line (the script imports it), so oomguard cannot point the command at a changed copy, and it never edits your files unasked. Add --edit-in-place to let it edit {file} in place (the original is kept in the run folder and restored when the run ends; `oomguard restore RUN_DIR` after a hard kill)"
                ));
            }
        }
        let task_files = task_files(&cmd, &run_env, &mut disc);
        let inside = crate::inside::Inside::find(
            &cmd,
            disc.config
                .files
                .iter()
                .map(|f| (f.shown.as_str(), f.doc.text())),
        );
        disc.notes.extend(inside.notes());
        if program == Some("salloc") {
            disc.warnings.push(
                "salloc: oomguard sees salloc, not the srun steps it starts, so a Ctrl-C or a kill cannot cancel them; wrap the srun instead: `salloc -N2 oomguard srun ...` (docs/clusters.md)".into(),
            );
        }
        let mut layout = knobs::layout(&cmd, &disc, opts.policy.resume.as_ref());
        if let Some(l) = layout
            .as_mut()
            .filter(|l| matches!(l.kind, checkpoint::Kind::Format(f) if f.id == crate::frameworks::hf::CHECKPOINTS.id))
        {
            let env_text = |n: &str| env(n).and_then(|v| v.into_string().ok());
            let major = crate::memory::facts::transformers_major(&cmd, &env_text);
            let (own, warning) = crate::frameworks::hf::own_search(
                &cmd,
                &l.root,
                disc.script_options.as_ref(),
                major,
            );
            l.own = own;
            disc.warnings.extend(warning);
        }
        if layout.is_some()
            && let Some(why) = knobs::saves_none(&cmd, &disc)
        {
            disc.warnings.push(why);
        }
        let resume_refused = layout
            .as_ref()
            .and_then(|l| knobs::resume_refused(&cmd, &disc, l));
        let job = match crate::job::Job::detect(
            &cmd,
            &run_env,
            layout.as_ref().map(|l| l.root.as_path()),
        ) {
            Ok(Some(j)) => {
                if j.copies_are_ranks(&cmd) {
                    disc.world.size = disc.world.size.saturating_mul(u64::from(j.copies));
                    disc.world.source = format!(
                        "{} × {} copies of oomguard, one per Slurm task ({})",
                        disc.world.source, j.copies, j.source
                    );
                }
                disc.notes.push(format!(
                    "job: copy {} of {} ({}); {} decides, through {}",
                    j.rank,
                    j.copies,
                    j.source,
                    if j.leader() { "this copy" } else { "copy 0" },
                    j.dir.display()
                ));
                Some(j)
            }
            Ok(None) => None,
            Err(e) => {
                disc.warnings.push(e.0);
                None
            }
        };
        let elastic = crate::frameworks::launchers::elastic_range(&cmd, &run_env);
        if let (Some((min, max)), None) = (elastic, &job) {
            disc.notes.push(format!(
                "elastic torchrun ({min} to {max} processes): the number of nodes is not fixed, so copies of oomguard on several nodes cannot meet as one job; sized for {min} processes (where ZeRO and FSDP shard over the fewest GPUs)"
            ));
        }
        let files: Vec<String> = disc.config.files.iter().map(|f| f.shown.clone()).collect();
        let env_text = |n: &str| env(n).and_then(|v| v.into_string().ok());
        let model = match memory::find_model(&cmd, &files, &env_text) {
            memory::Found::Model(m) => Some(m),
            memory::Found::Unknown(why) if opts.params.is_none() => {
                disc.warnings.push(why);
                None
            }
            _ => None,
        }
        .or_else(|| opts.params.map(memory::ModelSpec::from_params));
        let remember = match (&gpu.identity, crate::remember::default_path()) {
            (Some(ids), Some(path)) => {
                let files: Vec<String> =
                    disc.config.files.iter().map(|f| f.shown.clone()).collect();
                let key = crate::remember::key(&opts.argv, &files, ids, disc.world.size);
                Some((path, key))
            }
            _ => None,
        };
        let remembered = remember
            .as_ref()
            .filter(|_| !opts.fresh)
            .and_then(|(p, k)| crate::remember::recorded(p, k));
        let workers_floor = workers_floor(&opts.argv, &disc);
        let logging = knobs::logging(&cmd, &disc);
        let counting = knobs::counting(&cmd, &disc);
        Ok(Target {
            cmd,
            job,
            elastic,
            task_files,
            inside,
            layout,
            resume_refused,
            disc,
            cuda_visible: gpu.cuda_visible.clone(),
            model,
            remember,
            remembered,
            // --gpu-memory wins over NVML (a GPU shared with others, MIG).
            gpu_memory: opts.gpu_memory.or(gpu.total_bytes.map(|b| b as f64)),
            workers_floor,
            logging,
            counting,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::Knob;
    use clap::Parser;
    use std::path::Path;

    /// Inspect `oomguard ARGS...` as `run` would, in an environment of `env`
    /// only and without GPUs.
    fn inspect_with(args: &[&str], env: &[(&str, &str)]) -> Result<Target, ConfigError> {
        let argv = std::iter::once("oomguard").chain(args.iter().copied());
        let cli = crate::cli::Cli::try_parse_from(argv).expect("a valid command line");
        let opts = Options::from_args(cli.run)?;
        let env: Vec<(String, OsString)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        let lookup = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Target::inspect(&opts, &GpuFacts::default(), &lookup)
    }

    fn inspect(args: &[&str]) -> Target {
        inspect_with(args, &[]).expect("inspected")
    }

    fn path(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn hf_trainer_under_torchrun() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let target = inspect(&[
            "torchrun",
            "--nproc_per_node=4",
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "4",
            "--output_dir",
            path(&out),
        ]);
        let s = target.disc.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(8));
        assert_eq!(s.int(Knob::GradAccum), Some(4));
        assert_eq!(target.disc.world.size, 4, "{}", target.disc.world.source);
        assert_eq!(s.global_batch(), Some(8 * 4 * 4));
        let layout = target
            .layout
            .as_ref()
            .expect("the output folder is the layout");
        assert_eq!(layout.root, out);
        assert!(target.job.is_none() && target.elastic.is_none());
        assert!(target.inside.shell_script.is_none());
        assert_eq!(
            target.cmd.args.first().map(String::as_str),
            Some("torchrun")
        );
    }

    #[test]
    fn deepspeed_launcher_with_its_config_file() {
        let t = tempfile::tempdir().unwrap();
        let ds = t.path().join("ds.json");
        std::fs::write(
            &ds,
            r#"{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}"#,
        )
        .unwrap();
        let target = inspect(&[
            "deepspeed",
            "--num_gpus",
            "2",
            "train.py",
            "--deepspeed",
            path(&ds),
        ]);
        let s = target.disc.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(4));
        assert_eq!(s.int(Knob::GradAccum), Some(2));
        assert_eq!(s.int(Knob::ZeroStage), Some(1));
        assert_eq!(target.disc.world.size, 2, "{}", target.disc.world.source);
        assert_eq!(target.disc.config.files.len(), 1);
    }

    #[test]
    fn accelerate_launch_counts_its_processes() {
        let target = inspect(&[
            "accelerate",
            "launch",
            "--num_processes",
            "2",
            "train.py",
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
        ]);
        let s = target.disc.settings();
        assert_eq!(s.int(Knob::MicroBatch), Some(4));
        assert_eq!(target.disc.world.size, 2, "{}", target.disc.world.source);
    }

    #[test]
    fn a_shell_script_is_seen_as_one_and_binds_nothing() {
        let t = tempfile::tempdir().unwrap();
        let script = t.path().join("train.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\npython train.py --per_device_train_batch_size 8\n",
        )
        .unwrap();
        let target = inspect(&["bash", path(&script)]);
        assert!(target.disc.knobs.is_empty(), "{:?}", target.disc.knobs);
        assert!(target.inside.shell_script.is_some(), "{:?}", target.inside);
        assert!(
            target.disc.notes.iter().any(|n| n.contains("train.sh")),
            "{:?}",
            target.disc.notes
        );
    }

    #[test]
    fn what_the_gpus_and_options_say_is_read_once() {
        let argv = ["oomguard", "--gpu-memory", "40", "python", "train.py"];
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let opts = Options::from_args(cli.run).unwrap();
        let gpu = GpuFacts {
            cuda_visible: Some("2,3".into()),
            count: 2,
            identity: None,
            total_bytes: Some(80 << 30),
        };
        let target = Target::inspect(&opts, &gpu, &|_| None).unwrap();
        assert_eq!(target.cuda_visible.as_deref(), Some("2,3"));
        // --gpu-memory wins over NVML.
        assert_eq!(target.gpu_memory, Some(40.0 * memory::GIB));
        assert!(
            target.remember.is_none(),
            "nothing to remember without NVML's identity"
        );
    }

    #[test]
    fn ray_job_submit_no_wait_is_refused_and_waiting_is_not() {
        let no_wait = [
            "ray",
            "job",
            "submit",
            "--address=http://h:8265",
            "--no-wait",
            "--",
            "python3",
            "t.py",
        ];
        assert!(matches!(
            inspect_with(&no_wait, &[]),
            Err(ConfigError::RayNoWait)
        ));
        let waits = ["ray", "job", "submit", "--", "python3", "t.py", "--no-wait"];
        assert!(
            inspect_with(&waits, &[]).is_ok(),
            "--no-wait of the entrypoint"
        );
    }

    #[test]
    fn sbatch_is_refused() {
        assert!(matches!(
            inspect_with(&["sbatch", "job.sh"], &[]),
            Err(ConfigError::Sbatch)
        ));
    }
}
