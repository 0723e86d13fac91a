//! The run folder and every file oomguard writes: created fresh and private,
//! opened without following symlinks, never written through an existing entry.
//!
//! Theory of operation. A run folder another user can write is one where they
//! can plant a symlink (`attempt-2/ds.json -> ~/.bashrc`) or swap the folder
//! between attempts, and make oomguard truncate or overwrite a file of the
//! victim's with the command's output or a config copy (a `.py` config copy the
//! trainer executes is code execution). So:
//!
//! - the default run folder `.oomguard/runs/<time>` is created with
//!   `create_dir` (exclusive: two runs started in the same second get `<time>`
//!   and `<time>-2`, never one folder between them), mode 0700;
//! - an existing folder oomguard is asked to use (`--run-dir`, `.oomguard`,
//!   `.oomguard/runs`) must be a real folder (not a symlink) owned by the user
//!   and writable by nobody else, and its parent must not be world-writable
//!   without the sticky bit; otherwise the run is refused before anything runs;
//! - files are created with `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600, under a
//!   fresh name, and renamed into place ([`write_private`]): a planted symlink
//!   is replaced, never followed, and a crash never leaves half a file;
//! - when the run folder cannot be written at all, the config copies go to a
//!   fresh temporary folder with a random name made by `mkdtemp` (0700), never
//!   to a predictable `/tmp/oomguard-<pid>`.

/// The first bytes of an attempt's output, written to `attempt-N/output.log`
/// as they come; the rest reaches the file when the attempt ends (its tail).
/// `oomguard status` reads the step from the log, live only this far.
pub const LOG_HEAD_BYTES: u64 = 8 << 20;
/// The last bytes of an attempt's output kept for its log, in memory until it ends.
pub const LOG_TAIL_BYTES: u64 = 1 << 20;

/// Where a log left bytes out between its head and its tail, this line stands:
/// `[oomguard: N bytes omitted]`.
const OMITTED_START: &[u8] = b"[oomguard: ";
const OMITTED_END: &[u8] = b" bytes omitted]\n";

/// The line a log holds where `n` bytes were left out (with the line end before it).
pub fn omitted_marker(n: u64) -> Vec<u8> {
    [b"\n", OMITTED_START, n.to_string().as_bytes(), OMITTED_END].concat()
}

/// Whether `text` may hold a log's omitted-bytes line (its start is enough).
pub fn may_hold_omitted(text: &[u8]) -> bool {
    memchr::memmem::find(text, OMITTED_START).is_some()
}

/// The end of a log: what follows its last omitted-bytes line, where the run's first
/// lines (its loading) stand before output from much later; all of `buf` without one.
pub fn after_omitted(buf: &[u8]) -> &[u8] {
    let mut end = buf.len();
    while let Some(at) = memchr::memmem::rfind(&buf[..end], OMITTED_END) {
        let line = memchr::memrchr(b'\n', &buf[..at]).map_or(0, |i| i + 1);
        let digits = buf[line..at].strip_prefix(OMITTED_START);
        if digits.is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit)) {
            return &buf[at + OMITTED_END.len()..];
        }
        end = at;
    }
    buf
}

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The names oomguard gives the files and folders it writes: spelled here
/// and nowhere else, so that the run that writes them, `status`, `runs`,
/// `restore` and a requeued job agree on them.
///
/// A run folder holds:
///
/// ```text
/// .oomguard/runs/<time>/     the default run folder (or --run-dir)
///   journal.jsonl            one JSON object a line (see `journal`)
///   attempt-N/               one folder per attempt: its config copies and
///     output.log             its output (head and tail)
///   restore.json             the record of files edited in place
///   originals/               their originals, until restored
///   previous-run             a requeued job's earlier run folder
/// ```
///
/// and beside a job's checkpoints, `<root>/.oomguard-job/<key>/fitting.json`:
/// the settings a Slurm or Kubernetes job last launched with.
pub mod names {
    /// Where default run folders are made, relative to the folder a run is
    /// started from.
    pub const RUNS: &str = ".oomguard/runs";
    pub const JOURNAL: &str = "journal.jsonl";
    pub const OUTPUT_LOG: &str = "output.log";
    pub const RESTORE: &str = "restore.json";
    pub const ORIGINALS: &str = "originals";
    pub const PREVIOUS_RUN: &str = "previous-run";
    /// A job's folder beside its checkpoints (see `job`).
    pub const JOB: &str = ".oomguard-job";
    pub const FITTING: &str = "fitting.json";

    /// `attempt-N`.
    pub fn attempt(n: u32) -> String {
        format!("attempt-{n}")
    }
}

