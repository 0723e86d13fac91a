//! The checkpoints an attempt's own output announced it saved: the trainer's
//! save lines, read as the output passes through. A checkpoint folder that
//! appeared during the attempt but that no line announced was written by
//! another process (another run saving into the same folder, a `cp`, a
//! `touch`), when the trainer announces its saves at all.
//!
//! Recognised (each trainer's own wording):
//!
//! - Hugging Face Trainer: `Saving model checkpoint to out/checkpoint-5`
//! - accelerate: `Saving current state to out/checkpoint_5`; diffusers' examples after it:
//!   `Saved state to out/checkpoint-500`
//! - DeepSpeed: `Saving model checkpoint: out/global_step5/mp_rank_00_model_states.pt`,
//!   `[Torch] Checkpoint global_step5 is ready now!`
//! - Lightning (ModelCheckpoint, verbose): `saving model to '/r/epoch=0-step=5.ckpt'`
//! - nanoGPT: `saving checkpoint to out`
//! - torchtune: `Model checkpoint of size 0.50 GB saved to /o/epoch_0/model.pt`
//! - Megatron: `successfully saved checkpoint at iteration 100 to /ckpt`
//! - fairseq: `Saved checkpoint checkpoints/checkpoint_1_500.pt (epoch 1 @ 500 updates, ...`

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use regex::bytes::Regex;

/// One announcement: a path (absolute, `.` and `..` resolved) or, where the
/// trainer names only the checkpoint (DeepSpeed's tag), its folder's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Announced {
    Path(PathBuf),
    Name(String),
}

/// Lines with a path after the phrase.
static PATHS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:Saving model checkpoint to|Saving model checkpoint:|Saving current state to|Saved state to|saving model to|saving checkpoint to|Saved checkpoint|checkpoint of size [0-9.]+ ?[KMGT]?i?B saved to)\s+['"]?([^'"\s,]+)"#,
    )
    .unwrap()
});
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"Checkpoint (\S+) is ready now").unwrap());
static MEGATRON: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"saved checkpoint (?:at|from) iteration\s+(\d+) to\s+(\S+)").unwrap()
});

/// The longest line looked at; a longer one is cut (no save line is that long).
const MAX_LINE: usize = 8 << 10;

/// A word every save line has (`av` of saving/saved), or DeepSpeed's `ready now`;
/// searchers built once.
static SAV: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"av"));
static READY: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"ready now"));

/// The phrases of the patterns above, one of which each save line holds: a line with
/// `av` in it (`have`, `available`) is matched against the three patterns only when it
/// holds one (OOM-dense output: the three searches and their captures were a tenth of the
/// pass-through's CPU).
static PHRASES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        "Saving model checkpoint|Saving current state to|Saved state to|saving model to|saving checkpoint to|saved to|saved checkpoint|Saved checkpoint|ready now",
    )
    .unwrap()
});

/// The lines of `text` (whole lines, ended by `\n` or `\r`, the last one possibly
/// not) that hold a word of a save line, in order, each once. Only the lines around a
/// hit are split out: `av` is common in prose ("available", "have"), but lines holding
/// it are few, and splitting every line of a chunk byte by byte cost more than all the
/// rest of the pass-through (OOM-dense output: 15 instructions a byte).
fn announcing_lines(text: &[u8], mut each: impl FnMut(&[u8])) {
    let mut pos = 0;
    // The next hit of each word at or after `pos` (None: no more).
    let mut sav = SAV.find(text);
    let mut ready = READY.find(text);
    while pos < text.len() {
        if sav.is_some_and(|i| i < pos) {
            sav = SAV.find(&text[pos..]).map(|i| pos + i);
        }
        if ready.is_some_and(|i| i < pos) {
            ready = READY.find(&text[pos..]).map(|i| pos + i);
        }
        let Some(hit) = sav.into_iter().chain(ready).min() else {
            return;
        };
        let start = memchr::memrchr2(b'\n', b'\r', &text[pos..hit]).map_or(pos, |i| pos + i + 1);
        let end = memchr::memchr2(b'\n', b'\r', &text[hit..]).map_or(text.len(), |i| hit + i);
        each(&text[start..end]);
        pos = end + 1;
    }
}
/// At most this many announcements are kept (a run saving every step for a
/// week stays small).
const MAX_KEPT: usize = 100_000;

