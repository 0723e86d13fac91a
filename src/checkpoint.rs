//! The newest complete checkpoint for the framework at hand, and how to resume from it.
//!
//! Theory of operation: a family (`frameworks`) or a policy's `[resume]`
//! table says where a command keeps its checkpoints — one of the layouts of
//! [`Kind`]: a family's [`Format`], which lives in the family's file with its
//! candidates and completeness check, or a custom one — and how it is told to
//! resume. This module keeps what the formats share: the generic checks below
//! and [`find`]. When the run starts, a
//! [`Baseline`] records the candidates already there. `find` lists the
//! candidates newest first, ignores those this run did not write (there at
//! the start and unchanged, or last written before it), and takes the first
//! complete one:
//!
//! * every marker file present and non-empty; a Hugging Face
//!   `trainer_state.json` is an object with a numeric `global_step`;
//! * weights that are what they say: a safetensors file has its header and
//!   every tensor's bytes, a sharded checkpoint every shard its index lists
//!   and at least the index's `total_size`;
//! * no temporary names (`*.tmp`, `tmp-*`, `*.incomplete`, `*.partial`);
//! * a single-file checkpoint (`.ckpt`, `.pt`) ends with a zip directory, as
//!   `torch.save` writes it last;
//! * nothing followed out of the checkpoint folder (a DeepSpeed `latest` tag,
//!   an index's shard names, a policy's markers are plain names inside it);
//! * not still being written: sizes and times stable over a short interval.
//!
//! Newer candidates that fail are reported with the reason. Checkpoints are
//! only ever read: never deleted, moved or renamed.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::command::Command;
use crate::detect::saves::Announced;

/// A checkpoint found on disk.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub step: u64,
}

/// A newer checkpoint that was not used, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub kind: SkipKind,
    pub why: String,
}

impl Skipped {
    /// A candidate the layout's checks turned down: unreadable when it could
    /// not be read, else incomplete.
    fn failed(path: PathBuf, why: NotComplete) -> Skipped {
        let kind = match why {
            NotComplete::Unreadable { .. } => SkipKind::Unreadable,
            NotComplete::Incomplete(_) => SkipKind::Incomplete,
        };
        Skipped {
            path,
            kind,
            why: why.to_string(),
        }
    }
}

/// Why a candidate is not a checkpoint to resume from, as a format's checks say it.
/// The journal counts the two apart ([`SkipKind`]); the words are the check's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotComplete {
    /// oomguard may not read it, or a file in it: "cannot read latest: permission denied".
    #[error("cannot read{}: {why}", what.as_deref().map(|w| format!(" {w}")).unwrap_or_default())]
    Unreadable {
        /// The file, where it is not the candidate itself.
        what: Option<String>,
        why: String,
    },
    /// Not whole by the format's checks: what is missing, empty, cut off or temporary.
    #[error("{0}")]
    Incomplete(String),
}

impl NotComplete {
    /// `what` (a file of the candidate) could not be read: `e` says why.
    pub fn unreadable(what: impl Into<String>, e: &std::io::Error) -> NotComplete {
        NotComplete::Unreadable {
            what: Some(what.into()),
            why: io_why(e),
        }
    }
}

impl From<String> for NotComplete {
    fn from(why: String) -> NotComplete {
        NotComplete::Incomplete(why)
    }
}

impl From<&str> for NotComplete {
    fn from(why: &str) -> NotComplete {
        NotComplete::Incomplete(why.to_string())
    }
}

/// Why a checkpoint was passed over, in one word: what the journal counts.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SkipKind {
    /// There when the run started and unchanged since: not this run's.
    PresentAtStart,
    /// Last written before the run started: not this run's.
    WrittenBeforeStart,
    /// oomguard may not read it.
    Unreadable,
    /// Not complete by the layout's checks.
    Incomplete,
    /// Its files changed while oomguard watched.
    BeingWritten,
    /// Its step is beyond the step this run reached: another run's.
    BeyondReached,
    /// Written during the run, but the trainer's output, which announced its
    /// other saves, never announced this one: another process's.
    NotAnnounced,
}

impl std::fmt::Display for SkipKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipKind::PresentAtStart => "present when this run started",
            SkipKind::WrittenBeforeStart => "written before this run started",
            SkipKind::Unreadable => "unreadable",
            SkipKind::Incomplete => "incomplete",
            SkipKind::BeingWritten => "still being written",
            SkipKind::BeyondReached => "beyond the step this run reached",
            SkipKind::NotAnnounced => "not announced by the trainer's output",
        })
    }
}

/// What a search found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Found {
    pub layout: String,
    pub latest: Option<Checkpoint>,
    /// This run's checkpoints newer than `latest` that are not usable, newest first.
    pub skipped: Vec<Skipped>,
    /// Checkpoints newer than `latest` that this run did not write, newest first.
    pub ignored: Vec<Skipped>,
}

/// How many skipped or ignored checkpoints are named one by one (journal,
/// stderr, plan's text); the rest are counted, so that ten thousand broken
/// folders cost one line, not ten thousand, on every relaunch.
pub const NAMED: usize = 5;

/// The checkpoints in `list` counted by kind.
pub fn count_kinds(list: &[Skipped]) -> std::collections::BTreeMap<SkipKind, usize> {
    let mut m = std::collections::BTreeMap::new();
    for s in list {
        *m.entry(s.kind).or_insert(0) += 1;
    }
    m
}

