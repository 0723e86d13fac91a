//! `--wait-for-memory auto`: the peak that the last successful attempt of the same command
//! used on one GPU, remembered across runs.
//!
//! One small JSON file, `$XDG_CACHE_HOME/oomguard/peaks.json` (default
//! `~/.cache/oomguard/peaks.json`):
//!
//! ```json
//! { "commands": { "9f1c2e0a4b7d3e61": { "peak_bytes": 76450000000,
//!     "recorded_at": "2026-11-21T05:43:56+00:00", "command": "torchrun ... train.py ..." } } }
//! ```
//!
//! The key is a stable hash (FNV-1a, 64 bits) of the user's argv as given to oomguard, so
//! the same command line finds its record; `command` is only there for a person reading
//! the file (its secrets redacted). At most [`MAX_ENTRIES`] commands are kept (the oldest
//! go). Read, changed and written back under the state file's lock, 0600, through a
//! temporary file renamed into place (`remember::update_state`), so a reader never sees half
//! a file and two runs finishing at once both keep their entry.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const MAX_ENTRIES: usize = 200;

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    #[serde(default)]
    commands: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    peak_bytes: u64,
    recorded_at: String,
    #[serde(default)]
    command: String,
}

/// Where the record lives; `None` when neither `XDG_CACHE_HOME` nor `HOME` is set.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("oomguard").join("peaks.json"))
}

/// The record key of a command line: FNV-1a 64 over the arguments, each followed by a NUL
/// (so `["a b"]` and `["a", "b"]` differ). Stable across builds, unlike `DefaultHasher`.
pub fn key(argv: &[OsString]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for a in argv {
        for &b in a.as_bytes().iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn load(path: &Path) -> File {
    crate::remember::read_state(path).unwrap_or_default()
}

/// The peak recorded for this command line, if any. A missing or unreadable file is "none".
pub fn recorded(path: &Path, argv: &[OsString]) -> Option<u64> {
    load(path).commands.get(&key(argv)).map(|e| e.peak_bytes)
}

/// Remembers `peak_bytes` for this command line (after a successful attempt),
/// under the state file's lock, 0600, the command line redacted.
pub fn record(path: &Path, argv: &[OsString], peak_bytes: u64) -> io::Result<()> {
    let command = crate::remember::redact(argv);
    crate::remember::update_state(path, |file: &mut File| {
        file.commands.insert(
            key(argv),
            Entry {
                peak_bytes,
                recorded_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                command,
            },
        );
        while file.commands.len() > MAX_ENTRIES {
            let oldest = file
                .commands
                .iter()
                .min_by(|a, b| a.1.recorded_at.cmp(&b.1.recorded_at))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => file.commands.remove(&k),
                None => break,
            };
        }
    })
}
