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
    read_state(path).unwrap_or_default()
}

/// The most oomguard reads of one of its state files.
const MAX_STATE: u64 = 16 << 20;

/// A state file of oomguard's (`fits.json`, `peaks.json`): the user's own
/// regular file, no link, capped; anything else reads as empty.
pub fn read_state<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = crate::untrusted::read(path, MAX_STATE, crate::untrusted::Expect::own()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Read, change and write back a state file under an exclusive lock
/// (`NAME.lock` beside it), so that runs finishing at once each add their
/// entry and none is lost; written 0600 to a new file renamed into place.
/// The folder is created private (0700).
pub fn update_state<T>(path: &Path, change: impl FnOnce(&mut T)) -> std::io::Result<()>
where
    T: Default + Serialize + for<'de> Deserialize<'de>,
{
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut lock_name = path.file_name().unwrap_or_default().to_os_string();
    lock_name.push(".lock");
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join(lock_name))?;
    if !lock.metadata()?.is_file() {
        return Err(std::io::Error::other("the lock file is not a regular file"));
    }
    // SAFETY: flock on a file descriptor we own; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut state: T = read_state(path).unwrap_or_default();
    change(&mut state);
    let body = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
    crate::run_folder::write_private(path, &body)
}

/// A command line as oomguard keeps it in a state file a person may read:
/// the values of options that name a secret (`--hub_token X`,
/// `--api-key=X`, `HF_TOKEN=X`) and words that look like tokens (`hf_…`,
/// `sk-…`, `ghp_…`, a URL's password) are replaced by `<redacted>`.
pub fn redact(argv: &[OsString]) -> String {
    const SECRET: &[&str] = &[
        "token",
        "secret",
        "password",
        "passwd",
        "api_key",
        "api-key",
        "apikey",
        "access_key",
        "access-key",
        "credential",
        "auth",
    ];
    let secret_name = |n: &str| {
        let n = n.to_ascii_lowercase();
        SECRET.iter().any(|s| n.contains(s))
    };
    let looks_like_token = |w: &str| {
        let long = |p: &str| {
            w.strip_prefix(p).is_some_and(|r| {
                r.len() >= 16
                    && r.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            })
        };
        [
            "hf_",
            "sk-",
            "ghp_",
            "gho_",
            "github_pat_",
            "xoxb-",
            "AKIA",
            "wandb_",
        ]
        .iter()
        .any(|p| long(p))
    };
    let mut out = Vec::new();
    let mut hide_next = false;
    for a in argv {
        let a = a.to_string_lossy().into_owned();
        if hide_next {
            hide_next = false;
            out.push("<redacted>".to_string());
            continue;
        }
        if let Some((name, _)) = a.split_once('=')
            && secret_name(name)
        {
            out.push(format!("{name}=<redacted>"));
            continue;
        }
        if a.starts_with('-') && secret_name(&a) {
            hide_next = true;
            out.push(a);
            continue;
        }
        if looks_like_token(&a) {
            out.push("<redacted>".to_string());
            continue;
        }
        // https://user:password@host/...
        if let Some((scheme, rest)) = a.split_once("://")
            && let Some((userinfo, host)) = rest.split_once('@')
            && let Some((user, _)) = userinfo.split_once(':')
        {
            out.push(format!("{scheme}://{user}:<redacted>@{host}"));
            continue;
        }
        out.push(a);
    }
    crate::plan::shell_quote(&out.iter().map(OsString::from).collect::<Vec<_>>())
}

/// The knob values that fit last time, if recorded.
pub fn recorded(path: &Path, key: &str) -> Option<BTreeMap<Knob, Value>> {
    load(path).fits.get(key).map(|e| e.knobs.clone())
}

/// Record the knob values of a run that fit (`command`: the command line,
/// redacted, for a person reading the file).
pub fn record(
    path: &Path,
    key: &str,
    knobs: &BTreeMap<Knob, Value>,
    command: &str,
) -> std::io::Result<()> {
    update_state(path, |f: &mut File| {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_a_command_line_are_redacted() {
        let argv: Vec<OsString> = [
            "python",
            "train.py",
            "--hub_token",
            "hf_abcdefghijklmnopqrstuvwxyz",
            "--api-key=s3cret",
            "WANDB_API_KEY=abc",
            "--report_to",
            "https://me:pw@example.com/x",
            "sk-0123456789abcdefghij",
            "--per_device_train_batch_size",
            "8",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let r = redact(&argv);
        for secret in ["hf_abc", "s3cret", "=abc", ":pw@", "sk-0123"] {
            assert!(!r.contains(secret), "{secret} in {r}");
        }
        assert!(r.contains("--per_device_train_batch_size 8"), "{r}");
        assert!(
            r.contains("--hub_token '<redacted>'") || r.contains("--hub_token <redacted>"),
            "{r}"
        );
    }
}
