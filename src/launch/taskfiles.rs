//! Per-task output files: with `srun --output=logs/%j-%t.out` (or `--error`, or
//! `SLURM_STDOUTMODE`/`SLURM_STDERRMODE`), each task writes to its own file and
//! nothing of it passes through srun, so oomguard reads those files too.
//!
//! # Theory of operation
//!
//! srun's file name pattern is turned into a matcher: `%j` (job), `%s` (step) and
//! `%J` (job.step) become the step's own numbers once they are known — the
//! allocation's `SLURM_JOB_ID`, and the step that srun's host and pid name in
//! `scontrol show step` (looked up on a helper thread, so a slow controller never
//! holds the output loop) — and `%u` our user's name; the per-task and per-node
//! fields (`%t`, `%n`, `%N`), the job name (`%x`) and the array fields (`%A`,
//! `%a`, `%b`) match any value. Relative patterns are relative to srun's working
//! directory (oomguard's), as srun opens them: `--chdir` moves the tasks, not
//! the files.
//!
//! A file the pattern matches is this attempt's only once it changed after the
//! attempt started: every matching file is noted (inode, size, modification time,
//! a hash of its first bytes) before the command starts, and a noted file is read
//! only after one of those changed — from its old end when its first bytes are
//! the same (srun's `--open-mode=append`), else from the start (srun truncated it
//! for the new step). So an older step's OOM in a reused file is never taken for
//! this attempt's, whatever the open mode.
//!
//! Files are looked for every second and read every [`READ_EVERY`] — less often
//! with many files, at most [`READS_PER_SECOND`] file reads a second, so that a
//! job of hundreds of tasks does not load a shared filesystem — whole lines at a
//! time (a line is the scanner's unit; the last, unfinished one waits for its
//! end, or for the end of the attempt). A look reads at most [`READ_CHUNK`] of a
//! file; a reader left more than [`MAX_LAG`] behind skips to the file's last
//! bytes, and the last look, after the step, reads at most the last
//! [`FINAL_READ`]: a rank's death is at the end of its file.
//!
//! Known limit: a field a pattern holds in a folder name (`logs/%j/%t.out`) is
//! matched folder by folder, at most [`MAX_ENTRIES`] entries a look.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;

/// How often the known files are read while the step runs (with few of them).
pub(crate) const READ_EVERY: Duration = Duration::from_millis(250);
/// At most this many file reads a second, whatever the number of files.
const READS_PER_SECOND: u32 = 200;
/// How often the folders are listed for new files (at least; with many files,
/// four reads' time).
const LIST_EVERY: Duration = Duration::from_secs(1);
/// Farther behind than this, reading skips to the file's last [`READ_CHUNK`].
const MAX_LAG: u64 = 64 << 20;
/// When the step's numbers are still unknown this long after the start (no
/// `scontrol`, a controller that does not answer), `%j`/`%s` match any number:
/// the changed-since-the-start rule still keeps older steps' files out.
const STEP_WAIT: Duration = Duration::from_secs(10);
/// At most this many bytes of one file per read (the rest comes next time).
const READ_CHUNK: usize = 1 << 20;
/// At the end of the attempt, at most the last this-many bytes of each file.
const FINAL_READ: u64 = 16 << 20;
/// A line longer than this is passed on unfinished (the scanner bounds lines too).
const MAX_PARTIAL: usize = 256 * 1024;
/// The first bytes of a file that tell an append from a rewrite.
const HEAD: usize = 4096;
/// At most this many folder entries looked at in one listing.
const MAX_ENTRIES: usize = 20_000;

/// Where srun sends its tasks' output, when that is files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFiles {
    /// srun's file name patterns (`logs/%j-%t.out`), as given.
    pub patterns: Vec<String>,
    /// srun's working directory: relative patterns are relative to it.
    pub cwd: PathBuf,
    /// The allocation srun runs in (`SLURM_JOB_ID`), if any: its steps' `%j`.
    pub job: Option<String>,
}

/// What srun's `--output`/`--error` value means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputMode {
    /// Through srun (`all`, the default).
    Srun,
    /// Thrown away (`none`).
    Discarded,
    /// Only task N's output, through srun; the others' thrown away.
    OneTask(String),
    /// Files named by this pattern.
    Files(String),
}

