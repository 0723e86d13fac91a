//! `--edit-in-place`: the one opt-in exception to "never write the user's files".
//!
//! A knob that lives in a module the script imports (`config/config.py:
//! MAX_SEQ_LENGTH`) cannot be changed in a copy, because nothing on the command
//! line names the file. With `--edit-in-place` oomguard keeps the original in
//! the run folder (`originals/`), writes `restore.json` there *before* touching
//! the file, edits it, and puts the original back when the run ends — on every
//! exit path it can (normal end, failure, interrupt, panic: a `Drop` guard).
//! After a hard kill, `oomguard restore RUN_DIR` puts it back.
//!
//! Theory of operation (what keeps the user's file whole):
//!
//! - Before anything runs ([`InPlace::prepare`]) every file that may be edited
//!   is checked writable (a read-only module fails now, not at the first OOM)
//!   and locked: one module is edited by one run at a time (an `flock` on a
//!   lock file keyed by the module's absolute path, in a private per-user
//!   folder; the lock file names the run holding it).
//! - `restore.json` records, per file, absolute paths and the SHA-256 of the
//!   original and of every text oomguard wrote. A file is restored only when
//!   its content is one oomguard wrote, from a backup whose content is the
//!   recorded original: an entry someone else wrote (say, "restore my file over
//!   /etc/...") matches neither, and a user's own later edit is left alone.
//! - Every edit is atomic: a new file beside the module (same mode and owner)
//!   renamed over it, so a full disk leaves the module as it was; and before
//!   each edit the module must still hold what oomguard last wrote (or the text
//!   read at start), so a user's edit meanwhile is never overwritten.
//! - The record of an edit that was not undone is never deleted: restore
//!   rewrites `restore.json` with what is left, and removes it only when
//!   nothing is. Cleanup runs once, however often it is called.
//! - `oomguard restore` trusts a run folder only when it is the user's and
//!   writable by nobody else, and reads `restore.json` without following links.
//!
//! [`InPlace::write_derived`] writes an attempt's changed files: the copies in the
//! attempt's folder (private), and through this guard the files edited in place.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::journal::{create_private_dir, write_private};
use crate::run_folder::{self, RunDirError, RunFolder, sha256};

/// The version of `restore.json` this oomguard writes and trusts.
const MANIFEST_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    /// The file edited in place (absolute).
    original: PathBuf,
    /// Its content before oomguard touched it (absolute; in `originals/`).
    backup: PathBuf,
    /// SHA-256 of that content.
    original_sha256: String,
    /// SHA-256 of every text oomguard wrote to it during the run: a file
    /// holding one of them is oomguard's to put back.
    written_sha256: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    oomguard_restore: u32,
    files: Vec<Entry>,
}