/// "3 checkpoints this run did not write (3 present when this run started):
/// out/checkpoint-500, out/checkpoint-400, out/checkpoint-300": the newest
/// few by path, the rest counted.
pub fn ignored_text(list: &[Skipped]) -> String {
    let names: Vec<String> = list
        .iter()
        .take(NAMED)
        .map(|s| s.path.display().to_string())
        .collect();
    let more = list.len() - names.len();
    format!(
        "{} checkpoint{} this run did not write ({}): {}{}",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        kinds_text(list),
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// "9995 incomplete, 2 unreadable".
pub fn kinds_text(list: &[Skipped]) -> String {
    count_kinds(list)
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A policy's `[resume]` table, for custom scripts:
///
/// ```toml
/// [resume]
/// flag = "--resume_from"          # how the script is told where to resume from
/// dir = "outputs/gsa-512m"        # or dir_flag = "--output_dir"
/// pattern = "step_{step}"         # checkpoint folder names, {step} is the number
/// complete_when = ["model.safetensors", "optimizer.pt"]
/// ```
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CustomSpec {
    pub flag: String,
    pub dir: Option<PathBuf>,
    pub dir_flag: Option<String>,
    pub pattern: String,
    #[serde(default)]
    pub complete_when: Vec<String>,
    /// How plan names the layout when a family (not a policy) describes it.
    #[serde(skip)]
    pub label: Option<String>,
}

/// How the framework is told to resume.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum ResumeHow {
    /// `--flag PATH` (or `--flag=PATH` when `equals`), replacing an earlier value.
    Flag { flag: String, equals: bool },
    /// A fixed flag value that makes the script find the checkpoint itself (`--init_from=resume`).
    Const {
        flag: String,
        value: String,
        equals: bool,
    },
    /// A `key=value` override; `value` None means the path.
    Override { key: String, value: Option<String> },
    /// The framework resumes from its folder by itself (Megatron `--load` = `--save`).
    Automatic,
    /// A bare switch that makes the program load the newest checkpoint of its folder
    /// (OpenRLHF's `--load_checkpoint`): added when there is one to resume from.
    Switch { flag: String },
}

/// A checkpoint format: where a family's checkpoints are under its root and when one is
/// complete. Each family's lives in its file under `frameworks/` (its `CHECKPOINTS`);
/// this module keeps what they share: the generic checks (a zip directory, safetensors,
/// a sharded index, temporaries, markers) and [`find`].
#[derive(Debug)]
pub struct Format {
    /// Its name in serialized layouts (`hugging_face`).
    pub id: &'static str,
    /// How plan names the layout.
    pub label: &'static str,
    /// The candidates under the root, newest first, and the newer ones the format's
    /// own "latest" marker already rules out.
    pub candidates: fn(&Path) -> (Vec<Checkpoint>, Vec<Skipped>),
    /// Why the candidate (second) under the root (first) is not complete, or Ok.
    pub complete: fn(&Path, &Path) -> Result<(), NotComplete>,
    /// The candidates' numbers are training steps (one beyond the step the run reached
    /// is another run's); false where they are times or epochs.
    pub stepped: bool,
    /// The step a candidate records of itself, where it does (the Trainer's
    /// `trainer_state.json`); else its number stands.
    pub recorded_step: Option<fn(&Path) -> Option<u64>>,
    /// A candidate the trainer saves beside the announced ones without announcing it
    /// (Lightning's `last.ckpt`).
    pub unannounced: fn(&Path) -> bool,
}

impl PartialEq for Format {
    fn eq(&self, other: &Format) -> bool {
        self.id == other.id
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A family's format.
    Format(&'static Format),
    /// A policy's `[resume]` table (or a family that describes its layout as one).
    Custom(CustomSpec),
}

impl Kind {
    /// The family's format; None for a custom layout.
    pub fn format(&self) -> Option<&'static Format> {
        match self {
            Kind::Format(f) => Some(f),
            Kind::Custom(_) => None,
        }
    }
}

/// Serialized as before the formats moved to their families: a family's format by its
/// name (`"hugging_face"`), a custom one as `{"custom": {...}}`.
impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Kind::Format(f) => s.serialize_unit_variant("Kind", 0, f.id),
            Kind::Custom(spec) => s.serialize_newtype_variant("Kind", 1, "custom", spec),
        }
    }
}

/// Where a command keeps its checkpoints and how it resumes from one.
#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    pub kind: Kind,
    pub root: PathBuf,
    pub how: ResumeHow,
    /// The resume path the user passed, if any: only a newer checkpoint replaces it.
    pub user_resume: Option<PathBuf>,
    /// What the script does with its folder by itself (see [`OwnSearch`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own: Option<OwnSearch>,
}

/// A script that looks in its folder by itself as it starts, when its command says
/// nothing: transformers 4.x's examples (`run_clm.py` and the scripts copied from it)
/// and the recipes that followed them resume from `get_last_checkpoint(output_dir)`, the
/// highest-numbered `checkpoint-N` whether or not it is whole, and stop on a folder that
/// holds files but no checkpoint ("Output directory ... already exists and is not empty.
/// Use --overwrite_output_dir to overcome"); older ones stop on any file at all.
///
/// A relaunch must not leave it to that search: this run's half-written checkpoint (an
/// OOM while saving) would be loaded, and the run's own files would stop it. So a
/// relaunch names the checkpoint (the newest complete one this run wrote, else the
/// one the first attempt picked) and carries the flag that turns the search off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnSearch {
    /// What the script picked as the first attempt started: its folder's newest
    /// `checkpoint-N` then (the command named none).
    pub picked: Option<PathBuf>,
    /// The flag that turns the search and the refusal off (`--overwrite_output_dir`),
    /// where the script stops on a folder that is not empty and its parser takes the
    /// flag: every relaunch carries it.
    pub off: Option<String>,
}

impl Layout {
    pub fn name(&self) -> &str {
        match &self.kind {
            Kind::Format(f) => f.label,
            Kind::Custom(spec) => spec
                .label
                .as_deref()
                .unwrap_or("custom (policy [resume] table)"),
        }
    }
}

// ---------------------------------------------------------------- the command

/// The layout a policy's `[resume]` table describes for this command.
/// (Every other layout is a family's: see `frameworks::layout`.)
pub fn custom_layout(cmd: &Command, spec: &CustomSpec) -> Layout {
    let root = spec
        .dir
        .clone()
        .or_else(|| {
            spec.dir_flag
                .as_deref()
                .and_then(|f| cmd.value(&[f]))
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("."));
    Layout {
        kind: Kind::Custom(spec.clone()),
        root,
        how: ResumeHow::Flag {
            flag: spec.flag.clone(),
            equals: false,
        },
        user_resume: cmd.value(&[spec.flag.as_str()]).map(PathBuf::from),
        own: None,
    }
}

// ---------------------------------------------------------------- completeness

pub fn is_temporary(name: &str) -> bool {
    name.ends_with(".tmp")
        || name.starts_with("tmp-")
        || name.ends_with(".incomplete")
        || name.ends_with(".partial")
}

/// (total size, newest mtime, file count) of the files up to two levels under `p`.
type Print = (u64, SystemTime, usize);

fn fingerprint(p: &Path) -> Option<Print> {
    let md = fs::metadata(p).ok()?;
    if md.is_file() {
        return Some((md.len(), md.modified().ok()?, 1));
    }
    let mut acc = (0, SystemTime::UNIX_EPOCH, 0);
    let mut stack = vec![(p.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).ok()?.flatten() {
            let md = e.metadata().ok()?;
            if md.is_dir() {
                if depth < 2 {
                    stack.push((e.path(), depth + 1));
                }
                continue;
            }
            acc.0 += md.len();
            acc.2 += 1;
            if let Ok(m) = md.modified() {
                acc.1 = acc.1.max(m);
            }
        }
    }
    Some(acc)
}

// ---------------------------------------------------------------- ownership

/// File systems record times in steps of up to 2 s (FAT; 1 s on ext3 and
/// HFS+): a checkpoint written in the same step as the run's start must not
/// look older than the run.
const GRANULARITY: Duration = Duration::from_secs(2);

/// What a candidate was: its own inode and time, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    mtime: Option<SystemTime>,
    print: Option<Print>,
}

impl Identity {
    fn of(p: &Path) -> Option<Identity> {
        use std::os::unix::fs::MetadataExt;
        let md = fs::metadata(p).ok()?;
        Some(Identity {
            dev: md.dev(),
            ino: md.ino(),
            mtime: md.modified().ok(),
            print: fingerprint(p),
        })
    }

    /// When it was last written: its newest file, or (empty or unreadable)
    /// the folder itself.
    fn written(&self) -> Option<SystemTime> {
        match self.print {
            Some((_, newest, n)) if n > 0 => Some(newest),
            _ => self.mtime,
        }
    }
}

