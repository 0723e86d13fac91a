//! Line scanner and outcome classification, shared by `run` and `diagnose`.
//!
//! OWNER: detect helper. Interface below is the contract the supervisor relies on.
//!
//! # Theory of operation
//!
//! The child's output is cut into *segments*: the text between two `\n` or `\r` bytes
//! (a `\r` ends a progress-bar frame, so each frame is looked at on its own; line
//! numbers count `\n` only). Each stream (stdout, stderr) keeps its own partial
//! segment, bounded: a segment of up to [`MAX_SEGMENT`] (64 KiB) is looked at whole;
//! a longer one as its first and its last 32 KiB (an OOM message at the end of a
//! 100 KB line is found; one in the middle of a 100 MB line is not), and a 100 MB line
//! without a newline costs at most 128 KiB.
//!
//! The hot path never looks at a segment byte by byte. One literal-set search
//! ([`NEEDLES`], a handful of case-sensitive words such as `emory`, `Error`, `Killed`)
//! runs over the whole chunk at SIMD speed; only segments holding one of those words
//! are cleaned (ANSI colours, `[rank3]:`-style prefixes, `&gt;`, a paste's `> ` quote
//! marks and `**` emphasis, full-width `：（），`) and given to the regexes: first one
//! pass of all OOM patterns at once ([`ANY_OOM`]), then the specific one that matched.
//! Every pattern below contains at least one needle (in the form it is printed in), so
//! skipping the other segments loses nothing.
//!
//! Decisions (the "why"):
//! - The first OOM decides (root cause wins), with two refinements:
//!   * a *weak* host OOM (only a signal: `exitcode: -9`, `SIGKILL`, `Killed`, a launcher
//!     killing its subprocesses) is replaced by a message that names the memory (a GPU
//!     OOM, the kernel's OOM-killer record) printed within [`UPGRADE_WINDOW`] lines after
//!     it, since a kill says nothing about which memory ran out; an explicit host message
//!     (DefaultCPUAllocator) is never replaced;
//!   * an OOM without numbers (NCCL `Cuda failure 'out of memory'`, posix_memalign's
//!     `12 vs 0`) takes missing numbers from an OOM line of the same memory within
//!     [`ENRICH_WINDOW`] lines after it (NCCL prints `Failed to CUDA calloc 6291456
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
//!   segments (at most [`MAX_JOIN_SEGMENTS`], [`MAX_JOINED`] bytes), without a separator,
//!   so `memor` + `y)` reads `memory)`, or with a space where a mail client broke the line
//!   at one; the number patterns accept missing spaces.
//! - Once the first OOM is settled (windows passed, no join pending) its numbers no
//!   longer change; while it is pending, only segments holding a needle or a word of
//!   life ([`LIFE_WORDS`]) are looked at; once it is also fatal only for life, and a
//!   settled mention (not fatal) only for life and where a fatal form of it can begin
//!   (a traceback, an `OutOfMemoryError` line: [`QUIET`]), so multi-GB logs stay cheap.
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
//!   ([`Scanner::armed`]): the exception line that ends a Python traceback (`Traceback
//!   (most recent call last):` … `RuntimeError: CUDA out of memory…`, or the next
//!   [`MESSAGE_LINES`] lines of that exception's message), or an exception line of class
//!   `torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError` — never a line that merely
//!   contains the words (a log line, a config dump, a warning).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::progress;

pub mod kernel;
pub mod phase;
pub mod refusal;
pub mod saves;
pub mod score;

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

/// One process named in a PyTorch OOM message ("Process 1234 has 3.00 GiB memory in use").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessUse {
    pub pid: u32,
    pub bytes: u64,
}

/// The numbers an OOM message carries; `None` when the message lacks them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OomNumbers {
    pub device: Option<u32>,
    pub tried_to_allocate_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    pub reserved_unallocated_bytes: Option<u64>,
    pub other_processes: Vec<ProcessUse>,
    /// Total reserved by PyTorch, as old messages print it ("X cached",
    /// "X reserved in total by PyTorch"). Not reserved-but-unallocated.
    pub reserved_total_bytes: Option<u64>,
    /// "Tried to allocate more than 1EB": a lower bound where the size is not printed.
    pub tried_at_least_bytes: Option<u64>,
    /// The process the kernel's OOM killer killed, when the output shows its record.
    pub victim: Option<kernel::Victim>,
    /// "4.00 GiB allowed;": the cap `torch.cuda.set_per_process_memory_fraction` set on
    /// this process's allocator, smaller than the GPU's total.
    pub allowed_bytes: Option<u64>,
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

/// Words every OOM pattern (GPU, host, absurd) contains one of. Case-sensitive on
/// purpose: a small literal set keeps the SIMD prefilter (Teddy).
/// Words every OOM pattern (GPU, host, absurd) contains one of. Case-sensitive on
/// purpose, and with [`ERROR_WORD_LIST`] at most 32 in all: a small literal set keeps the
/// SIMD prefilter (slim Teddy; 33 or more take the fat one, about half as fast).
const OOM_WORD_LIST: [&str; 25] = [
    "emory",              // out of memory, MemoryError, cudaErrorMemoryAllocation
    "OutOfMem",           // torch.OutOfMemoryError, also cut short
    "out of m",           // a wrapped "CUDA out of mem|ory"
    "lloc",               // calloc, allocate, DefaultCPUAllocator, std::bad_alloc
    "ALLOC",              // CUBLAS_STATUS_ALLOC_FAILED
    "OUT_OF_",            // CUDA_ERROR_OUT_OF_MEMORY, PI_ERROR_OUT_OF_RESOURCES
    "DA error",           // "CUDA error 2", "Cuda error: 2"
    "da error",           // "cuda error 2"
    "12 vs 0",            // posix_memalign's ENOMEM: "nbytes) == 0. 12 vs 0"
    "oom-kill",           // the kernel: "oom-kill:constraint=", "invoked oom-killer"
    "KV cache",           // vLLM: "... can be stored in KV cache"
    "Killed",             // bare shell "Killed", "signal: Killed"
    "killed",             // "is killed by signal"
    "Killing subprocess", // DeepSpeed's launcher
    "exitcode",           // elastic "failed (exitcode: -9)", "exitcode  : -9"
    "SIGKILL",            // "died with <Signals.SIGKILL: 9>", "Signal 9 (SIGKILL)"
    "ode = -9",           // DeepSpeed: "exits with return code = -9"
    "code 137",           // "exited with code 137" ("exit status 137": a CalledProcessError line)
    "executable batch",   // accelerate "No executable batch size found"
    // The shell's "Killed" in other languages (glibc's strsignal(SIGKILL)).
    "已杀死",
    "強制", // 強制終了 (ja), 強制結束 (zh_TW)
    "죽었음",
    "Getötet",
    "Убито",
    "Processus arrêté",
];

/// Words of the other failures (exception lines, CUDA errors, C++ aborts).
const ERROR_WORD_LIST: [&str; 9] = [
    "Error",            // exception lines
    "Exception",        // exception lines
    "OutOfResources",   // triton
    "Watchdog",         // NCCL watchdog timeout
    "Assertion",        // device-side assert
    "terminate called", // C++ abort
    "Traceback",        // where an exception's report begins
    "DA error",         // "CUDA error: ..." (ECC, invalid configuration argument)
    "da error",         // "cuda error: ..."
];

/// Words at least one of which occurs in every segment the patterns below can match.
static NEEDLES: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    let mut words: Vec<&str> = OOM_WORD_LIST
        .iter()
        .chain(&ERROR_WORD_LIST)
        .copied()
        .collect();
    words.sort_unstable();
    words.dedup();
    let pattern = words
        .iter()
        .map(|w| regex::escape(w))
        .collect::<Vec<_>>()
        .join("|");
    regex::bytes::Regex::new(&pattern).expect("needle pattern")
});

/// Words at least one of which occurs in every line that shows life ([`RECOVERED`],
/// [`progress::last_step`]): looked for as well while an OOM is pending.
const LIFE_WORDS: [&str; 17] = [
    "step",
    "Step",
    "STEP", // step 120, global_step=120
    "iter",
    "Iter",
    "ITER", // iter 120, iteration 120
    "/s]",
    "/it]", // a tqdm bar ends with its rate: "120/1000 [00:10<01:30, 9.8it/s]"
    // batch-size finders
    "atch size",
    "atch_size",
    "ATCH",
    "inder",
    "continue with",
    "succeeded",
    "failed, trying",
    // the Hugging Face Trainer's log dicts: {'loss': 1.9, ..., 'epoch': 0.02}
    "'epoch': ",
    "\"epoch\": ",
];

/// A launcher's exception that reports a worker's failure rather than being one:
/// torchrun's `ChildFailedError`, `subprocess.CalledProcessError` (accelerate,
/// deepspeed launchers), torch.multiprocessing's `ProcessRaisedException` /
/// `ProcessExitedException`.
static LAUNCHER_REPORT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"ChildFailedError|CalledProcessError|ProcessRaisedException|ProcessExitedException")
        .expect("launcher report pattern")
});

/// The epoch of a Hugging Face Trainer's log dict line.
static LOG_DICT_EPOCH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^\{.*['"]loss['"]: [^,]+,.*['"]epoch['"]: ([0-9]+(?:\.[0-9]+)?)"#)
        .expect("log dict pattern")
});

static LIFE: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(&LIFE_WORDS.map(regex::escape).join("|")).expect("life pattern")
});

/// The needles and the life words: what is looked for while an OOM is pending.
static PENDING_NEEDLES: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    let pattern = format!("{}|{}", NEEDLES.as_str(), LIFE.as_str());
    regex::bytes::Regex::new(&pattern).expect("pending needle pattern")
});

/// While a mention of an OOM is pending and settled: words of life, where a fatal
/// form of it can begin (a traceback, an OOM exception line), and exception lines.
static QUIET: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    // `Error`/`Exception` (OutOfMemoryError among them): the exception line of a
    // later traceback, another error that ended the process.
    let pattern = format!("{}|Traceback|Error|Exception", LIFE.as_str());
    regex::bytes::Regex::new(&pattern).expect("quiet needle pattern")
});

/// Where a Python traceback begins (a finder built once: building one per line costs
/// more than the search).
static TRACEBACK: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"Traceback (most recent call last)"));

/// The class an OOM line names when it is an exception (a finder built once).
static OOM_ERROR_CLASS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"OutOfMemoryError"));

/// A line that mentions an OOM and says, in its own words, that it was handled.
static HANDLED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:caught|catch(?:ing)?|retry(?:ing)?|retried|skip(?:ping|ped)?|recover(?:ed|ing)?|will\s+be\s+(?:decreased|reduced|halved)|trying\s+(?:batch|micro)|reducing|halving|lowering)\b",
    )
    .expect("handled pattern")
});