/// Why a file cannot be edited in place.
#[derive(Debug, thiserror::Error)]
pub enum InPlaceError {
    #[error(
        "{}: {why}, so --edit-in-place could not change it at the first OOM; make it writable or bind the knob elsewhere (--knob)",
        path.display()
    )]
    NotWritable { path: PathBuf, why: String },
    #[error(
        "{} is being edited in place by another oomguard run ({other}); one run at a time may edit a file in place: wait for that run to end (or `oomguard restore` its run folder after a hard kill)",
        path.display()
    )]
    Locked { path: PathBuf, other: String },
    #[error("cannot lock {} for editing in place: {why}", path.display())]
    Lock { path: PathBuf, why: String },
    #[error(
        "the run folder cannot be written ({0}); --edit-in-place keeps the originals there, so nothing is edited: give a writable --run-dir"
    )]
    NoRunFolder(#[source] RunDirError),
    #[error(
        "{} was changed since oomguard last wrote it (by you or another program): it is not overwritten; the relaunch cannot use new settings there",
        path.display()
    )]
    Changed { path: PathBuf },
    #[error(
        "{} holds the restore record of an earlier run whose in-place edits were not undone: run `oomguard restore {}` first, or give another --run-dir",
        dir.display(), dir.display()
    )]
    PendingRestore { dir: PathBuf },
    #[error(
        "{} still holds the in-place edit of an oomguard run that did not finish (killed?); its original is kept in {}. \
         Run `oomguard restore {}` first, then start again: a run now would take the edited values for the original ones",
        path.display(), dir.display(), dir.display()
    )]
    Unfinished { path: PathBuf, dir: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// An attempt's changed files could not all be written: the attempt is not
/// launched.
#[derive(Debug, thiserror::Error)]
pub enum DerivedError {
    #[error("{0} (edit in place)")]
    InPlace(#[source] InPlaceError),
    /// A copy in the attempt's folder, or that folder.
    #[error("{}: {source}", path.display())]
    Copy { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> InPlaceError + '_ {
    move |source| InPlaceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A file this run may edit: its real path and the hash of the text read at start.
struct Planned {
    /// As discovery has it (what `Derived::dest` names).
    given: PathBuf,
    /// Absolute, symlinks resolved: what is edited and recorded.
    real: PathBuf,
    start_sha256: String,
}

/// The files edited in place during one run; restores them when dropped.
pub struct InPlace {
    dir: PathBuf,
    entries: Vec<Entry>,
    planned: Vec<Planned>,
    /// Cleanup ran: a second call (finish, then Drop) does nothing.
    restored: bool,
    _locks: Vec<Lock>,
    /// `flock`s on the module files themselves (each version this run wrote),
    /// held for the run: another user's run, whose per-user lock file is
    /// elsewhere, finds the module locked too.
    held: Vec<nix::fcntl::Flock<File>>,
}

/// Lock the module file at `path` itself (the inode its name holds now), or
/// say that another run — maybe another user's — holds it.
fn lock_module(path: &Path) -> Result<nix::fcntl::Flock<File>, InPlaceError> {
    use nix::fcntl::{Flock, FlockArg};
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io_err(path))?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(l),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(InPlaceError::Locked {
            path: path.to_path_buf(),
            other: "another run, maybe another user's, that holds a lock on the module file itself"
                .into(),
        }),
        Err((_, e)) => Err(InPlaceError::Lock {
            path: path.to_path_buf(),
            why: e.desc().to_string(),
        }),
    }
}

fn manifest(run_dir: &Path) -> PathBuf {
    RunFolder::at(run_dir).restore_record()
}

impl InPlace {
    /// A guard with nothing planned (no `--edit-in-place` file): config
    /// copies only, or a unit test's edits.
    pub fn new(run_dir: &Path) -> InPlace {
        InPlace {
            dir: std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf()),
            entries: Vec::new(),
            planned: Vec::new(),
            restored: false,
            _locks: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Before anything runs: check that every file to be edited in place
    /// (`files`: (path, text read at start)) can be written, and lock each for
    /// this run. `run_dir`: the run folder, `Err` with why it cannot be written.
    pub fn prepare(
        run_dir: Result<PathBuf, RunDirError>,
        files: &[(&Path, &str)],
    ) -> Result<InPlace, InPlaceError> {
        let dir = match (run_dir, files.is_empty()) {
            (Ok(d), _) => d,
            (Err(_), true) => PathBuf::new(),
            (Err(why), false) => return Err(InPlaceError::NoRunFolder(why)),
        };
        // A record of edits an earlier run did not undo is never overwritten.
        if !dir.as_os_str().is_empty() && fs::symlink_metadata(manifest(&dir)).is_ok() {
            return Err(InPlaceError::PendingRestore { dir });
        }
        let mut g = InPlace::new(&dir);
        for (path, start) in files {
            let real = fs::canonicalize(path).map_err(io_err(path))?;
            check_writable(&real)?;
            g._locks.push(Lock::take(&real, &g.dir)?);
            g.held.push(lock_module(&real)?);
            g.planned.push(Planned {
                given: path.to_path_buf(),
                real,
                start_sha256: sha256(start.as_bytes()),
            });
        }
        Ok(g)
    }

    /// Replace `original`'s content with `text`, keeping the first original.
    /// The file must hold the text read at start (first edit) or what
    /// oomguard last wrote; the record is saved before the file is touched.
    pub fn write(&mut self, original: &Path, text: &str) -> Result<(), InPlaceError> {
        let planned = self.planned.iter().find(|p| p.given == original);
        let real = match planned {
            Some(p) => p.real.clone(),
            None => fs::canonicalize(original).map_err(io_err(original))?,
        };
        let (now, meta) = run_folder::read_nofollow(&real).map_err(io_err(&real))?;
        let now_sha = sha256(&now);
        let new_sha = sha256(text.as_bytes());
        let pos = match self.entries.iter().position(|e| e.original == real) {
            Some(p) => {
                if !self.entries[p].written_sha256.contains(&now_sha) {
                    return Err(InPlaceError::Changed { path: real });
                }
                if !self.entries[p].written_sha256.contains(&new_sha) {
                    self.entries[p].written_sha256.push(new_sha);
                    self.save_manifest()?;
                }
                p
            }
            None => {
                if planned.is_some_and(|p| p.start_sha256 != now_sha) {
                    return Err(InPlaceError::Changed { path: real });
                }
                let store = RunFolder::at(&self.dir).originals();
                create_private_dir(&store).map_err(io_err(&store))?;
                let n = self.entries.len();
                let name = real
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "file".into());
                let entry = Entry {
                    original: real.clone(),
                    backup: store.join(format!("{n}-{name}")),
                    original_sha256: now_sha,
                    written_sha256: vec![new_sha],
                };
                // Keep the original and say how to restore it *before* the edit.
                write_private(&entry.backup, &now).map_err(io_err(&entry.backup))?;
                self.entries.push(entry);
                self.save_manifest()?;
                n
            }
        };
        let e = &self.entries[pos];
        run_folder::replace_with(
            &e.original,
            text.as_bytes(),
            meta.mode() & 0o7777,
            Some((meta.uid(), meta.gid())),
        )
        .map_err(io_err(&e.original))?;
        // The new version is locked as the first was (a moment after the
        // rename: a run starting in that moment is still refused by the
        // per-user lock when it is the same user's).
        let original = e.original.clone();
        if let Ok(l) = lock_module(&original) {
            self.held.push(l);
        }
        Ok(())
    }

    fn save_manifest(&self) -> Result<(), InPlaceError> {
        save(&self.dir, &self.entries)
    }

    /// Write an attempt's changed config copies, readable by the user only
    /// (and, with --edit-in-place, the edited originals, kept and restored).
    pub fn write_derived(&mut self, files: &[crate::knobs::Derived]) -> Result<(), DerivedError> {
        let copy = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DerivedError::Copy { path, source }
        };
        for f in files {
            if f.in_place {
                self.write(&f.dest, &f.text)
                    .map_err(DerivedError::InPlace)?;
                continue;
            }
            if let Some(parent) = f.dest.parent() {
                create_private_dir(parent).map_err(copy(parent))?;
            }
            write_private(&f.dest, f.text.as_bytes()).map_err(copy(&f.dest))?;
        }
        Ok(())
    }

    /// Put every original back, once. Returns one line per file for the user.
    pub fn restore(&mut self) -> Vec<String> {
        if self.restored || self.entries.is_empty() {
            self.restored = true;
            return Vec::new();
        }
        self.restored = true;
        let entries = std::mem::take(&mut self.entries);
        let (lines, left) = restore_entries(&self.dir, &entries);
        if let Err(e) = save(&self.dir, &left) {
            let mut lines = lines;
            lines.push(format!("cannot update the restore record: {e}"));
            return lines;
        }
        lines
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        for l in self.restore() {
            crate::report::terminal::get().say(&l);
        }
    }
}

/// Save the record of `entries` in `run_dir`, or remove it when none is left.
fn save(run_dir: &Path, entries: &[Entry]) -> Result<(), InPlaceError> {
    let path = manifest(run_dir);
    if entries.is_empty() {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        };
    }
    let m = Manifest {
        oomguard_restore: MANIFEST_VERSION,
        files: entries.to_vec(),
    };
    let json = serde_json::to_vec_pretty(&m).expect("manifest serializes");
    write_private(&path, &json).map_err(io_err(&path))
}

