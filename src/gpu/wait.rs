//! Before, between and after attempts: preflight, bounded waits, and "was it another tenant?".

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::procinfo;
use super::{GpuState, Probe, belongs, gib};
use crate::detect::ProcessUse;

/// How often the waits look again. An NVML snapshot costs well under a millisecond of CPU.
const POLL: Duration = Duration::from_millis(200);

/// A process outside the run counts as a tenant only when its memory grew at least this much
/// since launch: PyTorch's caching allocator makes every process's figure wobble a little.
pub const MIN_GROWTH: u64 = 256 << 20;

/// What the run's GPUs held just before an attempt (for the journal, and as the baseline
/// of [`foreign_tenants`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Preflight {
    /// The run's GPUs, in the order asked, with every process on them.
    pub gpus: Vec<GpuState>,
    /// Processes on those GPUs that are not the run's.
    pub foreign: Vec<Tenant>,
    /// The probe failed: nothing else is known.
    pub error: Option<String>,
}

impl Preflight {
    /// The least free memory over the run's GPUs (`None`: nothing known).
    pub fn min_free(&self) -> Option<u64> {
        self.gpus.iter().map(|g| g.free).min()
    }

    /// One line for the terminal or the journal:
    /// "GPU 0: 79.1 of 79.6 GiB free; GPU 1: 40.0 of 79.6 GiB free (pid 4242 bob 39.0 GiB)".
    pub fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("GPU state unknown: {e}");
        }
        self.gpus
            .iter()
            .map(|g| {
                let others: Vec<String> = self
                    .foreign
                    .iter()
                    .filter(|t| t.gpu == Some(g.index))
                    .map(|t| {
                        format!(
                            "pid {} {} {}",
                            t.pid,
                            user_or_unknown(&t.user),
                            gib(t.bytes)
                        )
                    })
                    .collect();
                let mut s = format!(
                    "GPU {}: {} of {} free",
                    g.index,
                    gib(g.free).trim_end_matches(" GiB"),
                    gib(g.total)
                );
                if !others.is_empty() {
                    s += &format!(" ({})", others.join(", "));
                }
                s
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn user_or_unknown(u: &Option<String>) -> &str {
    u.as_deref().unwrap_or("?")
}

/// A process outside the run holding memory on one of its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Tenant {
    pub pid: u32,
    pub user: Option<String>,
    /// Memory it holds now.
    pub bytes: u64,
    /// Growth since the baseline (the preflight before launch); in a preflight, 0.
    pub grew_by: u64,
    /// The GPU (NVML index); `None` when only the OOM message named it and the GPU is unknown.
    pub gpu: Option<u32>,
    /// Its oomguard attempt marker when it is another oomguard run's process.
    pub oomguard_attempt: Option<String>,
}

impl fmt::Display for Tenant {
    /// "pid 4242 (bob) holds 39.0 GiB on GPU 1, +38.5 GiB since launch"
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({})", self.pid, user_or_unknown(&self.user))?;
        if self.oomguard_attempt.is_some() {
            write!(f, " [another oomguard run]")?;
        }
        write!(f, " holds {}", gib(self.bytes))?;
        if let Some(g) = self.gpu {
            write!(f, " on GPU {g}")?;
        }
        if self.grew_by > 0 {
            write!(f, ", +{} since launch", gib(self.grew_by))?;
        }
        Ok(())
    }
}

/// A bounded wait ran out.
#[derive(Debug, Clone, thiserror::Error)]
#[error("gave up after {}: {still}", fmt_duration(*.waited))]
pub struct WaitTimedOut {
    pub waited: Duration,
    /// What was still in the way, in words.
    pub still: String,
}

/// "2h 5m", "4m 10s", "1.5s".
pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// Snapshot the run's GPUs before an attempt. `run_marker`: processes matching it are the
/// run's (see [`belongs`]); `None`: every process is foreign. A probe error is logged and
/// recorded; it never stops the run.
pub fn preflight(p: &mut dyn Probe, gpus: &[u32], run_marker: Option<&str>) -> Preflight {
    match p.gpus() {
        Err(e) => {
            tracing::warn!("GPU preflight: {e}");
            Preflight {
                error: Some(e.to_string()),
                ..Preflight::default()
            }
        }
        Ok(all) => {
            let picked: Vec<GpuState> = gpus
                .iter()
                .filter_map(|i| all.iter().find(|g| g.index == *i).cloned())
                .collect();
            let foreign = picked
                .iter()
                .flat_map(|g| {
                    g.processes
                        .iter()
                        .filter(|q| {
                            !run_marker.is_some_and(|m| belongs(q.oomguard_attempt.as_deref(), m))
                        })
                        .map(|q| Tenant {
                            pid: q.pid,
                            user: q.user.clone(),
                            bytes: q.used,
                            grew_by: 0,
                            gpu: Some(g.index),
                            oomguard_attempt: q.oomguard_attempt.clone(),
                        })
                })
                .collect();
            Preflight {
                gpus: picked,
                foreign,
                error: None,
            }
        }
    }
}