/// A line saying a run went on after an OOM: batch-size finders and trainers that
/// catch an OOM and retry smaller (Lightning, Composer, HF's auto_find_batch_size).
static RECOVERED: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        r"(?i)batch[ _]size(?:\s+\S+)?\s+found|batch[ _]size\s+finder|(?:succeeded|failed),?\s+trying\s+batch\s+size|microbatch\s+size\s+will\s+be|will\s+continue\s+with\s+(?:full\s+run|batch)",
    )
    .expect("recovered pattern")
});

/// A Python exception line as a traceback ends with it: the class name (dotted) starts
/// the line (after launcher prefixes), then `:` or the end.
static EXCEPTION_START: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|OutOfResources|Interrupt)(?::\s|:$|$)",
    )
    .expect("exception start pattern")
});

/// Words one of which every OOM pattern contains: a literal search (SIMD) is several
/// times cheaper than running the OOM patterns' automata over a segment.
static OOM_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    let pattern = OOM_WORD_LIST.map(regex::escape).join("|");
    regex::bytes::Regex::new(&pattern).expect("oom words")
});

/// Words one of which every other-error pattern contains.
static OTHER_ERROR_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        "Watchdog|terminate called|Assertion|illegal memory|Error|exitcode|killed by|DA error|da error",
    )
    .expect("other error words")
});

/// Words of an exception line, checked before the (slower) exception pattern.
static ERROR_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new("Error|Exception|Failure|OutOfResources").expect("error words")
});

/// GPU out-of-memory messages: PyTorch's wordings for CUDA, HIP, XPU, MPS and NPU since
/// 0.4, cudaMallocAsync's, NCCL's, THC's, accelerate's; a CUDA extension's own wording or
/// only the CUDA error code (2 is `cudaErrorMemoryAllocation`); Intel's SYCL/Level Zero
/// codes (old PI, new UR); vLLM's "no room for the KV cache".
const GPU_OOM_SRC: &str = r"
        (?-u:\b)(?:CUDA|HIP|XPU|NPU)\ out\ of\ memory
        | (?-u:\b)MPS\ backend\ out\ of\ memory
        | (?-u:\b)(?:CUDA|HIP)\ error:\ out\ of\ memory
        | cuda\ runtime\ error\ \(2\)\ :\ out\ of\ memory
        | THCudaCheck\ FAIL.*error=2\ :\ out\ of\ memory
        | Cuda\ failure\ (?:2\ )?'out\ of\ memory'
        | Failed\ to\ CUDA\ calloc
        | cudaErrorMemoryAllocation
        | CUDA_ERROR_OUT_OF_MEMORY
        | hipErrorOutOfMemory
        | No\ executable\ batch\ size\ found
        # torch.OutOfMemoryError whatever its message (cudaMallocAsync: 'Allocation on
        # device'), also cut short; a bare OutOfMemoryError: but not java.lang's.
        | (?-u:\b)torch\.(?:cuda\.|xpu\.)?OutOfMem
        | (?:^|[^.A-Za-z0-9_])OutOfMemoryError:
        | Allocation\ on\ device\ \d*\ ?would\ exceed\ allowed\ memory
        # An extension's CUDA_CHECK: 'Error out of memory at line 88 in file ops.cu'
        # (bitsandbytes), 'CUDA error 2 at x.cu:12'.
        | (?i:error)\W{0,3}out\ of\ memory\ (?:at|in)\ (?:line|file)
        | (?i:cuda)(?:\ runtime)?\ (?i:error)\s*(?:code\s*)?[:=\#(]?\s*2(?-u:\b)
        # Intel: Level Zero's out-of-device-memory, through SYCL's old PI and new UR.
        | (?:UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_DEVICE_MEMORY
        | PI_ERROR_OUT_OF_RESOURCES
        # vLLM: the GPU memory budget leaves too little for the KV cache.
        | No\ available\ memory\ for\ the\ cache\ blocks
        | can\ be\ stored\ in\ KV\ cache
        | larger\ than\ the\ available\ KV\ cache\ memory";

static GPU_OOM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("(?x){GPU_OOM_SRC}")).expect("gpu pattern"));

/// thrust's `bad_alloc` for a failed device allocation, as Python shows it (`MemoryError:
/// std::bad_alloc: cudaErrorMemoryAllocation: out of memory`; `bad allocation` is MSVC's
/// `what()`). thrust prints no size. In the public threads of this wording (the
/// corpus's not_oom-76 to -79: gaussian-splatting#740 and #961,
/// hierarchical-3d-gaussians#35, cuhnsw#30) a bigger GPU failed where a smaller one
/// worked and a reinstall, or a rebuild for the GPU's architecture, fixed it: an
/// extension built for another GPU runs no kernel, and thrust is asked for a size
/// computed from garbage. A really full GPU prints the same words (MinkowskiEngine#359;
/// the corpus's unsettled-01 failed after 35 epochs), so the advice says how to tell.
/// Not RMM's `std::bad_alloc: CUDA error at ...: cudaErrorMemoryAllocation out of
/// memory`, nor thrust's `parallel_for failed: cudaErrorMemoryAllocation`: GPU OOMs.
static THRUST_BAD_ALLOC: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:std::bad_alloc|bad allocation):\s*cudaErrorMemoryAllocation")
        .expect("thrust bad_alloc pattern")
});

/// GPU allocation failures that also come from a broken CUDA setup or the wrong device
/// (cuBLAS creating its handle, cuDNN): a GPU OOM only in the form a process dies with
/// (the exception line, or the message of a traceback's exception), never in prose.
const GPU_OOM_AMBIGUOUS_SRC: &str =
    r"(?-u:\b)(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED";

static GPU_OOM_AMBIGUOUS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(GPU_OOM_AMBIGUOUS_SRC).expect("ambiguous gpu pattern"));

/// Every OOM pattern at once, the sizes in other words too: one pass of the DFA says
/// whether any of them is worth looking for (most segments with an OOM word hold none).
static ANY_OOM: LazyLock<Regex> = LazyLock::new(|| {
    let tried = r"(?i:tried\s*(?:to\s*allocate|allocating))";
    Regex::new(&format!(
        "(?x:{GPU_OOM_SRC}\n)|(?x:{HOST_OOM_SRC}\n)|{GPU_OOM_AMBIGUOUS_SRC}|{tried}"
    ))
    .expect("any oom pattern")
});

/// Host (CPU RAM) out-of-memory messages. The `weak` group: only a kill signal; the
/// `silent` group: a launcher killing the rest after a rank died without a word, which
/// counts only when no error was printed before it.
const HOST_OOM_SRC: &str = r"
        DefaultCPUAllocator:\ (?:not\ enough\ memory|can't\ allocate\ memory)
        # the C++ allocator's old spelling: posix_memalign returned ENOMEM (12), also with
        # the call wrapped away (only '...nbytes) == 0. 12 vs 0' left)
        | ==\s*0\.\s*12\s*vs\s*0
        | alloc_cpu\(\)\ seems\ to\ have\ been\ called\ with\ negative\ number
        | (?-u:\b)MemoryError(?-u:\b)
        | _ArrayMemoryError
        | std::bad_alloc
        # fork() of a DataLoader worker, mmap of shared memory: ENOMEM
        | \[Errno\s*12\]\s*Cannot\ allocate\ memory
        | Cannot\ allocate\ memory\s*\(12\)
        | fork(?:\(\))?:\s*Cannot\ allocate\ memory
        | (?:PI|UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_HOST_MEMORY
        # the kernel's OOM killer, old and new, global and in a memory cgroup
        | (?i:out\ of\ memory):\ Kill(?:ed)?\ process
        | Killed\ process\ \d+\ \(.*\)\ total-vm
        | oom-kill:constraint=
        | invoked\ oom-killer
        | (?P<weak>
            exitcode\s*:\s*-9(?-u:\b)
          | died\ with\ <Signals\.SIGKILL:\ 9>
          | Signal\ 9\ \(SIGKILL\)\ receive
          | return\ code\ =\ -9(?-u:\b)
          | (?i:exit(?:ed)?\ (?:with\ )?(?:code|status))\ 137(?-u:\b)
          | killed\ by\ signal:\ Killed
          | (?-u:\b)Killed(?-u:\b)
          # the shell's 'Killed' in other languages, alone or after a job's number
          | (?:^|\d\s+|\]\+?\s+)(?:已杀死|強制終了|強制結束|죽었음|Getötet|Убито|Processus\ arrêté)(?:\s|$)
        )
        | (?P<silent>Killing\ subprocess\ \d+)";

static HOST_OOM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("(?x){HOST_OOM_SRC}")).expect("host pattern"));

