//! `--edit-in-place`: the one opt-in exception to "never write the user's files".
//!
//! A knob that lives in a module the script imports (`config/config.py:
//! MAX_SEQ_LENGTH`) cannot be changed in a copy, because nothing on the command
//! line names the file. With `--edit-in-place` oomguard keeps the original in
//! the run folder (`originals/`), writes `restore.json` there *before* touching
//! the file, edits it, and puts the original back when the run ends — on every
//! exit path it can (normal end, failure, interrupt, panic: a `Drop` guard).
//! After a hard kill, `oomguard restore RUN_DIR` puts it back. A file the user
//! changed meanwhile is never overwritten: restore says so and leaves it.
//!
//! [`InPlace::write_derived`] writes an attempt's changed files: the copies in the
//! attempt's folder (private), and through this guard the files edited in place.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::journal::{create_private_dir, write_private};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    original: PathBuf,
    /// The file as it was before oomguard touched it.
    backup: PathBuf,
    /// What oomguard last wrote (to tell a user's later edit apart).
    written: PathBuf,
}

/// The files edited in place during one run; restores them when dropped.
pub struct InPlace {
    dir: PathBuf,
    entries: Vec<Entry>,
}

fn manifest(run_dir: &Path) -> PathBuf {
    run_dir.join("restore.json")
}

impl InPlace {
    pub fn new(run_dir: &Path) -> InPlace {
        InPlace {
            dir: run_dir.to_path_buf(),
            entries: Vec::new(),
        }
    }

