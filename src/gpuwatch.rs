//! What the attempt loop does with the GPUs (issue: shared servers): pick them,
//! wait for memory before an attempt, wait for the previous attempt's memory to
//! be released, sample the run's peak, and tell another tenant's OOM apart.
//!
//! Everything here degrades to nothing without NVML: the loop then behaves as
//! if no GPU feature was asked for (and says so once, when one was).

use crate::report::terminal;
use std::ffi::OsString;
use std::time::Duration;

use serde::Serialize;

use crate::detect::Finding;
use crate::gpu::{self, PeakReport, PeakSampler, Preflight, Probe, Tenant};

/// `--wait-for-memory`.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitFor {
    Bytes(u64),
    /// The peak the last successful run of this command used.
    Auto,
}

/// Validated GPU options.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    pub wait_for: Option<WaitFor>,
    pub wait_timeout: Duration,
    pub status_every: Duration,
    /// `--gpus auto:N`
    pub pick: Option<usize>,
}

/// A GPU option's value was refused: a usage error (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum GpuOptionError {
    #[error("--wait-for-memory {0}: expected a number of GiB (e.g. 40) or auto")]
    WaitForMemory(String),
    #[error(
        "--gpus {0}: expected auto:N, e.g. --gpus auto:2 for the two GPUs with the most free memory"
    )]
    Gpus(String),
    /// 0 (or less) would print the status in a busy loop.
    #[error("--wait-status-every {0}: expected a positive number of seconds")]
    StatusEvery(f64),
    #[error("--wait-timeout {0}: expected seconds")]
    WaitTimeout(f64),
}

/// `--gpus auto:N` cannot be honoured: a usage error (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    #[error(
        "--gpus auto:{wanted} needs NVML to see the GPUs' free memory, and it is not available here"
    )]
    NoNvml { wanted: usize },
    #[error("--gpus auto:{wanted}: only {visible} GPU(s) visible")]
    TooFew { wanted: usize, visible: usize },
}

impl GpuOptions {
    pub fn parse(
        wait_for: Option<&str>,
        wait_timeout: f64,
        status_every: f64,
        gpus: Option<&str>,
    ) -> Result<GpuOptions, GpuOptionError> {
        let wait_for = match wait_for {
            None => None,
            Some("auto") => Some(WaitFor::Auto),
            Some(v) => match v.parse::<f64>() {
                Ok(g) if g.is_finite() && g > 0.0 => {
                    Some(WaitFor::Bytes((g * (1u64 << 30) as f64) as u64))
                }
                _ => return Err(GpuOptionError::WaitForMemory(v.to_string())),
            },
        };
        let pick = match gpus {
            None => None,
            Some(v) => match v
                .strip_prefix("auto:")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(n) if n > 0 => Some(n),
                _ => return Err(GpuOptionError::Gpus(v.to_string())),
            },
        };
        // 0 (or less) would print the status in a busy loop.
        if !(status_every.is_finite() && status_every > 0.0) {
            return Err(GpuOptionError::StatusEvery(status_every));
        }
        if !(wait_timeout.is_finite() && wait_timeout >= 0.0) {
            return Err(GpuOptionError::WaitTimeout(wait_timeout));
        }
        Ok(GpuOptions {
            wait_for,
            wait_timeout: Duration::from_secs_f64(wait_timeout),
            status_every: Duration::from_secs_f64(status_every.max(0.05)),
            pick,
        })
    }

    fn requested(&self) -> bool {
        self.wait_for.is_some() || self.pick.is_some()
    }
}

/// What happened on the run's GPUs before an attempt: the journal's `gpu`
/// field of `attempt_start`. A wait that did not happen leaves its key out.
#[derive(Debug, Clone, Serialize)]
pub struct BeforeAttempt {
    /// Seconds spent waiting for the previous attempt's memory to be released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_wait_s: Option<f64>,
    /// Why that wait gave up (the attempt launched anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_wait_timed_out: Option<String>,
    /// Seconds spent waiting for `--wait-for-memory`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_wait_s: Option<f64>,
    /// Why that wait gave up (the attempt launched anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_wait_timed_out: Option<String>,
    pub preflight: Preflight,
    /// "GPU 0: 60.0 of 80.0 GiB free"
    pub summary: String,
}

/// How long to wait for the previous attempt's processes to release GPU memory.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

/// The fewest good samples of an attempt whose peak is remembered with the
/// settings that fit (see [`GpuWatch::last_peak`]).
const PEAK_SAMPLES: u64 = 3;
/// Same-settings retries after OOMs caused by another tenant, before the policy applies anyway.
pub const TENANT_RETRIES: u32 = 3;

