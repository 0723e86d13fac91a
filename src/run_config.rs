//! The validated options of `run` and `plan`: the second stage of
//! configuration, built once from the raw clap struct (`cli::RunArgs`); the
//! rest of the program sees only this. Discovery runs here, so a knob that
//! cannot be bound is a usage error before anything runs.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::checkpoint;
use crate::cli::RunArgs;
use crate::command::Command;
use crate::envmerge::{self, EnvSet};
use crate::gpuwatch::{GpuOptions, GpuWatch};
use crate::journal;
use crate::knobs::{self, Discovery};
use crate::memory;
use crate::policy::{self, Policy};

/// Validated options for `run` and `plan`.
pub struct RunConfig {
    pub argv: Vec<OsString>,
    pub policy: Policy,
    pub max_attempts: u32,
    /// The run folder: as `--run-dir` gave it, or `.oomguard/runs/<time>` (the
    /// name a run starts from; `supervise` creates the folder and sets the one made).
    pub run_dir: PathBuf,
    /// `--run-dir` named it (an existing private folder of the user's is used).
    pub run_dir_given: bool,
    pub no_env: bool,
    pub hang_timeout: Duration,
    pub grace: Duration,
    pub verbose: u8,
    pub quiet: bool,
    pub disc: Discovery,
    pub layout: Option<checkpoint::Layout>,
    /// GPUs: picking, memory waits, peaks, other tenants (inert without NVML).
    pub gpu: Option<GpuWatch>,
    /// `CUDA_VISIBLE_DEVICES` chosen by `--gpus auto:N`.
    pub cuda_visible: Option<String>,
    /// The memory model's view of the command's model (`None`: no model config
    /// found and no `--knob params=N`: decisions follow the policy's ladder).
    pub model: Option<memory::ModelSpec>,
    /// Where the settings that fit are remembered for this command on these GPUs
    /// (the file and the key); `None` without NVML or a state folder.
    pub remember: Option<(PathBuf, String)>,
    /// The knob values that fit the last run of this command (`None` with `--fresh`).
    pub remembered: Option<std::collections::BTreeMap<knobs::Knob, knobs::Value>>,
    /// `--fit`: start at the fastest settings the memory model predicts to fit
    /// when the command as given is predicted not to.
    pub fit: bool,
    /// `--gpu-memory GIB`, else the smallest of the run's GPUs from NVML, in bytes.
    pub gpu_memory: Option<f64>,
    /// This copy's place when the run is supervised by several (see `job`).
    pub job: Option<crate::job::Job>,
    /// torchrun's elastic range (`--nnodes` / `PET_NNODES` `MIN:MAX`): the world
    /// sizes at its two ends (the world is sized for the first).
    pub elastic: Option<(u64, u64)>,
    /// The fewest DataLoader workers a host OOM halves to (see [`workers_floor`]).
    pub workers_floor: u64,
    /// How often the trainer prints its per-step log dicts, when the command says.
    pub logging: Option<crate::progress::Logging>,
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

/// A usage error: printed and mapped to exit 2 by main.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    #[error("{0}")]
    Gpu(String),
    /// `oomguard sbatch ...`: nothing would be supervised.
    #[error(
        "sbatch returns as soon as the job is submitted, so oomguard would supervise nothing: put oomguard in front of the srun line inside the batch script instead (`oomguard srun python3 train.py ...`; docs/clusters.md)"
    )]
    Sbatch,
    #[error("--{flag} {value}: {why}")]
    BadNumber {
        flag: &'static str,
        value: f64,
        why: &'static str,
    },
}

pub(crate) fn real_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
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
        .filter(|l| l.kind == crate::command::LauncherKind::Srun)?;
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

fn secs(flag: &'static str, v: f64, min: f64) -> Result<Duration, ConfigError> {
    if !v.is_finite() || v < min {
        return Err(ConfigError::BadNumber {
            flag,
            value: v,
            why: if min > 0.0 {
                "must be a positive number of seconds"
            } else {
                "must be zero or a positive number of seconds"
            },
        });
    }
    Ok(Duration::from_secs_f64(v))
}

