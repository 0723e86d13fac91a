//! The newest complete checkpoint, and why newer ones were skipped.
//!
//! Hugging Face `Trainer` layout: `output_dir/checkpoint-N/`. A checkpoint is
//! complete when `trainer_state.json` is present, non-empty and parses as JSON
//! (the Trainer writes it last), no file in it carries a temporary name, and it
//! is not still being written (sizes and times stable over a short interval).
//! Checkpoints are only ever read: never deleted, moved or renamed.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// A checkpoint folder found on disk.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub step: u64,
}

/// A newer checkpoint that was not used, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
}

/// What a search found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Found {
    pub layout: &'static str,
    pub latest: Option<Checkpoint>,
    pub skipped: Vec<Skipped>,
}

fn is_temporary(name: &str) -> bool {
    name.ends_with(".tmp")
        || name.starts_with("tmp-")
        || name.ends_with(".incomplete")
        || name.ends_with(".partial")
}

/// (total size, newest mtime) of the files directly and one level under `dir`.
fn fingerprint(dir: &Path) -> Option<(u64, std::time::SystemTime, usize)> {
    let mut size = 0;
    let mut newest = std::time::UNIX_EPOCH;
    let mut count = 0;
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).ok()?.flatten() {
            let md = e.metadata().ok()?;
            if md.is_dir() {
                if depth < 2 {
                    stack.push((e.path(), depth + 1));
                }
                continue;
            }
            size += md.len();
            count += 1;
            if let Ok(m) = md.modified() {
                newest = newest.max(m);
            }
        }
    }
    Some((size, newest, count))
}

/// Why `dir` is not a complete Hugging Face checkpoint, or `None` when it is.
fn incomplete_reason(dir: &Path) -> Option<String> {
    let state = dir.join("trainer_state.json");
    let text = match fs::read(&state) {
        Err(_) => return Some("no trainer_state.json (the Trainer writes it last)".into()),
        Ok(t) => t,
    };
    if text.is_empty() {
        return Some("trainer_state.json is empty".into());
    }
    if serde_json::from_slice::<serde_json::Value>(&text).is_err() {
        return Some("trainer_state.json is not valid JSON (cut off mid-write?)".into());
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_temporary(&name) {
                return Some(format!("holds a temporary file {name}"));
            }
        }
    }
    None
}

/// Numbered `checkpoint-N` folders under `output_dir`, newest first.
fn hf_candidates(output_dir: &Path) -> Vec<Checkpoint> {
    let mut out: Vec<Checkpoint> = fs::read_dir(output_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("checkpoint-")?.parse::<u64>().ok()?;
            Some(Checkpoint {
                path: e.path(),
                step,
            })
        })
        .collect();
    out.sort_by(|a, b| b.step.cmp(&a.step));
    out
}

/// The newest complete Hugging Face checkpoint under `output_dir`.
///
/// `settle` is how long to watch a candidate for changes (0 in `plan`, a short
/// interval between attempts, when a dying process may still be writing).
pub fn latest_hf(output_dir: &Path, settle: Duration) -> Found {
    let mut found = Found {
        layout: "hugging-face checkpoint-N",
        ..Found::default()
    };
    for c in hf_candidates(output_dir) {
        if let Some(why) = incomplete_reason(&c.path) {
            found.skipped.push(Skipped { path: c.path, why });
            continue;
        }
        if !settle.is_zero() {
            let before = fingerprint(&c.path);
            std::thread::sleep(settle);
            let after = fingerprint(&c.path);
            if before != after {
                found.skipped.push(Skipped {
                    path: c.path,
                    why: "still being written (files changed while oomguard watched)".into(),
                });
                continue;
            }
        }
        found.latest = Some(c);
        break;
    }
    found
}

/// The step number of a user-given resume path (`.../checkpoint-N`), if it has one.
pub fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("checkpoint-")?
        .parse()
        .ok()
}

/// The global step recorded in a checkpoint's `trainer_state.json`.
pub fn recorded_step(ckpt: &Path) -> Option<u64> {
    let text = fs::read(ckpt.join("trainer_state.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("global_step")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ckpt(root: &Path, n: u64, state: Option<&str>) {
        let d = root.join(format!("checkpoint-{n}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("model.safetensors"), b"weights").unwrap();
        if let Some(s) = state {
            fs::write(d.join("trainer_state.json"), s).unwrap();
        }
    }

    #[test]
    fn newest_complete_wins_and_skips_are_explained() {
        let t = tempfile::tempdir().unwrap();
        ckpt(t.path(), 5, Some(r#"{"global_step": 5}"#));
        ckpt(t.path(), 10, Some(r#"{"global_step": 10}"#));
        ckpt(t.path(), 15, None); // killed before trainer_state.json
        ckpt(t.path(), 20, Some(r#"{"global_st"#)); // cut mid-write
        fs::create_dir_all(t.path().join("checkpoint-x")).unwrap();
        let f = latest_hf(t.path(), Duration::ZERO);
        let latest = f.latest.unwrap();
        assert_eq!(latest.step, 10);
        assert_eq!(recorded_step(&latest.path), Some(10));
        let skipped: Vec<_> = f
            .skipped
            .iter()
            .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(skipped, ["checkpoint-20", "checkpoint-15"]);
        assert!(f.skipped[0].why.contains("not valid JSON"));
    }

    #[test]
    fn temporary_files_make_it_incomplete() {
        let t = tempfile::tempdir().unwrap();
        ckpt(t.path(), 5, Some("{}"));
        ckpt(t.path(), 6, Some("{}"));
        fs::write(t.path().join("checkpoint-6/optimizer.pt.tmp"), b"x").unwrap();
        assert_eq!(latest_hf(t.path(), Duration::ZERO).latest.unwrap().step, 5);
    }

    #[test]
    fn no_folder_means_no_checkpoint() {
        let f = latest_hf(Path::new("/nonexistent/oomguard"), Duration::ZERO);
        assert!(f.latest.is_none() && f.skipped.is_empty());
    }
}