pub struct GpuWatch {
    probe: Option<Box<dyn Probe>>,
    sampler: Option<PeakSampler>,
    /// NVML indices of the run's GPUs.
    pub gpus: Vec<u32>,
    marker: String,
    opts: GpuOptions,
    /// `CUDA_VISIBLE_DEVICES` chosen by `--gpus auto:N`.
    pub cuda_visible: Option<String>,
    pub preflight: Option<Preflight>,
    pub peak: Option<PeakReport>,
    /// The peak of the last successful attempt (for `--wait-for-memory auto`).
    auto_bytes: Option<u64>,
    argv: Vec<OsString>,
    /// The smallest memory among the run's GPUs, for the memory model (`None` without NVML).
    pub total_bytes: Option<u64>,
    /// The run's GPUs, model and memory ("NVIDIA H100 80GB HBM3 85520809984, ..."),
    /// for remembering what fits (`None` without NVML).
    pub identity: Option<String>,
}

impl GpuWatch {
    /// Open the probe and choose the GPUs. Fails (a usage error) only when the
    /// user asked for `--gpus auto:N` and it cannot be honoured.
    pub fn open(opts: GpuOptions, argv: &[OsString]) -> Result<GpuWatch, PickError> {
        let probe = match gpu::try_open_probe() {
            Ok(p) => Some(p),
            Err(e) => {
                if opts.requested() {
                    terminal::get().say(&e.to_string());
                } else {
                    tracing::info!("{e}");
                }
                None
            }
        };
        let mut w = GpuWatch {
            probe,
            sampler: None,
            gpus: Vec::new(),
            marker: gpu::run_marker(),
            opts,
            cuda_visible: None,
            preflight: None,
            peak: None,
            auto_bytes: None,
            argv: argv.to_vec(),
            total_bytes: None,
            identity: None,
        };
        let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let all = match w.probe.as_mut().map(|p| p.gpus()) {
            Some(Ok(all)) => all,
            Some(Err(e)) => {
                terminal::get().warn(&format!("NVML: {e}; GPU features off for this run"));
                w.probe = None;
                Vec::new()
            }
            None => Vec::new(),
        };
        let visible = gpu::visible(&all, cvd.as_deref());
        if let Some(n) = w.opts.pick {
            if w.probe.is_none() {
                return Err(PickError::NoNvml { wanted: n });
            }
            let candidates: Vec<_> = all
                .iter()
                .filter(|g| visible.contains(&g.index))
                .cloned()
                .collect();
            let picked = gpu::pick(&candidates, n);
            if picked.len() < n {
                return Err(PickError::TooFew {
                    wanted: n,
                    visible: candidates.len(),
                });
            }
            w.cuda_visible = Some(gpu::cuda_visible_value(&picked));
            w.gpus = picked;
        } else {
            w.gpus = visible;
        }
        let ids: Vec<String> = all
            .iter()
            .filter(|g| w.gpus.contains(&g.index))
            .map(|g| format!("{} {}", g.name, g.total))
            .collect();
        w.identity = (!ids.is_empty()).then(|| ids.join(", "));
        w.total_bytes = all
            .iter()
            .filter(|g| w.gpus.contains(&g.index))
            .map(|g| g.total)
            .min();
        if w.opts.wait_for == Some(WaitFor::Auto) {
            w.auto_bytes = gpu::peaks::default_path().and_then(|p| gpu::peaks::recorded(&p, argv));
            if w.auto_bytes.is_none() && w.probe.is_some() {
                terminal::get().say(
                    "--wait-for-memory auto: no successful run of this command recorded yet; not waiting",
                );
            }
        }
        Ok(w)
    }

    /// Before an attempt: wait for the previous attempt's memory to be released,
    /// then (with `--wait-for-memory`) for enough free memory; then record the
    /// preflight. `None` without a GPU probe.
    pub fn before_attempt(&mut self, attempt: u32, prev_pid: Option<u32>) -> Option<BeforeAttempt> {
        let p = self.probe.as_mut()?;
        let (mut release_wait_s, mut release_wait_timed_out) = (None, None);
        if attempt > 1 {
            let pids: Vec<u32> = prev_pid.into_iter().collect();
            match gpu::wait_released(p.as_mut(), &self.gpus, &self.marker, &pids, RELEASE_TIMEOUT) {
                Ok(d) => release_wait_s = Some(d.as_secs_f64()),
                Err(e) => {
                    terminal::get().warn(&format!("{e}; launching anyway"));
                    release_wait_timed_out = Some(e.to_string());
                }
            }
        }
        let want = match &self.opts.wait_for {
            Some(WaitFor::Bytes(b)) => Some(*b),
            Some(WaitFor::Auto) => self.auto_bytes,
            None => None,
        };
        let (mut memory_wait_s, mut memory_wait_timed_out) = (None, None);
        if let Some(bytes) = want {
            let mut say = |l: &str| terminal::get().say(l);
            match gpu::wait_for_free(
                p.as_mut(),
                &self.gpus,
                bytes,
                self.opts.wait_timeout,
                self.opts.status_every,
                &mut say,
            ) {
                Ok(d) => memory_wait_s = Some(d.as_secs_f64()),
                Err(e) => {
                    terminal::get().warn(&format!("{e}; launching anyway"));
                    memory_wait_timed_out = Some(e.to_string());
                }
            }
        }
        let pf = gpu::preflight(p.as_mut(), &self.gpus, Some(&self.marker));
        self.preflight = Some(pf.clone());
        Some(BeforeAttempt {
            release_wait_s,
            release_wait_timed_out,
            memory_wait_s,
            memory_wait_timed_out,
            summary: pf.summary(),
            preflight: pf,
        })
    }

