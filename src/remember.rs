//! Remember the settings that fit: after a run that finished, its last
//! attempt's knob values are recorded, keyed by the command line, the content
//! of the config files it names, the GPUs (model and memory, from NVML) and the
//! world size; the next run of the same command starts there (`--fresh`: not).
//!
//! One small JSON file, `$XDG_STATE_HOME/oomguard/fits.json` (default
//! `~/.local/state/oomguard/fits.json`), written to a temporary file and
//! renamed. Without NVML nothing is remembered: the same command on another
//! GPU must not start from settings sized for this one.
//!
//! With the settings, the entry keeps what NVML measured of the run's last
//! attempt (its peak on the fullest GPU and that GPU's memory) and the
//! settings that ran out of GPU memory in this command's runs: the next run
//! climbs back from settings shrunk for a spike when the peak leaves room
//! (`memory::climb`), never to settings that failed.

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
    /// What NVML measured of the attempt that ran to the end (absent in
    /// records written before oomguard kept it, or without a measurement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peak: Option<Peak>,
    /// Settings that ran out of GPU memory in this command's runs on these
    /// GPUs (the last [`MAX_FAILED`]): never climbed back to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    failed: Vec<BTreeMap<Knob, Value>>,
}

/// At most this many failed settings are kept per command.
const MAX_FAILED: usize = 16;

/// The peak of a run's last attempt on its fullest GPU, as NVML measured it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// The most the run held on that GPU at one sample (the whole GPU's use
    /// where NVML does not show the run's processes: never less).
    pub bytes: u64,
    /// That GPU's memory.
    pub total_bytes: u64,
}

/// What is remembered of the last run of a command that fit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Remembered {
    pub knobs: BTreeMap<Knob, Value>,
    pub peak: Option<Peak>,
    pub failed: Vec<BTreeMap<Knob, Value>>,
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

/// What fit last time, if recorded.
pub fn recorded(path: &Path, key: &str) -> Option<Remembered> {
    load(path).fits.get(key).map(|e| Remembered {
        knobs: e.knobs.clone(),
        peak: e.peak,
        failed: e.failed.clone(),
    })
}

/// Record what fit in a run that finished: its last settings, their measured
/// peak, and the settings that ran out of memory in it (added to those of the
/// command's earlier runs). `command`: the command line, redacted, for a
/// person reading the file.
pub fn record(path: &Path, key: &str, fit: &Remembered, command: &str) -> std::io::Result<()> {
    update_state(path, |f: &mut File| {
        let mut failed = f
            .fits
            .get(key)
            .map(|e| e.failed.clone())
            .unwrap_or_default();
        for s in &fit.failed {
            failed.retain(|x| x != s);
            failed.push(s.clone());
        }
        // Settings that fit now are no failure of this command's any more.
        failed.retain(|x| *x != fit.knobs);
        let drop = failed.len().saturating_sub(MAX_FAILED);
        failed.drain(..drop);
        f.fits.insert(
            key.to_string(),
            Entry {
                knobs: fit.knobs.clone(),
                recorded_at: chrono::Utc::now().to_rfc3339(),
                command: command.to_string(),
                peak: fit.peak,
                failed,
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

    fn knobs(micro: u64, accum: u64) -> BTreeMap<Knob, Value> {
        [
            (Knob::MicroBatch, Value::Int(micro)),
            (Knob::GradAccum, Value::Int(accum)),
        ]
        .into_iter()
        .collect()
    }

    /// The peak and the failed settings are kept with the settings; the
    /// failures of the command's runs add up, a record without them (an older
    /// oomguard's) reads as none.
    #[test]
    fn the_peak_and_the_failed_settings_are_kept_and_failures_add_up() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("fits.json");
        let peak = Peak {
            bytes: 44 << 30,
            total_bytes: 64 << 30,
        };
        let first = Remembered {
            knobs: knobs(8, 6),
            peak: Some(peak),
            failed: vec![knobs(16, 3)],
        };
        record(&path, "k", &first, "cmd").unwrap();
        assert_eq!(recorded(&path, "k"), Some(first));
        // The next run fit at 12 without an OOM: 16 stays a failure.
        let second = Remembered {
            knobs: knobs(12, 4),
            peak: None,
            failed: vec![],
        };
        record(&path, "k", &second, "cmd").unwrap();
        let got = recorded(&path, "k").unwrap();
        assert_eq!((got.peak, got.failed), (None, vec![knobs(16, 3)]));
        // An entry written before peaks were kept.
        std::fs::write(
            &path,
            r#"{"fits":{"k":{"knobs":{"micro_batch":4},"recorded_at":"x"}}}"#,
        )
        .unwrap();
        let old = recorded(&path, "k").unwrap();
        assert_eq!((old.peak, old.failed.len()), (None, 0));
    }

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