/// Logs a probe error once per streak of errors (a lost GPU must not flood the log).
struct ErrorStreak(bool);

impl ErrorStreak {
    fn failed(&mut self, what: &str, e: &super::GpuError) {
        if !self.0 {
            tracing::warn!("{what}: {e} (will keep trying)");
        }
        self.0 = true;
    }
}

/// `--wait-for-memory`: wait until each of `gpus` has at least `bytes` free. Says where it
/// stands through `out` when it starts waiting and every `status_every` after. Returns how
/// long it waited. While the probe fails, it keeps trying until `timeout`. A GPU smaller
/// than `bytes` fails the wait at once (it could never succeed).
pub fn wait_for_free(
    p: &mut dyn Probe,
    gpus: &[u32],
    bytes: u64,
    timeout: Duration,
    status_every: Duration,
    out: &mut dyn FnMut(&str),
) -> Result<Duration, WaitTimedOut> {
    let start = Instant::now();
    let mut next_status = start;
    let mut streak = ErrorStreak(false);
    loop {
        let mut impossible = None;
        let still = match p.gpus() {
            Ok(all) => {
                streak.0 = false;
                let short: Vec<String> = gpus
                    .iter()
                    .filter_map(|i| match all.iter().find(|g| g.index == *i) {
                        None => Some(format!("GPU {i} not found")),
                        Some(g) if g.free >= bytes => None,
                        Some(g) if g.total < bytes => {
                            impossible = Some(format!("GPU {i} has only {} in all", gib(g.total)));
                            None
                        }
                        Some(g) => Some(short_of(g)),
                    })
                    .collect();
                if let Some(still) = impossible {
                    return Err(WaitTimedOut {
                        waited: start.elapsed(),
                        still,
                    });
                }
                if short.is_empty() {
                    return Ok(start.elapsed());
                }
                short.join("; ")
            }
            Err(e) => {
                streak.failed("waiting for GPU memory", &e);
                format!("GPU state unknown: {e}")
            }
        };
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(WaitTimedOut { waited, still });
        }
        if Instant::now() >= next_status {
            out(&format!(
                "waiting for {} free on GPU {}: {still}; waited {} of {}",
                gib(bytes),
                list(gpus),
                fmt_duration(waited),
                fmt_duration(timeout)
            ));
            next_status = Instant::now() + status_every;
        }
        std::thread::sleep(POLL.min(timeout - waited));
    }
}

fn list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// "GPU 0 has 12.3 GiB free (pid 4242 bob 60.1 GiB, ...)": the biggest holders first.
fn short_of(g: &GpuState) -> String {
    let mut procs: Vec<_> = g.processes.iter().collect();
    procs.sort_by_key(|q| std::cmp::Reverse(q.used));
    let holders: Vec<String> = procs
        .iter()
        .take(3)
        .map(|q| format!("pid {} {} {}", q.pid, user_or_unknown(&q.user), gib(q.used)))
        .collect();
    let mut s = format!("GPU {} has {} free", g.index, gib(g.free));
    if !holders.is_empty() {
        s += &format!(" ({})", holders.join(", "));
    }
    s
}