    pub fn start_sampling(&mut self) {
        if let Some(p) = self.probe.take() {
            self.sampler = Some(PeakSampler::start(
                p,
                self.gpus.clone(),
                self.marker.clone(),
                gpu::DEFAULT_EVERY,
            ));
        }
    }

    pub fn stop_sampling(&mut self) -> Option<&PeakReport> {
        let s = self.sampler.take()?;
        let (p, report) = s.stop();
        self.probe = Some(p);
        self.peak = Some(report);
        self.peak.as_ref()
    }

    /// Remember a successful attempt's peak for `--wait-for-memory auto`.
    pub fn record_success(&self) {
        let (Some(peak), Some(path)) = (
            self.peak.as_ref().and_then(PeakReport::run_peak),
            gpu::peaks::default_path(),
        ) else {
            return;
        };
        if let Err(e) = gpu::peaks::record(&path, &self.argv, peak) {
            tracing::warn!("cannot record the peak in {}: {e}", path.display());
        }
    }

    /// The last attempt's peak on its fullest GPU, for remembering what fit:
    /// the run's own processes, or where NVML shows none of them (a container
    /// whose processes NVML cannot see) the whole GPU's use, never less than
    /// the run's. `None` when nothing was measured, or too little to have
    /// seen the peak (fewer than [`PEAK_SAMPLES`] samples: an attempt of a
    /// second or two, sampled before its memory grew).
    pub fn last_peak(&self) -> Option<crate::remember::Peak> {
        let r = self.peak.as_ref()?;
        if r.samples.saturating_sub(r.errors) < PEAK_SAMPLES {
            return None;
        }
        r.per_gpu
            .iter()
            .map(|g| crate::remember::Peak {
                bytes: if g.run_peak_bytes > 0 {
                    g.run_peak_bytes
                } else {
                    g.device_peak_bytes
                },
                total_bytes: g.total_bytes,
            })
            .filter(|p| p.bytes > 0 && p.total_bytes > 0)
            .max_by(|a, b| {
                let share = |p: &crate::remember::Peak| p.bytes as f64 / p.total_bytes as f64;
                share(a).total_cmp(&share(b))
            })
    }

    /// Processes outside the run that grew since launch and may have caused this OOM.
    pub fn tenants(&mut self, finding: Option<&Finding>) -> Vec<Tenant> {
        let (Some(pf), Some(peak)) = (&self.preflight, &self.peak) else {
            return Vec::new();
        };
        // What the GPUs hold now (the sampler's last sample may be a second old).
        let now = match self.probe.as_mut().map(|p| p.gpus()) {
            Some(Ok(all)) => all,
            _ => peak.last.clone(),
        };
        let oom_gpu = finding
            .and_then(|f| f.numbers.device)
            .and_then(|d| self.gpus.get(d as usize).copied());
        let others = finding
            .map(|f| f.numbers.other_processes.clone())
            .unwrap_or_default();
        gpu::foreign_tenants(&pf.gpus, &now, &self.gpus, &self.marker, oom_gpu, &others)
    }

    /// Wait (bounded) for another tenant's memory to go: true when it did.
    pub fn wait_for_tenant(&mut self, prev_pid: u32) -> bool {
        let (Some(p), Some(pf)) = (self.probe.as_mut(), &self.preflight) else {
            return false;
        };
        let _ = gpu::wait_released(
            p.as_mut(),
            &self.gpus,
            &self.marker,
            &[prev_pid],
            RELEASE_TIMEOUT,
        );
        let Some(free_at_launch) = pf.min_free() else {
            return false;
        };
        let want = free_at_launch.saturating_sub(gpu::MIN_GROWTH);
        let mut say = |l: &str| terminal::get().say(l);
        gpu::wait_for_free(
            p.as_mut(),
            &self.gpus,
            want,
            self.opts.wait_timeout,
            self.opts.status_every,
            &mut say,
        )
        .is_ok()
    }

    /// "peak 71.2 of 79.6 GiB on GPU 2: 8.4 GiB headroom"
    pub fn peak_summary(&self) -> Option<String> {
        self.peak.as_ref().and_then(PeakReport::summary)
    }
}