/// Python exception lines: `torch.distributed.DistBackendError: ...`, `KeyboardInterrupt`,
/// also glued to text in another script (`报错：triton...OutOfResources: ...`).
static EXCEPTION_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:^|[\s`'"\]\)>|*:]|[^\x00-\x7F])((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Failure|OutOfResources))(?::(?:\s|$)|$)"#,
    )
    .expect("exception pattern")
});

/// Other telling error lines that are not `XError:` lines.
static OTHER_ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        Watchdog\ caught\ collective\ operation\ timeout
        | terminate\ called\ after\ throwing
        | (?-u:\b)Assertion\ .*\ failed
        | illegal\ memory\ access
        | ^Error(?-u:\b)
        | failed\ \(exitcode:\ -?\d+\)
        | killed\ by\ signal
        # 'CUDA error: uncorrectable ECC error encountered', 'invalid configuration argument'
        | (?-u:\b)(?i:cuda)\ error(?::\ |\ \d)",
    )
    .expect("other error pattern")
});

/// A process of a distributed run that failed because a peer did: the connection to a
/// dead rank closed or reset (gloo, NCCL's sockets, the c10d store), the rendezvous
/// closed or timed out, the store timed out, a collective timed out waiting for a rank
/// that is gone (NCCL's watchdog, gloo), NCCL's "remote process exited". Such an ending
/// says nothing of its own: in a job of several copies it means "wait for the decision".
/// Every form is an error line (it holds a needle: `Error`, `Exception`, `Watchdog`,
/// `terminate called`), so it is looked for only where errors are.
static PEER_FAILURE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        Connection\ (?:closed|reset)\ by\ (?:remote\ )?peer
        | gloo::IoException
        | (?-u:\b)DistStoreError(?-u:\b)
        # the store's client when its server (a peer's torchrun) is gone; not
        # DistNetworkError as such, which is also this node's own port in use
        | Connection\ was\ likely\ closed
        | Did\ the\ remote\ server\ shutdown
        | (?-u:\b)Rendezvous(?:Closed|Timeout|Connection)Error(?-u:\b)
        | (?i:rendezvous)\ (?:timed\ out|is\ closed|has\ been\ closed)
        | NCCL\ communicator\ was\ aborted
        | Watchdog\ caught\ collective\ operation\ timeout
        | remote\ process\ exited\ or\ there\ was\ a\ network\ error
        | ncclRemoteError
        | Timed\ out\ waiting\ \d+\s*ms\ for\ (?:recv|send)\ operation
        | (?-u:\b)Socket\ Timeout(?-u:\b)
        | waiting\ for\ workers\.\ \d+/\d+\ workers\ joined",
    )
    .expect("peer failure pattern")
});

/// Error lines that only say a process died (a launcher's summary, a C++ abort whose
/// reason follows): they are not an error of the process's own.
static CONSEQUENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"failed\ \(exitcode:|killed\ by\ signal|terminate\ called\ after\ throwing")
        .expect("consequence pattern")
});

/// Words one of which every [`PEER_FAILURE`] form contains (a cheap literal search
/// before the pattern, on error lines only).
static PEER_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        "by peer|by remote peer|gloo::|DistStore|likely closed|remote server|endezvous|was aborted|Watchdog caught|remote process|ncclRemote|Timed out waiting|Socket Timeout|workers joined",
    )
    .expect("peer words")
});

/// Whether an error line says a peer of the run failed (see [`PEER_FAILURE`]).
pub fn is_peer_failure(line: &str) -> bool {
    PEER_WORDS.is_match(line.as_bytes()) && PEER_FAILURE.is_match(line)
}

/// The launcher prefix a segment starts with (`[rank1]:`, `[1,0]<stderr>:`), spaces
/// removed, or "" — which process printed it, as far as the output says.
/// Whether `seg` comes from `source` (as [`source_of`] says), without allocating: asked of
/// every progress line while an OOM is pending.
fn source_is(seg: &[u8], source: &str) -> bool {
    let Ok(head) = std::str::from_utf8(&seg[..seg.len().min(256)]) else {
        return source_of(seg) == source; // cut mid-character or not UTF-8: rare
    };
    let found = PREFIX.find(head).map_or("", |m| m.as_str());
    found
        .split_whitespace()
        .flat_map(str::chars)
        .eq(source.chars())
}

fn source_of(seg: &[u8]) -> String {
    let head = String::from_utf8_lossy(&seg[..seg.len().min(256)]);
    PREFIX
        .find(&head)
        .map(|m| m.as_str().split_whitespace().collect())
        .unwrap_or_default()
}

/// Prefixes added by launchers, stripped from the decisive line.
static PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:\s*(?:\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std(?:out|err)>:|\([A-Za-z_]\w* pid=\d+\)|SUBPROCESS:))+\s*",
    )
    .expect("prefix pattern")
});

static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
        .expect("ansi pattern")
});

/// A size as PyTorch prints it: `1.50 GiB`, `0 bytes`, `147.24 MB`.
const SIZE: &str = r"(\d+(?:\.\d+)?\s*(?:bytes|[KMGTPE]i?B|B))";

struct NumberPatterns {
    tried: Regex,
    tried_more_than: Regex,
    tried_async: Regex,
    total_async: Regex,
    free_async: Regex,
    negative: Regex,
    calloc: Regex,
    total_old: Regex,
    total_new: Regex,
    total_mps: Regex,
    allowed: Regex,
    free_old: Regex,
    free_new: Regex,
    allocated_old: Regex,
    allocated_new: Regex,
    allocated_mps: Regex,
    reserved_unallocated: Regex,
    reserved_total: Regex,
    device: Regex,
    process: Regex,
}

static NUMBERS: LazyLock<NumberPatterns> = LazyLock::new(|| {
    let re = |p: &str| Regex::new(&p.replace("SIZE", SIZE)).expect("number pattern");
    NumberPatterns {
        tried: re(r"(?i:tried\s*(?:to\s*allocate|allocating))\s*SIZE"),
        // "more than 1EB": PyTorch's words for a size too large to print; a bound.
        tried_more_than: re(r"(?i:tried\s*to\s*allocate)\s*more\s*than\s*SIZE"),
        // cudaMallocAsync's block: "Requested : 512.00 KiB", "Device limit : 15.99 GiB",
        // "Free (according to CUDA): 0 bytes".
        tried_async: re(r"Requested\s*:\s*SIZE"),
        total_async: re(r"Device\s*limit\s*:\s*SIZE"),
        free_async: re(r"Free\s*\(according\s*to\s*CUDA\)\s*:\s*SIZE"),
        // alloc_cpu's overflow check: "called with negative number: 18446744072009756672"
        negative: re(r"negative\s*number:\s*(\d+)"),
        calloc: re(r"CUDA\s*calloc\s*(\d+)\s*bytes"),
        total_old: re(r"SIZE\s*total\s*capac"),
        total_new: re(r"total\s*capac[a-z]*\s*of\s*SIZE"),
        total_mps: re(r"max\s*allowed:\s*SIZE"),
        allowed: re(r"SIZE\s*allowed\s*;"),
        free_old: re(r"SIZE\s*free\b"),
        free_new: re(r"of\s*which\s*SIZE\s*is\s*free"),
        allocated_old: re(r"SIZE\s*already\s*allocated"),
        allocated_new: re(r"Of\s*the\s*allocated\s*memory\s*SIZE\s*is\s*allocated"),
        allocated_mps: re(r"MPS\s*allocated:\s*SIZE"),
        reserved_unallocated: re(r"SIZE\s*is\s*reserved\s*by\s*PyTorch\s*but\s*unallocated"),
        reserved_total: re(r"SIZE\s*(?:reserved\s*in\s*total|cached\b)"),
        device: re(
            r"\(GPU\s*(\d+)\s*;|\bGPU\s?(\d*)\s*has\s*a\s*total|Allocation\s*on\s*device\s*(\d+)",
        ),
        process: re(r"Process\s*(\d+)\s*has\s*SIZE"),
    }
});

/// A message joined with the segments that follow it (hard-wrapped output).
#[derive(Debug)]
enum Pending {
    /// The first OOM's message looks cut short: append segments and re-read its numbers.
    Complete { text: String, left: u8 },
    /// A segment that may end in the middle of an OOM message: test it joined with the next.
    Split { text: String, line_no: u64 },
}

#[derive(Debug, Default)]
struct StreamState {
    /// The start of the current partial segment: at most [`MAX_SEGMENT`] bytes.
    partial: Vec<u8>,
    /// Once the partial segment outgrew [`MAX_SEGMENT`]: its last bytes so far (at most
    /// [`HALF_SEGMENT`] of them after each push).
    tail: Vec<u8>,
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
    streams: [StreamState; STREAMS],
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
    /// The last bytes of each stream's previous chunk, for a cancel line split across chunks.
    cancel_carry: [Vec<u8>; STREAMS],
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
    LazyLock::new(|| memchr::memmem::Finder::new(b" CANCELLED AT "));

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
        if self.cancelled.is_none() {
            self.look_for_cancel(si, chunk);
        }
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

    /// A Slurm cancel line in this chunk (or across its start). Cheap: one SIMD
    /// substring search per chunk, so it runs whatever else the scanner skips.
    fn look_for_cancel(&mut self, si: usize, chunk: &[u8]) {
        const KEEP: usize = 256;
        let carry = &mut self.cancel_carry[si];
        let mut joined = std::mem::take(carry);
        joined.extend_from_slice(&chunk[..chunk.len().min(KEEP)]);
        let found = CANCELLED
            .find(&joined)
            .and_then(|at| cancel_line(&joined, at))
            .or_else(|| {
                CANCELLED
                    .find_iter(chunk)
                    .find_map(|at| cancel_line(chunk, at))
            });
        if found.is_some() {
            self.cancelled = found;
            return;
        }
        let from = chunk.len().saturating_sub(KEEP);
        joined.clear();
        joined.extend_from_slice(&chunk[from..]);
        *carry = joined;
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
    #[allow(
        dead_code,
        reason = "part of the scanner's contract; for journal statistics"
    )]
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
                    Some(m) => (
                        memchr::memrchr2(b'\n', b'\r', &region[pos..m.start()])
                            .map_or(pos, |i| pos + i + 1),
                        hit,
                    ),
                }
            };
            self.lines += count_newlines(&region[pos..start]);
            let end = start
                + memchr::memchr2(b'\n', b'\r', &region[start..])
                    .expect("a region ends with a line end");
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
        if !hit.unwrap_or_else(|| NEEDLES.is_match(seg)) {
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
            Some(_) if exception.is_none() && !in_message && HANDLED.is_match(&text) => {
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
                let next = clean(seg);
                if starts_new_record(&next) || self.first.is_none() {
                    // The join ends here; `next` is a segment of its own.
                    return false;
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
        if !LIFE.is_match(seg) {
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
        if priority >= 2 {
            if is_peer_failure(text) {
                if !self.own_error && self.peer.is_none() {
                    self.peer = Some((text.to_string(), line_no));
                }
            } else if priority == 3 || !CONSEQUENCE.is_match(text) {
                // An exception of its own, or a telling error (an illegal memory access,
                // a failed assertion) — not a launcher's word that a process died.
                self.own_error = true;
            }
        }
        self.note_pids(text);
        match &mut self.error {
            Some((p, line, n)) if priority >= *p => {
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

/// A line of Python code (a traceback's source line, a pasted snippet) that names an
/// exception class without raising it: `except torch.cuda.OutOfMemoryError:`.
fn is_code(text: &str) -> bool {
    let trimmed = text.trim_start_matches(['`', '"', '\'', ' ']);
    ["raise ", "except ", "from ", "import ", "class ", "def "]
        .iter()
        .any(|k| trimmed.starts_with(k))
}

fn count_newlines(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// How much an OOM line says by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strength {
    /// The message names the memory that ran out.
    Strong,
    /// Only a kill signal (SIGKILL, `exitcode: -9`): a GPU OOM close behind it wins.
    Weak,
    /// A GPU allocation failure that a broken setup also reports: only in the form a
    /// process dies with (an exception line, or its traceback's message).
    NeedsException,
    /// A launcher killing the rest after a rank died: only when nothing before it said
    /// why (a rank that raised an exception printed it first).
    NeedsSilence,
}