/// The checkpoints present when the run started, so that a relaunch resumes
/// only from one this run wrote: never from an older experiment's in the same
/// folder, nor from another run's that was there first.
///
/// A candidate is this run's when it was not there at the start, or has
/// changed since (a trainer that saves over `checkpoint-5` again), and its
/// newest file is not older than the start. A candidate that appears while
/// the run goes on is taken as the run's own: two runs writing one folder at
/// the same time cannot be told apart by the files.
#[derive(Debug, Clone)]
pub struct Baseline {
    started: SystemTime,
    seen: std::collections::HashMap<PathBuf, Option<Identity>>,
    /// The highest step this run's attempts can have saved (the step they
    /// reached), when known: a checkpoint of a later step is another run's,
    /// however recent its files (`touch` makes any folder recent).
    pub reached: Option<u64>,
    /// The checkpoints this run's attempts announced they saved, in the
    /// order announced (see `detect::saves`), each with where it resolves to
    /// when it could be resolved. When one of them is a candidate, a
    /// candidate written during the run that none names is another
    /// process's: the trainer announces every save it makes.
    announced: Vec<(Announced, Option<PathBuf>)>,
}

impl Default for Baseline {
    /// Nothing present, started at the epoch: every candidate counts.
    fn default() -> Baseline {
        Baseline {
            started: SystemTime::UNIX_EPOCH,
            seen: Default::default(),
            reached: None,
            announced: Vec::new(),
        }
    }
}

impl Baseline {
    /// The layout's candidates now, with their identities.
    pub fn take(layout: Option<&Layout>) -> Baseline {
        let started = SystemTime::now();
        let mut seen = std::collections::HashMap::new();
        if let Some(l) = layout {
            let (cands, _, pre) = candidates(l);
            for p in cands
                .into_iter()
                .map(|c| c.path)
                .chain(pre.into_iter().map(|s| s.path))
            {
                let id = Identity::of(&p);
                seen.insert(p, id);
            }
        }
        Baseline {
            started,
            seen,
            reached: None,
            announced: Vec::new(),
        }
    }

    /// Add the checkpoints an attempt's output announced it saved.
    pub fn note_announced(&mut self, saves: &[Announced]) {
        for a in saves {
            if self.announced.len() >= 100_000 {
                break;
            }
            if !self.announced.iter().any(|(b, _)| b == a) {
                let resolved = match a {
                    Announced::Path(p) => std::fs::canonicalize(p).ok(),
                    Announced::Name(_) => None,
                };
                self.announced.push((a.clone(), resolved));
            }
        }
    }

    /// Whether the output announced `p` (it, a file in it, or a folder it is in).
    fn announced(&self, p: &Path) -> bool {
        let cwd = std::env::current_dir().unwrap_or_default();
        let forms = [
            Some(crate::detect::saves::absolute(&cwd, p)),
            std::fs::canonicalize(p).ok(),
        ];
        let name = p.file_name().and_then(|n| n.to_str());
        self.announced.iter().any(|(a, resolved)| match a {
            Announced::Name(n) => name == Some(n.as_str()),
            Announced::Path(a) => forms.iter().flatten().any(|f| {
                [Some(a), resolved.as_ref()]
                    .into_iter()
                    .flatten()
                    .any(|a| a.starts_with(f) || f.starts_with(a))
            }),
        })
    }

    /// Why the output's announcements rule `p` out, when they do.
    fn unannounced_why(&self) -> String {
        let names: Vec<String> = self
            .announced
            .iter()
            .rev()
            .take(3)
            .map(|(a, _)| match a {
                Announced::Path(p) => p.display().to_string(),
                Announced::Name(n) => n.clone(),
            })
            .collect();
        let more = self.announced.len() - names.len();
        format!(
            "written during this run but never announced by the trainer's output, which announced {}{} (newest first): another process's",
            names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }

    /// Why `p` is not this run's checkpoint, or None when this run wrote it.
    fn not_this_runs(&self, p: &Path) -> Option<(SkipKind, String)> {
        let now = Identity::of(p);
        if self.seen.get(p).is_some_and(|then| *then == now) {
            return Some((
                SkipKind::PresentAtStart,
                "present when this run started and unchanged since (an older experiment's or another run's)".into(),
            ));
        }
        let written = now.as_ref().and_then(Identity::written)?;
        if written + GRANULARITY < self.started {
            let before = self
                .started
                .duration_since(written)
                .unwrap_or_default()
                .as_secs();
            return Some((
                SkipKind::WrittenBeforeStart,
                format!("last written {before} s before this run started"),
            ));
        }
        None
    }
}

/// `torch.save` writes a zip whose end-of-central-directory record comes last:
/// a file cut mid-write lacks it.
pub fn zip_complete(file: &Path) -> Result<(), NotComplete> {
    let (mut f, m) = crate::untrusted::open(file, crate::untrusted::Expect::any())
        .map_err(|e| format!("cannot open: {e}"))?;
    let len = m.len();
    if len == 0 {
        return Err("is empty".into());
    }
    let tail = len.min(64 * 1024 + 22);
    f.seek(SeekFrom::Start(len - tail))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(tail as usize);
    f.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    if buf.windows(4).any(|w| w == b"PK\x05\x06") {
        Ok(())
    } else if buf.len() >= 2 && buf[0] == 0x80 {
        // Legacy (non-zip) pickle format: cannot be checked; trust it.
        Ok(())
    } else {
        Err("ends without a zip directory (cut off mid-write?)".into())
    }
}

pub fn nonempty(p: &Path) -> Result<(), NotComplete> {
    match fs::metadata(p) {
        Err(_) => Err(format!("no {}", p.file_name().unwrap_or_default().to_string_lossy()).into()),
        Ok(m) if m.len() == 0 => Err(format!(
            "{} is empty",
            p.file_name().unwrap_or_default().to_string_lossy()
        )
        .into()),
        Ok(_) => Ok(()),
    }
}

pub fn no_temporaries(dir: &Path) -> Result<(), NotComplete> {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_temporary(&name) {
            return Err(format!("holds a temporary file {name}").into());
        }
    }
    Ok(())
}

/// Why an I/O error kept a file or folder from being read, in words
/// ("permission denied", not "no such file" when the file is there).
pub fn io_why(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::NotFound => "not found".into(),
        _ => e.to_string(),
    }
}

/// Ok when `dir` can be listed; else "cannot read: permission denied".
fn readable(dir: &Path) -> Result<(), NotComplete> {
    fs::read_dir(dir)
        .map(|_| ())
        .map_err(|e| NotComplete::Unreadable {
            what: None,
            why: io_why(&e),
        })
}

/// `name` read from `dir`; a missing file is `missing`, another error says why.
pub fn read_in(dir: &Path, name: &str, missing: &str) -> Result<Vec<u8>, NotComplete> {
    crate::untrusted::read(
        &dir.join(name),
        MAX_SMALL_FILE,
        crate::untrusted::Expect::any(),
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => missing.into(),
        _ => NotComplete::unreadable(name, &e),
    })
}

/// The most oomguard reads of a checkpoint's small files (trainer state, an
/// index, a `latest` tag): a link to `/dev/zero` or a huge file is refused.
const MAX_SMALL_FILE: u64 = 64 << 20;

/// A checkpoint's small text file (`latest`), read as [`read_in`] does.
pub fn read_small(path: &Path) -> std::io::Result<String> {
    crate::untrusted::read(path, MAX_SMALL_FILE, crate::untrusted::Expect::any())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// A file name inside a checkpoint folder, as an index or a `latest` tag
/// writes it: one plain component, never a way out of the folder.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.contains('\0')
}

