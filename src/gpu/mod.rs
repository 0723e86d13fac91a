//! What the GPUs hold right now, through NVML behind one small trait, with a fake for tests.
//!
//! # Theory of operation
//!
//! Everything here goes through [`Probe::gpus`]: one snapshot of every GPU of the machine
//! (memory, utilisation, and each process holding memory, with its user and — when it is
//! ours — the `OOMGUARD_ATTEMPT` marker it inherited). Two probes implement it:
//!
//! * [`nvml`]: the real one. `libnvidia-ml.so.1` is opened at run time (dlopen, through
//!   `nvml-wrapper`), so the binary runs on machines without a driver; there
//!   [`open_probe`] prints one line, "oomguard: NVML not available (...): GPU features
//!   off", and the caller carries on without GPU features.
//! * [`fake`]: `OOMGUARD_FAKE_GPUS=<timeline file>` (test-only, documented in `fake.rs`):
//!   snapshots over time, read from a JSON or TOML file, including simulated NVML errors.
//!
//! On top of a probe, plain functions the attempt loop calls (none of them keeps state
//! between calls, so each is tested alone):
//!
//! * [`visible`] / [`pick`]: which GPUs the run uses (`CUDA_VISIBLE_DEVICES`, `--gpus auto:N`);
//! * [`preflight`] before an attempt: free memory and the processes that are not ours;
//! * [`wait_for_free`] (`--wait-for-memory`) and [`wait_released`] (between attempts);
//! * [`PeakSampler`]: a background thread that samples the run's memory during an attempt;
//! * [`foreign_tenants`]: after an OOM, was it another tenant that grew?
//! * [`peaks`]: the small record of past peaks behind `--wait-for-memory auto`.
//!
//! # Which processes are the run's
//!
//! A process belongs to the run when its `OOMGUARD_ATTEMPT` value matches the run marker
//! ([`belongs`]). The probe reads it from `/proc/PID/environ`, or from the nearest ancestor
//! that has it (a descendant started with a cleaned environment is still the run's as long
//! as it was not reparented). [`run_marker`] matches every attempt this oomguard process
//! launched, so the caller needs no attempt id before `launch::run` returns.
//!
//! Known limits: NVML reports PIDs of the host's PID namespace; inside a container without
//! `--pid=host` they cannot be looked up in `/proc`, so their user is unknown and they are
//! neither counted as the run's (no peak) nor blamed as another tenant. MIG instances are
//! not mapped (a `MIG-` entry in `CUDA_VISIBLE_DEVICES` ends the list, as an unknown
//! entry does for CUDA). NVML numbers GPUs in PCI bus order, CUDA by default "fastest
//! first": integer entries of `CUDA_VISIBLE_DEVICES` mean NVML indices only with
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` or identical GPUs (UUID entries are always exact).

// Until the lead wires the CLI and the attempt loop, nothing outside this module calls it;
// remove this line then so dead code is reported again.

pub mod fake;
pub mod nvml;
pub mod peaks;
mod procinfo;
mod report;
mod sample;
mod wait;

#[cfg(test)]
mod tests;

use serde::Serialize;

pub use report::gpus_main;
#[cfg(test)]
pub use sample::GpuPeak;
pub use sample::{DEFAULT_EVERY, PeakReport, PeakSampler};
pub use wait::{
    MIN_GROWTH, Preflight, Tenant, foreign_tenants, preflight, wait_for_free, wait_released,
};

/// Environment variable naming a fake timeline file (tests only; see `fake.rs`).
pub const FAKE_VAR: &str = "OOMGUARD_FAKE_GPUS";

/// Exit code of `oomguard gpus` when no GPU information can be had: NVML is not available
/// (no driver), it failed, or the fake timeline cannot be read. 69 is sysexits'
/// EX_UNAVAILABLE ("a service is unavailable").
pub const NO_GPU_INFO: i32 = crate::exit::NO_GPU_INFO;

/// One GPU at one instant. Memory in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuState {
    /// NVML index (PCI bus order), what `nvidia-smi` shows.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    #[serde(rename = "total_bytes")]
    pub total: u64,
    #[serde(rename = "used_bytes")]
    pub used: u64,
    #[serde(rename = "free_bytes")]
    pub free: u64,
    /// GPU utilisation over NVML's last sample period; `None` when NVML cannot say.
    pub util_percent: Option<u32>,
    pub processes: Vec<GpuProcess>,
}

/// A process holding memory on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// Memory it holds on this GPU (0 when NVML cannot say, e.g. under some hypervisors).
    #[serde(rename = "used_bytes")]
    pub used: u64,
    /// Its user name (numeric uid when the name is unknown); `None` when the process cannot
    /// be looked up in `/proc` (gone, or another PID namespace).
    pub user: Option<String>,
    /// The `OOMGUARD_ATTEMPT` marker of the oomguard attempt it belongs to, if any.
    pub oomguard_attempt: Option<String>,
}

/// A probe failed: the snapshot could not be taken. The caller logs it and goes on.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("NVML {call} failed: {source}")]
    Nvml {
        call: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// A simulated failure from a fake timeline (`"error": "GPU is lost"`).
    #[error("{message} (simulated by {FAKE_VAR})")]
    Simulated { message: String },
}

/// All GPUs with their processes, at this instant. NVML and the fake implement it.
pub trait Probe: Send {
    fn gpus(&mut self) -> Result<Vec<GpuState>, GpuError>;
}

/// Why there is no probe: the one line the user is shown.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("NVML not available ({0}): GPU features off")]
    Nvml(String),
    #[error("{FAKE_VAR}={path}: {reason}: GPU features off")]
    Fake {
        path: String,
        #[source]
        reason: fake::TimelineError,
    },
}

/// Opens the fake named by `OOMGUARD_FAKE_GPUS` when set, else NVML; says why not otherwise.
pub fn try_open_probe() -> Result<Box<dyn Probe>, Unavailable> {
    if let Some(path) = std::env::var_os(FAKE_VAR).filter(|p| !p.is_empty()) {
        let path = std::path::PathBuf::from(path);
        return fake::FakeProbe::open(&path)
            .map(|p| Box::new(p) as Box<dyn Probe>)
            .map_err(|reason| Unavailable::Fake {
                path: path.display().to_string(),
                reason,
            });
    }
    nvml::NvmlProbe::open()
        .map(|p| Box::new(p) as Box<dyn Probe>)
        .map_err(|e| Unavailable::Nvml(nvml::describe_init_error(&e)))
}

/// The marker matching every attempt this oomguard process launches.
///
/// Mirrors `launch::new_marker`, which makes `"<oomguard pid>.<counter>.<nanos>"`: the
/// prefix `"<oomguard pid>."` is shared by all attempts of this run and by nobody else.
pub fn run_marker() -> String {
    format!("{}.", std::process::id())
}

/// Does a process whose `OOMGUARD_ATTEMPT` is `attempt` belong to `marker`? An exact
/// match, or — when `marker` ends with '.' (see [`run_marker`]) — a prefix match.
pub fn belongs(attempt: Option<&str>, marker: &str) -> bool {
    let Some(a) = attempt else { return false };
    !marker.is_empty() && (a == marker || (marker.ends_with('.') && a.starts_with(marker)))
}

/// The NVML indices the run will use, in CUDA order (`cuda:0` first), given the value of
/// `CUDA_VISIBLE_DEVICES` (`None`: unset, every GPU).
///
/// Entries are NVML indices or UUIDs (`GPU-8932f937-...`, or any unique prefix of one,
/// case-insensitive). As CUDA does, the list ends at the first entry that names no GPU,
/// names one twice, or is ambiguous (`-1`, `MIG-...`, a UUID prefix of two GPUs); an empty
/// value means no GPU.
pub fn visible(all: &[GpuState], cuda_visible_devices: Option<&str>) -> Vec<u32> {
    let Some(value) = cuda_visible_devices else {
        let mut all: Vec<u32> = all.iter().map(|g| g.index).collect();
        all.sort_unstable();
        return all;
    };
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let found = if entry.len() >= 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let want = entry.to_ascii_lowercase();
            let mut hits = all
                .iter()
                .filter(|g| g.uuid.to_ascii_lowercase().starts_with(&want));
            match (hits.next(), hits.next()) {
                (Some(g), None) => Some(g.index),
                _ => None,
            }
        } else {
            entry
                .parse::<u32>()
                .ok()
                .filter(|i| all.iter().any(|g| g.index == *i))
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// `--gpus auto:N`: the `n` GPUs of `candidates` with the most free memory (ties: lower
/// index), returned in index order. Fewer than `n` when there are fewer GPUs: the caller
/// says so.
pub fn pick(candidates: &[GpuState], n: usize) -> Vec<u32> {
    let mut by_free: Vec<&GpuState> = candidates.iter().collect();
    by_free.sort_by(|a, b| b.free.cmp(&a.free).then(a.index.cmp(&b.index)));
    let mut chosen: Vec<u32> = by_free.iter().take(n).map(|g| g.index).collect();
    chosen.sort_unstable();
    chosen
}

/// The `CUDA_VISIBLE_DEVICES` value for `gpus` (NVML indices). Set
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` with it (unless the user set it) so CUDA numbers the GPUs
/// as NVML does.
pub fn cuda_visible_value(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Bytes as "71.2 GiB" (one decimal: the summary's unit).
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}