/// A run folder's paths. Naming only: it creates nothing (see
/// [`create_run_dir`] and `journal::Journal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFolder {
    dir: PathBuf,
}

impl RunFolder {
    pub fn at(dir: impl Into<PathBuf>) -> RunFolder {
        RunFolder { dir: dir.into() }
    }

    /// `.oomguard/runs/<local time>`: the name a run folder starts from
    /// ([`create_run_dir`] adds `-2`, `-3`... when another run took it).
    pub fn default_name() -> PathBuf {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
        runs_root().join(stamp)
    }

    pub fn journal(&self) -> PathBuf {
        self.dir.join(names::JOURNAL)
    }

    /// The folder of attempt `n`.
    pub fn attempt(&self, n: u32) -> PathBuf {
        self.dir.join(names::attempt(n))
    }

    /// Attempt `n`'s output.
    pub fn output_log(&self, n: u32) -> PathBuf {
        output_log_in(&self.attempt(n))
    }

    /// The record of the files edited in place (`oomguard restore`).
    pub fn restore_record(&self) -> PathBuf {
        self.dir.join(names::RESTORE)
    }

    /// Where the originals of files edited in place are kept.
    pub fn originals(&self) -> PathBuf {
        self.dir.join(names::ORIGINALS)
    }

    /// A requeued job's note of its earlier run folder.
    pub fn previous_run(&self) -> PathBuf {
        self.dir.join(names::PREVIOUS_RUN)
    }
}

/// `.oomguard/runs`: where default run folders are made (relative to the
/// folder the run is started from).
pub fn runs_root() -> PathBuf {
    PathBuf::from(names::RUNS)
}

/// `DIR/output.log`, for an attempt's folder `DIR`.
pub fn output_log_in(attempt_dir: &Path) -> PathBuf {
    attempt_dir.join(names::OUTPUT_LOG)
}

/// A job's folder under a checkpoint root: `<root>/.oomguard-job`.
pub fn job_root(root: &Path) -> PathBuf {
    root.join(names::JOB)
}

/// `<job folder>/fitting.json`.
pub fn fitting_in(job_dir: &Path) -> PathBuf {
    job_dir.join(names::FITTING)
}

/// An existing folder oomguard will not use: someone else could change what is
/// in it. A usage error (exit 2), before anything runs.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} {why}: someone else could plant files in it; oomguard will not use it. {advice}",
    path.display()
)]
pub struct Unsafe {
    pub path: PathBuf,
    pub why: String,
    pub advice: &'static str,
}

/// Why a run folder could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// Exists but is not safe to use: refuse the run.
    #[error(transparent)]
    Unsafe(#[from] Unsafe),
    /// Cannot be created (read-only file system, permission, disk full): the
    /// run goes on without a journal.
    #[error("cannot create the run folder {}: {source}", path.display())]
    Unwritable { path: PathBuf, source: io::Error },
}