impl RunConfig {
    pub fn from_args(args: RunArgs) -> Result<RunConfig, ConfigError> {
        let policy = Policy::load(&args.policy)?;
        // `--knob params=N` is the memory model's, not a binding.
        let mut params = None;
        let mut knob_args = Vec::new();
        for k in &args.knob {
            match k.strip_prefix("params=") {
                Some(v) => match v.parse::<f64>() {
                    Ok(p) if p.is_finite() && p >= 1.0 => params = Some(p),
                    _ => {
                        return Err(ConfigError::BadNumber {
                            flag: "knob params",
                            value: v.parse::<f64>().unwrap_or(f64::NAN),
                            why: "must be a parameter count such as 7e9",
                        });
                    }
                },
                None => knob_args.push(k.clone()),
            }
        }
        let gpu_memory = match args.gpu_memory {
            Some(g) if !(g.is_finite() && g > 0.0) => {
                return Err(ConfigError::BadNumber {
                    flag: "gpu-memory",
                    value: g,
                    why: "must be a positive number of GiB",
                });
            }
            g => g.map(|g| g * memory::GIB),
        };
        let user = knobs::parse_user_bindings(&knob_args)?;
        let gpu_opts = GpuOptions::parse(
            args.wait_for_memory.as_deref(),
            args.wait_timeout,
            args.wait_status_every,
            args.gpus.as_deref(),
        )
        .map_err(ConfigError::Gpu)?;
        let gpu = GpuWatch::open(gpu_opts, &args.command).map_err(ConfigError::Gpu)?;
        // `--gpus auto:N` sets CUDA_VISIBLE_DEVICES, and the world size follows it.
        let picked = gpu.cuda_visible.clone();
        // Tools that start one process per GPU (accelerate and LLaMA-Factory
        // without a count, torchrun `--nproc_per_node gpu`) count what NVML sees
        // when CUDA_VISIBLE_DEVICES is unset.
        let nvml_gpus = (!gpu.gpus.is_empty()).then(|| OsString::from(gpu.gpus.len().to_string()));
        let env = move |name: &str| match (&picked, name) {
            (Some(v), "CUDA_VISIBLE_DEVICES") => Some(OsString::from(v)),
            (_, crate::frameworks::launchers::NVML_GPUS) => nvml_gpus.clone(),
            _ => real_env(name),
        };
        let cmd = Command::parse(&args.command);
        let program = cmd.args.first().map(|a| crate::command::base_name(a));
        if program == Some("sbatch") {
            return Err(ConfigError::Sbatch);
        }
        let mut disc = knobs::discover(&cmd, &user, &env, &|p| p.to_path_buf())?;
        for (knob, file) in disc.unnamed_files() {
            if args.edit_in_place {
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
        let task_files = task_files(&cmd, &env, &mut disc);
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
        let layout = knobs::layout(&cmd, &disc, policy.resume.as_ref());
        let job =
            match crate::job::Job::detect(&cmd, &env, layout.as_ref().map(|l| l.root.as_path())) {
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
        let elastic = crate::frameworks::launchers::elastic_range(&cmd, &env);
        if let (Some((min, max)), None) = (elastic, &job) {
            disc.notes.push(format!(
                "elastic torchrun ({min} to {max} processes): the number of nodes is not fixed, so copies of oomguard on several nodes cannot meet as one job; sized for {min} processes (where ZeRO and FSDP shard over the fewest GPUs)"
            ));
        }
        let files: Vec<String> = disc.config.files.iter().map(|f| f.shown.clone()).collect();
        let env_text = |n: &str| real_env(n).and_then(|v| v.into_string().ok());
        let model = match memory::find_model(&cmd, &files, &env_text) {
            memory::Found::Model(m) => Some(m),
            memory::Found::Unknown(why) if params.is_none() => {
                disc.warnings.push(why);
                None
            }
            _ => None,
        }
        .or_else(|| params.map(memory::ModelSpec::from_params));
        let nvml_total = gpu.total_bytes;
        let remember = match (&gpu.identity, crate::remember::default_path()) {
            (Some(ids), Some(path)) => {
                let files: Vec<String> =
                    disc.config.files.iter().map(|f| f.shown.clone()).collect();
                let key = crate::remember::key(&args.command, &files, ids, disc.world.size);
                Some((path, key))
            }
            _ => None,
        };
        let remembered = remember
            .as_ref()
            .filter(|_| !args.fresh)
            .and_then(|(p, k)| crate::remember::recorded(p, k));
        let workers_floor = workers_floor(&args.command, &disc);
        let logging = knobs::logging(&cmd, &disc);
        Ok(RunConfig {
            job,
            elastic,
            task_files,
            inside,
            layout,
            max_attempts: args.max_attempts.unwrap_or(policy.max_attempts),
            policy,
            run_dir_given: args.run_dir.is_some(),
            run_dir: args.run_dir.unwrap_or_else(journal::default_run_dir),
            no_env: args.no_env,
            hang_timeout: secs("hang-timeout", args.hang_timeout, 0.001)?,
            grace: secs("grace", args.grace, 0.0)?,
            verbose: args.verbose,
            quiet: args.quiet,
            argv: args.command,
            disc,
            cuda_visible: gpu.cuda_visible.clone(),
            gpu: Some(gpu),
            model,
            remember,
            remembered,
            fit: args.fit,
            // --gpu-memory wins over NVML (a GPU shared with others, MIG).
            gpu_memory: gpu_memory.or(nvml_total.map(|b| b as f64)),
            workers_floor,
            logging,
        })
    }

    /// The environment oomguard adds to the user's (`--gpus`, the policy's defaults).
    pub fn env_defaults(&self) -> Vec<EnvSet> {
        let mut out = Vec::new();
        if let Some(cvd) = self.cuda_visible.clone() {
            out.push(EnvSet {
                name: "CUDA_VISIBLE_DEVICES".into(),
                value: cvd,
                how: "--gpus",
            });
            if real_env("CUDA_DEVICE_ORDER").is_none() {
                // NVML numbers GPUs by PCI bus; make CUDA agree.
                out.push(EnvSet {
                    name: "CUDA_DEVICE_ORDER".into(),
                    value: "PCI_BUS_ID".into(),
                    how: "--gpus",
                });
            }
        }
        if !self.no_env {
            out.extend(envmerge::merge(&self.policy.env, &real_env));
        }
        out
    }

    /// The checkpoints present now, which a relaunch never resumes from
    /// (`run` takes it as the first attempt starts; `plan` as it plans).
    pub fn baseline(&self) -> checkpoint::Baseline {
        checkpoint::Baseline::take(self.layout.as_ref())
    }

    /// The checkpoint to resume from now: the newest complete one this run
    /// wrote (`baseline`: what was there when it started). Without one, the
    /// next attempt starts as the first did: from the user's own resume
    /// argument if they gave one, else fresh.
    pub fn resume(&self, baseline: &checkpoint::Baseline, settle: Duration) -> ResumeInfo {
        let Some(layout) = &self.layout else {
            return ResumeInfo {
                found: None,
                chosen: None,
                arg: None,
                why: format!(
                    "no checkpoint folder in the command (looked for {}): each attempt starts from the beginning; a policy's [resume] table describes a custom layout",
                    crate::frameworks::output_hints()
                ),
            };
        };
        let found = checkpoint::find(layout, baseline, settle);
        // Anything this run wrote continues it, so it wins over the user's
        // resume argument (where the first attempt began).
        let chosen = found.latest.clone();
        let automatic = layout.how == checkpoint::ResumeHow::Automatic;
        let why = match (&chosen, &layout.user_resume) {
            (Some(c), _) if automatic => format!(
                "{} is the newest complete checkpoint this run wrote; the command resumes from its folder by itself",
                c.path.display()
            ),
            (Some(c), _) => format!(
                "resume from {} (the newest complete checkpoint this run wrote)",
                c.path.display()
            ),
            (None, _) if automatic => format!(
                "no complete checkpoint written by this run under {} yet: the command resumes from its folder by itself, as the first attempt did",
                layout.root.display()
            ),
            (None, Some(u)) => format!(
                "no complete checkpoint written by this run under {} yet: keep your resume argument {}, as the first attempt did",
                layout.root.display(),
                u.display()
            ),
            (None, None) => format!(
                "no complete checkpoint written by this run under {} yet: start fresh, as the first attempt did",
                layout.root.display()
            ),
        };
        ResumeInfo {
            arg: chosen.as_ref().map(|c| knobs::ResumeArg {
                how: layout.how.clone(),
                path: c.path.clone().into_os_string(),
            }),
            found: Some(found),
            chosen,
            why,
        }
    }
}

/// Where the next attempt resumes from, and why.
pub struct ResumeInfo {
    /// What the search found (`None`: no checkpoint layout in the command).
    pub found: Option<checkpoint::Found>,
    /// The checkpoint chosen, if any.
    pub chosen: Option<checkpoint::Checkpoint>,
    /// How the command is told (`None`: run it as the user wrote it).
    pub arg: Option<knobs::ResumeArg>,
    pub why: String,
}

impl RunConfig {
    /// The settings of the first attempt: as written, or the ones that fit the
    /// last run of this command on these GPUs — when every knob is still bound
    /// and the global batch is the same — with the one line that says so.
    ///
    /// Without remembered settings the memory model speaks: a command predicted
    /// not to fit is said to be likely to OOM in one line, and with `--fit` it
    /// starts at the fastest settings predicted to fit (`memory::fit`).
    pub fn start_settings(&self) -> (knobs::Settings, Option<String>) {
        let (s, line) = self.remembered_start();
        if line.is_some() {
            return (s, line);
        }
        match self.calibrated() {
            Some(cal) => {
                let st = memory::fit::start(&self.policy, &s, &cal, self.fit);
                (st.settings.unwrap_or(s), st.line)
            }
            None => (s, None),
        }
    }

    /// The remembered half of [`RunConfig::start_settings`].
    fn remembered_start(&self) -> (knobs::Settings, Option<String>) {
        let first = self.disc.settings();
        let Some(knobs) = &self.remembered else {
            return (first, None);
        };
        let mut s = first.clone();
        for (k, v) in knobs {
            if !s.knobs.contains_key(k) {
                return (first, None);
            }
            s.knobs.insert(*k, v.clone());
        }
        if s == first || s.global_batch() != first.global_batch() {
            return (first, None);
        }
        let changed: Vec<String> = s
            .knobs
            .iter()
            .filter(|(k, v)| first.knobs.get(k) != Some(v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let line = format!(
            "starting from the settings that fit the last run of this command on these GPUs ({}); --fresh starts as written",
            changed.join(" ")
        );
        (s, Some(line))
    }

    /// The memory model for this run, not yet calibrated (`None` without a model).
    pub fn calibrated(&self) -> Option<memory::Calibrated> {
        self.model
            .clone()
            .map(|m| memory::Calibrated::new(m, self.gpu_memory))
    }

    /// The folder of attempt `n` (what `plan` shows; `run` creates it through the journal).
    pub fn attempt_dir(&self, n: usize) -> PathBuf {
        self.run_dir.join(format!("attempt-{n}"))
    }
}