    /// Replace `original`'s content with `text`, keeping the first original.
    pub fn write(&mut self, original: &Path, text: &str) -> io::Result<()> {
        let original = std::path::absolute(original)?;
        let pos = match self.entries.iter().position(|e| e.original == original) {
            Some(p) => p,
            None => {
                let store = self.dir.join("originals");
                create_private_dir(&store)?;
                let n = self.entries.len();
                let name = original
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "file".into());
                let entry = Entry {
                    original: original.clone(),
                    backup: store.join(format!("{n}-{name}")),
                    written: store.join(format!("{n}-{name}.written")),
                };
                // Keep the original and say how to restore it *before* the edit.
                fs::copy(&original, &entry.backup)?;
                self.entries.push(entry);
                self.save_manifest()?;
                n
            }
        };
        let e = &self.entries[pos];
        write_private(&e.written, text.as_bytes())?;
        fs::write(&e.original, text)
    }

    fn save_manifest(&self) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(&self.entries).expect("manifest serializes");
        write_private(&manifest(&self.dir), &json)
    }

    /// Write an attempt's changed config copies, readable by the user only
    /// (and, with --edit-in-place, the edited originals, kept and restored).
    pub fn write_derived(&mut self, files: &[crate::knobs::Derived]) -> Result<(), String> {
        for f in files {
            if f.in_place {
                self.write(&f.dest, &f.text)
                    .map_err(|e| format!("{} (edit in place): {e}", f.dest.display()))?;
                continue;
            }
            if let Some(parent) = f.dest.parent() {
                create_private_dir(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            write_private(&f.dest, f.text.as_bytes())
                .map_err(|e| format!("{}: {e}", f.dest.display()))?;
        }
        Ok(())
    }

    /// Put every original back. Returns one line per file for the user.
    pub fn restore(&mut self) -> Vec<String> {
        let lines = restore_entries(&self.entries);
        if self
            .entries
            .iter()
            .all(|e| !e.original.exists() || same(&e.original, &e.backup))
        {
            let _ = fs::remove_file(manifest(&self.dir));
        }
        self.entries.clear();
        lines
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        for l in self.restore() {
            eprintln!("oomguard: {l}");
        }
    }
}

fn same(a: &Path, b: &Path) -> bool {
    matches!((fs::read(a), fs::read(b)), (Ok(x), Ok(y)) if x == y)
}

fn restore_entries(entries: &[Entry]) -> Vec<String> {
    let mut out = Vec::new();
    for e in entries {
        let now = fs::read(&e.original).ok();
        let ours = fs::read(&e.written).ok();
        let line = if now.is_some() && now == fs::read(&e.backup).ok() {
            format!("{} is already the original", e.original.display())
        } else if now.is_some() && now != ours {
            format!(
                "{} was changed by someone else since oomguard edited it: left as it is; the original is in {}",
                e.original.display(),
                e.backup.display()
            )
        } else {
            match fs::copy(&e.backup, &e.original) {
                Ok(_) => format!("restored {} (edited in place)", e.original.display()),
                Err(err) => format!(
                    "cannot restore {}: {err}; the original is in {}",
                    e.original.display(),
                    e.backup.display()
                ),
            }
        };
        out.push(line);
    }
    out
}

/// `oomguard restore RUN_DIR`: after a hard kill, put the originals back.
pub fn restore_main(run_dir: &Path) -> i32 {
    // A mistyped path is not "nothing to restore": say so, and where runs live.
    if !run_dir.is_dir() {
        eprintln!(
            "oomguard: error: no run folder at {}\n\
             oomguard: runs live under .oomguard/runs/<time>/ in the directory the run was started \
             from (or where its --run-dir said): oomguard restore .oomguard/runs/<time>",
            run_dir.display()
        );
        return crate::exit::USAGE;
    }
    let text = match fs::read(manifest(run_dir)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!(
                "nothing to restore: {} has no restore.json (no file was edited in place, or it was already restored)",
                run_dir.display()
            );
            return crate::exit::SUCCESS;
        }
        Err(e) => {
            eprintln!(
                "oomguard: error: cannot read {}: {e}",
                manifest(run_dir).display()
            );
            return crate::exit::USAGE;
        }
    };
    let entries: Vec<Entry> = match serde_json::from_slice(&text) {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "oomguard: error: {} is not an oomguard restore manifest: {e}",
                manifest(run_dir).display()
            );
            return crate::exit::USAGE;
        }
    };
    for l in restore_entries(&entries) {
        println!("{l}");
    }
    let _ = fs::remove_file(manifest(run_dir));
    crate::exit::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_are_restored_when_the_guard_drops() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.py");
        fs::write(&f, "MAX_SEQ_LENGTH = 1536\n").unwrap();
        {
            let mut g = InPlace::new(&t.path().join("run"));
            g.write(&f, "MAX_SEQ_LENGTH = 1152\n").unwrap();
            assert_eq!(fs::read_to_string(&f).unwrap(), "MAX_SEQ_LENGTH = 1152\n");
            assert!(t.path().join("run/restore.json").exists());
            g.write(&f, "MAX_SEQ_LENGTH = 864\n").unwrap();
        }
        assert_eq!(fs::read_to_string(&f).unwrap(), "MAX_SEQ_LENGTH = 1536\n");
        assert!(!t.path().join("run/restore.json").exists());
    }

    #[test]
    fn restore_after_a_hard_kill_and_a_users_edit_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a.py"), t.path().join("b.py"));
        fs::write(&a, "X = 1\n").unwrap();
        fs::write(&b, "Y = 1\n").unwrap();
        let run = t.path().join("run");
        let mut g = InPlace::new(&run);
        g.write(&a, "X = 2\n").unwrap();
        g.write(&b, "Y = 2\n").unwrap();
        std::mem::forget(g); // a hard kill: no Drop
        fs::write(&b, "Y = 99  # the user's own edit\n").unwrap();
        assert_eq!(restore_main(&run), 0);
        assert_eq!(fs::read_to_string(&a).unwrap(), "X = 1\n");
        assert_eq!(
            fs::read_to_string(&b).unwrap(),
            "Y = 99  # the user's own edit\n"
        );
        assert_eq!(restore_main(&run), 0, "a second restore has nothing to do");
    }
}