/// The largest safetensors header the format allows (100 MB), so a garbage
/// length never makes oomguard read gigabytes.
const SAFETENSORS_MAX_HEADER: u64 = 100_000_000;

/// Why a safetensors file is not whole, or Ok: an 8-byte little-endian header
/// length, that many bytes of JSON header, and every tensor's bytes behind it.
pub fn safetensors_complete(file: &Path) -> Result<(), NotComplete> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let (mut f, m) = crate::untrusted::open(file, crate::untrusted::Expect::any())
        .map_err(|e| NotComplete::unreadable(name.as_ref(), &e))?;
    let len = m.len();
    let mut n = [0u8; 8];
    if len < 8 || f.read_exact(&mut n).is_err() {
        return Err(format!("{name} is {len} bytes, too short for a safetensors header").into());
    }
    let n = u64::from_le_bytes(n);
    if !(2..=SAFETENSORS_MAX_HEADER).contains(&n) {
        return Err(format!("{name} is not a safetensors file (header length {n})").into());
    }
    if len - 8 < n {
        return Err(format!(
            "{name} is cut off in its header ({len} bytes, the header alone needs {})",
            8 + n
        )
        .into());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| NotComplete::unreadable(name.as_ref(), &e))?;
    let Ok(serde_json::Value::Object(tensors)) = serde_json::from_slice(&header) else {
        return Err(format!("{name} has a safetensors header that is not a JSON object").into());
    };
    let data_end = tensors
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    if len - 8 - n < data_end {
        return Err(format!(
            "{name} is cut off: its tensors need {data_end} bytes of data, {} are there",
            len - 8 - n
        )
        .into());
    }
    Ok(())
}

/// Why a weights file is not whole, or Ok, by its kind: safetensors by its
/// header, a `torch.save` file by its zip directory.
pub fn weights_complete(file: &Path) -> Result<(), NotComplete> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    if name.ends_with(".safetensors") {
        safetensors_complete(file)
    } else {
        zip_complete(file).map_err(|w| format!("{name} {w}").into())
    }
}

/// Why a sharded checkpoint is not whole, or Ok: every shard the index's
/// `weight_map` lists is in the folder and whole, and together they hold at
/// least the index's `metadata.total_size` (tensor bytes; files add headers).
pub fn index_complete(dir: &Path, index: &str) -> Result<(), NotComplete> {
    let text = read_in(dir, index, &format!("no {index}"))?;
    let v: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|_| format!("{index} is not valid JSON (cut off mid-write?)"))?;
    let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(format!("{index} has no weight_map").into());
    };
    let mut shards: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
    shards.sort_unstable();
    shards.dedup();
    if shards.is_empty() {
        return Err(format!("{index} lists no shard files").into());
    }
    let mut held = 0u64;
    for shard in shards {
        if !plain_name(shard) {
            return Err(format!(
                "{index} lists {shard:?}, which is not a file name inside the checkpoint folder"
            )
            .into());
        }
        let p = dir.join(shard);
        match fs::metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("{index} lists {shard}, which is missing").into());
            }
            Err(e) => return Err(NotComplete::unreadable(shard, &e)),
            Ok(m) => held += m.len(),
        }
        weights_complete(&p)?;
    }
    let total = v
        .pointer("/metadata/total_size")
        .and_then(|t| t.as_f64())
        .unwrap_or(0.0);
    // "At least, roughly": some writers round total_size for packed dtypes.
    if (held as f64) < total * 0.99 {
        return Err(format!(
            "its shards hold {held} bytes, less than {index}'s total_size {total}"
        )
        .into());
    }
    Ok(())
}

/// The step in a checkpoint folder's name `{prefix}N{suffix}`, N digits only:
/// `checkpoint-+10` is not a checkpoint name (`u64::from_str` would take the sign).
pub fn step_in_name(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn numbered_dirs(root: &Path, prefix: &str, suffix: &str) -> Vec<Checkpoint> {
    let mut out: Vec<Checkpoint> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        // A symlinked checkpoint-N (kept on another disk, linked in) is a
        // real layout: followed like a folder.
        .filter(|e| match e.file_type() {
            Ok(t) if t.is_symlink() => fs::metadata(e.path()).is_ok_and(|m| m.is_dir()),
            Ok(t) => t.is_dir(),
            Err(_) => false,
        })
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = step_in_name(&name, prefix, suffix)?;
            Some(Checkpoint {
                path: e.path(),
                step,
            })
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.step));
    out
}

/// Candidates newest first, each with its completeness check.
type Check = Box<dyn Fn(&Path) -> Result<(), NotComplete>>;

/// The layout's candidates newest first, their check, and the newer ones
/// already ruled out by the framework's own "latest" marker.
fn candidates(layout: &Layout) -> (Vec<Checkpoint>, Check, Vec<Skipped>) {
    let root = &layout.root;
    match &layout.kind {
        Kind::Format(f) => {
            let (c, pre) = (f.candidates)(root);
            let (root2, complete) = (root.clone(), f.complete);
            let check: Check = Box::new(move |p: &Path| complete(&root2, p));
            (c, check, pre)
        }
        Kind::Custom(spec) => {
            let (pre_s, post_s) = spec
                .pattern
                .split_once("{step}")
                .unwrap_or((&spec.pattern, ""));
            let markers = spec.complete_when.clone();
            let check: Check = Box::new(move |p: &Path| custom_complete(&markers, p));
            (numbered_dirs(root, pre_s, post_s), check, Vec::new())
        }
    }
}

/// Why a folder is not complete by a policy's `complete_when` markers, or Ok.
fn custom_complete(markers: &[String], p: &Path) -> Result<(), NotComplete> {
    for m in markers {
        // Policies are validated at load; a marker out of the folder is never followed.
        if Path::new(m)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!("{m:?} is not a file inside the checkpoint folder").into());
        }
        nonempty(&p.join(m))?;
    }
    no_temporaries(p)
}