/// srun's `--output`/`--error` value (see srun(1), "IO Redirection").
pub fn output_mode(value: &str) -> OutputMode {
    match value {
        "" | "all" => OutputMode::Srun,
        "none" => OutputMode::Discarded,
        v if v.bytes().all(|b| b.is_ascii_digit()) => OutputMode::OneTask(v.to_string()),
        v => OutputMode::Files(v.to_string()),
    }
}

/// One piece of a pattern's path component.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    /// `%j`, `%3t`: the letter.
    Field(char),
}

/// A pattern cut into path components, each a list of pieces.
#[derive(Debug, Clone)]
struct Pattern {
    /// The folder before the first component with a field (absolute).
    root: PathBuf,
    /// The components from there on.
    parts: Vec<Vec<Piece>>,
}

/// The pieces of one path component: `%%` is `%`, `%3t` is `t`; a backslash
/// anywhere turns replacement off (srun: "\\ Do not process any of the
/// replacement symbols"); an unknown letter stays as written.
fn pieces(component: &str, literal: bool) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut lit = String::new();
    let mut chars = component.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' || literal {
            lit.push(c);
            continue;
        }
        let mut raw = String::from("%");
        while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
            raw.push(d);
            chars.next();
        }
        match chars.next() {
            Some('%') if raw.len() == 1 => lit.push('%'),
            Some(l) if "jsJtnNuxAab".contains(l) => {
                if !lit.is_empty() {
                    out.push(Piece::Lit(std::mem::take(&mut lit)));
                }
                out.push(Piece::Field(l));
            }
            Some(other) => {
                lit.push_str(&raw);
                lit.push(other);
            }
            None => lit.push_str(&raw),
        }
    }
    if !lit.is_empty() {
        out.push(Piece::Lit(lit));
    }
    out
}

impl Pattern {
    fn parse(pattern: &str, cwd: &Path) -> Pattern {
        let literal = pattern.contains('\\');
        let text = if literal {
            pattern.replace('\\', "")
        } else {
            pattern.to_string()
        };
        let path = cwd.join(&text);
        let mut root = PathBuf::new();
        let mut parts: Vec<Vec<Piece>> = Vec::new();
        for c in path.components() {
            let s = c.as_os_str().to_string_lossy();
            let p = pieces(&s, literal);
            let fixed = p.iter().all(|x| matches!(x, Piece::Lit(_)));
            if fixed && parts.is_empty() {
                root.push(c.as_os_str());
            } else {
                parts.push(p);
            }
        }
        Pattern { root, parts }
    }

    /// The matcher of each component, with what is known of the step.
    fn matchers(&self, known: &Known) -> Vec<Regex> {
        self.parts
            .iter()
            .map(|pieces| {
                let mut re = String::from("^");
                for p in pieces {
                    match p {
                        Piece::Lit(s) => re.push_str(&regex::escape(s)),
                        Piece::Field(f) => re.push_str(&known.field(*f)),
                    }
                }
                re.push('$');
                Regex::new(&re).expect("escaped pattern")
            })
            .collect()
    }

    /// Every existing file the pattern matches, with what is known.
    fn files(&self, known: &Known) -> Vec<PathBuf> {
        if self.parts.is_empty() {
            return if self.root.is_file() {
                vec![self.root.clone()]
            } else {
                Vec::new()
            };
        }
        let matchers = self.matchers(known);
        let mut level = vec![self.root.clone()];
        let mut budget = MAX_ENTRIES;
        for (i, m) in matchers.iter().enumerate() {
            let last = i + 1 == matchers.len();
            let mut next = Vec::new();
            for dir in &level {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if budget == 0 {
                        break;
                    }
                    budget -= 1;
                    let name = e.file_name();
                    let Some(name) = name.to_str() else { continue };
                    if !m.is_match(name) {
                        continue;
                    }
                    let path = e.path();
                    let keep = if last { path.is_file() } else { path.is_dir() };
                    if keep {
                        next.push(path);
                    }
                }
            }
            level = next;
        }
        level.sort();
        level
    }
}

