//! The fake probe: GPUs, processes and memory over time, from a file. Test-only.
//!
//! `OOMGUARD_FAKE_GPUS=path/to/timeline.json` (or `.toml`) replaces NVML for the whole
//! oomguard process. It is meant for tests and demos on machines without a GPU; a real run
//! never sets it.
//!
//! # Timeline format
//!
//! ```json
//! { "snapshots": [
//!     { "at_s": 0.0, "gpus": [
//!         { "index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
//!           "name": "Fake H100", "total_gib": 80, "used_gib": 3.5, "util_percent": 40,
//!           "processes": [
//!             { "pid": 4242, "used_gib": 3.0, "user": "bob" },
//!             { "pid": 5000, "used_gib": 0.5, "user": "me", "attempt": "self" } ] } ] },
//!     { "at_s": 1.5, "gpus": [ ... ] },
//!     { "at_s": 3.0, "error": "GPU is lost" }
//! ] }
//! ```
//!
//! The same in TOML: `[[snapshots]]`, `[[snapshots.gpus]]`, `[[snapshots.gpus.processes]]`
//! (a file whose name ends in `.toml` is read as TOML, any other as JSON).
//!
//! * The clock starts when the probe is opened. A call returns the last snapshot whose
//!   `at_s` is ≤ the time since then (before the first one: the first one). `at_s` must not
//!   decrease.
//! * A snapshot with `error` makes the probe fail with that message for as long as it is
//!   the current one (a simulated NVML error); the next snapshot ends it.
//! * GPU fields: `total_gib` (required); `index` (default: its position), `uuid` (default
//!   `GPU-fake-<index>`), `name` (default "Fake GPU"), `used_gib` (default: the sum of its
//!   processes), `util_percent` (default none). `free` is `total - used`.
//! * Process fields: `pid`, `used_gib` (required); `user` (default: unknown, as for a PID
//!   that `/proc` cannot show); `attempt`: the `OOMGUARD_ATTEMPT` marker it carries —
//!   `"self"` stands for this oomguard process's [`run_marker`](super::run_marker), which
//!   makes the process part of the run being supervised; any other string is taken as is
//!   (unit tests use `"run"` and pass `"run"` as the marker); absent: not an oomguard
//!   process.
//!
//! The PIDs are made up: nothing looks them up in `/proc`.

use std::path::Path;
use std::time::Instant;

use serde::Deserialize;

use super::{GpuError, GpuProcess, GpuState, Probe};

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub at_s: f64,
    #[serde(default)]
    pub gpus: Vec<FakeGpu>,
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeGpu {
    pub index: Option<u32>,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub total_gib: f64,
    pub used_gib: Option<f64>,
    pub util_percent: Option<u32>,
    #[serde(default)]
    pub processes: Vec<FakeProcess>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeProcess {
    pub pid: u32,
    pub used_gib: f64,
    pub user: Option<String>,
    pub attempt: Option<String>,
}

pub struct FakeProbe {
    start: Instant,
    /// (at_s, the snapshot's result), sorted by at_s.
    frames: Vec<(f64, Result<Vec<GpuState>, String>)>,
}

/// Why a timeline cannot be used: one line for the user, after
/// `OOMGUARD_FAKE_GPUS=<path>: ` (see [`super::Unavailable`]).
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    #[error("bad TOML timeline: {0}")]
    Toml(#[source] toml::de::Error),
    #[error("bad JSON timeline: {0}")]
    Json(#[source] serde_json::Error),
    #[error("no snapshots")]
    NoSnapshots,
    /// A snapshot's `at_s` is below the one before it (or NaN).
    #[error("at_s {at_s} comes after at_s {last}")]
    OutOfOrder { at_s: f64, last: f64 },
}

fn bytes(gib: f64) -> u64 {
    (gib * GIB).round() as u64
}

impl FakeProbe {
    /// Reads a timeline file; the error is one line for the user.
    pub fn open(path: &Path) -> Result<FakeProbe, TimelineError> {
        let text = std::fs::read_to_string(path).map_err(TimelineError::Read)?;
        let toml = path.extension().is_some_and(|e| e == "toml");
        Self::parse(&text, toml)
    }

    /// Parses a timeline (TOML when `toml`, else JSON); the clock starts now.
    pub fn parse(text: &str, toml: bool) -> Result<FakeProbe, TimelineError> {
        let timeline: Timeline = if toml {
            toml::from_str(text).map_err(TimelineError::Toml)?
        } else {
            serde_json::from_str(text).map_err(TimelineError::Json)?
        };
        Self::from_timeline(timeline)
    }

    pub fn from_timeline(t: Timeline) -> Result<FakeProbe, TimelineError> {
        if t.snapshots.is_empty() {
            return Err(TimelineError::NoSnapshots);
        }
        let mut frames = Vec::new();
        let mut last = f64::NEG_INFINITY;
        let me = super::run_marker();
        for s in t.snapshots {
            if s.at_s.is_nan() || s.at_s < last {
                return Err(TimelineError::OutOfOrder { at_s: s.at_s, last });
            }
            last = s.at_s;
            let frame = match s.error {
                Some(e) => Err(e),
                None => Ok(s
                    .gpus
                    .into_iter()
                    .enumerate()
                    .map(|(pos, g)| {
                        let index = g.index.unwrap_or(pos as u32);
                        let processes: Vec<GpuProcess> = g
                            .processes
                            .into_iter()
                            .map(|p| GpuProcess {
                                pid: p.pid,
                                used: bytes(p.used_gib),
                                user: p.user,
                                oomguard_attempt: p
                                    .attempt
                                    .map(|a| if a == "self" { me.clone() } else { a }),
                            })
                            .collect();
                        let total = bytes(g.total_gib);
                        let used = g
                            .used_gib
                            .map(bytes)
                            .unwrap_or_else(|| processes.iter().map(|p| p.used).sum())
                            .min(total);
                        GpuState {
                            index,
                            uuid: g.uuid.unwrap_or_else(|| format!("GPU-fake-{index}")),
                            name: g.name.unwrap_or_else(|| "Fake GPU".into()),
                            total,
                            used,
                            free: total - used,
                            util_percent: g.util_percent,
                            processes,
                        }
                    })
                    .collect()),
            };
            frames.push((s.at_s, frame));
        }
        Ok(FakeProbe {
            start: Instant::now(),
            frames,
        })
    }
}

impl Probe for FakeProbe {
    fn gpus(&mut self) -> Result<Vec<GpuState>, GpuError> {
        let now = self.start.elapsed().as_secs_f64();
        let i = self
            .frames
            .iter()
            .rposition(|(at, _)| *at <= now)
            .unwrap_or(0);
        self.frames[i]
            .1
            .clone()
            .map_err(|message| GpuError::Simulated { message })
    }
}