/// A file that can be edited in place: a regular file with a write
/// permission bit that the user can write, in a folder the user can write
/// (the edit is a new file renamed over it).
fn check_writable(path: &Path) -> Result<(), InPlaceError> {
    use nix::unistd::{AccessFlags, access};
    let bad = |why: String| InPlaceError::NotWritable {
        path: path.to_path_buf(),
        why,
    };
    let m = fs::metadata(path).map_err(|e| bad(format!("cannot be examined ({e})")))?;
    if !m.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    // Root may write anything; a file nobody may write was made read-only on
    // purpose, and is not edited behind its owner's back.
    if m.mode() & 0o222 == 0 {
        return Err(bad(format!("is read-only (mode {:o})", m.mode() & 0o7777)));
    }
    if let Err(e) = access(path, AccessFlags::W_OK) {
        return Err(bad(format!("cannot be written by you ({})", e.desc())));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    if let Err(e) = access(dir, AccessFlags::W_OK) {
        return Err(bad(format!(
            "its folder {} cannot be written by you ({}; the edit is a new file renamed over it)",
            dir.display(),
            e.desc()
        )));
    }
    Ok(())
}

/// An exclusive `flock` on a lock file keyed by a module's absolute path,
/// held for the run. Not removed afterwards: removing a lock file races with
/// the next run opening it.
struct Lock {
    _file: nix::fcntl::Flock<File>,
}

/// The private per-user folder of lock files: `$XDG_RUNTIME_DIR/oomguard/locks`,
/// else `$XDG_CACHE_HOME` or `~/.cache` `/oomguard/locks`.
fn lock_dir() -> Option<PathBuf> {
    let abs = |v: std::ffi::OsString| {
        let p = PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").and_then(abs) {
        return Some(d.join("oomguard/locks"));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .and_then(abs)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(abs)
                .map(|h| h.join(".cache"))
        })?;
    Some(cache.join("oomguard/locks"))
}

