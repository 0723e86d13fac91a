//! The live line scanner: the attempt loop feeds it the child's output as it arrives,
//! and it keeps the first OOM (see the parent module's theory of operation).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

use super::numbers::{NUMBERS, OomNumbers, fill_missing, gpu_numbers, host_numbers};
use super::wordings::{
    ANSI, ANY_OOM, CANCEL_WORD, CONSEQUENCE, ERROR_WORDS, EXCEPTION_LINE, EXCEPTION_START, GPU_OOM,
    GPU_OOM_AMBIGUOUS, HANDLED, HOST_OOM, LAUNCHER_REPORT, LIFE, LOG_DICT_EPOCH, NEEDLES,
    OOM_ERROR_CLASS, OOM_WORDS, OTHER_ERROR_LINE, OTHER_ERROR_WORDS, PEER_FAILURE, PEER_WORDS,
    PENDING_NEEDLES, PREFIX, QUIET, RECOVERED, REPORTED_EXCEPTION, Strength, THRUST_BAD_ALLOC,
    TRACEBACK, clean, handled, holds_word, is_code, is_peer_failure, message_complete, oom_in,
    source_is, source_of, starts_new_record,
};
use super::{Finding, Kind, judge};
use crate::progress;

/// Which of the child's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
    /// Files the command's tasks write instead (`srun --output=logs/%j-%t.out`),
    /// fed whole lines at a time, one file's lines after another's.
    Files,
}

/// How many [`Stream`]s there are.
const STREAMS: usize = 3;

/// Longest segment (line) looked at whole; a longer one is looked at as its first and
/// its last `MAX_SEGMENT / 2` bytes.
pub const MAX_SEGMENT: usize = 64 * 1024;
/// Each end of a segment longer than [`MAX_SEGMENT`].
const HALF_SEGMENT: usize = MAX_SEGMENT / 2;
/// After the exception line that ends a traceback, this many lines are still its
/// message (NCCL's `DistBackendError` says `Cuda failure 'out of memory'` lines later).
const MESSAGE_LINES: u64 = 8;
/// A weak host OOM (a kill signal) yields to a GPU OOM this many lines later.
const UPGRADE_WINDOW: u64 = 50;
/// A GPU OOM without numbers takes them from a GPU OOM line this many lines later.
const ENRICH_WINDOW: u64 = 8;
/// Hard-wrapped messages: at most this many segments joined, this many bytes.
const MAX_JOIN_SEGMENTS: u8 = 8;
const MAX_JOINED: usize = 8 * 1024;
/// A segment shorter than this is not taken for a hard-wrapped one.
const MIN_WRAP_WIDTH: usize = 40;
/// Bytes either side of a segment boundary where a split message is looked for.
const SPLIT_WINDOW: usize = 256;

/// A message joined with the segments that follow it (hard-wrapped output).
#[derive(Debug)]
enum Pending {
    /// The first OOM's message looks cut short: append segments and re-read its numbers.
    Complete { text: String, left: u8 },
    /// A segment that may end in the middle of an OOM message: test it joined with the next.
    Split { text: String, line_no: u64 },
}

#[derive(Debug, Default)]
pub(super) struct StreamState {
    /// The start of the current partial segment: at most [`MAX_SEGMENT`] bytes.
    pub(super) partial: Vec<u8>,
    /// Once the partial segment outgrew [`MAX_SEGMENT`]: its last bytes so far (at most
    /// [`HALF_SEGMENT`] of them after each push).
    pub(super) tail: Vec<u8>,
    /// The partial segment is longer than [`MAX_SEGMENT`].
    long: bool,
    pending: Option<Pending>,
    /// A `Traceback (most recent call last):` was seen and its exception line not yet.
    traceback: bool,
    /// Lines up to this one are the message of an exception that ended a traceback.
    message_until: u64,
}

impl StreamState {
    /// Add bytes of the current segment: its first [`MAX_SEGMENT`] bytes are kept, and
    /// beyond them its last [`HALF_SEGMENT`] bytes.
    fn push(&mut self, bytes: &[u8]) {
        let room = MAX_SEGMENT.saturating_sub(self.partial.len());
        let take = room.min(bytes.len());
        if take > 0 {
            if self.partial.capacity() < MAX_SEGMENT
                && self.partial.len() + take > self.partial.capacity()
            {
                // Grow in powers of two, but never past the cap.
                let want = (self.partial.len() + take)
                    .next_power_of_two()
                    .min(MAX_SEGMENT);
                self.partial.reserve_exact(want - self.partial.len());
            }
            self.partial.extend_from_slice(&bytes[..take]);
        }
        let beyond = &bytes[take..];
        if beyond.is_empty() {
            return;
        }
        self.long = true;
        if self.tail.capacity() == 0 {
            self.tail.reserve_exact(2 * HALF_SEGMENT);
        }
        self.tail
            .extend_from_slice(&beyond[beyond.len().saturating_sub(HALF_SEGMENT)..]);
        if self.tail.len() > HALF_SEGMENT {
            self.tail.drain(..self.tail.len() - HALF_SEGMENT);
        }
    }