const ADVICE_DIR: &str = "Give a new --run-dir (it is created readable by you only), or make this one yours with `chmod go-w`";

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Check that an existing `dir` is a folder (not a symlink), owned by the
/// user, and writable by nobody else.
pub fn check_private_dir(dir: &Path) -> Result<(), Unsafe> {
    let bad = |why: String| Unsafe {
        path: dir.to_path_buf(),
        why,
        advice: ADVICE_DIR,
    };
    let m = fs::symlink_metadata(dir).map_err(|e| bad(format!("cannot be examined ({e})")))?;
    if m.file_type().is_symlink() {
        return Err(bad("is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(bad("is not a folder".into()));
    }
    if m.uid() != euid() {
        return Err(bad(format!(
            "is owned by another user (uid {}, you are {})",
            m.uid(),
            euid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(bad(format!(
            "is writable by others (mode {:o})",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The parent of a folder oomguard uses must not let others rename it away
/// and put their own in its place: world-writable is refused unless sticky
/// (`/tmp`).
fn check_parent(dir: &Path) -> Result<(), Unsafe> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(m) = fs::metadata(&parent) else {
        return Ok(()); // created below, by us
    };
    if m.mode() & 0o002 != 0 && m.mode() & 0o1000 == 0 {
        return Err(Unsafe {
            path: parent,
            why: format!(
                "is writable by everyone without the sticky bit (mode {:o}), so the run folder in it could be swapped",
                m.mode() & 0o7777
            ),
            advice: "Put the run folder somewhere only you can write (--run-dir)",
        });
    }
    Ok(())
}

/// Make `dir` a private folder: create it (0700), or check an existing one
/// with [`check_private_dir`]. Missing parents are created 0700 too.
pub fn ensure_private_dir(dir: &Path) -> Result<(), RunDirError> {
    match fs::symlink_metadata(dir) {
        Ok(_) => return Ok(check_private_dir(dir)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(RunDirError::Unwritable {
                path: dir.to_path_buf(),
                source: e,
            });
        }
    }
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        ensure_private_dir(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        // Someone (maybe another run) made it meanwhile: it must pass the checks.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(check_private_dir(dir)?),
        Err(e) => Err(RunDirError::Unwritable {
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

/// As [`ensure_private_dir`], with plain `io::Error`s (for folders inside a
/// run folder that was checked already).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    ensure_private_dir(dir).map_err(|e| match e {
        RunDirError::Unwritable { source, .. } => source,
        RunDirError::Unsafe(u) => io::Error::new(io::ErrorKind::PermissionDenied, u.to_string()),
    })
}

/// Create the run folder. `given`: the user named it (`--run-dir`): an
/// existing one is used when it is private and the user's. Otherwise `dir` is
/// `.oomguard/runs/<time>`: created exclusively, with `-2`, `-3`... when
/// another run took the name first. Returns the folder created or checked.
pub fn create_run_dir(dir: &Path, given: bool) -> Result<PathBuf, RunDirError> {
    if given {
        check_parent(dir)?;
        ensure_private_dir(dir)?;
        return Ok(dir.to_path_buf());
    }
    let base = dir.parent().unwrap_or(Path::new("."));
    // `.oomguard`: the folder oomguard puts in the user's directory.
    check_parent(base.parent().unwrap_or(Path::new(".")))?;
    ensure_private_dir(base)?;
    let stamp = dir.file_name().unwrap_or_default().to_os_string();
    for n in 1u32.. {
        let mut name = stamp.clone();
        if n > 1 {
            name.push(format!("-{n}"));
        }
        let candidate = base.join(&name);
        match fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(RunDirError::Unwritable {
                    path: candidate,
                    source: e,
                });
            }
        }
    }
    unreachable!("u32 names run out")
}

/// A fresh private folder with a random name under the temporary folder
/// (`mkdtemp`, mode 0700): where config copies go when the run folder cannot
/// be written. Never a predictable name another user could plant first.
pub fn fresh_temp_dir() -> io::Result<PathBuf> {
    let template = std::env::temp_dir().join("oomguard-XXXXXX");
    nix::unistd::mkdtemp(&template).map_err(io::Error::from)
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A name beside `path` that no one else is likely to have taken:
/// `.NAME.oomguard-PID-N.tmp`.
fn temp_name(path: &Path) -> PathBuf {
    let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().unwrap_or_default();
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".oomguard-{}-{n}.tmp", std::process::id()));
    path.with_file_name(tmp)
}

/// Create `path` new: `O_CREAT|O_EXCL|O_NOFOLLOW`, with `mode`. Fails on any
/// existing entry, a symlink included; never follows or truncates one.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Write `bytes` to `path` readable by the user only, atomically: a new file
/// beside it (created exclusively, not following symlinks) renamed over it.
/// An entry already at `path` — a planted symlink included — is replaced,
/// never written through.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_with(path, bytes, 0o600, None)
}

/// Replace `path` with `bytes`: write a new file in the same folder (mode
/// `mode`; owner `owner` when given, as far as the user may), flush it to
/// disk, and rename it over `path`. On any error the new file is removed and
/// `path` is left as it was.
pub fn replace_with(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    let (tmp, mut f) = loop {
        let tmp = temp_name(path);
        match create_new(&tmp, 0o600) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let written = (|| {
        if let Some((uid, gid)) = owner {
            // Root editing someone's module keeps its owner; anyone else
            // cannot give a file away, and keeps the group where allowed.
            let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
        }
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Open `path` for appending without following a symlink, creating it
/// (0600) when absent. Only a regular file of the user's with one link is
/// accepted: an entry someone linked to another file is refused.
pub fn open_append(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != euid() || m.nlink() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a regular file of yours with a single link",
                path.display()
            ),
        ));
    }
    Ok(f)
}

/// The most [`read_nofollow`] reads (a module, a kept original).
const MAX_READ: u64 = 64 << 20;

/// Read `path` without following a symlink at its last component, without
/// blocking on a FIFO: a regular file of at most 64 MiB.
pub fn read_nofollow(path: &Path) -> io::Result<(Vec<u8>, fs::Metadata)> {
    use std::io::Read;
    let expect = crate::untrusted::Expect {
        no_link: true,
        ..Default::default()
    };
    let (f, m) = crate::untrusted::open(path, expect)?;
    if m.len() > MAX_READ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is larger than {} MiB", path.display(), MAX_READ >> 20),
        ));
    }
    let mut buf = Vec::new();
    f.take(MAX_READ).read_to_end(&mut buf)?;
    Ok((buf, m))
}

/// Lower-case hex SHA-256 of `bytes`: how oomguard tells a file's content.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// `path` as bytes, for a lock key.
pub fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log whose middle oomguard left out: its first lines (the run's loading)
    /// are not read as what came before the OOM.
    #[test]
    fn the_lines_before_an_omitted_marker_are_not_read() {
        let log = b"Loading checkpoint shards: 100%|##| 2/2\n[oomguard: 12345 bytes omitted]\nstep 9\ntorch.OutOfMemoryError: CUDA out of memory.\n";
        assert_eq!(
            after_omitted(log),
            &b"step 9\ntorch.OutOfMemoryError: CUDA out of memory.\n"[..]
        );
        let plain = b"a line that says [oomguard: x bytes omitted]\nstep 1\n";
        assert_eq!(after_omitted(plain), &plain[..]);
        assert_eq!(
            omitted_marker(12345),
            b"\n[oomguard: 12345 bytes omitted]\n"
        );
        assert!(may_hold_omitted(&omitted_marker(1)));
    }

    #[test]
    fn run_folder_names_every_path_once() {
        let f = RunFolder::at("/r");
        assert_eq!(f.journal(), Path::new("/r/journal.jsonl"));
        assert_eq!(f.attempt(3), Path::new("/r/attempt-3"));
        assert_eq!(f.output_log(3), Path::new("/r/attempt-3/output.log"));
        assert_eq!(f.restore_record(), Path::new("/r/restore.json"));
        assert_eq!(f.originals(), Path::new("/r/originals"));
        assert_eq!(f.previous_run(), Path::new("/r/previous-run"));
        assert_eq!(
            fitting_in(&job_root(Path::new("/ck")).join("slurm-7")),
            Path::new("/ck/.oomguard-job/slurm-7/fitting.json")
        );
        let d = RunFolder::default_name();
        assert_eq!(d.parent(), Some(Path::new(".oomguard/runs")));
        let stamp = d.file_name().unwrap().to_str().unwrap();
        assert_eq!(stamp.len(), "20260101-000000".len(), "{stamp}");
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn two_runs_in_the_same_second_get_two_folders() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join(".oomguard/runs/20260101-000000");
        let a = create_run_dir(&dir, false).unwrap();
        let b = create_run_dir(&dir, false).unwrap();
        let c = create_run_dir(&dir, false).unwrap();
        assert_eq!(a, dir);
        assert_eq!(b, t.path().join(".oomguard/runs/20260101-000000-2"));
        assert_eq!(c, t.path().join(".oomguard/runs/20260101-000000-3"));
        for d in [&a, &b, &c, &t.path().join(".oomguard/runs")] {
            assert_eq!(mode(d), 0o700, "{}", d.display());
        }
    }

    #[test]
    fn an_existing_folder_writable_by_others_or_a_symlink_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = create_run_dir(&open, true).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        let e = create_run_dir(&link, true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Inside a world-writable folder without the sticky bit.
        let e = create_run_dir(&open.join("run"), true).unwrap_err();
        assert!(e.to_string().contains("sticky"), "{e}");
        let mine = t.path().join("mine");
        assert_eq!(create_run_dir(&mine, true).unwrap(), mine);
        assert_eq!(mode(&mine), 0o700);
        // An existing private one of the user's is used as it is.
        assert_eq!(create_run_dir(&mine, true).unwrap(), mine);
    }

    #[test]
    fn write_private_replaces_a_planted_symlink_and_never_follows_it() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, "precious\n").unwrap();
        let p = t.path().join("ds.json");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_private(&p, b"{}\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(fs::read_to_string(&p).unwrap(), "{}\n");
        assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        assert_eq!(mode(&p), 0o600);
        // No temporary file is left beside it.
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 2);
        // Appending refuses a symlink.
        let j = t.path().join("journal.jsonl");
        std::os::unix::fs::symlink(&victim, &j).unwrap();
        assert!(open_append(&j).is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    #[test]
    fn the_fallback_folder_is_fresh_random_and_private() {
        let a = fresh_temp_dir().unwrap();
        let b = fresh_temp_dir().unwrap();
        assert_ne!(a, b);
        assert_eq!(mode(&a), 0o700);
        assert_ne!(
            a.file_name().unwrap().to_string_lossy(),
            format!("oomguard-{}", std::process::id())
        );
        fs::remove_dir(&a).unwrap();
        fs::remove_dir(&b).unwrap();
    }

    #[test]
    fn sha256_of_known_text() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