/// Which OOM `text` reports, and how strongly. With `boundary`, only a match that spans
/// it counts (a message split across two segments).
fn oom_in(text: &str, boundary: Option<usize>) -> Option<(Kind, Strength)> {
    if !OOM_WORDS.is_match(text.as_bytes()) || !ANY_OOM.is_match(text) {
        return None;
    }
    let spans = |m: regex::Match| boundary.is_none_or(|b| m.start() < b && m.end() > b);
    // thrust's sizeless bad_alloc: likely an extension built for another GPU, a bug.
    if let Some(m) = THRUST_BAD_ALLOC.find(text)
        && spans(m)
        && !NUMBERS.tried.is_match(text)
    {
        return Some((Kind::AbsurdRequest, Strength::Strong));
    }
    // `is_match` first: it is much cheaper than finding where, and usually false.
    if GPU_OOM.is_match(text) && GPU_OOM.find_iter(text).any(spans) {
        return Some((Kind::GpuOom, Strength::Strong));
    }
    if HOST_OOM.is_match(text) {
        let host = HOST_OOM
            .captures_iter(text)
            .find(|c| spans(c.get(0).expect("group 0")))
            .map(|c| {
                let strength = if c.name("weak").is_some() {
                    Strength::Weak
                } else if c.name("silent").is_some() {
                    Strength::NeedsSilence
                } else {
                    Strength::Strong
                };
                (Kind::HostOom, strength)
            });
        if host.is_some() {
            return host;
        }
    }
    if GPU_OOM_AMBIGUOUS.is_match(text) && GPU_OOM_AMBIGUOUS.find_iter(text).any(spans) {
        return Some((Kind::GpuOom, Strength::NeedsException));
    }
    // Any other words for a failed allocation ("Tried allocating 67371012.07 GiB", a
    // paraphrase): only a size no machine has says what it was.
    if let Some(m) = NUMBERS.tried.captures(text).and_then(|c| c.get(1))
        && spans(m)
        && parse_size(m.as_str()).is_some_and(|b| b > ABSURD_HOST_BYTES)
    {
        return Some((Kind::AbsurdRequest, Strength::Strong));
    }
    None
}

/// Does a GPU OOM message carry all the numbers it is going to carry?
fn message_complete(text: &str) -> bool {
    let numbered = [
        "out of memory. Tried",
        "out of memory (",
        "out of memory.Tried",
        "would exceed allowed memory",
    ]
    .iter()
    .any(|w| text.contains(w));
    !numbered
        || [
            "unallocated",
            "cached)",
            "by PyTorch)",
            "PYTORCH_",
            "Memory Management",
            "on private pool",
            "(according to CUDA)",
        ]
        .iter()
        .any(|w| text.contains(w))
}

/// A segment that starts something else, not the rest of a wrapped message.
fn starts_new_record(text: &str) -> bool {
    let t = text.trim_start();
    t.is_empty()
        || [
            "Traceback",
            "File \"",
            "During handling",
            "The above exception",
        ]
        .iter()
        .any(|w| t.starts_with(w))
}

/// Decode, drop ANSI escapes and launcher prefixes, undo HTML escaping, read full-width
/// punctuation as ASCII (`：` is `:`), drop a paste's `> ` quote marks and markdown
/// emphasis around the line, trim. Borrows when there is nothing to rewrite (the common
/// case: no allocation).
fn clean(seg: &[u8]) -> Cow<'_, str> {
    let mut text = String::from_utf8_lossy(seg);
    if memchr::memchr3(b'\x1b', b'&', 0xEF, seg).is_some() {
        let mut owned = text.into_owned();
        if owned.contains('\x1b') {
            owned = ANSI.replace_all(&owned, "").into_owned();
        }
        // "&&" in C++ assertion text is common; only an entity (with ';') is rewritten.
        if owned.contains('&') && owned.contains(';') {
            owned = owned
                .replace("&gt;", ">")
                .replace("&lt;", "<")
                .replace("&quot;", "\"")
                .replace("&#39;", "'")
                .replace("&amp;", "&");
        }
        // U+FF01..U+FF5E are ASCII's full-width forms (UTF-8 EF BC/BD xx).
        if owned.contains(|c: char| ('\u{FF01}'..='\u{FF5E}').contains(&c)) {
            owned = owned
                .chars()
                .map(|c| match c {
                    '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
                    c => c,
                })
                .collect();
        }
        text = Cow::Owned(owned);
    }
    let decoration = |c: char| c.is_whitespace() || matches!(c, '>' | '*' | '`');
    let trimmed = text.trim_start_matches(decoration);
    let start = text.len() - trimmed.len();
    let start = if trimmed.starts_with(['[', '(', 'S']) {
        PREFIX.find(trimmed).map_or(start, |m| start + m.end())
    } else {
        start
    };
    let end = text
        .trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '*' | '`'))
        .len()
        .max(start);
    match text {
        Cow::Borrowed(s) => Cow::Borrowed(&s[start..end]),
        Cow::Owned(s) => Cow::Owned(s[start..end].to_string()),
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn size_of(re: &Regex, text: &str) -> Option<u64> {
    re.captures(text)
        .and_then(|c| c.get(1))
        .and_then(|m| parse_size(m.as_str()))
}

/// `size_of`, only where `word` (which the pattern needs) occurs: a substring search is
/// much cheaper than the captures, and most messages hold only a few of the numbers.
fn size_if(word: &str, re: &Regex, text: &str) -> Option<u64> {
    if text.contains(word) {
        size_of(re, text)
    } else {
        None
    }
}

fn gpu_numbers(text: &str) -> OomNumbers {
    let n = &*NUMBERS;
    let device = if text.contains("GPU") || text.contains("device") {
        n.device.captures(text).and_then(|c| {
            c.get(1)
                .or_else(|| c.get(2))
                .or_else(|| c.get(3))
                .and_then(|m| m.as_str().parse().ok())
        })
    } else {
        None
    };
    let tried = if text.contains("ried") || text.contains("RIED") {
        size_of(&n.tried, text)
    } else {
        None
    };
    let tried = tried
        .or_else(|| {
            text.contains("calloc")
                .then(|| n.calloc.captures(text))
                .flatten()
                .and_then(|c| c[1].parse::<u64>().ok())
        })
        .or_else(|| size_if("Requested", &n.tried_async, text));
    OomNumbers {
        device,
        tried_to_allocate_bytes: tried,
        total_bytes: size_if("capac", &n.total_new, text)
            .or_else(|| size_if("capac", &n.total_old, text))
            .or_else(|| size_if("allowed", &n.total_mps, text))
            .or_else(|| size_if("limit", &n.total_async, text)),
        free_bytes: size_if("which", &n.free_new, text)
            .or_else(|| size_if("free", &n.free_old, text))
            .or_else(|| size_if("according", &n.free_async, text)),
        allocated_bytes: size_if("allocated", &n.allocated_new, text)
            .or_else(|| size_if("already", &n.allocated_old, text))
            .or_else(|| size_if("MPS", &n.allocated_mps, text)),
        reserved_unallocated_bytes: size_if("unallocated", &n.reserved_unallocated, text),
        other_processes: if text.contains("Process") {
            n.process
                .captures_iter(text)
                .filter_map(|c| {
                    Some(ProcessUse {
                        pid: c[1].parse().ok()?,
                        bytes: parse_size(&c[2])?,
                    })
                })
                .collect()
        } else {
            Vec::new()
        },
        reserved_total_bytes: size_if("reserved", &n.reserved_total, text)
            .or_else(|| size_if("cached", &n.reserved_total, text)),
        tried_at_least_bytes: size_if("than", &n.tried_more_than, text),
        victim: None,
        allowed_bytes: size_if("allowed", &n.allowed, text),
    }
}

fn host_numbers(text: &str) -> OomNumbers {
    let n = &*NUMBERS;
    OomNumbers {
        tried_to_allocate_bytes: size_of(&n.tried, text).or_else(|| {
            n.negative
                .captures(text)
                .and_then(|c| c[1].parse::<u64>().ok())
        }),
        victim: kernel::victim_in(text),
        ..OomNumbers::default()
    }
}

fn fill_missing(into: &mut OomNumbers, from: OomNumbers) {
    into.device = into.device.or(from.device);
    into.tried_to_allocate_bytes = into
        .tried_to_allocate_bytes
        .or(from.tried_to_allocate_bytes);
    into.total_bytes = into.total_bytes.or(from.total_bytes);
    into.free_bytes = into.free_bytes.or(from.free_bytes);
    into.allowed_bytes = into.allowed_bytes.or(from.allowed_bytes);
    into.allocated_bytes = into.allocated_bytes.or(from.allocated_bytes);
    into.reserved_unallocated_bytes = into
        .reserved_unallocated_bytes
        .or(from.reserved_unallocated_bytes);
    into.reserved_total_bytes = into.reserved_total_bytes.or(from.reserved_total_bytes);
    into.tried_at_least_bytes = into.tried_at_least_bytes.or(from.tried_at_least_bytes);
    if into.other_processes.is_empty() {
        into.other_processes = from.other_processes;
    }
    match (&mut into.victim, from.victim) {
        (None, v) => into.victim = v,
        (Some(a), Some(b)) if a.pid == b.pid => a.fill_from(b),
        _ => {}
    }
}

/// Classify a whole saved log (for `oomguard diagnose`). No failure found => Kind::NoFailure
/// with an empty line; a non-OOM error => Kind::OtherFailure with that line.
#[allow(
    dead_code,
    reason = "for callers holding a whole log; diagnose streams through Scanner instead"
)]
pub fn classify_log(bytes: &[u8]) -> Finding {
    let mut scanner = Scanner::new();
    scanner.feed(Stream::Out, bytes);
    scanner.finish();
    scanner.finding()
}

/// Is this finding thrust's `bad_alloc` for a device allocation, which prints no size
/// (see [`THRUST_BAD_ALLOC`])? It is an absurd request, but not a size seen to be absurd.
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