/// What is known of the step whose files are read.
#[derive(Debug, Clone, Default)]
struct Known {
    job: Option<String>,
    step: Option<String>,
    /// Our user's name (`%u`): srun runs the tasks as the user who runs it.
    user: Option<String>,
    /// Past [`STEP_WAIT`] without the step: `%s` matches any number.
    gave_up: bool,
}

impl Known {
    /// The regex one field matches.
    fn field(&self, f: char) -> String {
        let any_number = r"\d+".to_string();
        match f {
            'j' => self.job.as_deref().map_or(any_number, regex::escape),
            's' => self.step.as_deref().map_or(any_number, regex::escape),
            'J' => match (&self.job, &self.step) {
                (Some(j), Some(s)) => regex::escape(&format!("{j}.{s}")),
                _ => r"\d+\.\d+".into(),
            },
            't' | 'n' | 'a' | 'A' | 'b' => any_number,
            'u' => self.user.as_deref().map_or(r"[^/]+".into(), regex::escape),
            _ => r"[^/]+".into(), // %N %x
        }
    }

    /// Whether the fields this pattern names are known enough to read its files.
    fn enough(&self, p: &Pattern) -> bool {
        if self.gave_up {
            return true;
        }
        let needs = |f: char| p.parts.iter().flatten().any(|x| *x == Piece::Field(f));
        (!needs('j') || self.job.is_some())
            && (!(needs('s') || needs('J')) || (self.job.is_some() && self.step.is_some()))
    }
}

/// A file as it was before the attempt started.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: Option<SystemTime>,
    head: u64,
}

fn head_hash(path: &Path, len: u64) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; HEAD.min(len as usize)];
    if let Ok(mut f) = std::fs::File::open(path)
        && f.read_exact(&mut buf).is_ok()
    {
        h.write(&buf);
    }
    h.finish()
}

fn seen(path: &Path) -> Option<Seen> {
    let m = std::fs::metadata(path).ok()?;
    Some(Seen {
        dev: m.dev(),
        ino: m.ino(),
        size: m.len(),
        mtime: m.modified().ok(),
        head: head_hash(path, m.len()),
    })
}

/// One file being read.
#[derive(Debug)]
struct Tail {
    offset: u64,
    /// The unfinished last line.
    partial: Vec<u8>,
    /// Skipped ahead: what comes before the next line's start is not read.
    skipping: bool,
}

/// The step srun runs, found on a helper thread: (job, step).
type StepSlot = Arc<Mutex<Option<(String, String)>>>;

/// The per-task files of one attempt, read as the step runs.
pub(crate) struct Reader {
    patterns: Vec<Pattern>,
    known: Known,
    started: Instant,
    /// Files that matched before the start.
    before: BTreeMap<PathBuf, Seen>,
    /// Files being read (this attempt's).
    tails: BTreeMap<PathBuf, Tail>,
    step: StepSlot,
    stop_lookup: Arc<std::sync::atomic::AtomicBool>,
    listed_at: Option<Instant>,
    read_at: Option<Instant>,
}

impl Reader {
    /// Notes what the patterns match before the command starts.
    pub(crate) fn new(spec: &TaskFiles) -> Reader {
        let patterns: Vec<Pattern> = spec
            .patterns
            .iter()
            .map(|p| Pattern::parse(p, &spec.cwd))
            .collect();
        let any = Known {
            gave_up: true,
            ..Known::default()
        };
        let mut before = BTreeMap::new();
        for p in &patterns {
            for f in p.files(&any) {
                if let Some(s) = seen(&f) {
                    before.insert(f, s);
                }
            }
        }
        Reader {
            patterns,
            known: Known {
                job: spec.job.clone(),
                user: nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map(|u| u.name),
                ..Known::default()
            },
            started: Instant::now(),
            before,
            tails: BTreeMap::new(),
            step: Arc::new(Mutex::new(None)),
            stop_lookup: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            listed_at: None,
            read_at: None,
        }
    }

