//! Peak memory of the run, per GPU, sampled in a background thread during an attempt.
//!
//! The run's memory on a GPU, at one sample, is the sum over the processes on it that
//! [`belong`](super::belongs) to the run marker (every torchrun worker, and anything they
//! started). The peak is the largest such sum over the attempt. PyTorch's caching allocator
//! keeps what it reserved, so what NVML shows only grows during a step and a 1 s period
//! catches the peak; the cost of each sample is measured (thread CPU time) and reported.
//!
//! A probe error is logged once per streak, counted, and sampling goes on.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{GpuState, Probe, belongs, gib};

/// The sampling period the attempt loop should use unless told otherwise.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(1);

/// One GPU's figures over an attempt. Bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPeak {
    pub gpu: u32,
    /// The most the run's processes held together on it at one sample.
    pub run_peak_bytes: u64,
    /// The most the whole GPU had in use at one sample (the run and everybody else).
    pub device_peak_bytes: u64,
    pub total_bytes: u64,
}

/// Written in `attempt_end` as `gpu_peak`, and read back by `oomguard status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PeakReport {
    /// The run's GPUs that were seen at least once, in the order asked.
    pub per_gpu: Vec<GpuPeak>,
    /// Samples taken, and how many of them failed.
    pub samples: u64,
    pub errors: u64,
    /// Mean CPU time of one sample (the sampler thread's own CPU clock), microseconds.
    pub cpu_us_per_sample: f64,
    /// The last snapshot that succeeded (all GPUs): `now` for [`foreign_tenants`](super::foreign_tenants).
    #[serde(skip)]
    pub last: Vec<GpuState>,
}

impl PeakReport {
    /// The run's largest peak on any one GPU (what `--wait-for-memory auto` will wait for).
    pub fn run_peak(&self) -> Option<u64> {
        self.per_gpu.iter().map(|g| g.run_peak_bytes).max()
    }

    /// "peak 71.2 of 79.6 GiB on GPU 2: 8.4 GiB headroom", for the GPU with the least
    /// headroom; `None` when nothing was measured.
    pub fn summary(&self) -> Option<String> {
        let g = self
            .per_gpu
            .iter()
            .min_by_key(|g| (g.total_bytes.saturating_sub(g.run_peak_bytes), g.gpu))?;
        Some(format!(
            "peak {} of {} on GPU {}: {} headroom",
            gib(g.run_peak_bytes).trim_end_matches(" GiB"),
            gib(g.total_bytes),
            g.gpu,
            gib(g.total_bytes.saturating_sub(g.run_peak_bytes))
        ))
    }
}

/// The running sampler. `stop` returns the probe and the report.
pub struct PeakSampler {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<(Box<dyn Probe>, PeakReport)>,
}

impl PeakSampler {
    /// Starts sampling `gpus` now and every `every` after, counting processes whose marker
    /// belongs to `marker` as the run's.
    pub fn start(
        probe: Box<dyn Probe>,
        gpus: Vec<u32>,
        marker: String,
        every: Duration,
    ) -> PeakSampler {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("oomguard-gpu-sampler".into())
            .spawn(move || sample_loop(probe, &gpus, &marker, every, &stopped))
            .expect("spawn the GPU sampler thread");
        PeakSampler { stop, thread }
    }

    /// Stops (within one probe call) and returns the probe and what was measured.
    pub fn stop(self) -> (Box<dyn Probe>, PeakReport) {
        let _ = self.stop.send(());
        match self.thread.join() {
            Ok(r) => r,
            // A panic in the sampler is a bug in this module: let it surface as one.
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

fn sample_loop(
    mut probe: Box<dyn Probe>,
    gpus: &[u32],
    marker: &str,
    every: Duration,
    stopped: &mpsc::Receiver<()>,
) -> (Box<dyn Probe>, PeakReport) {
    let mut r = PeakReport::default();
    let mut failing = false;
    let mut cpu = Duration::ZERO;
    loop {
        let t0 = thread_cpu_time();
        let snapshot = probe.gpus();
        match snapshot {
            Ok(all) => {
                if failing {
                    tracing::info!("GPU sampling works again");
                }
                failing = false;
                add(&mut r, &all, gpus, marker);
                r.last = all;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("GPU sampling: {e} (supervision goes on; will keep trying)");
                }
                failing = true;
                r.errors += 1;
            }
        }
        r.samples += 1;
        cpu += thread_cpu_time().saturating_sub(t0);
        match stopped.recv_timeout(every) {
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    r.cpu_us_per_sample = cpu.as_secs_f64() * 1e6 / r.samples.max(1) as f64;
    (probe, r)
}

/// Folds one snapshot into the report.
pub(super) fn add(r: &mut PeakReport, all: &[GpuState], gpus: &[u32], marker: &str) {
    for &i in gpus {
        let Some(g) = all.iter().find(|g| g.index == i) else {
            continue;
        };
        let run: u64 = g
            .processes
            .iter()
            .filter(|q| belongs(q.oomguard_attempt.as_deref(), marker))
            .map(|q| q.used)
            .sum();
        let pos = match r.per_gpu.iter().position(|p| p.gpu == i) {
            Some(pos) => pos,
            None => {
                r.per_gpu.push(GpuPeak {
                    gpu: i,
                    run_peak_bytes: 0,
                    device_peak_bytes: 0,
                    total_bytes: g.total,
                });
                r.per_gpu.len() - 1
            }
        };
        let p = &mut r.per_gpu[pos];
        p.run_peak_bytes = p.run_peak_bytes.max(run);
        p.device_peak_bytes = p.device_peak_bytes.max(g.used);
        p.total_bytes = g.total;
    }
}

/// CPU time this thread has used.
pub(super) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        // Cannot happen on Linux; the cost would only read as 0.
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