/// One line of advice for a finding (what a user should do next).
pub fn advice(f: &Finding) -> &'static str {
    let n = &f.numbers;
    match f.kind {
        Kind::GpuOom => {
            let fragmented = match (n.tried_to_allocate_bytes, n.free_bytes) {
                (Some(tried), Some(free)) => free >= tried,
                _ => false,
            } || matches!(
                (n.tried_to_allocate_bytes, n.reserved_unallocated_bytes),
                (Some(tried), Some(unalloc)) if unalloc >= tried
            );
            let others: u64 = n.other_processes.iter().map(|p| p.bytes).sum();
            let crowded = n.total_bytes.is_some_and(|t| others >= t / 4);
            if fragmented {
                "GPU memory is fragmented (enough is free or reserved, but not in one piece): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (oomguard does this by default when it runs your command), then lower the micro-batch if it still fails"
            } else if crowded {
                "other processes hold a large share of this GPU: free it (nvidia-smi shows who) or pick another GPU before shrinking the run"
            } else {
                "GPU memory ran out: lower the micro-batch and raise gradient accumulation to keep the global batch, then enable gradient checkpointing, shorten sequences, raise the ZeRO stage or offload (oomguard does these in order when it runs your command)"
            }
        }
        Kind::HostOom => {
            "host RAM ran out, or the process was SIGKILLed (often the kernel OOM killer; check dmesg): lower DataLoader num_workers, load checkpoints with low_cpu_mem_usage/mmap, reduce CPU offload, or use a machine with more RAM; a smaller GPU batch rarely helps"
        }
        Kind::AbsurdRequest if sizeless_thrust_alloc(f) => {
            "not fixable by smaller settings — likely a bug: thrust (inside a CUDA extension) failed to allocate GPU memory and printed no size; usually the extension was built for another GPU, so its kernel did not run and the size computed from its output is garbage (in public reports a bigger GPU failed where a smaller one worked). Rebuild it for this GPU: delete its build/ folder, then TORCH_CUDA_ARCH_LIST=\"X.Y\" pip install --no-build-isolation --force-reinstall --no-deps <the extension's folder or package>, X.Y being this GPU's compute capability (nvidia-smi --query-gpu=compute_cap --format=csv). If the GPU really was full — nvidia-smi, run while the job starts, shows its memory near the total or other processes holding it, or the run got through earlier steps (a build for another GPU fails at its first call) — lower the batch or the input size yourself (oomguard does not shrink the run for this message)"
        }
        Kind::AbsurdRequest => {
            "not fixable by smaller settings — likely a bug: the allocation asked for is far beyond the device (or any machine), a corrupted size (a CUDA extension built for another GPU, an integer overflow, a bad shape); rebuild the extensions for this GPU (TORCH_CUDA_ARCH_LIST) or find what computes that size (oomguard does not shrink the run for it)"
        }
        Kind::OtherFailure => {
            "not an out-of-memory failure: shrinking the batch will not fix it; fix the error on the line shown (oomguard stops and passes on the child's exit status)"
        }
        Kind::NoFailure => {
            "no failure found in this output; if the run still died, check its exit status or signal (a SIGKILL from the kernel OOM killer may leave no message: see dmesg)"
        }
    }
}

/// "1.50 GiB", "576.00 KiB", "30.96 MiB", "17179869184.00 GiB", "0 bytes" -> bytes.
/// `KB`/`MB`/`GB` are read as binary units (PyTorch's MPS allocator prints them so).
/// Values too large for u64 saturate at `u64::MAX`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let shift = match unit.trim() {
        "" | "B" | "byte" | "bytes" => 0,
        "KiB" | "KB" | "kB" => 10,
        "MiB" | "MB" => 20,
        "GiB" | "GB" => 30,
        "TiB" | "TB" => 40,
        "PiB" | "PB" => 50,
        "EiB" | "EB" => 60,
        _ => return None,
    };
    if shift == 0
        && let Ok(exact) = number.parse::<u64>()
    {
        return Some(exact);
    }
    let value: f64 = number.parse().ok()?;
    // Float-to-int `as` saturates, which is what a bogus "17179869184.00 GiB" needs.
    Some((value * (1u64 << shift) as f64).round() as u64)
}

/// Bytes as PyTorch prints them: "0 bytes", "576.00 KiB", ..., capped at GiB.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `oomguard diagnose [--json] [FILE|-]`: classify the file (or stdin when None or "-"),
/// print the result to stdout. Returns 0 when it classified (any kind), 2 for an
/// unreadable file (message on stderr naming the file and the OS error).
/// What `diagnose` says before it reads standard input: at a terminal, `oomguard diagnose`
/// alone would otherwise wait in silence, looking hung.
pub fn stdin_hint(reads_stdin: bool, stdin_is_terminal: bool) -> Option<&'static str> {
    (reads_stdin && stdin_is_terminal).then_some(
        "oomguard: reading a log from standard input (paste it, then Ctrl-D); or give a file: oomguard diagnose FILE",
    )
}

pub fn diagnose_main(path: Option<&Path>, kernel_log: Option<&Path>, json: bool) -> i32 {
    let stdin = path.is_none_or(|p| p.as_os_str() == "-");
    if let Some(hint) = stdin_hint(stdin, std::io::stdin().is_terminal()) {
        eprintln!("{hint}");
    }
    let victims = match kernel_log.map(std::fs::read) {
        None => None,
        Some(Ok(bytes)) => Some(kernel::victims(&String::from_utf8_lossy(&bytes))),
        Some(Err(e)) => {
            let name = kernel_log.expect("a path").display();
            eprintln!("oomguard diagnose: cannot read the kernel log {name}: {e}");
            return crate::exit::USAGE;
        }
    };
    let name = if stdin {
        "<stdin>".to_string()
    } else {
        path.map(|p| p.display().to_string()).unwrap_or_default()
    };
    let reader: Result<Box<dyn Read>, std::io::Error> = if stdin {
        Ok(Box::new(std::io::stdin().lock()))
    } else {
        std::fs::File::open(path.expect("a path")).map(|f| Box::new(f) as Box<dyn Read>)
    };
    let scanner = match reader.and_then(scan_reader) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("oomguard diagnose: cannot read {name}: {e}");
            return crate::exit::USAGE;
        }
    };
    let mut finding = scanner.finding();
    if let Some(victims) = victims {
        finding = with_kernel_record(finding, scanner.named_pids(), &victims);
    }
    let text = if json {
        render_json(&finding) + "\n"
    } else {
        render_human(&finding)
    };
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not a failure of the diagnosis.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    0
}

