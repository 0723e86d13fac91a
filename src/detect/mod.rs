//! Line scanner and outcome classification, shared by `run` and `diagnose`.
//!
//! OWNER: detect helper. Interface below is the contract the supervisor relies on.
//!
//! # Theory of operation
//!
//! The child's output is cut into *segments*: the text between two `\n` or `\r` bytes
//! (a `\r` ends a progress-bar frame, so each frame is looked at on its own; line
//! numbers count `\n` only). Each stream (stdout, stderr) keeps its own partial
//! segment, bounded: a segment of up to [`MAX_SEGMENT`](scanner::MAX_SEGMENT) (64 KiB) is looked at whole;
//! a longer one as its first and its last 32 KiB (an OOM message at the end of a
//! 100 KB line is found; one in the middle of a 100 MB line is not), and a 100 MB line
//! without a newline costs at most 128 KiB.
//!
//! The hot path never looks at a segment byte by byte. One literal-set search
//! ([`NEEDLES`](wordings::NEEDLES), a handful of case-sensitive words such as `emory`, `Error`, `Killed`)
//! runs over the whole chunk at SIMD speed; only segments holding one of those words
//! are cleaned (ANSI colours, `[rank3]:`-style prefixes, `&gt;`, a paste's `> ` quote
//! marks and `**` emphasis, full-width `：（），`) and given to the regexes: first one
//! pass of all OOM patterns at once ([`ANY_OOM`](wordings::ANY_OOM)), then the specific one that matched.
//! Every pattern below contains at least one needle (in the form it is printed in), so
//! skipping the other segments loses nothing.
//!
//! Decisions (the "why"):
//! - The first OOM decides (root cause wins), with two refinements:
//!   * a *weak* host OOM (only a signal: `exitcode: -9`, `SIGKILL`, `Killed`, a launcher
//!     killing its subprocesses) is replaced by a message that names the memory (a GPU
//!     OOM, the kernel's OOM-killer record) printed within [`UPGRADE_WINDOW`](scanner::UPGRADE_WINDOW) lines after
//!     it, since a kill says nothing about which memory ran out; an explicit host message
//!     (DefaultCPUAllocator) is never replaced;
//!   * an OOM without numbers (NCCL `Cuda failure 'out of memory'`, posix_memalign's
//!     `12 vs 0`) takes missing numbers from an OOM line of the same memory within
//!     [`ENRICH_WINDOW`](scanner::ENRICH_WINDOW) lines after it (NCCL prints `Failed to CUDA calloc 6291456
//!     bytes` right after).
//! - Some lines count only in context: cuBLAS/cuDNN `*_STATUS_ALLOC_FAILED`, which a
//!   broken CUDA setup or the wrong device also prints, only in the form a process dies
//!   with (an exception line, or its traceback's message), never quoted in prose;
//!   DeepSpeed's "Killing subprocess" only when no error came before it (a rank that
//!   raised printed its exception first; one that printed nothing was killed).
//! - An OOM asking for far more than the device (over [`ABSURD_GPU_FACTOR`] times its
//!   stated total, over [`ABSURD_GPU_BYTES`] without one) or any machine (over
//!   [`ABSURD_HOST_BYTES`] of host memory) is [`Kind::AbsurdRequest`]: a bug (a corrupted
//!   size), which smaller settings cannot fix. So is thrust's `bad_alloc` for a device
//!   allocation (`std::bad_alloc: cudaErrorMemoryAllocation: out of memory`, MSVC's
//!   `bad allocation: ...`), which never prints the size: in public threads it is
//!   usually a CUDA extension built for another GPU (a bigger card failing where a
//!   smaller one worked, fixed by a rebuild), though a really full GPU prints it too
//!   ([`sizeless_thrust_alloc`], whose advice says how to tell). thrust's other
//!   spellings (`parallel_for failed: cudaErrorMemoryAllocation`), RMM's and PyTorch's
//!   stay GPU OOMs.
//! - A message hard-wrapped by a terminal or a logger is joined with its next
//!   segments (at most [`MAX_JOIN_SEGMENTS`](scanner::MAX_JOIN_SEGMENTS), [`MAX_JOINED`](scanner::MAX_JOINED) bytes), without a separator,
//!   so `memor` + `y)` reads `memory)`, or with a space where a mail client broke the line
//!   at one; the number patterns accept missing spaces.
//! - Once the first OOM is settled (windows passed, no join pending) its numbers no
//!   longer change; while it is pending, only segments holding a needle or a word of
//!   life ([`LIFE_WORDS`](wordings::LIFE_WORDS)) are looked at; once it is also fatal only for life, and a
//!   settled mention (not fatal) only for life and where a fatal form of it can begin
//!   (a traceback, an `OutOfMemoryError` line: [`QUIET`](wordings::QUIET)), so multi-GB logs stay cheap.
//!   `error_line` stops updating while an OOM is pending.
//! - Old messages say `X cached` (torch <= 1.3) or `X reserved in total by PyTorch`:
//!   that is the *total* reserved, kept in `reserved_total_bytes`;
//!   `reserved_unallocated_bytes` is only filled where the message states it (2.x).
//! - Sizes: PyTorch prints binary units; the MPS allocator labels them `KB`/`MB`/`GB`
//!   but also divides by 1024, so those are binary too.
//! - Only an OOM that ended the process decides. An OOM found is *pending*: it decides
//!   if the process then exits non-zero (the supervisor's call, from the exit status),
//!   unless later output of the same process shows it went on:
//!   * a line that mentions an OOM and says it was handled ("caught CUDA out of memory,
//!     retrying with batch size 16", fairseq's "skipping batch", Composer's "will be
//!     decreased") is never pending;
//!   * a pending OOM is cleared by a later line of the same source (the same launcher
//!     prefix such as `[rank1]:`, or none) that shows the run went on: a batch-size
//!     finder's "Batch size found"-like line, or two progress lines whose step increases
//!     (one is not enough: a peer may still finish the step the failed rank died in).
//!     Scanning then starts afresh: the next OOM is the first.
//! - The hang timer (`--hang-timeout`) is only armed by an OOM in a *fatal* form
//!   ([`Scanner::armed`](scanner::Scanner::armed)): the exception line that ends a Python traceback (`Traceback
//!   (most recent call last):` … `RuntimeError: CUDA out of memory…`, or the next
//!   [`MESSAGE_LINES`](scanner::MESSAGE_LINES) lines of that exception's message), or an exception line of class
//!   `torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError` — never a line that merely
//!   contains the words (a log line, a config dump, a warning).

