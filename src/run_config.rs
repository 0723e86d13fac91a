//! The validated configuration of `run`, `plan` and `estimate`: the
//! [`Options`] the user gave and the [`Target`] inspected from them, both
//! values, neither edited after. The live things (the GPU watch, the job's
//! opened folder, the journal, signal handlers) are not here: the subcommand's
//! entry builds them and hands them to `supervise` (see `main`).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::envmerge::{self, EnvSet};
use crate::knobs;
use crate::memory;
pub use crate::options::{ConfigError, Options};
use crate::target::{GpuFacts, Target};

/// Options and target: what `run`, `plan` and `estimate` read.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub opts: Options,
    pub target: Target,
}

pub(crate) fn real_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

impl RunConfig {
    /// Inspect the command of `opts` with what the GPUs said, in this
    /// process's environment.
    pub fn new(opts: Options, gpu: &GpuFacts) -> Result<RunConfig, ConfigError> {
        let target = Target::inspect(&opts, gpu, &real_env)?;
        Ok(RunConfig { opts, target })
    }
}

impl RunConfig {
    /// The environment oomguard adds to the user's (`--gpus`, the policy's defaults).
    pub fn env_defaults(&self) -> Vec<EnvSet> {
        let mut out = Vec::new();
        if let Some(cvd) = self.target.cuda_visible.clone() {
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
        if !self.opts.no_env {
            out.extend(envmerge::merge(&self.opts.policy.env, &real_env));
        }
        out
    }
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
                let st = memory::fit::start(&self.opts.policy, &s, &cal, self.opts.fit);
                (st.settings.unwrap_or(s), st.line)
            }
            None => (s, None),
        }
    }

    /// The remembered half of [`RunConfig::start_settings`]: the settings
    /// that fit last time, or — when they were shrunk from the command's own
    /// and their measured peak leaves room — the largest between the two that
    /// the memory model, calibrated to that peak, predicts to fit
    /// (`memory::climb`).
    fn remembered_start(&self) -> (knobs::Settings, Option<String>) {
        let first = self.target.disc.settings();
        let Some(rem) = &self.target.remembered else {
            return (first, None);
        };
        let Some(s) = applied(&first, &rem.knobs) else {
            return (first, None);
        };
        if s == first || s.global_batch() != first.global_batch() {
            return (first, None);
        }
        let climbed = match (self.calibrated(), rem.peak) {
            (Some(cal), Some(p)) if self.opts.policy.memory_model => {
                let failed: Vec<knobs::Settings> = rem
                    .failed
                    .iter()
                    .filter_map(|f| applied(&first, f))
                    .collect();
                // `--gpu-memory` (a GPU shared with others, MIG) caps the GPU's.
                let total = p.total_bytes as f64;
                let m = memory::climb::Measured {
                    peak: p.bytes as f64,
                    total: self.opts.gpu_memory.map_or(total, |g| g.min(total)),
                };
                Some(memory::climb::climb(&first, &s, &failed, m, &cal))
            }
            _ => None,
        };
        let why_not = match climbed {
            Some(Ok(c)) => return (c.settings, Some(c.line)),
            Some(Err(why)) => format!("; {why}"),
            None => String::new(),
        };
        let changed: Vec<String> = s
            .knobs
            .iter()
            .filter(|(k, v)| first.knobs.get(k) != Some(v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let line = format!(
            "starting from the settings that fit the last run of this command on these GPUs ({}){why_not}; --fresh starts as written",
            changed.join(" ")
        );
        (s, Some(line))
    }

    /// The memory model the run decides with: not yet calibrated, with the
    /// peak NVML measured of the last run of this command (at the settings
    /// that fit it) as a measured point — the second point when an OOM comes
    /// at other settings (`memory::calibrate`).
    pub fn calibrated_for_run(&self) -> Option<memory::Calibrated> {
        let mut cal = self.calibrated()?;
        if let Some(rem) = &self.target.remembered
            && let Some(p) = rem.peak
            && let Some(s) = applied(&self.target.disc.settings(), &rem.knobs)
        {
            cal.learn_peak(&s, p.bytes as f64);
        }
        Some(cal)
    }

    /// The memory model for this run, not yet calibrated (`None` without a model).
    pub fn calibrated(&self) -> Option<memory::Calibrated> {
        self.target
            .model
            .clone()
            .map(|m| memory::Calibrated::new(m, self.target.gpu_memory))
    }

    /// The folder of attempt `n` (what `plan` shows; `run` creates it through the journal).
    pub fn attempt_dir(&self, n: usize) -> PathBuf {
        crate::run_folder::RunFolder::at(&self.opts.run_dir).attempt(n as u32)
    }
}

/// `first` with the remembered knob values, `None` when one of them is no
/// longer bound in the command.
fn applied(
    first: &knobs::Settings,
    remembered: &std::collections::BTreeMap<knobs::Knob, knobs::Value>,
) -> Option<knobs::Settings> {
    let mut s = first.clone();
    for (k, v) in remembered {
        if !s.knobs.contains_key(k) {
            return None;
        }
        s.knobs.insert(*k, v.clone());
    }
    Some(s)
}