/// The lock file of the module at `path` (absolute), in `dir`.
fn lock_file(dir: &Path, path: &Path) -> PathBuf {
    let key = sha256(run_folder::path_bytes(path));
    dir.join(format!("{}.lock", &key[..32]))
}

impl Lock {
    fn open(path: &Path) -> Result<File, InPlaceError> {
        let lock_err = |why: String| InPlaceError::Lock {
            path: path.to_path_buf(),
            why,
        };
        let dir = lock_dir().ok_or_else(|| {
            lock_err("neither XDG_RUNTIME_DIR nor HOME says where the lock files go".into())
        })?;
        run_folder::ensure_private_dir(&dir).map_err(|e| lock_err(e.to_string()))?;
        let file = lock_file(&dir, path);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&file)
            .map_err(|e| lock_err(format!("{}: {e}", file.display())))
    }

    /// Lock `path` for this run (`run_dir`), or say which run holds it.
    fn take(path: &Path, run_dir: &Path) -> Result<Lock, InPlaceError> {
        use nix::fcntl::{Flock, FlockArg};
        let f = Lock::open(path)?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(mut locked) => {
                let who = format!(
                    "pid {}, run folder {}\n",
                    std::process::id(),
                    run_dir.display()
                );
                let _ = locked.set_len(0);
                let _ = locked.write_all(who.as_bytes());
                Ok(Lock { _file: locked })
            }
            Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut who = String::new();
                let _ = f.read_to_string(&mut who);
                let who = who.trim();
                Err(InPlaceError::Locked {
                    path: path.to_path_buf(),
                    other: if who.is_empty() {
                        "a run that has not said which yet".into()
                    } else {
                        who.to_string()
                    },
                })
            }
            Err((_, e)) => Err(InPlaceError::Lock {
                path: path.to_path_buf(),
                why: e.desc().to_string(),
            }),
        }
    }
}

/// At most this much of a module or a lock file is read to tell its content.
const READ_CAP: u64 = 16 << 20;

/// A regular file's content, read without following a link or blocking (a
/// FIFO planted at the name), at most [`READ_CAP`] bytes; `None` otherwise.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > READ_CAP {
        return None;
    }
    let mut buf = Vec::new();
    f.take(READ_CAP).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// The run folder the lock file of `real` names: the last run that locked it.