//!
//! # Where things live
//!
//! - [`wordings`]: the words and patterns of OOM and error lines, and how a segment is
//!   cleaned and judged ([`wordings::oom_in`]);
//! - [`numbers`]: the numbers an OOM message carries, sizes parsed and printed;
//! - [`scanner`]: the live line scanner the attempt loop feeds ([`Scanner`]);
//! - [`diagnose`]: the `oomguard diagnose` subcommand and its renderings;
//! - this module: what a finding is ([`Kind`], [`Finding`]) and how it is judged
//!   (absurd requests, the kernel's OOM-killer record).

use std::collections::BTreeSet;

use serde::Serialize;

pub mod diagnose;
pub mod kernel;
pub mod numbers;
pub mod phase;
pub mod refusal;
pub mod saves;
pub mod scanner;
pub mod score;
pub mod wordings;

pub use diagnose::{advice, diagnose_main};
pub use numbers::{OomNumbers, ProcessUse, format_size};
pub use scanner::{Scanner, Stream, classify_log, warm};

use wordings::{Strength, THRUST_BAD_ALLOC, oom_in};

/// What a log (or an attempt's output) says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A GPU (CUDA, ROCm, XPU) ran out of memory: `cuda_oom`, the journal's word for
    /// the outcome, in `diagnose` as in the journal.
    #[serde(rename = "cuda_oom")]
    GpuOom,
    HostOom,
    /// An allocation far beyond the device (or any machine): a corrupted size, an
    /// extension built for another GPU, an overflow. Not fixable by smaller settings.
    AbsurdRequest,
    OtherFailure,
    #[default]
    NoFailure,
}

impl Kind {
    /// The snake_case name used in JSON and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::GpuOom => "cuda_oom",
            Kind::HostOom => "host_oom",
            Kind::AbsurdRequest => "absurd_request",
            Kind::OtherFailure => "other_failure",
            Kind::NoFailure => "no_failure",
        }
    }
}

/// A GPU request above this many times the device's stated total is absurd. A real OOM
/// of a too-big batch asks for at most a few times the device (the fixtures: up to 1.05×,
/// cuda_oom-77 and -80); a corrupted size asks for thousands of times (not_oom-55: 2943×).
/// 64× is also more than the default policy could ever take off by halving.
pub const ABSURD_GPU_FACTOR: u64 = 64;
/// Without a stated total, a GPU request above this is absurd: 64 × 256 GiB, the largest
/// accelerator memory made (the fixtures: real OOMs ask up to 219 GiB, cuda_oom-85;
/// corrupted sizes 20.9 TiB and more, not_oom-57, -56, -73).
pub const ABSURD_GPU_BYTES: u64 = 16 << 40;
/// A host request above this is absurd: 64 × 16 TiB, more RAM than any machine has (the
/// fixtures: real host OOMs ask up to 123 GiB, host_oom-27; bugs 3.55 PiB and 16 EiB,
/// not_oom-46 and -49).
pub const ABSURD_HOST_BYTES: u64 = 1 << 50;

