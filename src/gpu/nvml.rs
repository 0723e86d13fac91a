//! The real probe: NVML, loaded at run time.
//!
//! `Nvml::init` dlopens `libnvidia-ml.so.1`, so a machine without the driver gets an error
//! here, not a binary that fails to start. Names and UUIDs never change while we run and are
//! read once; memory, utilisation and processes are read on every call. Cost of one call:
//! per GPU, one handle lookup, memory, utilisation and two process lists (compute and
//! graphics), plus `/proc` reads for processes not seen before (cached in `procinfo`).

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use super::procinfo;
use super::{GpuError, GpuProcess, GpuState, Probe};

pub struct NvmlProbe {
    nvml: Nvml,
    /// (index, uuid, name) of every GPU, read at open.
    devices: Vec<(u32, String, String)>,
    who: procinfo::Cache,
}

fn err(call: &'static str) -> impl FnOnce(NvmlError) -> GpuError {
    move |source| GpuError::Nvml { call, source }
}

impl NvmlProbe {
    pub fn open() -> Result<NvmlProbe, GpuError> {
        let nvml = Nvml::init().map_err(err("init"))?;
        let count = nvml.device_count().map_err(err("device_count"))?;
        let mut devices = Vec::new();
        for i in 0..count {
            let d = nvml.device_by_index(i).map_err(err("device_by_index"))?;
            let uuid = d.uuid().map_err(err("uuid"))?;
            let name = d.name().unwrap_or_else(|_| "unknown GPU".into());
            devices.push((i, uuid, name));
        }
        Ok(NvmlProbe {
            nvml,
            devices,
            who: procinfo::Cache::default(),
        })
    }
}

/// The reason in "NVML not available (REASON)": short, without the wrapper's noise.
pub fn describe_init_error(e: &GpuError) -> String {
    match e {
        GpuError::Nvml {
            source: NvmlError::LibloadingError(l),
            ..
        } => format!("{l}; is the NVIDIA driver installed?"),
        GpuError::Nvml { call, source } => format!("{call}: {source}"),
        other => other.to_string(),
    }
}

impl Probe for NvmlProbe {
    fn gpus(&mut self) -> Result<Vec<GpuState>, GpuError> {
        let mut out = Vec::with_capacity(self.devices.len());
        let mut seen = Vec::new();
        for (index, uuid, name) in &self.devices {
            let d = self
                .nvml
                .device_by_index(*index)
                .map_err(err("device_by_index"))?;
            let mem = d.memory_info().map_err(err("memory_info"))?;
            let util_percent = d.utilization_rates().ok().map(|u| u.gpu);
            let mut listed: Vec<ProcessInfo> = d
                .running_compute_processes()
                .map_err(err("running_compute_processes"))?;
            // Graphics contexts hold memory too (a desktop, a visualiser); best effort.
            listed.extend(d.running_graphics_processes().unwrap_or_default());
            let mut processes: Vec<GpuProcess> = Vec::new();
            for p in listed {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                };
                // A process with both kinds of context is listed twice with the same memory.
                if let Some(q) = processes.iter_mut().find(|q| q.pid == p.pid) {
                    q.used = q.used.max(used);
                    continue;
                }
                let who = self.who.who(p.pid);
                seen.push(p.pid);
                processes.push(GpuProcess {
                    pid: p.pid,
                    used,
                    user: who.user,
                    oomguard_attempt: who.attempt,
                });
            }
            processes.sort_by_key(|p| p.pid);
            out.push(GpuState {
                index: *index,
                uuid: uuid.clone(),
                name: name.clone(),
                total: mem.total,
                used: mem.used,
                free: mem.free,
                util_percent,
                processes,
            });
        }
        self.who.retain(&seen);
        Ok(out)
    }
}