/// The newest complete checkpoint this run wrote. `settle` is how long to
/// watch a candidate for changes (zero in `plan`; a short interval between
/// attempts). Candidates the run did not write (by `baseline`) are ignored
/// without being checked.
pub fn find(layout: &Layout, baseline: &Baseline, settle: Duration) -> Found {
    let (cands, check, pre) = candidates(layout);
    let (mut skipped, mut ignored) = (Vec::new(), Vec::new());
    for s in pre {
        match baseline.not_this_runs(&s.path) {
            Some((kind, why)) => ignored.push(Skipped {
                path: s.path,
                kind,
                why,
            }),
            None => skipped.push(s),
        }
    }
    let mut latest = None;
    // The trainer announces its saves: a candidate it did not announce is
    // another process's. Only when one announcement is a candidate here (a
    // path printed from inside a container, or a save line oomguard does not
    // know, leaves the step and time rules to decide).
    let announcing =
        !baseline.announced.is_empty() && cands.iter().any(|c| baseline.announced(&c.path));
    let format = layout.kind.format();
    let stepped = format.is_none_or(|f| f.stepped);
    for c in cands {
        // There at the start, or written before it: that says most (an older
        // experiment's), whatever its step.
        if let Some((kind, why)) = baseline.not_this_runs(&c.path) {
            ignored.push(Skipped {
                path: c.path,
                kind,
                why,
            });
            continue;
        }
        // Lightning's `last.ckpt` is saved beside the announced ones, unannounced.
        let unannounced = format.is_some_and(|f| (f.unannounced)(&c.path));
        // A half-written save is said as such first: the trainer's own save
        // that ran out (a trainer may announce a save only once it is done).
        let readable_now = || {
            if c.path.is_dir() {
                readable(&c.path)
            } else {
                Ok(())
            }
        };
        if announcing && !unannounced && !baseline.announced(&c.path) {
            if let Err(why) = readable_now().and_then(|()| check(&c.path)) {
                skipped.push(Skipped::failed(c.path, why));
                continue;
            }
            ignored.push(Skipped {
                path: c.path,
                kind: SkipKind::NotAnnounced,
                why: baseline.unannounced_why(),
            });
            continue;
        }
        if let Some(limit) = baseline.reached.filter(|_| stepped)
            && let Some(step) = format
                .and_then(|f| f.recorded_step)
                .and_then(|recorded| recorded(&c.path))
                .or(Some(c.step))
                .filter(|s| *s > limit)
        {
            ignored.push(Skipped {
                path: c.path,
                kind: SkipKind::BeyondReached,
                why: format!("step {step}, beyond step {limit} this run reached"),
            });
            continue;
        }
        // A folder that cannot be listed says so, not "no trainer_state.json".
        let readable = if c.path.is_dir() {
            readable(&c.path)
        } else {
            Ok(())
        };
        if let Err(why) = readable.and_then(|()| check(&c.path)) {
            skipped.push(Skipped::failed(c.path, why));
            continue;
        }
        if !settle.is_zero() {
            let before = fingerprint(&c.path);
            std::thread::sleep(settle);
            if fingerprint(&c.path) != before {
                skipped.push(Skipped {
                    path: c.path,
                    kind: SkipKind::BeingWritten,
                    why: "still being written (files changed while oomguard watched)".into(),
                });
                continue;
            }
        }
        latest = Some(c);
        break;
    }
    Found {
        layout: layout.name().to_string(),
        latest,
        skipped,
        ignored,
    }
}

/// The step a checkpoint records: a Hugging Face folder's `trainer_state.json`
/// `global_step`; a file `torch.save` wrote, its `global_step` (Lightning's
/// `.ckpt`) or `iter_num` (nanoGPT's `ckpt.pt`).
pub fn recorded_step(ckpt: &Path) -> Option<u64> {
    if ckpt.is_file() {
        return crate::torch_save::top_level_int(ckpt, "global_step")
            .or_else(|| crate::torch_save::top_level_int(ckpt, "iter_num"));
    }
    let text = crate::untrusted::read(
        &ckpt.join("trainer_state.json"),
        MAX_SMALL_FILE,
        crate::untrusted::Expect::any(),
    )
    .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("global_step")?.as_u64()
}

/// The step a checkpoint stands for: recorded in it, else its number.
pub fn step_for(c: &Checkpoint) -> Option<u64> {
    recorded_step(&c.path).or_else(|| (c.step > 0 && c.step < 1 << 40).then_some(c.step))
}