/// Reads the output as it comes, one carry per stream for a line split
/// across chunks.
#[derive(Debug, Clone)]
pub struct Saves {
    cwd: PathBuf,
    carry: [Vec<u8>; 3],
    found: BTreeSet<Announced>,
}

impl Saves {
    /// Paths in the output are relative to `cwd` (the command's working directory).
    pub fn new(cwd: PathBuf) -> Saves {
        Saves {
            cwd,
            carry: Default::default(),
            found: BTreeSet::new(),
        }
    }

    pub fn feed(&mut self, stream: usize, chunk: &[u8]) {
        let stream = stream.min(2);
        let mut rest = chunk;
        // The line carried from the last chunk ends in this one: joined, then read.
        if !self.carry[stream].is_empty() {
            let Some(at) = memchr::memchr2(b'\n', b'\r', rest) else {
                self.keep(stream, rest);
                return;
            };
            let (line, after) = rest.split_at(at);
            let mut whole = std::mem::take(&mut self.carry[stream]);
            whole.extend_from_slice(&line[..line.len().min(MAX_LINE)]);
            // Through the words' filter as well, as the lines wholly in a chunk are: a
            // terminal's reads are 4 KiB, so nearly every read ends inside a line, and the
            // phrases' regex ran on each joined line.
            announcing_lines(&whole, |l| self.line(l));
            // Its buffer kept: passing output through allocates nothing per line.
            whole.clear();
            self.carry[stream] = whole;
            rest = &after[1..];
        }
        // The lines wholly in this chunk: read one by one only when the chunk holds a
        // word of a save line at all (every training byte passes here; almost no line
        // is a save's).
        if let Some(last) = memchr::memrchr2(b'\n', b'\r', rest) {
            let (lines, after) = rest.split_at(last);
            announcing_lines(lines, |line| self.line(line));
            rest = &after[1..];
        }
        self.keep(stream, rest);
    }

    /// Keeps the start of an unfinished line (at most [`MAX_LINE`] bytes).
    fn keep(&mut self, stream: usize, part: &[u8]) {
        let carry = &mut self.carry[stream];
        let room = MAX_LINE.saturating_sub(carry.len());
        carry.extend_from_slice(&part[..part.len().min(room)]);
    }

    /// What was announced (the unfinished last lines included).
    pub fn finish(mut self) -> Vec<Announced> {
        for s in 0..3 {
            let last = std::mem::take(&mut self.carry[s]);
            self.line(&last);
        }
        self.found.into_iter().collect()
    }

    fn line(&mut self, line: &[u8]) {
        let line = &line[..line.len().min(MAX_LINE)];
        if self.found.len() >= MAX_KEPT || !PHRASES.is_match(line) {
            return;
        }
        if let Some(c) = MEGATRON.captures(line) {
            let iter: u64 = std::str::from_utf8(&c[1])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if let Ok(root) = std::str::from_utf8(&c[2]) {
                let p = Path::new(root).join(format!("iter_{iter:07}"));
                self.found.insert(Announced::Path(absolute(&self.cwd, &p)));
            }
            return;
        }
        if let Some(c) = PATHS.captures(line)
            && let Ok(p) = std::str::from_utf8(&c[1])
        {
            let p = p.trim_end_matches(['.', ':', ';', ')']);
            if !p.is_empty() {
                self.found
                    .insert(Announced::Path(absolute(&self.cwd, Path::new(p))));
            }
            return;
        }
        if let Some(c) = TAG.captures(line)
            && let Ok(t) = std::str::from_utf8(&c[1])
        {
            self.found.insert(Announced::Name(t.to_string()));
        }
    }
}