    /// Forget the partial segment, keeping the buffers.
    fn clear_partial(&mut self) {
        self.partial.clear();
        self.tail.clear();
        self.long = false;
    }
}

/// Incremental scanner over a child's stdout and stderr. See the module docs.
#[derive(Debug, Default)]
pub struct Scanner {
    pub(super) streams: [StreamState; STREAMS],
    /// `\n`-terminated lines seen so far (all streams).
    lines: u64,
    /// The pending OOM: the first one since the start or since the last sign of life.
    first: Option<Finding>,
    /// The first OOM is a host OOM known only from a kill signal.
    first_weak: bool,
    /// The memory the first OOM's message is about (`GpuOom` or `HostOom`), also when
    /// its kind is `AbsurdRequest`.
    first_memory: Kind,
    /// An OOM in a fatal form was seen while this one is pending (see `armed`).
    fatal: bool,
    /// Where the pending OOM came from: its launcher prefix (`[rank1]:`), or "".
    source: String,
    /// The step of the last progress line of that source since the OOM.
    life_step: Option<u64>,
    /// The epoch of the last Trainer log dict of that source since the OOM.
    life_epoch: Option<f64>,
    /// A traceback of the pending OOM's source began after it, not chained to
    /// it: its exception line, when not an OOM or a peer's failure, is what
    /// ended the process (the OOM's was printed and survived).
    later_traceback: bool,

    /// Set by `on_segment` when an OOM becomes pending; read and cleared by `feed`.
    found_now: bool,
    /// (priority, line, line_no): the most telling non-OOM error line.
    error: Option<(u8, String, u64)>,
    /// Slurm's `*** STEP 5.0 ON n1 CANCELLED AT ... ***` line (scancel, preemption,
    /// time limit), if one was seen.
    cancelled: Option<String>,
    /// PIDs that OOM and error lines name ("exitcode: -9 (pid: 3309)", "DataLoader
    /// worker (pid(s) 812) exited"): processes of the run, for the kernel's record.
    named_pids: BTreeSet<u32>,
    /// The first error line saying a peer of a distributed run failed ([`PEER_FAILURE`]),
    /// when no error of the process's own came before it (the root cause wins).
    peer: Option<(String, u64)>,
    /// An error line of the process's own (an exception or a telling error that is not
    /// a peer's failure) was seen.
    own_error: bool,
}

static CANCELLED: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(CANCEL_WORD));

/// The Slurm cancel line around `at` in `bytes`, if it is one (`*** JOB|STEP ...`).
fn cancel_line(bytes: &[u8], at: usize) -> Option<String> {
    let start = memchr::memrchr2(b'\n', b'\r', &bytes[..at]).map_or(0, |i| i + 1);
    let end = memchr::memchr2(b'\n', b'\r', &bytes[at..]).map_or(bytes.len(), |i| at + i);
    let line = String::from_utf8_lossy(&bytes[start..end]);
    let tail = line.split("***").nth(1)?;
    let tail = tail.trim_start();
    (tail.starts_with("STEP ") || tail.starts_with("JOB ")).then(|| line.trim().to_string())
}

/// At most this many PIDs named in the output are kept.
const MAX_NAMED_PIDS: usize = 4096;

/// A PID in the words launchers and PyTorch use for a process that died.
static PID_WORDS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i:\bpids?(?:\(s\))?\s*[:=]?\s*|received by PID\s+|Killing subprocess\s+)(\d+(?:\s*,\s*\d+)*)")
        .expect("pid pattern")
});

