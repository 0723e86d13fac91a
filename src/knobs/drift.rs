//! A config file the command names, edited by the user while the run goes on.
//!
//! Every attempt's copy is made from the text read at start (discovery), so a
//! user's later edit of the original is not in the relaunch. That must not
//! pass silently: before each relaunch the original's content hash is compared
//! with the one of the text read at start, and a changed file is reported with
//! the knobs the edit changed.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::config::{self, Ref};
use super::{Binding, Discovery, Knob, Value};
use crate::files::Doc;
use crate::run_folder::sha256;

/// One knob a user's edit changed in a config file: its value in the text read
/// at start and in the file now (`None`: not readable there any more).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnobEdit {
    pub knob: Knob,
    pub start: Value,
    pub now: Option<Value>,
}

/// A config file whose content is no longer the text read at start.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift {
    pub path: PathBuf,
    /// As the command named it.
    pub shown: String,
    /// The content hash of the file now (`None`: it cannot be read).
    pub hash: Option<String>,
    pub knobs: Vec<KnobEdit>,
}

/// The hashes of the text read at start, by `disc.config.files` index; `None`
/// for files that are never copied (packaged configs) or are edited in place
/// (`--edit-in-place` checks those itself before each edit).
pub fn start_hashes(disc: &Discovery) -> Vec<Option<String>> {
    disc.config
        .files
        .iter()
        .map(|f| match f.reference {
            Ref::Packaged | Ref::Unnamed => None,
            _ => Some(sha256(f.doc.original().as_bytes())),
        })
        .collect()
}

/// The files that changed since the text read at start (their hash differs
/// from `start`), with the knobs the edit changed.
pub fn changed(disc: &Discovery, start: &[Option<String>]) -> Vec<Drift> {
    let mut out = Vec::new();
    for (i, f) in disc.config.files.iter().enumerate() {
        let Some(Some(was)) = start.get(i) else {
            continue;
        };
        let path = f.doc.path();
        let now = crate::untrusted::read(
            path,
            crate::untrusted::MAX_TEXT,
            crate::untrusted::Expect::any(),
        )
        .ok();
        let hash = now.as_deref().map(sha256);
        if hash.as_ref() == Some(was) {
            continue;
        }
        let text = now.and_then(|b| String::from_utf8(b).ok());
        out.push(Drift {
            path: path.to_path_buf(),
            shown: f.shown.clone(),
            hash,
            knobs: knob_edits(disc, i, path, text),
        });
    }
    out
}

/// The knobs bound in `files[i]` whose value in `text` differs from the start.
fn knob_edits(disc: &Discovery, i: usize, path: &Path, text: Option<String>) -> Vec<KnobEdit> {
    let start_doc = &disc.config.files[i].doc;
    let now_doc = text.and_then(|t| Doc::parse_as(path, t, start_doc.format()).ok());
    let mut edits = Vec::new();
    for (knob, bound) in &disc.knobs {
        for b in std::iter::once(&bound.binding).chain(&bound.mirrors) {
            let Binding::Config { file, key, .. } = b else {
                continue;
            };
            if *file != i {
                continue;
            }
            let read = |d: &Doc| {
                d.get(key)
                    .ok()
                    .flatten()
                    .and_then(|s| config::scalar_to_value(*knob, &s))
            };
            let was = read(start_doc);
            let now = now_doc.as_ref().and_then(read);
            // A key absent from both texts (the framework's default) is no edit.
            if now == was || edits.iter().any(|e: &KnobEdit| e.knob == *knob) {
                continue;
            }
            edits.push(KnobEdit {
                knob: *knob,
                start: was.unwrap_or_else(|| bound.value.clone()),
                now,
            });
        }
    }
    edits
}

impl Drift {
    /// The terminal's line: which file changed, and that attempt `n` uses the
    /// settings read at start, with the knobs the edit changed.
    pub fn line(&self, n: u32) -> String {
        let knobs = if self.hash.is_none() {
            " (it cannot be read now)".to_string()
        } else if self.knobs.is_empty() {
            " (no knob changed in it)".to_string()
        } else {
            let parts: Vec<String> = self
                .knobs
                .iter()
                .map(|e| match &e.now {
                    Some(v) => format!("{} {} → {v}", e.knob, e.start),
                    None => format!("{} {} → not readable", e.knob, e.start),
                })
                .collect();
            format!(" (changed from the start's text: {})", parts.join(", "))
        };
        format!(
            "warning: {} was changed since the run started{knobs}; attempt {n} uses the settings read at start, not the edit (restart the run to use it)",
            self.shown
        )
    }
}