    /// Looks up, on a helper thread, the step srun `pid` runs (its `%j`, `%s`).
    pub(crate) fn find_step(&self, pid: u32) {
        let (slot, stop) = (self.step.clone(), self.stop_lookup.clone());
        let spawned = std::thread::Builder::new()
            .name("oomguard-step".into())
            .spawn(move || {
                let since = Instant::now();
                // Past STEP_WAIT the fields match any number anyway.
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && since.elapsed() < STEP_WAIT
                {
                    if let Some(step) = super::slurm::step_of_srun(pid) {
                        let (job, step) = match step.split_once('.') {
                            Some((j, s)) => (j.to_string(), s.to_string()),
                            None => (step, "0".into()),
                        };
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((job, step));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot look up srun's step: {e}");
        }
    }

    /// How long between two reads of the files.
    fn every(&self) -> Duration {
        let n = u32::try_from(self.tails.len()).unwrap_or(u32::MAX);
        READ_EVERY.max(Duration::from_secs(1) * n / READS_PER_SECOND)
    }

    /// When the next look is due.
    pub(crate) fn next_at(&self) -> Instant {
        self.read_at.map_or(self.started, |t| t + self.every())
    }

    /// Gives `sink` the new whole lines of this attempt's files, one file at a
    /// time (`last`: the attempt is over: the end of each file, unfinished lines
    /// too). Looks only when due, unless `last`.
    pub(crate) fn read(&mut self, now: Instant, last: bool, mut sink: impl FnMut(&Path, &[u8])) {
        if !last && now < self.next_at() {
            return;
        }
        self.read_at = Some(now);
        if let Some((job, step)) = self.step.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            self.known.job = Some(job);
            self.known.step = Some(step);
        }
        // A step too short to be looked up, or no controller to ask: any number,
        // the changed-since-the-start rule keeping older steps' files out.
        if !self.known.gave_up
            && self.known.step.is_none()
            && (last || self.started.elapsed() >= STEP_WAIT)
        {
            self.known.gave_up = true;
        }
        let list_every = LIST_EVERY.max(4 * self.every());
        if last || self.listed_at.is_none_or(|t| now >= t + list_every) {
            self.listed_at = Some(now);
            self.adopt();
        }
        for (path, tail) in &mut self.tails {
            let bytes = read_lines(path, tail, last);
            if !bytes.is_empty() {
                sink(path, &bytes);
            }
        }
    }

    /// Starts reading the files that became this attempt's.
    fn adopt(&mut self) {
        for p in &self.patterns {
            if !self.known.enough(p) {
                continue;
            }
            for f in p.files(&self.known) {
                if self.tails.contains_key(&f) {
                    continue;
                }
                let offset = match self.before.get(&f) {
                    None => 0,
                    Some(old) => {
                        let Some(now) = seen(&f) else { continue };
                        if now == *old {
                            continue; // not written since the start: an older step's
                        }
                        let appended = now.dev == old.dev
                            && now.ino == old.ino
                            && now.size >= old.size
                            && head_hash(&f, old.size) == old.head;
                        if appended { old.size } else { 0 }
                    }
                };
                self.tails.insert(
                    f,
                    Tail {
                        offset,
                        partial: Vec::new(),
                        skipping: false,
                    },
                );
            }
        }
    }

    /// The files read so far.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        self.tails.keys().cloned().collect()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop_lookup
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Reads what `path` holds past `tail.offset` (at most [`READ_CHUNK`], or at the
/// `last` read the rest, up to its last [`FINAL_READ`]; far behind, only its end):
/// the whole lines of it (with the unfinished line kept before them), and at the
/// `last` read the unfinished line too, ended.
fn read_lines(path: &Path, tail: &mut Tail, last: bool) -> Vec<u8> {
    let mut fresh = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < tail.offset {
            // Truncated under us: start again.
            tail.offset = 0;
            tail.partial.clear();
        }
        let (keep, limit) = if last {
            (FINAL_READ, FINAL_READ)
        } else {
            (MAX_LAG, READ_CHUNK as u64)
        };
        if len - tail.offset > keep {
            // Too far behind: the end of the file is what tells how a rank died.
            tail.offset = len - limit;
            tail.partial.clear();
            tail.skipping = true;
        }
        if f.seek(SeekFrom::Start(tail.offset)).is_ok() {
            let _ = (&mut f).take(limit).read_to_end(&mut fresh);
        }
    }
    if std::mem::take(&mut tail.skipping) {
        // Landed in the middle of a line: it starts at the next one.
        match memchr::memchr(b'\n', &fresh) {
            Some(i) => {
                tail.offset += (i + 1) as u64;
                fresh.drain(..=i);
            }
            None => {
                tail.offset += fresh.len() as u64;
                tail.skipping = true;
                return Vec::new();
            }
        }
    }
    tail.offset += fresh.len() as u64;
    tail.partial.extend_from_slice(&fresh);
    let cut = if last || tail.partial.len() > MAX_PARTIAL {
        tail.partial.len()
    } else {
        match memchr::memrchr(b'\n', &tail.partial) {
            Some(i) => i + 1,
            None => return Vec::new(),
        }
    };
    let mut lines: Vec<u8> = tail.partial.drain(..cut).collect();
    if last && !lines.is_empty() && !lines.ends_with(b"\n") {
        lines.push(b'\n');
    }
    lines
}

/// The per-task files srun's `--output` and `--error` values (else its
/// `SLURM_STDOUTMODE`/`SLURM_STDERRMODE` environment) name, and what the other
/// values mean: `(files, a warning for output thrown away)`.
pub fn from_srun(
    output: Option<&str>,
    error: Option<&str>,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> (Vec<String>, Option<String>) {
    let env_str = |k: &str| env(k).and_then(|v| v.into_string().ok());
    let out = output
        .map(str::to_string)
        .or_else(|| env_str("SLURM_STDOUTMODE"));
    let err = error
        .map(str::to_string)
        .or_else(|| env_str("SLURM_STDERRMODE"));
    let mut files = Vec::new();
    let mut lost = Vec::new();
    for (name, v) in [("--output", &out), ("--error", &err)] {
        let Some(v) = v else { continue };
        match output_mode(v) {
            OutputMode::Srun => {}
            OutputMode::Files(p) => {
                if !files.contains(&p) {
                    files.push(p);
                }
            }
            OutputMode::Discarded => lost.push(format!(
                "srun {name}={v}: the tasks' output is thrown away, so an OOM printed there cannot be seen"
            )),
            OutputMode::OneTask(t) => lost.push(format!(
                "srun {name}={t}: only task {t}'s output comes through srun, the others' is thrown away, so their OOM cannot be seen"
            )),
        }
    }
    let warning = (!lost.is_empty()).then(|| {
        format!(
            "{}; drop the option (oomguard passes the output through and keeps each attempt's in its run folder)",
            lost.join("; ")
        )
    });
    (files, warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(job: Option<&str>, step: Option<&str>) -> Known {
        Known {
            job: job.map(str::to_string),
            step: step.map(str::to_string),
            user: Some("alice".into()),
            gave_up: false,
        }
    }

    #[test]
    fn srun_patterns_become_matchers() {
        let p = Pattern::parse("logs/%j-%4t.%%.out", Path::new("/w"));
        assert_eq!(p.root, Path::new("/w/logs"));
        let m = p.matchers(&known(Some("17"), Some("0")));
        assert!(m[0].is_match("17-0001.%.out"));
        assert!(m[0].is_match("17-1.%.out"));
        assert!(!m[0].is_match("18-1.%.out"));
        // Before the job is known, %j matches any number, and the files are not read.
        let any = known(None, None);
        assert!(p.matchers(&any)[0].is_match("18-1.%.out"));
        assert!(!any.enough(&p));
        assert!(known(Some("17"), None).enough(&p));
        let step = Pattern::parse("o-%J-%N-%x-%u.txt", Path::new("/w"));
        assert!(!known(Some("17"), None).enough(&step));
        let m = step.matchers(&known(Some("17"), Some("2")));
        assert!(m[0].is_match("o-17.2-n1-train-alice.txt"));
        assert!(!m[0].is_match("o-17.3-n1-train-alice.txt"));
        assert!(!m[0].is_match("o-17.2-n1-train-bob.txt"), "another user's");
        // A backslash turns replacement off; an unknown letter stays as written.
        let lit = Pattern::parse("a\\%t.log", Path::new("/w"));
        assert_eq!(lit.root, Path::new("/w/a%t.log"));
        assert!(lit.parts.is_empty());
        assert_eq!(
            pieces("x%q%5", false),
            vec![Piece::Lit("x%q%5".into())],
            "unknown fields are literal"
        );
        // A field in a folder name.
        let dir = Pattern::parse("/logs/%j/%t.out", Path::new("/w"));
        assert_eq!(dir.root, Path::new("/logs"));
        assert_eq!(dir.parts.len(), 2);
    }

    #[test]
    fn what_srun_output_values_mean() {
        assert_eq!(output_mode("all"), OutputMode::Srun);
        assert_eq!(output_mode("none"), OutputMode::Discarded);
        assert_eq!(output_mode("0"), OutputMode::OneTask("0".into()));
        assert_eq!(
            output_mode("logs/%t.out"),
            OutputMode::Files("logs/%t.out".into())
        );
        let env = |k: &str| (k == "SLURM_STDERRMODE").then(|| OsString::from("err-%t.log"));
        let (files, warn) = from_srun(Some("out-%t.log"), None, &env);
        assert_eq!(files, ["out-%t.log", "err-%t.log"]);
        assert_eq!(warn, None);
        let (files, warn) = from_srun(Some("none"), None, &|_| None);
        assert!(files.is_empty());
        assert!(warn.unwrap().contains("--output=none"));
    }

    /// A file an older step wrote is read only once this attempt's step writes it:
    /// from its old end when appended to, from the start when rewritten.
    #[test]
    fn only_what_this_attempt_writes_is_read() {
        let t = tempfile::tempdir().unwrap();
        let logs = t.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let old_oom = "torch.OutOfMemoryError: CUDA out of memory. (an older step's)\n";
        std::fs::write(logs.join("0.out"), old_oom).unwrap();
        std::fs::write(logs.join("1.out"), old_oom).unwrap();
        std::fs::write(logs.join("2.out"), old_oom).unwrap();
        let spec = TaskFiles {
            patterns: vec!["logs/%t.out".into()],
            cwd: t.path().to_path_buf(),
            job: None,
        };
        let mut r = Reader::new(&spec);
        let now = Instant::now();
        let read = |r: &mut Reader, at: Instant, last: bool| {
            let mut got = BTreeMap::new();
            r.read(at, last, |path, bytes| {
                got.insert(
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    String::from_utf8(bytes.to_vec()).unwrap(),
                );
            });
            got
        };
        assert!(read(&mut r, now, false).is_empty(), "nothing new yet");
        // Task 0 appends; task 1's file is rewritten (truncated by srun); task 2
        // is not written; task 3's file is new, its last line unfinished.
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(logs.join("0.out"))
            .unwrap();
        f.write_all(b"step 1\n").unwrap();
        std::fs::write(logs.join("1.out"), "step 1 of the new step\n").unwrap();
        std::fs::write(logs.join("3.out"), "step 1\nstep 2 unfini").unwrap();
        assert_eq!(
            read(&mut r, now + LIST_EVERY, false),
            BTreeMap::from([
                ("0.out".to_string(), "step 1\n".to_string()),
                ("1.out".to_string(), "step 1 of the new step\n".to_string()),
                ("3.out".to_string(), "step 1\n".to_string()),
            ])
        );
        assert_eq!(
            read(&mut r, now + 2 * LIST_EVERY, true),
            BTreeMap::from([("3.out".to_string(), "step 2 unfini\n".to_string())])
        );
        assert_eq!(r.files().len(), 3);
    }

    /// A reader far behind a chatty file skips to its end (where a death is),
    /// starting at a whole line.
    #[test]
    fn a_reader_far_behind_skips_to_the_end_of_the_file() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("big.out");
        let mut text = "step 1 of a very chatty task\n".repeat((MAX_LAG as usize) / 29 + 10);
        text.push_str("torch.OutOfMemoryError: CUDA out of memory.\n");
        std::fs::write(&path, &text).unwrap();
        let mut tail = Tail {
            offset: 0,
            partial: Vec::new(),
            skipping: false,
        };
        let got = read_lines(&path, &mut tail, false);
        assert!(got.len() <= READ_CHUNK, "{}", got.len());
        assert!(got.starts_with(b"step 1 of a very chatty task\n"));
        assert!(got.ends_with(b"torch.OutOfMemoryError: CUDA out of memory.\n"));
        assert_eq!(tail.offset, text.len() as u64);
    }
}