/// When a checkpoint was written (its newest file).
pub fn written_at(p: &Path) -> Option<SystemTime> {
    fingerprint(p).map(|f| f.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frameworks::{deepspeed, hf, lightning, megatron, nanogpt, torchtune};

    /// The Hugging Face check, its reason as the journal writes it.
    fn hf_complete(dir: &Path) -> Result<(), String> {
        hf::complete(dir).map_err(|why| why.to_string())
    }

    /// A layout's kind serializes as it did when the formats were variants of `Kind`.
    #[test]
    fn a_kind_serializes_by_its_formats_name() {
        let names = [
            (&hf::CHECKPOINTS, "hugging_face"),
            (&deepspeed::CHECKPOINTS, "deep_speed"),
            (&megatron::CHECKPOINTS, "megatron"),
            (&lightning::CHECKPOINTS, "lightning"),
            (&torchtune::CHECKPOINTS, "torchtune"),
            (&nanogpt::CHECKPOINTS, "nano_gpt"),
        ];
        for (format, name) in names {
            let json = serde_json::to_string(&Kind::Format(format)).unwrap();
            assert_eq!(json, format!("\"{name}\""));
        }
    }

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    /// A trainer_state.json as complete as the checks need.
    const STATE: &str = r#"{"global_step": 5}"#;

    fn hf_ckpt(root: &Path, n: u64, state: Option<&str>) {
        let d = root.join(format!("checkpoint-{n}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("model.safetensors"), safetensors(4)).unwrap();
        if let Some(s) = state {
            fs::write(d.join("trainer_state.json"), s).unwrap();
        }
    }

    /// The layout a run would use: the policy's table, else the families'.
    fn detect(cmd: &Command, custom: Option<&CustomSpec>, out: Option<&str>) -> Option<Layout> {
        if let Some(spec) = custom {
            return Some(custom_layout(cmd, spec));
        }
        let ctx = crate::frameworks::Ctx {
            recipe_output_dir: out,
            recipe_value: &|_| None,
        };
        crate::frameworks::layout(cmd, &ctx)
    }

    fn layout_for(cmd: &str) -> Layout {
        detect(&argv(cmd), None, None).expect("a layout")
    }

    #[test]
    fn recipe_yaml_output_dir_and_each_tools_resume_spelling() {
        let l = detect(
            &argv("axolotl train cfg.yml"),
            None,
            Some("./outputs/lora-out"),
        )
        .unwrap();
        assert_eq!(l.root, PathBuf::from("./outputs/lora-out"));
        assert_eq!(
            l.how,
            ResumeHow::Flag {
                flag: "--resume-from-checkpoint".into(),
                equals: false
            }
        );
        let l = detect(
            &argv("llamafactory-cli train x.yaml"),
            None,
            Some("saves/x"),
        )
        .unwrap();
        assert!(
            matches!(l.how, ResumeHow::Override { ref key, value: None } if key == "resume_from_checkpoint")
        );
        // A flag on the command line wins over the recipe.
        let l = detect(
            &argv("python sft.py --config r.yaml --output_dir o"),
            None,
            Some("x"),
        )
        .unwrap();
        assert_eq!(l.root, PathBuf::from("o"));
    }

    /// A tiny valid zip, as torch.save writes (only the end record matters here).
    fn zip_bytes() -> Vec<u8> {
        let mut v = b"PK\x03\x04fake-entry".to_vec();
        v.extend_from_slice(b"PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        v
    }

    /// accelerate's `save_state` folders (diffusers' `checkpoint-N`, the `*_no_trainer.py`
    /// examples' `step_N`) hold no trainer_state.json: rank 0's random states, written
    /// last, say the save finished.
    #[test]
    fn accelerate_save_state_folders_are_resumed_once_their_random_states_are_whole() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let saved = |name: &str, files: &[(&str, Vec<u8>)]| {
            let d = out.join(name);
            fs::create_dir_all(&d).unwrap();
            for (f, bytes) in files {
                fs::write(d.join(f), bytes).unwrap();
            }
        };
        let whole = || zip_bytes();
        let mut cut = zip_bytes();
        cut.truncate(cut.len() - 30);
        saved(
            "checkpoint-4",
            &[
                ("optimizer.bin", whole()),
                ("scheduler.bin", whole()),
                ("random_states_0.pkl", whole()),
            ],
        );
        fs::create_dir_all(out.join("checkpoint-4/unet")).unwrap();
        saved(
            "step_6",
            &[
                ("model.safetensors", safetensors(4)),
                ("random_states_0.pkl", whole()),
            ],
        );
        // Killed in the optimizer's save, before the random states.
        saved(
            "step_8",
            &[
                ("model.safetensors", safetensors(4)),
                ("optimizer.bin", cut.clone()),
            ],
        );
        // Killed while writing the random states; rank 1 cut while rank 0 finished.
        saved(
            "checkpoint-10",
            &[
                ("optimizer.bin", whole()),
                ("random_states_0.pkl", cut.clone()),
            ],
        );
        saved(
            "checkpoint-12",
            &[
                ("random_states_0.pkl", whole()),
                ("random_states_1.pkl", cut),
            ],
        );
        let l = layout_for(&format!(
            "accelerate launch train.py --output_dir {}",
            out.display()
        ));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        let names = |v: &[Skipped]| -> Vec<String> {
            v.iter()
                .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            names(&f.skipped),
            ["checkpoint-12", "checkpoint-10", "step_8"]
        );
        for (skipped, file) in f.skipped.iter().zip([
            "random_states_1.pkl",
            "random_states_0.pkl",
            "random_states_0.pkl",
        ]) {
            assert!(skipped.why.contains(file), "{}", skipped.why);
        }
        let latest = f.latest.expect("step_6 is complete");
        assert_eq!(latest.path, out.join("step_6"));
        assert_eq!(step_for(&latest), Some(6));
        // Without step_6, diffusers' checkpoint-4 (weights in a hook's subfolder) is taken.
        fs::remove_dir_all(out.join("step_6")).unwrap();
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().path, out.join("checkpoint-4"));
    }

    #[test]
    fn hf_newest_complete_wins_and_skips_are_explained() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        hf_ckpt(&out, 5, Some(r#"{"global_step": 5}"#));
        hf_ckpt(&out, 10, Some(r#"{"global_step": 10}"#));
        hf_ckpt(&out, 15, None); // killed before trainer_state.json
        hf_ckpt(&out, 20, Some(r#"{"global_st"#)); // cut mid-write
        fs::create_dir_all(out.join("checkpoint-x")).unwrap();
        let l = layout_for(&format!("python t.py --output_dir {}", out.display()));
        assert_eq!(l.kind, Kind::Format(&hf::CHECKPOINTS));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        let latest = f.latest.unwrap();
        assert_eq!(latest.step, 10);
        assert_eq!(step_for(&latest), Some(10));
        let skipped: Vec<_> = f
            .skipped
            .iter()
            .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(skipped, ["checkpoint-20", "checkpoint-15"]);
        assert!(f.skipped[0].why.contains("not valid JSON"));
    }

    #[test]
    fn hf_needs_weights_and_no_temporaries() {
        let t = tempfile::tempdir().unwrap();
        hf_ckpt(t.path(), 5, Some(STATE));
        hf_ckpt(t.path(), 6, Some(STATE));
        hf_ckpt(t.path(), 7, Some(STATE));
        fs::write(t.path().join("checkpoint-6/optimizer.pt.tmp"), b"x").unwrap();
        fs::remove_file(t.path().join("checkpoint-7/model.safetensors")).unwrap();
        let l = layout_for(&format!("python t.py --output_dir={}", t.path().display()));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 5);
        assert!(
            f.skipped[0].why.contains("no model weights"),
            "{:?}",
            f.skipped
        );
        assert!(f.skipped[1].why.contains("temporary"), "{:?}", f.skipped);
    }

    #[test]
    fn hf_with_deepspeed_checks_the_tag_folder() {
        let t = tempfile::tempdir().unwrap();
        for n in [10, 20] {
            let d = t.path().join(format!("checkpoint-{n}"));
            fs::create_dir_all(d.join(format!("global_step{n}"))).unwrap();
            fs::write(d.join("trainer_state.json"), STATE).unwrap();
            fs::write(d.join("latest"), format!("global_step{n}")).unwrap();
        }
        fs::write(
            t.path()
                .join("checkpoint-10/global_step10/mp_rank_00_model_states.pt"),
            b"x",
        )
        .unwrap();
        // checkpoint-20's global_step20 is still empty: the save died.
        let l = layout_for(&format!(
            "deepspeed t.py --output_dir {}",
            t.path().display()
        ));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 10);
        assert!(f.skipped[0].why.contains("is empty"), "{:?}", f.skipped);
    }

    #[test]
    fn megatron_follows_the_tracker_file() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for it in [500u64, 1000, 1500] {
            let d = root.join(format!("iter_{it:07}/mp_rank_00"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model_optim_rng.pt"), zip_bytes()).unwrap();
        }
        fs::write(root.join("latest_checkpointed_iteration.txt"), "1000\n").unwrap();
        // iter 1000's file was cut: fall back to 500.
        fs::write(
            root.join("iter_0001000/mp_rank_00/model_optim_rng.pt"),
            b"PK\x03\x04cut",
        )
        .unwrap();
        let cmd = format!(
            "torchrun pretrain_gpt.py --save {0} --load {0} --micro-batch-size 4",
            root.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Format(&megatron::CHECKPOINTS));
        assert_eq!(l.how, ResumeHow::Automatic);
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 500);
        assert!(
            f.skipped
                .iter()
                .any(|s| s.why.contains("latest_checkpointed_iteration.txt (1000)"))
        );
        assert!(f.skipped.iter().any(|s| s.why.contains("zip directory")));
    }

    #[test]
    fn deepspeed_engine_latest_tag() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for n in [100, 200, 300] {
            let d = root.join(format!("global_step{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("mp_rank_00_model_states.pt"), b"x").unwrap();
        }
        fs::write(root.join("latest"), "global_step200").unwrap();
        let cmd = format!(
            "deepspeed pretrain.py --deepspeed --save {} ",
            root.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Format(&deepspeed::CHECKPOINTS));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 200);
        assert!(f.skipped[0].why.contains("newer than `latest`"));
    }

    #[test]
    fn lightning_prefers_the_newest_complete_ckpt() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("lightning_logs/version_0/checkpoints");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("epoch=0-step=100.ckpt"), zip_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        fs::write(d.join("last.ckpt"), b"PK\x03\x04 cut off").unwrap();
        let cmd = format!(
            "python cli.py fit --trainer.default_root_dir={}/lightning_logs",
            t.path().display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Format(&lightning::CHECKPOINTS));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert!(f.latest.unwrap().path.ends_with("epoch=0-step=100.ckpt"));
        assert!(f.skipped[0].path.ends_with("last.ckpt"));
    }

    #[test]
    fn nanogpt_reads_out_dir_from_its_config_module() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("config/train_x.py");
        fs::create_dir_all(cfg.parent().unwrap()).unwrap();
        let out = t.path().join("out-x");
        fs::write(
            &cfg,
            format!("batch_size = 12\nout_dir = '{}'\n", out.display()),
        )
        .unwrap();
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("ckpt.pt"), zip_bytes()).unwrap();
        let cmd = format!("python train.py {} --batch_size=12", cfg.display());
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Format(&nanogpt::CHECKPOINTS));
        assert_eq!(l.root, out);
        assert!(
            find(&l, &Baseline::default(), Duration::ZERO)
                .latest
                .is_some()
        );
        fs::write(out.join("ckpt.pt"), b"PK\x03\x04half").unwrap();
        assert!(
            find(&l, &Baseline::default(), Duration::ZERO)
                .latest
                .is_none()
        );
    }

    #[test]
    fn torchtune_needs_recipe_state() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path();
        for n in [0, 1] {
            let d = out.join(format!("epoch_{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model-00001-of-00001.safetensors"), b"w").unwrap();
        }
        let cmd = format!(
            "tune run lora_finetune_single_device --config x batch_size=8 output_dir={}",
            out.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Format(&torchtune::CHECKPOINTS));
        assert!(
            find(&l, &Baseline::default(), Duration::ZERO)
                .latest
                .is_none()
        );
        fs::create_dir_all(out.join("recipe_state")).unwrap();
        fs::write(out.join("recipe_state/recipe_state.pt"), zip_bytes()).unwrap();
        assert_eq!(
            find(&l, &Baseline::default(), Duration::ZERO)
                .latest
                .unwrap()
                .step,
            1
        );
    }

    #[test]
    fn custom_layout_from_a_policy_table() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("outputs/gsa-512m");
        for n in [4000, 5000, 6000] {
            let d = root.join(format!("step_{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model.safetensors"), b"w").unwrap();
            if n != 6000 {
                fs::write(d.join("optimizer.pt"), b"o").unwrap();
            }
        }
        let spec = CustomSpec {
            flag: "--resume_from".into(),
            dir: Some(root.clone()),
            dir_flag: None,
            pattern: "step_{step}".into(),
            complete_when: vec!["model.safetensors".into(), "optimizer.pt".into()],
            label: None,
        };
        let l = detect(&argv("python train.py --lr 1e-4"), Some(&spec), None).unwrap();
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 5000);
        assert_eq!(f.skipped[0].why, "no optimizer.pt");
    }

    #[test]
    fn still_being_written_is_skipped() {
        let t = tempfile::tempdir().unwrap();
        hf_ckpt(t.path(), 5, Some(STATE));
        hf_ckpt(t.path(), 10, Some(STATE));
        let l = layout_for(&format!("python t.py --output_dir {}", t.path().display()));
        let writer_path = t.path().join("checkpoint-10/optimizer.pt");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || {
            let mut n = 0u64;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                fs::write(&writer_path, vec![0u8; (n % 50 + 1) as usize * 1024]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let f = find(&l, &Baseline::default(), Duration::from_millis(150));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().unwrap();
        assert_eq!(f.latest.unwrap().step, 5);
        assert!(f.skipped[0].why.contains("still being written"));
    }

    #[test]
    fn no_folder_means_no_checkpoint() {
        let l = layout_for("python t.py --output_dir /nonexistent/oomguard");
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert!(f.latest.is_none() && f.skipped.is_empty());
    }

    /// A real-shaped safetensors file holding `floats` f32 values.
    fn safetensors(floats: usize) -> Vec<u8> {
        let header = format!(
            r#"{{"__metadata__":{{"format":"pt"}},"w":{{"dtype":"F32","shape":[{floats}],"data_offsets":[0,{}]}}}}"#,
            floats * 4
        );
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, floats * 4));
        v
    }

    /// A complete HF checkpoint folder at `d` with these weights files.
    fn hf_dir(d: &Path, files: &[(&str, Vec<u8>)]) {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join("trainer_state.json"), r#"{"global_step": 5}"#).unwrap();
        for (name, bytes) in files {
            fs::write(d.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn a_weights_file_must_be_what_it_says() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("checkpoint-5");
        hf_dir(&d, &[("model.safetensors", safetensors(4))]);
        assert_eq!(hf_complete(&d), Ok(()));
        // One byte: not even a header length.
        fs::write(d.join("model.safetensors"), b"x").unwrap();
        let why = hf_complete(&d).unwrap_err();
        assert!(why.contains("model.safetensors"), "{why}");
        // A header length with fewer header bytes behind it.
        let mut cut = safetensors(4);
        cut.truncate(20);
        fs::write(d.join("model.safetensors"), &cut).unwrap();
        assert!(hf_complete(&d).unwrap_err().contains("model.safetensors"));
        // The whole header, but the tensor data cut short.
        let mut cut = safetensors(4);
        cut.truncate(cut.len() - 3);
        fs::write(d.join("model.safetensors"), &cut).unwrap();
        assert!(hf_complete(&d).unwrap_err().contains("cut off"));
        // A pytorch_model.bin must end with its zip directory.
        fs::remove_file(d.join("model.safetensors")).unwrap();
        fs::write(d.join("pytorch_model.bin"), b"x").unwrap();
        assert!(hf_complete(&d).unwrap_err().contains("pytorch_model.bin"));
        fs::write(d.join("pytorch_model.bin"), zip_bytes()).unwrap();
        assert_eq!(hf_complete(&d), Ok(()));
    }

    #[test]
    fn trainer_state_must_be_an_object_with_a_numeric_global_step() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("checkpoint-5");
        hf_dir(&d, &[("model.safetensors", safetensors(4))]);
        for bad in [
            "null",
            "[]",
            "{}",
            r#"{"global_step": null}"#,
            r#"{"global_step": "5"}"#,
        ] {
            fs::write(d.join("trainer_state.json"), bad).unwrap();
            let why = hf_complete(&d).unwrap_err();
            assert!(why.contains("global_step"), "{bad}: {why}");
        }
        fs::write(d.join("trainer_state.json"), r#"{"global_step": 0}"#).unwrap();
        assert_eq!(hf_complete(&d), Ok(()));
    }

    #[test]
    fn sharded_weights_are_checked_against_their_index() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("checkpoint-5");
        let (a, b) = (safetensors(8), safetensors(8));
        let index = |total: usize| {
            format!(
                r#"{{"metadata": {{"total_size": {total}}}, "weight_map": {{"a.w": "model-00001-of-00002.safetensors", "b.w": "model-00002-of-00002.safetensors"}}}}"#
            )
        };
        hf_dir(
            &d,
            &[
                ("model.safetensors.index.json", index(64).into_bytes()),
                ("model-00001-of-00002.safetensors", a),
            ],
        );
        // A listed shard is missing.
        let why = hf_complete(&d).unwrap_err();
        assert!(why.contains("model-00002-of-00002.safetensors"), "{why}");
        fs::write(d.join("model-00002-of-00002.safetensors"), &b).unwrap();
        assert_eq!(hf_complete(&d), Ok(()));
        // The shards hold less than the index's total_size.
        fs::write(d.join("model.safetensors.index.json"), index(1 << 20)).unwrap();
        assert!(hf_complete(&d).unwrap_err().contains("total_size"));
        // A shard of one byte.
        fs::write(d.join("model.safetensors.index.json"), index(64)).unwrap();
        fs::write(d.join("model-00002-of-00002.safetensors"), b"x").unwrap();
        assert!(hf_complete(&d).is_err());
        // The same for pytorch_model.bin.index.json with zip shards.
        let e = t.path().join("checkpoint-6");
        let z = zip_bytes();
        let total = z.len();
        hf_dir(
            &e,
            &[
                (
                    "pytorch_model.bin.index.json",
                    format!(
                        r#"{{"metadata": {{"total_size": {total}}}, "weight_map": {{"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}}}"#
                    )
                    .into_bytes(),
                ),
                ("pytorch_model-00001-of-00002.bin", z.clone()),
            ],
        );
        assert!(
            hf_complete(&e)
                .unwrap_err()
                .contains("pytorch_model-00002-of-00002.bin")
        );
        fs::write(e.join("pytorch_model-00002-of-00002.bin"), &z).unwrap();
        assert_eq!(hf_complete(&e), Ok(()));
        // An index naming a shard outside the folder is not followed.
        fs::write(
            e.join("pytorch_model.bin.index.json"),
            r#"{"metadata": {"total_size": 1}, "weight_map": {"a": "../checkpoint-5/model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        assert!(hf_complete(&e).is_err());
    }

    #[test]
    fn a_deepspeed_tag_must_be_a_folder_inside_the_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("out/checkpoint-10");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("trainer_state.json"), r#"{"global_step": 10}"#).unwrap();
        // Outside, something that would pass for a tag folder.
        fs::create_dir_all(t.path().join("elsewhere")).unwrap();
        fs::write(t.path().join("elsewhere/mp_rank_00_model_states.pt"), b"x").unwrap();
        for tag in ["../../elsewhere", "../../..", "/etc", ".", ""] {
            fs::write(d.join("latest"), tag).unwrap();
            let why = hf_complete(&d).unwrap_err();
            assert!(why.contains("not a folder name"), "{tag:?}: {why}");
        }
        fs::create_dir_all(d.join("global_step10")).unwrap();
        fs::write(d.join("global_step10/mp_rank_00_model_states.pt"), b"x").unwrap();
        fs::write(d.join("latest"), "global_step10\n").unwrap();
        assert_eq!(hf_complete(&d), Ok(()));
    }

    #[test]
    fn a_symlinked_checkpoint_folder_is_used() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        hf_ckpt(&out, 10, Some(r#"{"global_step": 10}"#));
        // checkpoint-20 lives on another disk, linked in.
        hf_ckpt(
            &t.path().join("scratch"),
            20,
            Some(r#"{"global_step": 20}"#),
        );
        for d in [
            out.join("checkpoint-10"),
            t.path().join("scratch/checkpoint-20"),
        ] {
            fs::write(d.join("model.safetensors"), safetensors(4)).unwrap();
        }
        std::os::unix::fs::symlink(
            t.path().join("scratch/checkpoint-20"),
            out.join("checkpoint-20"),
        )
        .unwrap();
        let l = layout_for(&format!("python t.py --output_dir {}", out.display()));
        let f = find(&l, &Baseline::default(), Duration::ZERO);
        assert_eq!(f.latest.unwrap().path, out.join("checkpoint-20"));
    }

    /// Set the mtime of every file in `dir` to `t`.
    fn backdate(dir: &Path, t: SystemTime) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            fs::File::options()
                .write(true)
                .open(e.path())
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
    }

    #[test]
    fn only_checkpoints_this_run_wrote_are_resumed_from() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path();
        // An older experiment's, far ahead; and one this run will save over.
        hf_ckpt(out, 500, Some(r#"{"global_step": 500}"#));
        hf_ckpt(out, 5, Some(STATE));
        let l = layout_for(&format!("python t.py --output_dir {}", out.display()));
        let base = Baseline::take(Some(&l));
        let f = find(&l, &base, Duration::ZERO);
        assert!(f.latest.is_none() && f.skipped.is_empty(), "{f:?}");
        let kinds: Vec<_> = f.ignored.iter().map(|s| (s.path.clone(), s.kind)).collect();
        assert_eq!(
            kinds,
            [
                (out.join("checkpoint-500"), SkipKind::PresentAtStart),
                (out.join("checkpoint-5"), SkipKind::PresentAtStart)
            ]
        );
        assert!(f.ignored[0].why.contains("present when this run started"));

        // The run saves checkpoint-5 again (atomically) and a new checkpoint-10.
        std::thread::sleep(Duration::from_millis(20));
        fs::write(
            out.join("checkpoint-5/model.safetensors.tmp"),
            safetensors(4),
        )
        .unwrap();
        fs::rename(
            out.join("checkpoint-5/model.safetensors.tmp"),
            out.join("checkpoint-5/model.safetensors"),
        )
        .unwrap();
        let f = find(&l, &base, Duration::ZERO);
        assert_eq!(f.latest.unwrap().path, out.join("checkpoint-5"));
        hf_ckpt(out, 10, Some(r#"{"global_step": 10}"#));
        let f = find(&l, &base, Duration::ZERO);
        assert_eq!(f.latest.unwrap().path, out.join("checkpoint-10"));
        assert_eq!(f.ignored.len(), 1);

        // A folder that appears but was last written well before the start
        // (copied in with its times) is not this run's; one written within the
        // file system's time granularity of the start is.
        hf_ckpt(out, 20, Some(r#"{"global_step": 20}"#));
        backdate(
            &out.join("checkpoint-20"),
            base.started - Duration::from_secs(60),
        );
        let f = find(&l, &base, Duration::ZERO);
        assert_eq!(f.latest.as_ref().unwrap().path, out.join("checkpoint-10"));
        let c20 = &f.ignored[1];
        assert_eq!(c20.path, out.join("checkpoint-20"));
        assert_eq!(c20.kind, SkipKind::WrittenBeforeStart);
        assert!(c20.why.contains("before this run started"), "{c20:?}");
        backdate(
            &out.join("checkpoint-20"),
            base.started - Duration::from_secs(1),
        );
        let f = find(&l, &base, Duration::ZERO);
        assert_eq!(f.latest.unwrap().path, out.join("checkpoint-20"));
    }

    #[test]
    fn skips_are_counted_by_kind() {
        let s = |kind| Skipped {
            path: PathBuf::from("x"),
            kind,
            why: String::new(),
        };
        let list = [
            s(SkipKind::Incomplete),
            s(SkipKind::Unreadable),
            s(SkipKind::Incomplete),
        ];
        assert_eq!(kinds_text(&list), "1 unreadable, 2 incomplete");
        assert_eq!(
            Skipped::failed(
                "p".into(),
                NotComplete::Unreadable {
                    what: None,
                    why: "permission denied".into()
                }
            )
            .kind,
            SkipKind::Unreadable
        );
        // The words are those the journal had when the reason was text.
        let unreadable = |what: Option<&str>| NotComplete::Unreadable {
            what: what.map(str::to_string),
            why: "permission denied".into(),
        };
        assert_eq!(
            unreadable(None).to_string(),
            "cannot read: permission denied"
        );
        assert_eq!(
            unreadable(Some("latest")).to_string(),
            "cannot read latest: permission denied"
        );
    }

    #[test]
    fn a_read_error_says_what_it_is() {
        assert_eq!(
            io_why(&std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
            "permission denied"
        );
    }
}