fn last_locker(real: &Path) -> Option<PathBuf> {
    let text = read_small(&lock_file(&lock_dir()?, real))?;
    let text = String::from_utf8_lossy(&text);
    let (_, dir) = text.lines().next()?.split_once(", run folder ")?;
    let dir = PathBuf::from(dir);
    dir.is_absolute().then_some(dir)
}

/// Whether a run that is going holds the lock of `real` now (its lock file
/// exists and cannot be locked).
fn locked_now(real: &Path) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let Some(dir) = lock_dir() else {
        return false;
    };
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(lock_file(&dir, real))
    else {
        return false;
    };
    matches!(
        Flock::lock(f, FlockArg::LockExclusiveNonblock),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

/// The edits in `entries` that `real` (content hash `now`) still holds.
fn holds_edit(entries: &[Entry], real: &Path, now: &str) -> bool {
    entries.iter().any(|e| {
        e.original == real && e.original_sha256 != now && e.written_sha256.iter().any(|w| w == now)
    })
}

/// Before anything is created or run: a file to be edited in place that still
/// holds the edit of a run that did not finish (oomguard SIGKILLed, the machine
/// rebooted) is refused, naming that run's folder to `oomguard restore`. A run
/// started now would read the edited values as the originals, and its own
/// restore would put the edited text back: the user's config would drift for
/// good. That run is found by the lock file of the module (which names the last
/// run folder that locked it) and among the run folders under `.oomguard/runs`
/// here; its `restore.json` must be trusted and name this file, and the file
/// must hold a text that run wrote. A run still going (it holds the lock) is
/// left to [`InPlace::prepare`], which names it.
pub fn check_unfinished(files: &[&Path]) -> Result<(), InPlaceError> {
    for path in files {
        let Ok(real) = fs::canonicalize(path) else {
            continue;
        };
        let Some(now) = read_small(&real) else {
            continue;
        };
        let now = sha256(&now);
        let mut dirs: Vec<PathBuf> = last_locker(&real).into_iter().collect();
        if let Ok(rd) = fs::read_dir(crate::run_folder::runs_root()) {
            let mut here: Vec<PathBuf> = rd
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            here.sort();
            dirs.extend(here);
        }
        for dir in dirs {
            let Ok(Some(entries)) = read_manifest(&dir) else {
                continue;
            };
            if holds_edit(&entries, &real, &now) && !locked_now(&real) {
                return Err(InPlaceError::Unfinished {
                    path: path.to_path_buf(),
                    dir,
                });
            }
        }
    }
    Ok(())
}

/// The files the restore record of `run_dir` names that still hold a text its
/// run wrote: edited in place and not put back (`oomguard status`, `runs`).
pub fn still_edited(run_dir: &Path) -> Vec<PathBuf> {
    let Ok(Some(entries)) = read_manifest(run_dir) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|e| {
            read_small(&e.original).is_some_and(|b| holds_edit(&entries, &e.original, &sha256(&b)))
        })
        .map(|e| e.original.clone())
        .collect()
}

/// Restore `entries` (recorded in `run_dir`): the lines for the user, and the
/// entries not undone (their record is kept).
fn restore_entries(run_dir: &Path, entries: &[Entry]) -> (Vec<String>, Vec<Entry>) {
    let mut out = Vec::new();
    let mut left = Vec::new();
    for e in entries {
        let (line, done) = restore_one(run_dir, e);
        out.push(line);
        if !done {
            left.push(e.clone());
        }
    }
    (out, left)
}