impl Scanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed raw bytes as they arrive, in any chunking, from one of the child's streams.
    /// Returns true when this call found an OOM that is now pending (the first one, or
    /// the first since later output showed the process went on).
    pub fn feed(&mut self, stream: Stream, chunk: &[u8]) -> bool {
        let si = stream as usize;
        self.found_now = false;
        let mut rest = chunk;
        if !self.streams[si].partial.is_empty() {
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    self.streams[si].push(rest);
                    return false;
                }
                Some(i) => {
                    self.streams[si].push(&rest[..i]);
                    self.end_partial(si);
                    if rest[i] == b'\n' {
                        self.lines += 1;
                    }
                    rest = &rest[i + 1..];
                }
            }
        }
        if let Some(j) = memchr::memrchr2(b'\n', b'\r', rest) {
            self.scan_region(si, &rest[..=j]);
            rest = &rest[j + 1..];
        }
        self.streams[si].push(rest);
        std::mem::take(&mut self.found_now) && self.first.is_some()
    }

    /// A Slurm cancel line in `seg` (one segment: the scan sets find its word, so a
    /// segment holding it is always looked at).
    fn look_for_cancel(&mut self, seg: &[u8]) {
        if self.cancelled.is_none() {
            self.cancelled = CANCELLED.find_iter(seg).find_map(|at| cancel_line(seg, at));
        }
    }

    /// Slurm's line saying the job or step was cancelled (`scancel`, preemption, a
    /// time limit): such an attempt is never taken for an OOM or relaunched.
    pub fn slurm_cancelled(&self) -> Option<&str> {
        self.cancelled.as_deref()
    }

    /// Flush partial last lines (end of output). Feeding after `finish` goes on counting.
    pub fn finish(&mut self) {
        self.found_now = false;
        for si in 0..STREAMS {
            if !self.streams[si].partial.is_empty() {
                self.end_partial(si);
                self.lines += 1;
            }
            // A `Complete` join has already updated the finding; a `Split` one is moot.
            self.streams[si].pending = None;
        }
    }

    /// The pending OOM: the first one seen, unless later output of the same process
    /// showed it went on (then the first one after that). The supervisor takes it as
    /// the cause when the process exits non-zero.
    pub fn first_oom(&self) -> Option<&Finding> {
        self.first.as_ref()
    }

    /// An OOM is pending and was seen in a fatal form (it ended a traceback, or is a
    /// `torch.OutOfMemoryError` exception line): silence after it means a hang.
    pub fn armed(&self) -> bool {
        self.first.is_some() && self.fatal
    }

    /// The most telling non-OOM error line seen: the last Python exception line
    /// (`RuntimeError: ...`), else the last other error line (NCCL watchdog, failed
    /// assertion, `failed (exitcode: 1)`), else a launcher's summary (`ChildFailedError`).
    pub fn error_line(&self) -> Option<&str> {
        self.error.as_ref().map(|(_, line, _)| line.as_str())
    }

    /// The line saying a peer of a distributed run failed (`Connection closed by peer`,
    /// a rendezvous or store error, NCCL's watchdog after a peer died), when the process
    /// printed no error of its own before it: the attempt ended because another rank did.
    pub fn peer_failure(&self) -> Option<&str> {
        self.peer.as_ref().map(|(line, _)| line.as_str())
    }

    /// PIDs the output's OOM and error lines named (a launcher's "exitcode: -9 (pid:
    /// 3309)"): processes of the run, also when they were never seen alive.
    pub fn named_pids(&self) -> &BTreeSet<u32> {
        &self.named_pids
    }

    /// Note the PIDs a telling line names.
    fn note_pids(&mut self, text: &str) {
        let named = ["pid", "PID", "Pid", "Killing"]
            .iter()
            .any(|w| text.contains(w));
        if !named || self.named_pids.len() >= MAX_NAMED_PIDS {
            return;
        }
        for c in PID_WORDS.captures_iter(text) {
            for pid in c[1].split(',').filter_map(|p| p.trim().parse().ok()) {
                self.named_pids.insert(pid);
            }
        }
    }

    /// Lines seen so far (an unterminated last line counts once `finish` has run).
    #[cfg(test)]
    pub fn lines_seen(&self) -> u64 {
        self.lines
    }

    /// The outcome so far: the pending OOM, else the error line, else no failure.
    pub fn finding(&self) -> Finding {
        if let Some(f) = &self.first {
            return f.clone();
        }
        match &self.error {
            Some((_, line, line_no)) => Finding {
                kind: Kind::OtherFailure,
                line: line.clone(),
                line_no: *line_no,
                numbers: OomNumbers::default(),
                note: None,
            },
            None => Finding {
                kind: Kind::NoFailure,
                line: String::new(),
                line_no: 0,
                numbers: OomNumbers::default(),
                note: None,
            },
        }
    }

    /// No traceback is open and no exception's message is being read, on any stream:
    /// the next line can be a fatal form of an OOM only by starting one.
    fn quiet_ahead(&self) -> bool {
        self.streams
            .iter()
            .all(|st| !st.traceback && st.message_until <= self.lines)
    }

    /// The first OOM's numbers and kind can no longer change (windows passed, no join
    /// pending). Life, and a fatal form, are still looked for.
    fn settled(&self) -> bool {
        let Some(first) = &self.first else {
            return false;
        };
        let window = if self.first_weak {
            UPGRADE_WINDOW
        } else {
            ENRICH_WINDOW
        };
        self.lines >= first.line_no + window && self.streams.iter().all(|s| s.pending.is_none())
    }

    /// `region` holds whole segments, each ended by `\n` or `\r`. Only segments holding a
    /// needle are looked at (and, while an OOM is pending, a word of life).
    fn scan_region(&mut self, si: usize, region: &[u8]) {
        let mut pos = 0;
        while pos < region.len() {
            // Without an OOM pending, the needles; with one, words of life as well;
            // with a fatal one whose numbers are settled, only words of life.
            let (start, hit) = if self.streams[si].pending.is_some() {
                (pos, None)
            } else {
                // Each set holds Slurm's cancel word as well (one pass finds both).
                let (needles, hit) = if self.first.is_none() {
                    (&*NEEDLES, Some(true))
                } else if self.settled() && (self.fatal || self.quiet_ahead()) {
                    // Nothing but life can change a fatal OOM now; a settled mention
                    // only becomes fatal through a traceback or an OOM exception line,
                    // which `QUIET` finds (and then the full set is back).
                    (if self.fatal { &*LIFE } else { &*QUIET }, None)
                } else {
                    (&*PENDING_NEEDLES, None)
                };
                match needles.find_at(region, pos) {
                    None => {
                        self.lines += count_newlines(&region[pos..]);
                        return;
                    }
                    Some(m) => {
                        let start = memchr::memrchr2(b'\n', b'\r', &region[pos..m.start])
                            .map_or(pos, |i| pos + i + 1);
                        // The cancel word alone: the segment is Slurm's business, not
                        // the scanner's, unless a word of the set is in it too.
                        if m.cancel {
                            let end = line_end(region, m.end);
                            let seg = &region[start..end];
                            if !holds_word(needles, seg) {
                                self.look_for_cancel(seg);
                                self.lines += count_newlines(&region[pos..=end]);
                                pos = end + 1;
                                continue;
                            }
                        }
                        (start, hit)
                    }
                }
            };
            self.lines += count_newlines(&region[pos..start]);
            let end = line_end(region, start);
            let seg = &region[start..end];
            if seg.len() <= MAX_SEGMENT {
                self.on_segment(si, seg, hit);
            } else {
                self.on_long_segment(si, &seg[..HALF_SEGMENT], &seg[seg.len() - HALF_SEGMENT..]);
            }
            if region[end] == b'\n' {
                self.lines += 1;
            }
            pos = end + 1;
        }
    }

    /// The partial segment of stream `si` has ended: look at it and clear it.
    fn end_partial(&mut self, si: usize) {
        let mut partial = std::mem::take(&mut self.streams[si].partial);
        if self.streams[si].long {
            // The last HALF_SEGMENT bytes: what `tail` lacks comes from the end of `partial`.
            let tail = &self.streams[si].tail;
            let need = HALF_SEGMENT.saturating_sub(tail.len());
            let from = partial.len().saturating_sub(need).max(HALF_SEGMENT);
            let last = [&partial[from..], &tail[..]].concat();
            self.on_long_segment(si, &partial[..HALF_SEGMENT], &last);
        } else {
            self.on_segment(si, &partial, None);
        }
        partial.clear();
        self.streams[si].partial = partial;
        self.streams[si].clear_partial();
    }

    /// A segment longer than [`MAX_SEGMENT`]: its first and its last bytes, looked at
    /// as two segments of the same line (never joined with each other).
    fn on_long_segment(&mut self, si: usize, head: &[u8], last: &[u8]) {
        self.on_segment(si, head, None);
        self.streams[si].pending = None;
        self.on_segment(si, last, None);
    }

    /// One whole segment (at most [`MAX_SEGMENT`] bytes); `hit`: whether it holds a
    /// needle, when the caller knows.
    fn on_segment(&mut self, si: usize, seg: &[u8], hit: Option<bool>) {
        if seg.is_empty() {
            return;
        }
        self.look_for_cancel(seg);
        let line_no = self.lines + 1;
        // A sign of life clears the pending OOM (and ends a join that continues its
        // message); this segment is then looked at afresh.
        if self.first.is_some() && self.shows_life(seg) {
            self.clear_pending();
        }
        if self.first.is_some() && self.another_error_ended_it(seg, line_no) {
            self.clear_pending();
        }
        if let Some(pending) = self.streams[si].pending.take()
            && self.join(si, pending, seg)
        {
            return;
        }
        if self.fatal && self.settled() {
            return; // nothing but life can change now
        }
        if !hit.unwrap_or_else(|| holds_word(&NEEDLES, seg)) {
            return;
        }
        let text = clean(seg);
        // A mention of an OOM whose numbers are settled: only a fatal form of it can
        // change anything (arm the hang timer), so only a line that may be one is read.
        let quiet = self.first.is_some() && self.settled();
        let st = &self.streams[si];
        let may_be_fatal =
            line_no <= st.message_until || st.traceback || OOM_ERROR_CLASS.find(seg).is_some();
        let oom = if is_code(&text) || (quiet && !may_be_fatal) {
            None // `except torch.cuda.OutOfMemoryError:` is code, not an OOM
        } else {
            oom_in(&text, None)
        };
        let st = &mut self.streams[si];
        // The exception line's class, only where it matters (the DFA's `find`, cheap):
        // to end an open traceback, or to judge an OOM line.
        let exception = if st.traceback || oom.is_some() {
            EXCEPTION_START.find(&text).map(|m| {
                m.as_str()
                    .trim_end_matches(|c: char| c == ':' || c.is_whitespace())
            })
        } else {
            None
        };
        let in_message = line_no <= st.message_until;
        let ends_traceback = exception.is_some() && st.traceback && !in_message;
        if ends_traceback {
            st.traceback = false;
            st.message_until = line_no + MESSAGE_LINES;
        } else if TRACEBACK.find(seg).is_some() {
            st.traceback = true;
        }
        let exception_form = exception.is_some() || in_message;
        let oom = oom.filter(|&(_, strength)| self.admits(strength, exception_form));
        match oom {
            Some(_) if exception.is_none() && !in_message && handled(&text) => {
                // "caught CUDA out of memory, retrying with batch size 16": not a death.
            }
            Some((kind, strength)) => {
                self.note_pids(&text);
                let fatal = in_message
                    || ends_traceback
                    || exception.is_some_and(|c| c.ends_with("OutOfMemoryError"));
                let source = source_of(seg);
                let weak = strength != Strength::Strong && strength != Strength::NeedsException;
                self.record(si, kind, weak, fatal, text.into_owned(), line_no, source);
            }
            None => {
                if self.first.is_none() {
                    self.note_error(&text, line_no);
                    if text.len() >= MIN_WRAP_WIDTH
                        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
                    {
                        let text = text.into_owned();
                        self.streams[si].pending = Some(Pending::Split { text, line_no });
                    }
                }
            }
        }
    }

    /// Continue a hard-wrapped message with `seg`; true when `seg` was taken by it.
    fn join(&mut self, si: usize, pending: Pending, seg: &[u8]) -> bool {
        match pending {
            Pending::Complete { mut text, left } => {
                if self.first.is_none() {
                    return false;
                }
                // torchrun's `[rank1]:` on every line a process prints: a line with
                // another's is not part of this message, which may go on after it (the
                // ranks' lines interleave). A wrapped line (the terminal's doing, after
                // the prefix was put on) has none; a line of the message's own process
                // has its prefix (cudaMallocAsync's message spans lines). Such a line
                // counts toward the join's limit, so the message is not continued by a
                // line of its process far below it.
                let prefix = source_of(seg);
                if !prefix.is_empty() && prefix != self.source {
                    if left > 1 {
                        self.streams[si].pending = Some(Pending::Complete {
                            text,
                            left: left - 1,
                        });
                    }
                    return false;
                }
                let next = clean(seg);
                if starts_new_record(&next) {
                    // The join ends here; `next` is a segment of its own.
                    return false;
                }
                if joins_with_space(&text, seg, &next, !prefix.is_empty()) {
                    text.push(' ');
                }
                text.push_str(&next);
                if let Some(first) = &mut self.first {
                    first.numbers = gpu_numbers(&text);
                    first.kind = judge(Kind::GpuOom, &first.numbers);
                    first.line.clone_from(&text);
                }
                if left > 1 && !message_complete(&text) && text.len() < MAX_JOINED {
                    self.streams[si].pending = Some(Pending::Complete {
                        text,
                        left: left - 1,
                    });
                }
                true
            }
            Pending::Split { text, line_no } => {
                let next = clean(seg);
                // Only a match across the boundary counts, and such a match lies
                // in a small window around it: test that first, it is cheap.
                let from = floor_boundary(&text, text.len().saturating_sub(SPLIT_WINDOW));
                let to = floor_boundary(&next, SPLIT_WINDOW.min(next.len()));
                // A terminal or a logger wraps mid-word (`memor` + `y)`); a mail client
                // at a space it drops (`CUDA out of` + `memory`).
                for sep in ["", " "] {
                    let boundary = text.len() - from + sep.len();
                    let window = [&text[from..], sep, &next[..to]].concat();
                    if oom_in(&window, Some(boundary)).is_none() {
                        continue;
                    }
                    let boundary = text.len() + sep.len();
                    let joined = [text.as_str(), sep, &next].concat();
                    match oom_in(&joined, Some(boundary)) {
                        Some((kind, strength))
                            if self.admits(strength, EXCEPTION_START.is_match(&joined)) =>
                        {
                            let source = source_of(seg);
                            let weak = strength != Strength::Strong
                                && strength != Strength::NeedsException;
                            self.record(si, kind, weak, false, joined, line_no, source);
                            return true;
                        }
                        _ => {}
                    }
                }
                false
            }
        }
    }

    /// Whether an OOM line of this strength counts here: an ambiguous GPU failure only in
    /// the form a process dies with (`exception_form`), a launcher's kill only when no
    /// error came before it.
    fn admits(&self, strength: Strength, exception_form: bool) -> bool {
        match strength {
            Strength::Strong | Strength::Weak => true,
            Strength::NeedsException => exception_form,
            Strength::NeedsSilence => self.error.is_none(),
        }
    }

    /// Does `seg` show that the process of the pending OOM went on? Progress lines are
    /// remembered: two whose step increases are the sign.
    fn shows_life(&mut self, seg: &[u8]) -> bool {
        // Cheapest first: most segments looked at here show no life at all.
        if !holds_word(&LIFE, seg) {
            return false;
        }
        // Only the pending OOM's process can show it went on: another's line (a rank's
        // progress in a run of several) is not read for its step. Every way below
        // answers false for it and changes nothing, so the cheap comparison goes first.
        if !source_is(seg, &self.source) {
            return false;
        }
        let recovered = RECOVERED.is_match(seg);
        let step = if recovered {
            None
        } else {
            match progress::last_step(seg) {
                Some(step) => Some(step),
                None => {
                    // A Trainer log dict: two whose epoch increases show life.
                    let text = String::from_utf8_lossy(seg);
                    let body = PREFIX.replace(&text, "");
                    let Some(epoch) = LOG_DICT_EPOCH
                        .captures(&body)
                        .and_then(|c| c[1].parse::<f64>().ok())
                    else {
                        return false;
                    };
                    if source_of(seg) != self.source {
                        return false;
                    }
                    let went_on = self.life_epoch.is_some_and(|e| epoch > e);
                    self.life_epoch = Some(epoch);
                    return went_on;
                }
            }
        };
        if !source_is(seg, &self.source) {
            return false;
        }
        match step {
            None => true, // recovered
            Some(step) => {
                let went_on = self.life_step.is_some_and(|s| step > s);
                self.life_step = Some(step);
                went_on
            }
        }
    }

    /// Two tracebacks one after the other: the pending OOM's, printed and
    /// survived (`traceback.print_exc()`), then another's, whose exception
    /// line — not an OOM, not a peer's failure — is what ended the process.
    /// A traceback Python chains to the OOM's ("During handling of the above
    /// exception, another exception occurred:", which Python puts between
    /// them with a blank line either side, so it begins 2 to 4 lines after
    /// the OOM's line) is the OOM's own failure: the root cause stays.
    /// Only a GPU OOM can have been caught and survived: a host OOM's kill
    /// (`exitcode: -9`) is final, and the launcher's report of it that follows
    /// (torchrun's `ChildFailedError`, accelerate's `CalledProcessError`) is the
    /// same failure told again.
    fn another_error_ended_it(&mut self, seg: &[u8], line_no: u64) -> bool {
        let Some(gap) = self
            .first
            .as_ref()
            .filter(|f| f.kind == Kind::GpuOom)
            .and_then(|f| line_no.checked_sub(f.line_no))
            .filter(|g| *g > 0)
        else {
            return false;
        };
        if TRACEBACK.find(seg).is_some() {
            if source_of(seg) == self.source {
                self.later_traceback = !(2..=4).contains(&gap);
            }
            return false;
        }
        if !self.later_traceback || source_of(seg) != self.source {
            return false;
        }
        let text = String::from_utf8_lossy(seg);
        let body = PREFIX.replace(&text, "");
        if !EXCEPTION_START.is_match(&body) {
            return false;
        }
        if OOM_WORDS.is_match(seg) || is_peer_failure(&body) || LAUNCHER_REPORT.is_match(&body) {
            self.later_traceback = false;
            return false;
        }
        true
    }

    /// The pending OOM was survived: forget it; the next OOM is the first again.
    fn clear_pending(&mut self) {
        self.first = None;
        self.first_weak = false;
        self.fatal = false;
        self.source.clear();
        self.life_step = None;
        self.life_epoch = None;
        self.later_traceback = false;
        for st in &mut self.streams {
            if matches!(st.pending, Some(Pending::Complete { .. })) {
                st.pending = None;
            }
        }
    }

    /// An OOM message was found at `line_no`; `fatal`: in a form that ends a process.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site per form of message"
    )]
    fn record(
        &mut self,
        si: usize,
        kind: Kind,
        weak: bool,
        fatal: bool,
        text: String,
        line_no: u64,
        source: String,
    ) {
        if fatal && !self.fatal {
            // Life must now come from the process this fatal OOM belongs to.
            self.source.clone_from(&source);
            self.life_step = None;
        }
        self.fatal |= fatal;
        // `memory`: which memory the message is about; `kind`: what it means (an
        // absurd request is a bug, not a lack of memory).
        let memory = kind;
        // The numbers only where they are used (reading them costs a dozen searches).
        let upgrade = self.first.as_ref().is_some_and(|first| {
            self.first_weak && !weak && self.lines < first.line_no + UPGRADE_WINDOW
        });
        let enrich = self.first.as_ref().is_some_and(|first| {
            self.first_memory == memory && !weak && self.lines < first.line_no + ENRICH_WINDOW
        });
        if self.first.is_some() && !upgrade && !enrich {
            return;
        }
        let numbers = match memory {
            Kind::GpuOom => gpu_numbers(&text),
            _ => host_numbers(&text),
        };
        let kind = judge(memory, &numbers);
        match &mut self.first {
            None => {
                self.found_now = true;
                self.first_weak = weak;
                self.first_memory = memory;
                self.fatal = fatal;
                self.source = source;
                self.life_step = None;
                self.life_epoch = None;
                self.later_traceback = false;
                let incomplete = memory == Kind::GpuOom && !message_complete(&text);
                self.first = Some(Finding {
                    kind,
                    line: text.clone(),
                    line_no,
                    numbers,
                    note: None,
                });
                if incomplete {
                    self.streams[si].pending = Some(Pending::Complete {
                        text,
                        left: MAX_JOIN_SEGMENTS - 1,
                    });
                }
            }
            Some(first) if upgrade => {
                // A kill signal followed by a message that names the memory (a GPU OOM,
                // the kernel's OOM-killer record): that message is the specific one.
                *first = Finding {
                    kind,
                    line: text,
                    line_no,
                    numbers,
                    note: None,
                };
                self.first_weak = false;
                self.first_memory = memory;
            }
            Some(first) if enrich => {
                // The same failure told again close behind (NCCL's calloc line, an
                // allocator's old and new spelling): it may add the numbers.
                fill_missing(&mut first.numbers, numbers);
                first.kind = judge(memory, &first.numbers);
            }
            Some(_) => {}
        }
    }

    fn note_error(&mut self, text: &str, line_no: u64) {
        if is_code(text) {
            return;
        }
        let exception = if ERROR_WORDS.is_match(text.as_bytes()) {
            // `find`, not `captures`: the DFA is several times faster than the
            // backtracker that capture groups need; the class name is cut out by hand.
            EXCEPTION_LINE.find(text)
        } else {
            None
        };
        let priority = if let Some(m) = exception {
            let class = m
                .as_str()
                .trim_start_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .trim_end_matches(|c: char| c == ':' || c.is_whitespace());
            let name = class.rsplit('.').next().unwrap_or(class);
            if matches!(name, "ChildFailedError" | "CalledProcessError") {
                1
            } else {
                3
            }
        } else if OTHER_ERROR_WORDS.is_match(text.as_bytes()) && OTHER_ERROR_LINE.is_match(text) {
            2
        } else if TRACEBACK.find(text.as_bytes()).is_some() {
            // A traceback whose exception line is missing (a paste cut short): an
            // exception was raised, which is a failure, though the least telling line.
            0
        } else {
            return;
        };
        // A launcher's or the runtime's word that a process died (`failed (exitcode: 1)`,
        // `terminate called after throwing`) is the consequence of a telling line before
        // it, which it does not replace (bitsandbytes' `Error operation not supported at
        // line 351`, then torchrun's record).
        let consequence = priority == 2 && CONSEQUENCE.is_match(text);
        if priority >= 2 {
            if is_peer_failure(text) {
                if !self.own_error && self.peer.is_none() {
                    self.peer = Some((text.to_string(), line_no));
                }
            } else if priority == 3 || !consequence {
                // An exception of its own, or a telling error (an illegal memory access,
                // a failed assertion) — not a launcher's word that a process died.
                self.own_error = true;
            }
        }
        self.note_pids(text);
        match &mut self.error {
            Some((p, line, n)) if priority > *p || (priority == *p && !consequence) => {
                // Reuse the buffer: error lines can be frequent in a long log.
                line.clear();
                line.push_str(text);
                (*p, *n) = (priority, line_no);
            }
            Some(_) => {}
            None => self.error = Some((priority, text.to_string(), line_no)),
        }
    }
}