/// `diagnose`, or its `--score DIR...` form.
pub fn diagnose_cmd(
    path: Option<&Path>,
    kernel_log: Option<&Path>,
    score: &[std::path::PathBuf],
    json: bool,
) -> i32 {
    if score.is_empty() {
        diagnose_main(path, kernel_log, json)
    } else {
        score::score_main(score, json)
    }
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

/// Stream a reader through a scanner in 1 MiB chunks (memory stays flat on huge logs).
fn scan_reader(mut reader: Box<dyn Read>) -> std::io::Result<Scanner> {
    let mut scanner = Scanner::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                scanner.feed(Stream::Out, &buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    scanner.finish();
    Ok(scanner)
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

/// The JSON form of `diagnose --json`: one flat object, null where a number is missing.
pub fn render_json(f: &Finding) -> String {
    let n = &f.numbers;
    serde_json::json!({
        "kind": f.kind.as_str(),
        "line": f.line,
        "line_no": f.line_no,
        "device": n.device,
        "tried_to_allocate_bytes": n.tried_to_allocate_bytes,
        "tried_at_least_bytes": n.tried_at_least_bytes,
        "total_bytes": n.total_bytes,
        "free_bytes": n.free_bytes,
        "allocated_bytes": n.allocated_bytes,
        "reserved_unallocated_bytes": n.reserved_unallocated_bytes,
        "reserved_total_bytes": n.reserved_total_bytes,
        "other_processes": n.other_processes,
        "victim": n.victim,
        "note": f.note,
        "advice": advice(f),
    })
    .to_string()
}

/// The human form of `diagnose`: kind, decisive line, numbers, advice.
pub fn render_human(f: &Finding) -> String {
    use std::fmt::Write as _;
    let n = &f.numbers;
    let what = match f.kind {
        Kind::GpuOom => "GPU out of memory",
        Kind::HostOom => "host (CPU RAM) out of memory",
        Kind::AbsurdRequest => absurd_what(f),
        Kind::OtherFailure => "a failure that is not out of memory",
        Kind::NoFailure => "no failure found",
    };
    let mut s = format!("kind: {} ({what})\n", f.kind.as_str());
    if f.kind != Kind::NoFailure {
        let _ = writeln!(s, "line {}: {}", f.line_no, f.line);
    }
    if let Some(d) = n.device {
        let _ = writeln!(s, "device: GPU {d}");
    }
    let sizes = [
        ("tried to allocate", n.tried_to_allocate_bytes),
        ("tried to allocate more than", n.tried_at_least_bytes),
        ("total capacity", n.total_bytes),
        ("free", n.free_bytes),
        ("allocated by PyTorch", n.allocated_bytes),
        ("reserved but unallocated", n.reserved_unallocated_bytes),
        ("reserved in total", n.reserved_total_bytes),
    ];
    for (label, value) in sizes {
        if let Some(v) = value {
            let _ = writeln!(s, "{label}: {}", format_size(v));
        }
    }
    if !n.other_processes.is_empty() {
        let list: Vec<String> = n
            .other_processes
            .iter()
            .map(|p| format!("pid {} ({})", p.pid, format_size(p.bytes)))
            .collect();
        let _ = writeln!(s, "processes on the GPU: {}", list.join(", "));
    }
    if let Some(v) = &n.victim {
        let _ = writeln!(s, "killed by the kernel's OOM killer: {}", v.describe());
    }
    if let Some(note) = &f.note {
        let _ = writeln!(s, "note: {note}");
    }
    let _ = writeln!(s, "advice: {}", advice(f));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fixture file: `# key: value` header lines, `# ---`, then the verbatim log.
    struct Fixture {
        name: String,
        label: String,
        tried: Option<String>,
        free: Option<String>,
        total: Option<String>,
        body: Vec<u8>,
    }

    fn load_fixture(path: &Path) -> Fixture {
        let bytes = std::fs::read(path).expect("read fixture");
        let sep = b"# ---\n";
        let at = bytes
            .windows(sep.len())
            .position(|w| w == sep)
            .unwrap_or_else(|| panic!("{}: no '# ---' line", path.display()));
        let header = String::from_utf8_lossy(&bytes[..at]).into_owned();
        let field = |key: &str| {
            header
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# {key}:")))
                .map(|v| v.trim().to_string())
        };
        let number = |key: &str| field(key).filter(|v| v != "-");
        Fixture {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            label: field("label").unwrap_or_else(|| panic!("{}: no label", path.display())),
            tried: number("tried_to_allocate"),
            free: number("free"),
            total: number("total"),
            body: bytes[at + sep.len()..].to_vec(),
        }
    }

    fn fixtures_in(dir: &Path) -> Vec<Fixture> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("txt" | "log")))
            .collect();
        paths.sort();
        paths.iter().map(|p| load_fixture(p)).collect()
    }

    /// The labelled real logs (tests/fixtures/corpus/logs, copied from public issue threads);
    /// panics when the folder is missing (it is part of the repository).
    fn corpus_dir() -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus/logs");
        assert!(
            dir.is_dir(),
            "{} is missing: it is part of the repository (restore it with git checkout)",
            dir.display()
        );
        dir
    }

    fn own_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs")
    }

    fn expected_kinds(label: &str) -> &'static [Kind] {
        score::expected(label).unwrap_or_else(|| panic!("unknown label {label}"))
    }

    /// Compare a parsed size with a header value such as "1.50 GiB", "6291456 bytes
    /// (NCCL calloc)" or "max allowed 20.40 GB", within the rounding of 2 decimals.
    fn check_size(
        errors: &mut Vec<String>,
        name: &str,
        what: &str,
        header: &Option<String>,
        got: Option<u64>,
    ) {
        let want = header.as_ref().map(|h| {
            let m = Regex::new(SIZE)
                .unwrap()
                .find(h)
                .unwrap_or_else(|| panic!("{name}: bad {what} header {h}"));
            (h.clone(), parse_size(m.as_str()).unwrap())
        });
        match (want, got) {
            (None, None) => {}
            (Some((h, w)), Some(g)) if g.abs_diff(w) <= w / 200 + 1 => {
                let _ = h;
            }
            (want, got) => errors.push(format!("{name}: {what}: header {want:?}, parsed {got:?}")),
        }
    }

    fn sweep(fixtures: &[Fixture]) -> Vec<String> {
        let mut errors = Vec::new();
        for fx in fixtures {
            let found = classify_log(&fx.body);
            let want = expected_kinds(&fx.label);
            if !want.contains(&found.kind) {
                errors.push(format!(
                    "{}: label {} => {want:?}, found {:?} at line {}: {}",
                    fx.name, fx.label, found.kind, found.line_no, found.line
                ));
                continue;
            }
            if found.kind != Kind::NoFailure && (found.line.is_empty() || found.line_no == 0) {
                errors.push(format!("{}: no decisive line", fx.name));
            }
            let n = &found.numbers;
            check_size(
                &mut errors,
                &fx.name,
                "tried_to_allocate",
                &fx.tried,
                n.tried_to_allocate_bytes,
            );
            check_size(&mut errors, &fx.name, "free", &fx.free, n.free_bytes);
            check_size(&mut errors, &fx.name, "total", &fx.total, n.total_bytes);
        }
        errors
    }

    /// Allocations made by this thread while `f` runs.
    fn allocations_in(f: impl FnOnce()) -> u64 {
        let before = crate::alloc_count::allocations();
        f();
        crate::alloc_count::allocations() - before
    }

    #[test]
    fn the_scanner_allocates_nothing_per_line_on_the_hot_path() {
        warm();
        let progress: Vec<u8> = (0..20_000)
            .map(|i| format!("step {i}/100000 loss 2.3456 lr 2.0e-05 tokens/s 51234 mem 61.2GiB\n"))
            .collect::<String>()
            .into_bytes();
        // Output with nothing wrong in it, fed in the launch loop's 64 KiB chunks.
        // Once through first: the buffers of a line cut between chunks grow to their size
        // once (a few allocations per stream, not per line).
        let mut s = Scanner::new();
        for chunk in progress.chunks(64 << 10) {
            s.feed(Stream::Out, chunk);
        }
        let n = allocations_in(|| {
            for chunk in progress.chunks(64 << 10) {
                s.feed(Stream::Out, chunk);
            }
        });
        assert_eq!(n, 0, "{n} allocations for 20000 progress lines");
        // A fatal OOM pending (the hang timer armed) while another rank goes on printing
        // its progress: the scanner looks at every line for life, and still allocates
        // nothing per line.
        let mut s = Scanner::new();
        s.feed(
            Stream::Err,
            b"[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. \
GPU 1 has a total capacity of 7.79 GiB of which 3.06 MiB is free. Of the allocated memory \
7.5 GiB is allocated by PyTorch, and 10.0 MiB is reserved by PyTorch but unallocated.\n",
        );
        assert!(s.armed());
        let rank0: Vec<u8> = progress
            .split_inclusive(|&b| b == b'\n')
            .flat_map(|l| [b"[rank0]: ".as_slice(), l].concat())
            .collect();
        s.feed(Stream::Out, &rank0[..rank0.len() / 2]);
        let n = allocations_in(|| {
            for chunk in rank0[rank0.len() / 2..].chunks(64 << 10) {
                s.feed(Stream::Out, chunk);
            }
        });
        assert!(s.armed(), "another rank's progress does not clear the OOM");
        // A couple of one-time allocations (a pattern's search cache first used on this
        // path) are allowed; one per line would be 10000.
        assert!(
            n <= 4,
            "{n} allocations for 10000 lines while an OOM is pending"
        );
    }

    #[test]
    fn the_needles_stay_few_enough_for_the_fast_prefilter() {
        // 33 literals or more make the SIMD prefilter take its fat variant, about half
        // as fast on output with no failure in it (benches: `diagnose` on progress lines).
        let mut words: Vec<&str> = OOM_WORD_LIST
            .iter()
            .chain(&ERROR_WORD_LIST)
            .copied()
            .collect();
        words.sort_unstable();
        words.dedup();
        assert!(words.len() <= 32, "{} needles: {words:?}", words.len());
    }

    #[test]
    fn corpus_fixtures_classify_as_labelled() {
        let dir = corpus_dir();
        let fixtures = fixtures_in(&dir);
        assert!(
            fixtures.len() >= 60,
            "expected the whole fixture set, got {}",
            fixtures.len()
        );
        let errors = sweep(&fixtures);
        assert!(
            errors.is_empty(),
            "{} fixture(s) wrong:\n{}",
            errors.len(),
            errors.join("\n")
        );
    }

    #[test]
    fn own_fixtures_classify_as_labelled() {
        let fixtures = fixtures_in(&own_dir());
        assert!(fixtures.len() >= 7);
        let errors = sweep(&fixtures);
        assert!(
            errors.is_empty(),
            "{} fixture(s) wrong:\n{}",
            errors.len(),
            errors.join("\n")
        );
    }

    fn own(name: &str) -> Vec<u8> {
        load_fixture(&own_dir().join(name)).body
    }

    #[test]
    fn rank_prefixed_oom_wins_over_later_nccl_and_child_failed() {
        let f = classify_log(&own("own-gpu_rank_prefixed_then_nccl.log"));
        assert_eq!(f.kind, Kind::GpuOom);
        assert_eq!(f.line_no, 7);
        assert!(
            f.line
                .starts_with("torch.OutOfMemoryError: CUDA out of memory."),
            "{}",
            f.line
        );
        let n = &f.numbers;
        assert_eq!(n.device, Some(1));
        assert_eq!(n.allocated_bytes, parse_size("36.02 GiB"));
        assert_eq!(n.reserved_unallocated_bytes, parse_size("1.71 GiB"));
        assert_eq!(
            n.other_processes,
            vec![
                ProcessUse {
                    pid: 40211,
                    bytes: 512 << 20
                },
                ProcessUse {
                    pid: 40213,
                    bytes: 512 << 20
                },
            ]
        );
    }

    #[test]
    fn old_cached_message_is_cleaned_and_cached_is_reserved_total() {
        let f = classify_log(&own("own-gpu_old_cached.log"));
        assert_eq!(f.kind, Kind::GpuOom);
        assert!(
            f.line.starts_with("RuntimeError: CUDA out of memory."),
            "ANSI left in {:?}",
            f.line
        );
        assert_eq!(f.numbers.device, Some(0));
        assert_eq!(f.numbers.allocated_bytes, parse_size("7.11 GiB"));
        assert_eq!(f.numbers.reserved_total_bytes, parse_size("112.50 MiB"));
        assert_eq!(f.numbers.reserved_unallocated_bytes, None);
    }

    #[test]
    fn hard_wrapped_new_message_is_joined() {
        let f = classify_log(&own("own-gpu_wrapped_new.log"));
        assert_eq!(f.kind, Kind::GpuOom);
        assert_eq!(f.line_no, 2);
        assert_eq!(f.numbers.device, Some(2));
        assert_eq!(f.numbers.allocated_bytes, parse_size("21.40 GiB"));
        assert_eq!(f.numbers.reserved_unallocated_bytes, parse_size("1.88 GiB"));
        assert!(f.line.contains("GPU 2 has a total capacity"), "{}", f.line);
    }

    #[test]
    fn hard_wrapped_host_message_is_joined() {
        let f = classify_log(&own("own-host_cpu_allocator_wrapped.log"));
        assert_eq!(f.kind, Kind::HostOom);
        assert_eq!(f.line_no, 5);
        assert!(
            f.line.contains("can't allocate memory: you tried"),
            "{}",
            f.line
        );
    }

    #[test]
    fn hang_after_oom_has_no_device_index() {
        let dir = corpus_dir();
        let fx = load_fixture(&dir.join("hang_after_oom-01.txt"));
        let f = classify_log(&fx.body);
        assert_eq!(f.kind, Kind::GpuOom);
        assert_eq!(f.line_no, 1);
        assert_eq!(f.numbers.device, None);
        assert_eq!(
            f.numbers.other_processes,
            vec![ProcessUse {
                pid: 2109115,
                bytes: parse_size("78.99 GiB").unwrap()
            }]
        );
    }

    #[test]
    fn many_processes_and_bogus_sizes() {
        let dir = corpus_dir();
        let f = classify_log(&load_fixture(&dir.join("cuda_oom-33.txt")).body);
        assert_eq!(f.numbers.other_processes.len(), 15);
        assert!(
            f.numbers
                .other_processes
                .iter()
                .all(|p| p.bytes == parse_size("1.19 GiB").unwrap())
        );
        let f = classify_log(&load_fixture(&dir.join("cuda_oom-15.txt")).body);
        assert_eq!(f.numbers.device, Some(1));
        assert_eq!(f.numbers.free_bytes, Some(0));
        // "6.93 GiB is alloca" was cut: not a complete "is allocated by PyTorch" clause.
        assert_eq!(f.numbers.allocated_bytes, None);
    }

    #[test]
    fn lookalikes_are_other_failures_with_their_error_line() {
        let cases = [
            (
                "own-not_pin_memory_and_attention.log",
                "RuntimeError: Pin memory thread exited unexpectedly",
            ),
            (
                "own-not_illegal_access_shm.log",
                "RuntimeError: CUDA error: an illegal memory access was encountered",
            ),
            (
                "own-not_except_clause.log",
                "ValueError: prompt 417 is empty",
            ),
        ];
        for (name, line) in cases {
            let f = classify_log(&own(name));
            assert_eq!(f.kind, Kind::OtherFailure, "{name}");
            assert_eq!(f.line, line, "{name}");
        }
    }

    #[test]
    fn launcher_prefixes_are_stripped_from_the_line() {
        for prefix in [
            "[rank12]: ",
            "(EngineCore_DP0 pid=7) ",
            "SUBPROCESS: ",
            "[default3]:",
            "[1,0]<stderr>:",
        ] {
            let log = format!("{prefix}RuntimeError: CUDA error: out of memory\n");
            let f = classify_log(log.as_bytes());
            assert_eq!(f.kind, Kind::GpuOom, "{prefix}");
            assert_eq!(
                f.line, "RuntimeError: CUDA error: out of memory",
                "{prefix}"
            );
        }
    }

    #[test]
    fn nothing_wrong_is_no_failure() {
        let f = classify_log(b"epoch 1 loss 0.3\nsaved checkpoint-500\nmemory use 3 GiB\n");
        assert_eq!(f.kind, Kind::NoFailure);
        assert_eq!(f.line, "");
        assert_eq!(f.line_no, 0);
    }

    #[test]
    fn first_oom_decides() {
        let log = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 1.00 GiB total capacity; 1.00 GiB already allocated; 0 bytes free; 1.00 GiB reserved in total by PyTorch)\n\
                   ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1\n";
        assert_eq!(classify_log(log.as_bytes()).kind, Kind::GpuOom);
        let log = "RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 64 bytes.\n\
                   RuntimeError: CUDA error: out of memory\n";
        let f = classify_log(log.as_bytes());
        assert_eq!(
            (f.kind, f.line_no, f.numbers.tried_to_allocate_bytes),
            (Kind::HostOom, 1, Some(64))
        );
    }

    #[test]
    fn a_kill_signal_yields_to_a_gpu_oom_close_behind_it() {
        let kill = "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0\n";
        let gpu = "[rank1]: RuntimeError: CUDA error: out of memory\n";
        let near = format!("{kill}{}{gpu}", "  frame\n".repeat(10));
        let f = classify_log(near.as_bytes());
        assert_eq!((f.kind, f.line_no), (Kind::GpuOom, 12));
        let far = format!("{kill}{}{gpu}", "  frame\n".repeat(60));
        let f = classify_log(far.as_bytes());
        assert_eq!((f.kind, f.line_no), (Kind::HostOom, 1));
    }

    /// The scanner after `log`, fed at once on stderr.
    fn scan(log: &str) -> Scanner {
        let mut s = Scanner::new();
        s.feed(Stream::Err, log.as_bytes());
        s.finish();
        s
    }

    const TRACEBACK: &str = "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    loss.backward()\n";

    #[test]
    fn a_line_that_mentions_an_oom_is_pending_but_never_armed() {
        for line in [
            "config: {'oom_message': 'CUDA out of memory'}",
            "INFO: last run: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "CUDA out of memory. Tried to allocate 2.00 GiB",
        ] {
            let s = scan(&format!("{line}\n"));
            assert!(s.first_oom().is_some(), "{line}: pending");
            assert!(!s.armed(), "{line}: a mention never arms the hang timer");
        }
    }

    #[test]
    fn a_line_saying_the_oom_was_handled_is_not_pending() {
        for line in [
            "WARNING: caught CUDA out of memory, retrying with batch size 16",
            "| WARNING: ran out of memory with exception: CUDA out of memory. Tried to allocate 1.00 GiB; skipping batch",
            "CUDA out of memory detected. Train microbatch size will be decreased from 8 -> 4.",
        ] {
            let s = scan(&format!("{line}\n"));
            assert!(s.first_oom().is_none(), "{line}");
            assert_eq!(s.finding().kind, Kind::NoFailure, "{line}");
        }
    }

    #[test]
    fn an_oom_that_ends_a_traceback_or_names_its_class_is_armed() {
        let old = format!(
            "{TRACEBACK}RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 4.00 GiB total capacity; 1.00 GiB already allocated; 1.00 MiB free; 3.10 GiB reserved in total by PyTorch)\n"
        );
        assert!(scan(&old).armed(), "RuntimeError ending a traceback");
        for class in ["torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"] {
            let line =
                format!("[rank1]: {class}: CUDA out of memory. Tried to allocate 20.00 MiB.\n");
            assert!(scan(&line).armed(), "{class} without a traceback");
        }
        // NCCL's exception says `out of memory` lines after its first one.
        let nccl = format!(
            "{TRACEBACK}torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details)\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'\n"
        );
        let s = scan(&nccl);
        assert_eq!(s.finding().kind, Kind::GpuOom);
        assert!(
            s.armed(),
            "an OOM in the message of a traceback's exception"
        );
        // A RuntimeError line without a traceback before it is only a mention.
        assert!(!scan("RuntimeError: CUDA out of memory.\n").armed());
    }

    #[test]
    fn later_progress_of_the_same_process_clears_a_pending_oom() {
        let caught = format!(
            "{TRACEBACK}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
        );
        // One progress line is not enough: a peer may finish the step the rank died in.
        let s = scan(&format!("{caught}step 41 loss 0.2\n"));
        assert!(s.armed());
        // Two, with the step going up: the process went on.
        let s = scan(&format!(
            "{caught}step 41 loss 0.2\nstep 42 loss 0.2\nValueError: bad label\n"
        ));
        assert!(s.first_oom().is_none() && !s.armed());
        assert_eq!(s.finding().kind, Kind::OtherFailure);
        assert_eq!(s.error_line(), Some("ValueError: bad label"));
        // tqdm frames and a batch-size finder's words count too.
        let s = scan(&format!(
            "{caught} 10%|#   | 5/50 [00:01<00:09,  3.21it/s]\r 12%|#   | 6/50 [00:01<00:09,  3.20it/s]\r"
        ));
        assert!(s.first_oom().is_none(), "tqdm frames");
        let s = scan(&format!(
            "{caught}Batch size 32 failed, trying batch size 16\n"
        ));
        assert!(s.first_oom().is_none(), "Lightning's batch-size finder");
        // The next OOM after that is pending again, and `feed` says so.
        let mut s = Scanner::new();
        assert!(s.feed(Stream::Err, caught.as_bytes()));
        assert!(!s.feed(Stream::Out, b"step 1\nstep 2\n"));
        assert!(s.first_oom().is_none());
        assert!(s.feed(Stream::Err, caught.as_bytes()));
        assert!(s.armed());
    }

    #[test]
    fn progress_of_another_rank_does_not_clear_an_oom() {
        let oom =
            "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n";
        for other in ["[rank0]: step 8\n[rank0]: step 9\n", "step 8\nstep 9\n"] {
            let s = scan(&format!("{oom}{other}"));
            assert!(s.armed(), "{other:?} is another process");
        }
        let s = scan(&format!("{oom}[rank1]: step 8\n[rank1]: step 9\n"));
        assert!(s.first_oom().is_none(), "the same rank went on");
    }

    #[test]
    fn nccl_failure_takes_numbers_from_the_calloc_line() {
        let log = b"host:1:2 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n\nhost:1:2 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes\n";
        let f = classify_log(log);
        assert_eq!((f.kind, f.line_no), (Kind::GpuOom, 1));
        assert_eq!(f.numbers.tried_to_allocate_bytes, Some(6291456));
    }

    #[test]
    fn feed_reports_the_first_oom_once() {
        let mut s = Scanner::new();
        assert!(!s.feed(
            Stream::Err,
            b"loading\nRuntimeError: CUDA error: out of mem"
        ));
        assert!(s.feed(Stream::Err, b"ory\nmore\n"));
        assert!(!s.feed(Stream::Err, b"RuntimeError: CUDA error: out of memory\n"));
        s.finish();
        assert_eq!(s.first_oom().unwrap().line_no, 2);
        assert_eq!(s.lines_seen(), 4);
    }

    fn scan_chunked(body: &[u8], chunk: usize) -> (Option<Finding>, Option<String>, u64) {
        let mut s = Scanner::new();
        for c in body.chunks(chunk.max(1)) {
            s.feed(Stream::Out, c);
        }
        s.finish();
        (
            s.first_oom().cloned(),
            s.error_line().map(str::to_string),
            s.lines_seen(),
        )
    }

    #[test]
    fn chunking_does_not_change_the_result() {
        let mut all = fixtures_in(&own_dir());
        all.extend(fixtures_in(&corpus_dir()));
        for fx in &all {
            let whole = scan_chunked(&fx.body, fx.body.len());
            for chunk in [1, 7, 4096] {
                assert_eq!(
                    scan_chunked(&fx.body, chunk),
                    whole,
                    "{} in chunks of {chunk}",
                    fx.name
                );
            }
        }
    }

    #[test]
    fn streams_keep_separate_partial_lines() {
        let mut s = Scanner::new();
        s.feed(Stream::Out, b"RuntimeError: CUDA out of ");
        s.feed(Stream::Err, b"epoch 1 step 9 loss 0.52\n");
        s.feed(Stream::Out, b"memory. Tried to allocate 2.00 MiB (GPU 3; 4.00 GiB total capacity; 3.00 GiB already allocated; 1.00 MiB free; 3.10 GiB reserved in total by PyTorch)\n");
        s.finish();
        let f = s
            .first_oom()
            .expect("the OOM split across two stdout chunks");
        assert_eq!(f.kind, Kind::GpuOom);
        assert_eq!(f.numbers.device, Some(3));
        assert!(
            f.line.starts_with("RuntimeError: CUDA out of memory."),
            "{}",
            f.line
        );
        assert_eq!(s.lines_seen(), 2);
    }

    #[test]
    fn progress_frames_are_separate_segments_and_crlf_is_fine() {
        let log = b"Loading 10%\rLoading 57%\rERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0\r\nTraceback\r\n";
        let f = classify_log(log);
        assert_eq!((f.kind, f.line_no), (Kind::HostOom, 1));
        assert!(f.line.starts_with("ERROR:torch"), "{}", f.line);
    }

    #[test]
    fn huge_line_keeps_memory_bounded_and_later_oom_is_found() {
        let mut s = Scanner::new();
        let block = vec![b'x'; 1 << 20];
        for _ in 0..100 {
            s.feed(Stream::Out, &block);
            // An absolute bound, not MAX_SEGMENT: the test must fail if the cap is raised.
            let held = s.streams[0].partial.capacity() + s.streams[0].tail.capacity();
            assert!(held <= 128 * 1024, "the partial line holds {held} bytes");
        }
        assert!(s.feed(Stream::Out, b"\nRuntimeError: CUDA error: out of memory\n"));
        assert_eq!(s.first_oom().unwrap().line_no, 2);
        // The same through one 100 MB slice: the middle of the line is not read.
        let mut whole = vec![b'y'; 50 << 20];
        whole.extend_from_slice(b" CUDA out of memory ");
        whole.extend_from_slice(&vec![b'y'; 50 << 20]);
        whole.extend_from_slice(b"\nok\n");
        let f = classify_log(&whole);
        assert_eq!(
            f.kind,
            Kind::NoFailure,
            "the middle of a huge line is not read"
        );
    }

    #[test]
    fn an_oom_at_the_end_of_a_line_longer_than_the_cap_is_found() {
        let oom = b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 4.00 GiB total capacity; 1.00 GiB already allocated; 1.00 MiB free; 3.10 GiB reserved in total by PyTorch)";
        for len in [MAX_SEGMENT, 100_000, 100 << 20] {
            let mut log = vec![b'x'; len];
            log.extend_from_slice(b" ");
            log.extend_from_slice(oom);
            log.extend_from_slice(b"\nbye\n");
            for chunk in [log.len(), 65_536, 4096, 777] {
                let mut s = Scanner::new();
                for c in log.chunks(chunk) {
                    s.feed(Stream::Err, c);
                }
                s.finish();
                let f = s
                    .first_oom()
                    .unwrap_or_else(|| panic!("{len} in chunks of {chunk}"));
                assert_eq!((f.kind, f.line_no), (Kind::GpuOom, 1), "{len}/{chunk}");
                assert_eq!(f.numbers.tried_to_allocate_bytes, Some(2 << 30));
            }
            // Without a final newline too (the end of the output).
            let mut s = Scanner::new();
            s.feed(Stream::Out, &log[..log.len() - 5]);
            s.finish();
            assert!(s.first_oom().is_some(), "{len} unterminated");
        }
    }

    #[test]
    fn parse_size_examples() {
        assert_eq!(parse_size("1.50 GiB"), Some(1_610_612_736));
        assert_eq!(parse_size("576.00 KiB"), Some(589_824));
        assert_eq!(
            parse_size("30.96 MiB"),
            Some((30.96f64 * 1048576.0).round() as u64)
        );
        assert_eq!(parse_size("17179869184.00 GiB"), Some(u64::MAX));
        assert_eq!(parse_size("0 bytes"), Some(0));
        assert_eq!(parse_size("5077901088 bytes"), Some(5_077_901_088));
        assert_eq!(
            parse_size("147.24 MB"),
            Some((147.24f64 * 1048576.0).round() as u64)
        );
        assert_eq!(parse_size("1.5GiB"), Some(1_610_612_736));
        assert_eq!(parse_size("GiB"), None);
        assert_eq!(parse_size("1.5 parsecs"), None);
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(589_824), "576.00 KiB");
        assert_eq!(format_size(1_610_612_736), "1.50 GiB");
    }

    #[test]
    fn json_is_flat_with_nulls() {
        let f = classify_log(&own("own-gpu_old_cached.log"));
        let v: serde_json::Value = serde_json::from_str(&render_json(&f)).unwrap();
        assert_eq!(v["kind"], "cuda_oom");
        assert_eq!(v["line_no"], 4);
        assert_eq!(v["device"], 0);
        assert_eq!(v["tried_to_allocate_bytes"], 200u64 << 20);
        assert!(v["reserved_unallocated_bytes"].is_null());
        assert_eq!(v["other_processes"], serde_json::json!([]));
        assert_eq!(v["advice"], advice(&f));
        let v: serde_json::Value = serde_json::from_str(&render_json(&classify_log(b""))).unwrap();
        assert_eq!(v["kind"], "no_failure");
        assert!(v["total_bytes"].is_null());
    }

    #[test]
    fn human_form_names_kind_line_numbers_and_advice() {
        let f = classify_log(&own("own-gpu_rank_prefixed_then_nccl.log"));
        let text = render_human(&f);
        assert!(text.starts_with("kind: cuda_oom"), "{text}");
        assert!(text.contains("line 7: torch.OutOfMemoryError"), "{text}");
        assert!(text.contains("tried to allocate: 1.25 GiB"), "{text}");
        assert!(text.contains("pid 40211 (512.00 MiB)"), "{text}");
        assert!(text.trim_end().ends_with(advice(&f)), "{text}");
    }

    #[test]
    fn diagnose_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("train.log");
        std::fs::write(&log, own("own-gpu_old_cached.log")).unwrap();
        assert_eq!(diagnose_main(Some(&log), None, true), 0);
        assert_eq!(diagnose_main(Some(&log), None, false), 0);
        assert_eq!(
            diagnose_main(Some(&dir.path().join("missing.log")), None, false),
            crate::exit::USAGE
        );
        assert_eq!(
            diagnose_main(Some(dir.path()), None, false),
            crate::exit::USAGE,
            "a directory is unreadable"
        );
    }

    #[test]
    fn a_terminal_on_stdin_gets_a_hint_before_diagnose_reads_it() {
        let hint = stdin_hint(true, true).expect("a hint at a terminal");
        assert!(hint.contains("Ctrl-D") && hint.contains("oomguard diagnose FILE"));
        assert_eq!(stdin_hint(true, false), None, "a pipe or file: no hint");
        assert_eq!(stdin_hint(false, true), None, "a file was named: no hint");
    }

    #[test]
    fn advice_depends_on_the_numbers() {
        let mut f = classify_log(&own("own-gpu_old_cached.log"));
        let plain = advice(&f);
        f.numbers.free_bytes = Some(1 << 30);
        assert_ne!(advice(&f), plain);
        assert!(advice(&f).contains("expandable_segments"));
    }

    /// thrust's `bad_alloc` for a device allocation prints no size; in the public threads
    /// of that wording (not_oom-58, -76 to -79) it was an extension built for another GPU:
    /// an absurd request, never shrunk, with advice naming the rebuild and how to tell a
    /// really full GPU. Its other spellings, RMM's and PyTorch's are GPU OOMs.
    #[test]
    fn thrusts_sizeless_bad_alloc_is_a_bug_and_its_other_spellings_are_gpu_ooms() {
        let bug = [
            // gaussian-splatting#961 (Linux: libstdc++'s what() is "std::bad_alloc")
            "dist2 = torch.clamp_min(distCUDA2(torch.from_numpy(np.asarray(pcd.points)).float().cuda()), 0.0000001)\nMemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n",
            // gaussian-splatting#99 (Windows: MSVC's what() is "bad allocation")
            "Traceback (most recent call last):\n  File \"train.py\", line 35, in training\n    scene = Scene(dataset, gaussians)\nMemoryError: bad allocation: cudaErrorMemoryAllocation: out of memory\n",
            // hierarchical-3d-gaussians#35: pasted in backticks
            "    dist2 = torch.clamp_min(distCUDA2(xyz), 0.0000001)\nMemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory`\nIsn't the A100 better?\n",
            // cuhnsw#30: an issue title, full-width colon and comma
            "gpu\u{ff1a}rtx3090 \u{ff0c} show error MemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n",
        ];
        for log in bug {
            let f = classify_log(log.as_bytes());
            assert_eq!(f.kind, Kind::AbsurdRequest, "{log}\n{f:?}");
            assert!(sizeless_thrust_alloc(&f), "{f:?}");
            assert_eq!(f.numbers.tried_to_allocate_bytes, None);
            let a = advice(&f);
            for words in [
                "not fixable by smaller settings — likely a bug",
                "built for another GPU",
                "TORCH_CUDA_ARCH_LIST",
                "pip install --no-build-isolation --force-reinstall",
                "compute_cap",
                "If the GPU really was full",
                "nvidia-smi",
            ] {
                assert!(a.contains(words), "{words:?} not in {a}");
            }
            let human = render_human(&f);
            assert!(
                human.contains("kind: absurd_request (a GPU allocation by thrust"),
                "{human}"
            );
            let v: serde_json::Value = serde_json::from_str(&render_json(&f)).unwrap();
            assert_eq!(v["kind"], "absurd_request");
            assert!(v["tried_to_allocate_bytes"].is_null());
        }
        let memory = [
            // MinkowskiEngine#357: thrust's system_error, 10267625 elements
            "/home/geza/workspace/MinkowskiEngine/src/kernel_map.cuh:314 Decomposing 10267625 elements\nCUDA error 2 [/usr/local/cuda/include/thrust/system/cuda/detail/parallel_for.h, 143]: out of memory\nterminate called after throwing an instance of 'thrust::system::system_error'\n  what():  parallel_for failed: cudaErrorMemoryAllocation: out of memory\n",
            // the same, its what() line alone
            "  what():  parallel_for failed: cudaErrorMemoryAllocation: out of memory\n",
            // cupoch#103: RMM's spelling, 97M points
            "Memory Error: std::bad_alloc: CUDA error at /home/path/cupoch/cupoch/third_party/rmm/include/rmm/mr/device/cuda_memory_resource.hpp:69: cudaErrorMemoryAllocation out of memory\n",
            "RuntimeError: CUDA error: out of memory\n",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.63 GiB. GPU 0 has a total capacty of 44.31 GiB of which 4.63 GiB is free.\n",
        ];
        for log in memory {
            let f = classify_log(log.as_bytes());
            assert_eq!(f.kind, Kind::GpuOom, "{log}\n{f:?}");
            assert!(!sizeless_thrust_alloc(&f));
        }
        // A size printed with it is not thrust's sizeless message: judged by its size.
        let sized = "MemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory. Tried to allocate 2.00 GiB\n";
        assert_ne!(classify_log(sized.as_bytes()).kind, Kind::AbsurdRequest);
    }

    /// Release-mode throughput: `cargo test --release detect::tests::throughput -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check: run it by name"]
    fn throughput() {
        let dir = corpus_dir();
        let fixtures = fixtures_in(&dir);
        let fixture_log = |label: Option<&str>| -> Vec<u8> {
            fixtures
                .iter()
                .filter(|f| label.is_none_or(|l| f.label == l))
                .flat_map(|f| f.body.iter().copied().chain(*b"\n"))
                .collect()
        };
        // A healthy run: trainer dicts, \r progress frames, a few warnings, no failure.
        let mut training = String::new();
        for step in 0..5000 {
            training += &format!(
                "{{'loss': {:.4}, 'grad_norm': 0.91, 'learning_rate': 1.9e-05, 'epoch': {:.2}}}\n",
                1.0 + (step % 97) as f64 / 97.0,
                step as f64 / 1000.0
            );
            training += &format!(
                " {}%|####   | {step}/5000 [01:02<10:00,  3.21it/s]\r",
                step / 50
            );
            if step % 500 == 0 {
                training += "UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.\n";
                training += "[rank0]: max memory allocated 35.20 GiB, reserved 38.00 GiB\n";
            }
        }
        let runs = [
            ("all fixtures", fixture_log(None)),
            (
                "not_oom fixtures only (never settles)",
                fixture_log(Some("not_oom")),
            ),
            ("synthetic healthy training log", training.into_bytes()),
        ];
        for (what, one) in runs {
            let mut big = Vec::with_capacity(1 << 30);
            while big.len() < 1 << 30 {
                big.extend_from_slice(&one);
            }
            let start = std::time::Instant::now();
            let mut s = Scanner::new();
            for c in big.chunks(1 << 20) {
                s.feed(Stream::Out, c);
            }
            s.finish();
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "{what}: {} MiB in {secs:.3} s = {:.0} MB/s, {} lines, kind {:?}",
                big.len() >> 20,
                big.len() as f64 / secs / 1e6,
                s.lines_seen(),
                s.finding().kind
            );
        }
    }
}
