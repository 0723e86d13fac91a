//! Remember the settings that fit: after a run that finished, its last
//! attempt's knob values are recorded, keyed by the command line, the content
//! of the config files it names, the GPUs (model and memory, from NVML) and the
//! world size; the next run of the same command starts there (`--fresh`: not).
//!
//! One small JSON file, `$XDG_STATE_HOME/oomguard/fits.json` (default
//! `~/.local/state/oomguard/fits.json`), written to a temporary file and
//! renamed. Without NVML nothing is remembered: the same command on another
//! GPU must not start from settings sized for this one.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::knobs::{Knob, Value};

/// At most this many commands are kept (the oldest go).
const MAX_ENTRIES: usize = 200;

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    #[serde(default)]
    fits: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    knobs: BTreeMap<Knob, Value>,
    recorded_at: String,
    #[serde(default)]
    command: String,
}

/// Where the record lives; `None` when neither `XDG_STATE_HOME` nor `HOME` is set.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(base.join("oomguard").join("fits.json"))
}

/// The key of a command on these GPUs: the command line, its config files'
/// content, the GPUs and the world size (FNV-1a 64, stable across builds).
pub fn key(argv: &[OsString], files: &[String], gpus: &str, world: u64) -> String {
    let mut parts: Vec<OsString> = argv.to_vec();
    for f in files {
        parts.push(OsString::from(
            std::fs::read_to_string(f).unwrap_or_default(),
        ));
    }
    parts.push(OsString::from(gpus));
    parts.push(OsString::from(world.to_string()));
    crate::gpu::peaks::key(&parts)
}

fn load(path: &Path) -> File {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The knob values that fit last time, if recorded.
pub fn recorded(path: &Path, key: &str) -> Option<BTreeMap<Knob, Value>> {
    load(path).fits.get(key).map(|e| e.knobs.clone())
}

/// Record the knob values of a run that fit.
pub fn record(
    path: &Path,
    key: &str,
    knobs: &BTreeMap<Knob, Value>,
    command: &str,
) -> std::io::Result<()> {
    let mut f = load(path);
    f.fits.insert(
        key.to_string(),
        Entry {
            knobs: knobs.clone(),
            recorded_at: chrono::Utc::now().to_rfc3339(),
            command: command.to_string(),
        },
    );
    while f.fits.len() > MAX_ENTRIES {
        let oldest = f
            .fits
            .iter()
            .min_by(|a, b| a.1.recorded_at.cmp(&b.1.recorded_at))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => f.fits.remove(&k),
            None => break,
        };
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".fits.json.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&f).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