/// Put one original back when the file holds what oomguard wrote and the
/// backup is the recorded original. (line for the user, undone).
fn restore_one(run_dir: &Path, e: &Entry) -> (String, bool) {
    let shown = e.original.display();
    // The backup is looked for in this run folder whatever the record says:
    // the folder may have been moved, and no record can point elsewhere.
    let backup = match e.backup.file_name() {
        Some(name) => RunFolder::at(run_dir).originals().join(name),
        None => return (format!("{shown}: the record names no backup"), false),
    };
    let now = match run_folder::read_nofollow(&e.original) {
        Ok((bytes, m)) if m.is_file() => (sha256(&bytes), m),
        Ok(_) => {
            return (
                format!("{shown} is not a regular file now: left as it is"),
                false,
            );
        }
        Err(err) => {
            return (
                format!(
                    "cannot read {shown}: {err}; the original is in {}",
                    backup.display()
                ),
                false,
            );
        }
    };
    let (now_sha, meta) = now;
    if now_sha == e.original_sha256 {
        return (format!("{shown} is already the original"), true);
    }
    if !e.written_sha256.contains(&now_sha) {
        return (
            format!(
                "{shown} was changed by someone else since oomguard edited it: left as it is; the original is in {}",
                backup.display()
            ),
            false,
        );
    }
    let bytes = match run_folder::read_nofollow(&backup) {
        Ok((b, m)) if m.is_file() && sha256(&b) == e.original_sha256 => b,
        Ok(_) => {
            return (
                format!(
                    "{shown}: the backup {} is not the original oomguard kept: left as it is",
                    backup.display()
                ),
                false,
            );
        }
        Err(err) => {
            return (
                format!(
                    "cannot restore {shown}: the backup {}: {err}",
                    backup.display()
                ),
                false,
            );
        }
    };
    match run_folder::replace_with(
        &e.original,
        &bytes,
        meta.mode() & 0o7777,
        Some((meta.uid(), meta.gid())),
    ) {
        Ok(()) => (format!("restored {shown} (edited in place)"), true),
        Err(err) => (
            format!(
                "cannot restore {shown}: {err}; the original is in {}",
                backup.display()
            ),
            false,
        ),
    }
}

/// Why a run folder's `restore.json` is not used: `oomguard restore` says
/// it; a run starting or `status` skip the folder.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// Not a regular file, too large, another user's, or writable by others.
    #[error(
        "{} is not a file of yours that only you can write: it is not trusted",
        path.display()
    )]
    Untrusted { path: PathBuf },
    /// Older versions wrote a list, without the hashes of what they wrote.
    #[error(
        "{} is not a restore record of this oomguard version (it has the form an older oomguard wrote, without the content hashes that tell its own edits): nothing restored; the originals are in {}",
        path.display(), originals.display()
    )]
    Older { path: PathBuf, originals: PathBuf },
    #[error(
        "{} is not a restore record of this oomguard version ({source}): nothing restored; the originals are in {}",
        path.display(), originals.display()
    )]
    NotARecord {
        path: PathBuf,
        originals: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{} has version {found}, this oomguard reads version {MANIFEST_VERSION}",
        path.display()
    )]
    Version { path: PathBuf, found: u32 },
    #[error(
        "{} names a relative path ({}): it is not trusted",
        path.display(), named.display()
    )]
    RelativePath { path: PathBuf, named: PathBuf },
}