/// Is this request far beyond what `memory` (GPU or host) could ever hold? Then shrinking
/// the run cannot help: it is a bug.
pub fn absurd(memory: Kind, n: &OomNumbers) -> bool {
    let Some(tried) = n.tried_to_allocate_bytes.or(n.tried_at_least_bytes) else {
        return false;
    };
    match memory {
        Kind::GpuOom => {
            tried > ABSURD_GPU_BYTES
                || n.total_bytes
                    .is_some_and(|t| t > 0 && tried / ABSURD_GPU_FACTOR > t)
        }
        // A size in other words, the memory not named: beyond any machine.
        Kind::HostOom | Kind::AbsurdRequest => tried > ABSURD_HOST_BYTES,
        _ => false,
    }
}

/// What an OOM message about `memory` means: that OOM, or an absurd request.
fn judge(memory: Kind, n: &OomNumbers) -> Kind {
    if absurd(memory, n) {
        Kind::AbsurdRequest
    } else {
        memory
    }
}

/// The decisive line of a log and what it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    /// The decisive line, cleaned of rank prefixes / ANSI but otherwise as printed.
    pub line: String,
    /// 1-based line number in the scanned output (0: the line is not in it).
    pub line_no: u64,
    pub numbers: OomNumbers,
    /// What else was learned about it (from the kernel's log).
    pub note: Option<String>,
}

/// Is this finding thrust's `bad_alloc` for a device allocation, which prints no size
/// (see [`THRUST_BAD_ALLOC`](wordings::THRUST_BAD_ALLOC))? It is an absurd request, but not a size seen to be absurd.
pub fn sizeless_thrust_alloc(f: &Finding) -> bool {
    f.kind == Kind::AbsurdRequest
        && f.numbers.tried_to_allocate_bytes.is_none()
        && THRUST_BAD_ALLOC.is_match(&f.line)
}

/// What an absurd request is, in a few words (`diagnose`, the supervisor's message).
pub fn absurd_what(f: &Finding) -> &'static str {
    if sizeless_thrust_alloc(f) {
        "a GPU allocation by thrust that failed with no size printed: likely a CUDA extension built for another GPU, not fixable by smaller settings"
    } else {
        "an impossible allocation: not fixable by smaller settings"
    }
}

/// Is this finding only a kill signal (`Killed`, `exitcode: -9`), which says nothing
/// about which memory, or whether memory at all?
pub fn only_a_kill(f: &Finding) -> bool {
    f.kind == Kind::HostOom
        && f.numbers.victim.is_none()
        && matches!(
            oom_in(&f.line, None),
            Some((_, Strength::Weak | Strength::NeedsSilence))
        )
}

/// A finding, judged again with the kernel's OOM-killer record of the same machine and
/// time (`victims`: the kills of the run's time, already narrowed to its processes when
/// oomguard knows them). `named`: the PIDs the log names.
///
/// - A GPU OOM, an absurd request, a host OOM the log states: the log's root cause stands
///   (a host OOM gets its victim when the record names one).
/// - A kill signal, a failure whose line names a process the kernel killed, or nothing at
///   all: a host OOM naming the victim when the record has one of the run's processes
///   (any, when the log names no PID); a kill signal with no such record was not the OOM
///   killer's.
pub fn with_kernel_record(
    mut f: Finding,
    named: &BTreeSet<u32>,
    victims: &[kernel::Victim],
) -> Finding {
    let ours: Vec<&kernel::Victim> = victims
        .iter()
        .filter(|v| named.is_empty() || named.contains(&v.pid))
        .collect();
    let kill_only = only_a_kill(&f);
    match f.kind {
        Kind::GpuOom | Kind::AbsurdRequest => {}
        Kind::HostOom if !kill_only => {
            if f.numbers.victim.is_none() {
                f.numbers.victim = ours.first().map(|v| (*v).clone());
            }
        }
        Kind::HostOom => match ours.first() {
            Some(v) => f.numbers.victim = Some((*v).clone()),
            None => {
                f.kind = Kind::OtherFailure;
                f.note = Some(NOT_THE_OOM_KILLER.into());
            }
        },
        Kind::OtherFailure => {
            if let Some(v) = ours.first().filter(|_| !named.is_empty()) {
                f.kind = Kind::HostOom;
                f.numbers.victim = Some((*v).clone());
            }
        }
        Kind::NoFailure => {
            if let Some(v) = ours.first() {
                f.kind = Kind::HostOom;
                f.line = format!("kernel: Killed process {}", v.describe());
                f.numbers.victim = Some((*v).clone());
            }
        }
    }
    f
}

/// What a SIGKILL that the kernel's log does not attribute to its OOM killer is.
pub const NOT_THE_OOM_KILLER: &str =
    "killed by SIGKILL (not by the OOM killer: the kernel's log names no process of this run)";

#[cfg(test)]
mod tests;