/// Between attempts: wait until no process of the previous attempt — one whose marker
/// [`belongs`] to `marker`, or whose PID is in `pids` — holds memory on `gpus` (empty: on
/// any GPU). Returns how long it waited. While the probe fails, it keeps trying until
/// `timeout`.
pub fn wait_released(
    p: &mut dyn Probe,
    gpus: &[u32],
    marker: &str,
    pids: &[u32],
    timeout: Duration,
) -> Result<Duration, WaitTimedOut> {
    let start = Instant::now();
    let mut streak = ErrorStreak(false);
    loop {
        let still = match p.gpus() {
            Ok(all) => {
                streak.0 = false;
                let held: Vec<String> = all
                    .iter()
                    .filter(|g| gpus.is_empty() || gpus.contains(&g.index))
                    .flat_map(|g| {
                        g.processes
                            .iter()
                            .filter(|q| {
                                pids.contains(&q.pid)
                                    || belongs(q.oomguard_attempt.as_deref(), marker)
                            })
                            .map(move |q| {
                                format!(
                                    "pid {} still holds {} on GPU {}",
                                    q.pid,
                                    gib(q.used),
                                    g.index
                                )
                            })
                    })
                    .collect();
                if held.is_empty() {
                    return Ok(start.elapsed());
                }
                held.join("; ")
            }
            Err(e) => {
                streak.failed("waiting for the previous attempt to release GPU memory", &e);
                format!("GPU state unknown: {e}")
            }
        };
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(WaitTimedOut { waited, still });
        }
        std::thread::sleep(POLL.min(timeout - waited));
    }
}

/// After an OOM: the processes outside the run that hold memory on its GPUs and grew by at
/// least [`MIN_GROWTH`] since launch. Non-empty means the OOM is not the run's own.
///
/// * `before`: the baseline (the preflight's `gpus`); empty means unknown, so every
///   foreign process counts as grown by all it holds.
/// * `now`: a snapshot near the OOM (the sampler's [`PeakReport::last`](super::PeakReport),
///   or a fresh one).
/// * `oom_gpu`: the NVML index of the GPU the OOM message names (its `cuda:N` mapped
///   through the run's GPU list), to look there only; `None`: all of `gpus`.
/// * `oom_other_processes`: "Process N has X GiB memory in use" from the message. Those
///   not in `now` are looked up in `/proc`.
///
/// A process whose owner cannot be looked up (user unknown: gone, or another PID namespace)
/// is never blamed: without a name the journal could not say who, and it may be the run's.
pub fn foreign_tenants(
    before: &[GpuState],
    now: &[GpuState],
    gpus: &[u32],
    marker: &str,
    oom_gpu: Option<u32>,
    oom_other_processes: &[ProcessUse],
) -> Vec<Tenant> {
    let in_scope = |i: u32| match oom_gpu {
        Some(o) => o == i,
        None => gpus.contains(&i),
    };
    let held_before = |pid: u32, gpu: Option<u32>| -> u64 {
        before
            .iter()
            .filter(|g| gpu.is_none_or(|i| g.index == i))
            .flat_map(|g| g.processes.iter())
            .filter(|q| q.pid == pid)
            .map(|q| q.used)
            .max()
            .unwrap_or(0)
    };
    let mut out: Vec<Tenant> = Vec::new();
    for g in now.iter().filter(|g| in_scope(g.index)) {
        for q in &g.processes {
            if q.user.is_none() || belongs(q.oomguard_attempt.as_deref(), marker) {
                continue;
            }
            // The OOM message may have caught it bigger than the last snapshot did.
            let bytes = oom_other_processes
                .iter()
                .filter(|o| o.pid == q.pid && oom_gpu.is_none_or(|i| i == g.index))
                .map(|o| o.bytes)
                .fold(q.used, u64::max);
            let grew_by = bytes.saturating_sub(held_before(q.pid, Some(g.index)));
            if grew_by >= MIN_GROWTH {
                out.push(Tenant {
                    pid: q.pid,
                    user: q.user.clone(),
                    bytes,
                    grew_by,
                    gpu: Some(g.index),
                    oomguard_attempt: q.oomguard_attempt.clone(),
                });
            }
        }
    }
    let mut who = procinfo::Cache::default();
    for o in oom_other_processes {
        let in_now = now
            .iter()
            .filter(|g| in_scope(g.index))
            .any(|g| g.processes.iter().any(|q| q.pid == o.pid));
        if in_now || out.iter().any(|t| t.pid == o.pid) {
            continue;
        }
        let w = who.who(o.pid);
        if w.user.is_none() || belongs(w.attempt.as_deref(), marker) {
            continue;
        }
        let grew_by = o.bytes.saturating_sub(held_before(o.pid, oom_gpu));
        if grew_by >= MIN_GROWTH {
            out.push(Tenant {
                pid: o.pid,
                user: w.user,
                bytes: o.bytes,
                grew_by,
                gpu: oom_gpu,
                oomguard_attempt: w.attempt,
            });
        }
    }
    out.sort_by(|a, b| b.grew_by.cmp(&a.grew_by).then(a.pid.cmp(&b.pid)));
    out
}