/// Read and check `restore.json` of `run_dir`: a regular file of the user's,
/// writable by nobody else, of this version, naming absolute paths.
fn read_manifest(run_dir: &Path) -> Result<Option<Vec<Entry>>, RecordError> {
    let path = manifest(run_dir);
    // Without blocking (a FIFO planted at the name) and only a regular file,
    // with a size cap: a run folder may be another run's, read by `status`.
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    let read_err = |source| RecordError::Read {
        path: path.clone(),
        source,
    };
    let (text, m) = match opened.and_then(|f| Ok((f.metadata()?, f))) {
        Ok((m, f)) if m.is_file() && m.len() <= READ_CAP => {
            let mut buf = Vec::new();
            f.take(READ_CAP).read_to_end(&mut buf).map_err(read_err)?;
            (buf, m)
        }
        Ok((m, _)) => (Vec::new(), m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    if !m.is_file()
        || m.len() > READ_CAP
        || m.uid() != nix::unistd::geteuid().as_raw()
        || m.mode() & 0o022 != 0
    {
        return Err(RecordError::Untrusted { path });
    }
    let parsed: Manifest = match serde_json::from_slice(&text) {
        Ok(p) => p,
        Err(source) => {
            let originals = RunFolder::at(run_dir).originals();
            return Err(match serde_json::from_slice::<serde_json::Value>(&text) {
                Ok(serde_json::Value::Array(_)) => RecordError::Older { path, originals },
                _ => RecordError::NotARecord {
                    path,
                    originals,
                    source,
                },
            });
        }
    };
    if parsed.oomguard_restore != MANIFEST_VERSION {
        return Err(RecordError::Version {
            path,
            found: parsed.oomguard_restore,
        });
    }
    if let Some(e) = parsed.files.iter().find(|e| !e.original.is_absolute()) {
        return Err(RecordError::RelativePath {
            path,
            named: e.original.clone(),
        });
    }
    Ok(Some(parsed.files))
}

/// `oomguard restore RUN_DIR`: after a hard kill, put the originals back.
pub fn restore_main(run_dir: &Path) -> i32 {
    // A mistyped path is not "nothing to restore": say so, and where runs live.
    if !run_dir.is_dir() {
        let term = crate::report::terminal::get();
        term.error(&format!("no run folder at {}", run_dir.display()));
        term.say(
            "runs live under .oomguard/runs/<time>/ in the directory the run was started \
             from (or where its --run-dir said): oomguard restore .oomguard/runs/<time>",
        );
        return crate::exit::USAGE;
    }
    // A folder someone else can write holds a record someone else can write.
    if let Err(e) = run_folder::check_private_dir(run_dir) {
        crate::report::terminal::get().error(&e.to_string());
        return crate::exit::USAGE;
    }
    let entries = match read_manifest(run_dir) {
        Ok(Some(e)) => e,
        Ok(None) => {
            println!(
                "nothing to restore: {} has no restore.json (no file was edited in place, or it was already restored)",
                run_dir.display()
            );
            return crate::exit::SUCCESS;
        }
        Err(e) => {
            crate::report::terminal::get().error(&e.to_string());
            return crate::exit::USAGE;
        }
    };
    // A run still going holds its files' locks: leave those to it.
    let mut locks = Vec::new();
    let mut mine = Vec::new();
    let mut left = Vec::new();
    for e in entries {
        match Lock::take(&e.original, run_dir) {
            Ok(l) => {
                locks.push(l);
                mine.push(e);
            }
            Err(err @ InPlaceError::Locked { .. }) => {
                println!("{err}: not restored now");
                left.push(e);
            }
            // No lock folder: restore anyway (the run that edited it is gone
            // or could not have locked either).
            Err(_) => mine.push(e),
        }
    }
    let (lines, undone) = restore_entries(run_dir, &mine);
    for l in lines {
        println!("{l}");
    }
    left.extend(undone);
    if let Err(e) = save(run_dir, &left) {
        crate::report::terminal::get().error(&format!("cannot update the restore record: {e}"));
        return crate::exit::CANNOT_WRITE;
    }
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
        // The record of the edit that was not undone is kept.
        let left = read_manifest(&run).unwrap().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].original, fs::canonicalize(&b).unwrap());
    }

    #[test]
    fn cleanup_runs_once_and_keeps_the_record_of_an_edit_not_undone() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("c.py");
        fs::write(&f, "X = 1\n").unwrap();
        let run = t.path().join("run");
        let mut g = InPlace::new(&run);
        g.write(&f, "X = 2\n").unwrap();
        fs::write(&f, "X = 3  # the user's\n").unwrap();
        let lines = g.restore();
        assert!(lines[0].contains("changed by someone else"), "{lines:?}");
        assert!(g.restore().is_empty(), "a second cleanup does nothing");
        drop(g);
        assert!(run.join("restore.json").exists(), "the record is kept");
    }

    #[test]
    fn an_edit_over_a_users_change_is_refused_and_a_failed_edit_leaves_the_file() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("c.py");
        fs::write(&f, "X = 1\n").unwrap();
        let mut g = InPlace::new(&t.path().join("run"));
        g.write(&f, "X = 2\n").unwrap();
        fs::write(&f, "X = 7\n").unwrap();
        assert!(matches!(
            g.write(&f, "X = 4\n"),
            Err(InPlaceError::Changed { .. })
        ));
        assert_eq!(fs::read_to_string(&f).unwrap(), "X = 7\n");
    }
}