/// `p` made absolute against `cwd`, `.` and `..` resolved by their names.
pub fn absolute(cwd: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saves(text: &str) -> Vec<Announced> {
        let mut s = Saves::new(PathBuf::from("/w"));
        // Split mid-line to exercise the carry.
        let (a, b) = text.as_bytes().split_at(text.len() / 2);
        s.feed(0, a);
        s.feed(0, b);
        let found = s.finish();
        // Read in small pieces (a terminal's reads end inside lines): the same.
        for piece in [1, 3, 7] {
            let mut s = Saves::new(PathBuf::from("/w"));
            for chunk in text.as_bytes().chunks(piece) {
                s.feed(0, chunk);
            }
            assert_eq!(s.finish(), found, "read {piece} bytes at a time: {text:?}");
        }
        found
    }

    fn path(p: &str) -> Announced {
        Announced::Path(PathBuf::from(p))
    }

    #[test]
    fn the_lines_looked_at_are_those_holding_a_word_of_a_save_line() {
        let text = b"have\r\nno\nready now and save\n\nsaved\rx ready now\nlast av";
        let mut seen = Vec::new();
        announcing_lines(text, |l| seen.push(String::from_utf8_lossy(l).into_owned()));
        let naive: Vec<String> = text
            .split(|&b| b == b'\n' || b == b'\r')
            .filter(|l| SAV.find(l).is_some() || READY.find(l).is_some())
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        assert_eq!(seen, naive);
        assert_eq!(
            seen,
            [
                "have",
                "ready now and save",
                "saved",
                "x ready now",
                "last av"
            ]
        );
    }

    #[test]
    fn each_trainers_save_line() {
        assert_eq!(
            saves("{'loss': 1.0}\nSaving model checkpoint to out/checkpoint-5\n"),
            [path("/w/out/checkpoint-5")]
        );
        assert_eq!(
            saves(
                "[INFO] [engine.py:3591:_save_checkpoint] Saving model checkpoint: ./o/global_step5/mp_rank_00_model_states.pt\n[Torch] Checkpoint global_step5 is ready now!"
            ),
            [
                path("/w/o/global_step5/mp_rank_00_model_states.pt"),
                Announced::Name("global_step5".into())
            ]
        );
        assert_eq!(
            saves(
                "Epoch 0, global step 5: 'val_loss' reached 0.50000 (best 0.50000), saving model to '/r/ck/epoch=0-step=5.ckpt' as top 1\n"
            ),
            [path("/r/ck/epoch=0-step=5.ckpt")]
        );
        assert_eq!(
            saves("step 250: train loss 1.2\nsaving checkpoint to out-shakespeare\n"),
            [path("/w/out-shakespeare")]
        );
        assert_eq!(
            saves(
                "INFO:torchtune.utils._logging:Model checkpoint of size 0.50 GB saved to /o/epoch_0/model-00001-of-00001.safetensors\n"
            ),
            [path("/o/epoch_0/model-00001-of-00001.safetensors")]
        );
        assert_eq!(
            saves("  successfully saved checkpoint at iteration     100 to /ckpt\n"),
            [path("/ckpt/iter_0000100")]
        );
        assert_eq!(
            saves("Saving current state to ../runs/checkpoint_3\r"),
            [path("/runs/checkpoint_3")]
        );
        assert_eq!(
            saves(
                "2026-11-28 10:00:01 | INFO | fairseq.checkpoint_utils | Saved checkpoint checkpoints/checkpoint_1_500.pt (epoch 1 @ 500 updates, score 5.31) (writing took 2.1 seconds)\n"
            ),
            [path("/w/checkpoints/checkpoint_1_500.pt")]
        );
        assert_eq!(
            saves(
                "11/28/2026 10:00:01 - INFO - __main__ - Saved state to sd-model/checkpoint-500\n"
            ),
            [path("/w/sd-model/checkpoint-500")]
        );
        assert!(saves("saving is fun\nwe saved nothing\n").is_empty());
    }
}