/// Whether a message's `text` so far and the segment `seg` that continues it (`next`,
/// cleaned) are two lines, not one wrapped line: `seg` is a line the process printed
/// (`prefixed`, with a launcher's prefix: cudaMallocAsync's message spans lines), or the
/// wrap fell on a space (cleaning drops it from `next`), or `text` ends a sentence or a
/// clause and `next` begins a word. A terminal wraps mid-word (`non-PyTo` + `rch`) and mid-number (`21` +
/// `.40 GiB`): those join as they are.
fn joins_with_space(text: &str, seg: &[u8], next: &str, prefixed: bool) -> bool {
    prefixed
        || seg.first().is_some_and(|b| matches!(b, b' ' | b'\t'))
        || (text.ends_with(['.', ';', ',', ')'])
            && next.starts_with(|c: char| c.is_ascii_alphabetic() || c == '('))
}

/// Where the segment that holds `at` ends in `region` (whose last byte ends a line).
fn line_end(region: &[u8], at: usize) -> usize {
    at + memchr::memchr2(b'\n', b'\r', &region[at..]).expect("a region ends with a line end")
}

fn count_newlines(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Classify a whole saved log (for `oomguard diagnose`). No failure found => Kind::NoFailure
/// with an empty line; a non-OOM error => Kind::OtherFailure with that line.
pub fn classify_log(bytes: &[u8]) -> Finding {
    let mut scanner = Scanner::new();
    scanner.feed(Stream::Out, bytes);
    scanner.finish();
    scanner.finding()
}

/// Build every pattern the scanner can need, now. Called on a thread of its own when a
/// run starts: the patterns are otherwise built at first use, which for most of them is
/// the first OOM line, and that build (tens of milliseconds of CPU) was then spent between
/// the OOM and the hang timer's reaction.
pub fn warm() {
    macro_rules! force {
        ($($s:expr),* $(,)?) => { $( LazyLock::force(&$s); )* };
    }
    force!(
        NEEDLES,
        LIFE,
        PENDING_NEEDLES,
        QUIET,
        TRACEBACK,
        OOM_ERROR_CLASS,
        HANDLED,
        REPORTED_EXCEPTION,
        RECOVERED,
        EXCEPTION_START,
        OOM_WORDS,
        OTHER_ERROR_WORDS,
        ERROR_WORDS,
        GPU_OOM,
        THRUST_BAD_ALLOC,
        GPU_OOM_AMBIGUOUS,
        ANY_OOM,
        HOST_OOM,
        EXCEPTION_LINE,
        OTHER_ERROR_LINE,
        PEER_FAILURE,
        CONSEQUENCE,
        PEER_WORDS,
        PREFIX,
        ANSI,
        NUMBERS,
        CANCELLED,
        PID_WORDS,
    );
    // The patterns of the modules the scanner calls (progress, the kernel's lines), and
    // the lazy DFAs' first states, through a log that takes every path once.
    classify_log(WARM_LOG.as_bytes());
}

/// A log that takes the scanner through each kind of line once (see [`warm`]).
const WARM_LOG: &str = "\
step 1/10 loss 2.0\n\
step 2/10 loss 1.9\n\
 30%|###       | 3/10 [00:03<00:07, 1.00it/s]\n\
[rank0]: Traceback (most recent call last):\n\
[rank0]:   File \"train.py\", line 1, in <module>\n\
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a \
total capacity of 7.79 GiB of which 3.06 MiB is free. Process 12 has 7.78 GiB memory in use. \
Of the allocated memory 7.5 GiB is allocated by PyTorch, and 10.0 MiB is reserved by PyTorch \
but unallocated.\n\
RuntimeError: NCCL error: unhandled cuda error, Connection closed by peer (pid: 12)\n\
Killed process 12 (python3) total-vm:1kB, anon-rss:1kB\n\
oom-kill:constraint=CONSTRAINT_NONE,task=python3,pid=12,uid=0\n\
*** STEP 5.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n\
Killed\n";
