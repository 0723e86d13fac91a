//! The options of `run`, `plan` and `estimate`: the first validated stage of
//! configuration, built once from the raw clap struct (`cli::RunArgs`).
//!
//! Values only: nothing here looks at the command, the GPUs or the disk
//! beyond reading the policy file. What oomguard learns about the command is
//! the [`Target`](crate::target::Target), inspected once from these options;
//! the live things (the GPU watch, signal handlers, the journal) are built by
//! the subcommand's entry and passed in. (ripgrep's `LowArgs` → `HiArgs`,
//! split once more so that a test can build a target without NVML.)

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::RunArgs;
use crate::gpuwatch::GpuOptions;
use crate::knobs::{self, Knob, UserBinding};
use crate::memory;
use crate::policy::{self, Policy};
use crate::run_folder::RunFolder;

/// Validated options for `run`, `plan` and `estimate`.
#[derive(Debug, Clone)]
pub struct Options {
    /// The command as the user wrote it (byte-exact).
    pub argv: Vec<OsString>,
    pub policy: Policy,
    pub max_attempts: u32,
    /// The run folder: as `--run-dir` gave it, or `.oomguard/runs/<time>` (the
    /// name a run starts from; `supervise` creates the folder, maybe as `<time>-2`).
    pub run_dir: PathBuf,
    /// `--run-dir` named it (an existing private folder of the user's is used).
    pub run_dir_given: bool,
    pub no_env: bool,
    pub hang_timeout: Duration,
    pub grace: Duration,
    /// `--knob KNOB=WHERE`: the user's own bindings.
    pub user: Vec<(Knob, UserBinding)>,
    /// `--knob params=N`: the model's size, for the memory model.
    pub params: Option<f64>,
    /// `--gpu-memory GIB`, in bytes.
    pub gpu_memory: Option<f64>,
    /// `--gpus`, `--wait-for-memory` and their timings.
    pub gpu: GpuOptions,
    pub edit_in_place: bool,
    /// `--fresh`: never start from the settings remembered for this command.
    pub fresh: bool,
    /// `--fit`: start at the fastest settings the memory model predicts to fit
    /// when the command as given is predicted not to.
    pub fit: bool,
}

/// A usage error: printed and mapped to exit 2 by main.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    #[error(transparent)]
    GpuOption(#[from] crate::gpuwatch::GpuOptionError),
    /// `--gpus auto:N` cannot be honoured on this machine.
    #[error(transparent)]
    Gpu(#[from] crate::gpuwatch::PickError),
    /// `oomguard sbatch ...`: nothing would be supervised.
    #[error(
        "sbatch returns as soon as the job is submitted, so oomguard would supervise nothing: put oomguard in front of the srun line inside the batch script instead (`oomguard srun python3 train.py ...`; docs/clusters.md)"
    )]
    Sbatch,
    /// `oomguard ray job submit --no-wait ...`: nothing would be supervised either.
    #[error(
        "ray job submit --no-wait returns as soon as the job is submitted, so oomguard would supervise nothing: drop --no-wait (ray job submit then follows the job to its end and fails with it), or put oomguard in front of the job's entrypoint (`ray job submit -- oomguard python3 train.py ...`)"
    )]
    RayNoWait,
    #[error("--{flag} {value}: {why}")]
    BadNumber {
        flag: &'static str,
        value: f64,
        why: &'static str,
    },
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

impl Options {
    pub fn from_args(args: RunArgs) -> Result<Options, ConfigError> {
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
        let gpu = GpuOptions::parse(
            args.wait_for_memory.as_deref(),
            args.wait_timeout,
            args.wait_status_every,
            args.gpus.as_deref(),
        )?;
        Ok(Options {
            max_attempts: args.max_attempts.unwrap_or(policy.max_attempts),
            policy,
            run_dir_given: args.run_dir.is_some(),
            run_dir: args.run_dir.unwrap_or_else(RunFolder::default_name),
            no_env: args.no_env,
            hang_timeout: secs("hang-timeout", args.hang_timeout, 0.001)?,
            grace: secs("grace", args.grace, 0.0)?,
            argv: args.command,
            user,
            params,
            gpu_memory,
            gpu,
            edit_in_place: args.edit_in_place,
            fresh: args.fresh,
            fit: args.fit,
        })
    }
}
