//! The words and patterns of OOM and error lines (see the parent module's theory of
//! operation): the needles the hot path looks for, the OOM, error and peer-failure
//! patterns, and how a segment is cleaned ([`clean`]) and judged ([`oom_in`]).

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

use super::numbers::{NUMBERS, parse_size};
use super::{ABSURD_HOST_BYTES, Kind};

/// Words every OOM pattern (GPU, host, absurd) contains one of. Case-sensitive on
/// purpose, and with [`ERROR_WORD_LIST`] at most 32 in all: a small literal set keeps the
/// SIMD prefilter (slim Teddy; 33 or more take the fat one, about half as fast).
pub(super) const OOM_WORD_LIST: [&str; 25] = [
    "emory",              // out of memory, MemoryError, cudaErrorMemoryAllocation
    "OutOfMem",           // torch.OutOfMemoryError, also cut short
    "out of m",           // a wrapped "CUDA out of mem|ory"
    "lloc",               // calloc, allocate, DefaultCPUAllocator, std::bad_alloc
    "ALLOC",              // CUBLAS_STATUS_ALLOC_FAILED
    "OUT_OF_",            // CUDA_ERROR_OUT_OF_MEMORY, PI_ERROR_OUT_OF_RESOURCES
    "A error",            // "CUDA error 2", "CUDA error: CUBLAS_STATUS_..."
    "a error",            // "Cuda error: 2", "cuda error 2"
    "error 2",            // an extension's "cuda execution failed with error 2"
    "12 vs 0",            // posix_memalign's ENOMEM: "nbytes) == 0. 12 vs 0"
    "oom-kill",           // the kernel: "oom-kill:constraint=", "invoked oom-killer"
    "KV cache",           // vLLM: "... can be stored in KV cache"
    "illed",              // bare shell "Killed", "signal: Killed", "is killed by signal"
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
pub(super) const ERROR_WORD_LIST: [&str; 9] = [
    "Error",            // exception lines
    "Exception",        // exception lines
    "OutOfResources",   // triton
    "Watchdog",         // NCCL watchdog timeout
    "Assertion",        // device-side assert
    "terminate called", // C++ abort
    "Traceback",        // where an exception's report begins
    "A error",          // "CUDA error: ..." (ECC, invalid configuration argument)
    "a error",          // "cuda error: ...", "Cuda error: ..."
];

/// Words at least one of which occurs in every segment the patterns below can match, and
/// [`CANCEL_WORD`] (so one pass over each byte finds both; see [`holds_word`]). Words of
/// the two lists that share their first [`MERGE_PREFIX`] bytes are looked for by those
/// bytes (`OutOfMem`, `OutOfResources`: `OutOf`), which keeps the set at 32 words, the
/// most the slim SIMD search takes (see [`Words`]).
pub(super) static NEEDLES: LazyLock<Words> = LazyLock::new(|| {
    let words: Vec<&str> = OOM_WORD_LIST
        .iter()
        .chain(&ERROR_WORD_LIST)
        .copied()
        .collect();
    Words::with_cancel_word(&needle_words(&words))
});

/// Words that share this many first bytes are looked for by them (see [`NEEDLES`]).
const MERGE_PREFIX: usize = 5;

/// `words` without repeats, each group of words sharing their first [`MERGE_PREFIX`]
/// bytes given as those bytes: a set that finds every segment holding one of `words`.
pub(super) fn needle_words<'a>(words: &[&'a str]) -> Vec<&'a str> {
    let mut out: Vec<&'a str> = Vec::with_capacity(words.len());
    for &w in words {
        if out.contains(&w) {
            continue;
        }
        let cut = |s: &'a str| s.get(..MERGE_PREFIX).filter(|p| p.len() < s.len());
        match cut(w).and_then(|p| out.iter().position(|o| o.starts_with(p)).map(|i| (i, p))) {
            Some((i, p)) => out[i] = p,
            None => out.push(w),
        }
    }
    out
}

/// Words at least one of which occurs in every line that shows life ([`RECOVERED`],
/// [`progress::last_step`]): looked for as well while an OOM is pending.
const LIFE_WORDS: [&str; 17] = [
    "step",
    "Step",
    "STEP", // step 120, global_step=120
    "iter",
    "Iter",
    "ITER", // iter 120, iteration 120
    // A training bar's rate (`progress` counts only bars in iterations): "120/1000
    // [00:10<01:30, 9.8it/s]", "2.5s/it]", with a postfix "3.98it/s, loss=2.1]" or
    // Lightning's "2.10it/s, v_num=0]". (`/s]` and `/it]` missed the postfixed bars, and a
    // 3-byte word made the SIMD search of every set holding it slower: see [`Words`].)
    "it/s",
    "s/it",
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
pub(super) static LAUNCHER_REPORT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"ChildFailedError|CalledProcessError|ProcessRaisedException|ProcessExitedException")
        .expect("launcher report pattern")
});

/// The epoch of a Hugging Face Trainer's log dict line.
pub(super) static LOG_DICT_EPOCH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^\{.*['"]loss['"]: [^,]+,.*['"]epoch['"]: ([0-9]+(?:\.[0-9]+)?)"#)
        .expect("log dict pattern")
});

/// The words of life, and [`CANCEL_WORD`] (see [`holds_word`]).
pub(super) static LIFE: LazyLock<Words> = LazyLock::new(|| Words::with_cancel_word(&LIFE_WORDS));

/// The word of Slurm's line saying a job or step was cancelled
/// (`*** STEP 5.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***`). Every set the scanner
/// searches the output with holds it too, so one pass over each byte finds both what the
/// scanner reads and that line; no set of its own, since each set's lazy DFA keeps a cache
/// (two more sets were 0.3 MiB more peak RSS).
pub(super) const CANCEL_WORD: &[u8] = b"CANCELLED AT ";

/// Whether `seg` holds a word of `set` other than [`CANCEL_WORD`].
pub(super) fn holds_word(set: &Words, seg: &[u8]) -> bool {
    let mut at = 0;
    while let Some(hit) = set.find_at(seg, at) {
        if !hit.cancel {
            return true;
        }
        at = hit.end;
    }
    false
}

/// The needles and the life words: what is looked for while an OOM is pending (with
/// [`CANCEL_WORD`], which both hold).
pub(super) static PENDING_NEEDLES: LazyLock<Words> =
    LazyLock::new(|| Words::with_cancel_word(&[NEEDLES.words(), &LIFE_WORDS].concat()));

/// While a mention of an OOM is pending and settled: words of life, where a fatal
/// form of it can begin (a traceback, an OOM exception line), and exception lines (with
/// [`CANCEL_WORD`], which [`LIFE`] holds).
pub(super) static QUIET: LazyLock<Words> = LazyLock::new(|| {
    // `Error`/`Exception` (OutOfMemoryError among them): the exception line of a
    // later traceback, another error that ended the process.
    Words::with_cancel_word(&[&LIFE_WORDS[..], &["Traceback", "Error", "Exception"]].concat())
});

/// A set of literal words looked for together, leftmost first (as a regex alternation of
/// them would): with the SIMD search of the `aho-corasick` crate (Teddy) where the CPU
/// has it, else its automaton. Per match it costs a fraction of what a regex costs (whose
/// literal prefilter only proposes where a match may start, and its lazy DFA then
/// confirms it): on OOM-dense output, where a word comes every few lines, the needles'
/// search was most of the scanner's time (benches/README.md). Up to 32 words take the
/// slim variant, which on output with no word in it is as fast as a regex's prefilter; 33
/// or more the fat one, about 0.6x as fast.
pub(super) struct Words {
    search: Search,
    /// The words without [`CANCEL_WORD`] (the last pattern).
    words: Vec<&'static str>,
}

enum Search {
    Packed(aho_corasick::packed::Searcher),
    Automaton(aho_corasick::AhoCorasick),
}

/// Where a word of a [`Words`] set was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hit {
    pub start: usize,
    pub end: usize,
    /// The word is [`CANCEL_WORD`].
    pub cancel: bool,
}

impl Words {
    /// `words` (sorted, without repeats), then [`CANCEL_WORD`].
    ///
    /// Sorted because the SIMD search puts the words into its 8 buckets in the order
    /// given, and how they fall decides how often it stops for nothing: the lists' own
    /// order made it 2.8x slower on progress lines and Hugging Face log dicts (4.7
    /// against 13.3 GB/s, as fast as the regex's prefilter was; a microbenchmark over 64
    /// KiB chunks), sorted it is as fast on those, tqdm bars and the fixture logs' lines
    /// that hold no word.
    fn with_cancel_word(words: &[&'static str]) -> Words {
        let mut words = words.to_vec();
        words.sort_unstable();
        words.dedup();
        let mut packed = aho_corasick::packed::Config::new()
            .match_kind(aho_corasick::packed::MatchKind::LeftmostFirst)
            .builder();
        let search = match packed.extend(Self::patterns(&words)).build() {
            Some(s) => Search::Packed(s),
            None => Self::automaton_of(&words),
        };
        Words { search, words }
    }

    /// The patterns searched for: `words`, then [`CANCEL_WORD`] (its index says a hit
    /// is the cancel word).
    fn patterns<'a>(words: &'a [&'static str]) -> impl Iterator<Item = &'a [u8]> {
        words.iter().map(|w| w.as_bytes()).chain([CANCEL_WORD])
    }

    /// The automaton's search of `words` (where the CPU has no SIMD search).
    fn automaton_of(words: &[&'static str]) -> Search {
        Search::Automaton(
            aho_corasick::AhoCorasick::builder()
                .match_kind(aho_corasick::MatchKind::LeftmostFirst)
                .build(Self::patterns(words))
                .expect("a few short words always build"),
        )
    }

    /// The words of the set, without [`CANCEL_WORD`].
    pub(super) fn words(&self) -> &[&'static str] {
        &self.words
    }

    /// Whether the CPU's SIMD search serves this set.
    #[cfg(test)]
    pub(super) fn is_simd(&self) -> bool {
        matches!(self.search, Search::Packed(_))
    }

    /// The same set, searched by the automaton (where the CPU has no SIMD search).
    #[cfg(test)]
    pub(super) fn automaton(&self) -> Words {
        Words {
            search: Self::automaton_of(&self.words),
            words: self.words.clone(),
        }
    }

    /// The first word in `hay[at..]` (leftmost; of words starting at the same byte, the
    /// one listed first).
    pub(super) fn find_at(&self, hay: &[u8], at: usize) -> Option<Hit> {
        let span = aho_corasick::Span::from(at..hay.len());
        let m = match &self.search {
            Search::Packed(s) => s.find_in(hay, span)?,
            Search::Automaton(ac) => ac.find(aho_corasick::Input::new(hay).span(span))?,
        };
        Some(Hit {
            start: m.start(),
            end: m.end(),
            cancel: m.pattern().as_usize() == self.words.len(),
        })
    }
}

/// Where a Python traceback begins (a finder built once: building one per line costs
/// more than the search).
pub(super) static TRACEBACK: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"Traceback (most recent call last)"));

/// The class an OOM line names when it is an exception (a finder built once).
pub(super) static OOM_ERROR_CLASS: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(b"OutOfMemoryError"));

/// Whether a line that mentions an OOM says, in its own words, that it was handled:
/// "caught CUDA out of memory, retrying", "skipping batch". "Caught" before "exception"
/// only reports one (oneCCL's "worker 0 caught internal exception: ... OUT_OF_DEVICE_MEMORY",
/// then its abort): that is not a handling.
pub(super) fn handled(text: &str) -> bool {
    HANDLED.find_iter(text).any(|m| {
        !(m.as_str().as_bytes()[0].eq_ignore_ascii_case(&b'c')
            && REPORTED_EXCEPTION.is_match(&text[m.end()..]))
    })
}

/// What follows "caught" when it reports an exception rather than handles it.
pub(super) static REPORTED_EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^\s+(?:(?:an?|the|internal|unhandled|uncaught|fatal|c\+\+)\s+)?exception")
        .expect("reported exception pattern")
});

/// The words of [`handled`].
pub(super) static HANDLED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:caught|catch(?:ing)?|retry(?:ing)?|retried|skip(?:ping|ped)?|recover(?:ed|ing)?|will\s+be\s+(?:decreased|reduced|halved)|trying\s+(?:batch|micro)|reducing|halving|lowering)\b",
    )
    .expect("handled pattern")
});

/// A line saying a run went on after an OOM: batch-size finders and trainers that
/// catch an OOM and retry smaller (Lightning, Composer, HF's auto_find_batch_size).
pub(super) static RECOVERED: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        r"(?i)batch[ _]size(?:\s+\S+)?\s+found|batch[ _]size\s+finder|(?:succeeded|failed),?\s+trying\s+batch\s+size|microbatch\s+size\s+will\s+be|will\s+continue\s+with\s+(?:full\s+run|batch)",
    )
    .expect("recovered pattern")
});

/// A Python exception line as a traceback ends with it: the class name (dotted) starts
/// the line (after launcher prefixes), then `:` or the end.
pub(super) static EXCEPTION_START: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Failure|OutOfResources|Interrupt)(?::\s|:$|$)",
    )
    .expect("exception start pattern")
});

/// Words one of which every OOM pattern contains: a literal search (SIMD) is several
/// times cheaper than running the OOM patterns' automata over a segment.
pub(super) static OOM_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    let pattern = OOM_WORD_LIST.map(regex::escape).join("|");
    regex::bytes::Regex::new(&pattern).expect("oom words")
});

/// Words one of which every other-error pattern contains.
pub(super) static OTHER_ERROR_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        "Watchdog|terminate called|Assertion|illegal memory|Error|exitcode|killed by|A error|a error",
    )
    .expect("other error words")
});

/// Words of an exception line, checked before the (slower) exception pattern.
pub(super) static ERROR_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new("Error|Exception|Failure|OutOfResources").expect("error words")
});

/// GPU out-of-memory messages: PyTorch's wordings for CUDA, HIP, XPU, MPS and NPU since
/// 0.4, cudaMallocAsync's, NCCL's, THC's, accelerate's, XLA's (TPU) and Gaudi's; a CUDA extension's own wording or
/// only the CUDA error code (2 is `cudaErrorMemoryAllocation`); Intel's SYCL/Level Zero
/// codes (old PI, new UR); vLLM's "no room for the KV cache".
const GPU_OOM_SRC: &str = r"
        # PyTorch's words, also as pasted with a word changed or put in ('CUDA: out of
        # memory', 'cuda Out Of Memory', 'CUDA ran out of memory', 'CUDA error. out of GPU
        # memory'): the device, at most two short words, 'out of', at most one, 'memory'.
        (?-u:\b)(?i:CUDA|HIP|XPU|NPU)(?-u:\b)[^A-Za-z0-9_]{1,3}(?:[A-Za-z]{1,10}[^A-Za-z0-9_]{1,3}){0,2}?(?i:out\ of)\ (?:(?i:GPU|device|VRAM)\ )?(?i:memory)
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
        | Allocation\ on\ device\ [0-9]*\ ?would\ exceed\ allowed\ memory
        # An extension's CUDA_CHECK: 'Error out of memory at line 88 in file ops.cu'
        # (bitsandbytes), 'CUDA error 2 at x.cu:12'.
        | (?i:error)[^A-Za-z0-9_]{0,3}out\ of\ memory\ (?:at|in)\ (?:line|file)
        # CUDA's error 2 (cudaErrorMemoryAllocation) in a CUDA check's own words, any
        # library's: 'CUDA error 2', 'cuda runtime error: 2', spconv's 'cuda execution
        # failed with error 2', tensorview's 'cuda failed with error 2 out of memory'.
        # Another code in the same words (error 3, 98, 700) is not an allocation failure.
        | (?i:cuda)(?:\ [A-Za-z_]{1,20}){0,3}?\ (?i:failed\ with\ error|error)\s*(?:code\s*)?[:=\#(]?\s*2(?-u:\b)(?:[^.0-9]|$)
        # Intel: Level Zero's out-of-device-memory, through SYCL's old PI and new UR.
        | (?:UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_DEVICE_MEMORY
        | PI_ERROR_OUT_OF_RESOURCES
        # XLA's allocator (PyTorch/XLA on TPU): 'RESOURCE_EXHAUSTED: Attempting to reserve
        # 6.48G at the bottom of memory. That was not possible. There are 6.78G free',
        # 'Resource exhausted: Attempting to allocate 180.59M. That was not possible.';
        # its compiler: 'Ran out of memory in memory space hbm'.
        | Attempting\ to\ (?:reserve|allocate)\ [0-9.]+[KMGTP]?i?B?\.?(?:\ at\ the\ bottom\ of\ memory\.)?\ That\ was\ not\ possible
        | Ran\ out\ of\ memory\ in\ memory\ space\ (?i:hbm|vmem)
        # Intel Gaudi (HPU): 'FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::2123366400'.
        | PT_DEVMEM\ Allocation\ failed
        # vLLM: the GPU memory budget leaves too little for the KV cache.
        | No\ available\ memory\ for\ the\ cache\ blocks
        | can\ be\ stored\ in\ KV\ cache
        | larger\ than\ the\ available\ KV\ cache\ memory";

pub(super) static GPU_OOM: LazyLock<Regex> =
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
pub(super) static THRUST_BAD_ALLOC: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:std::bad_alloc|bad allocation):\s*cudaErrorMemoryAllocation")
        .expect("thrust bad_alloc pattern")
});

/// GPU allocation failures that also come from a broken CUDA setup or the wrong device
/// (cuBLAS creating its handle, cuDNN): a GPU OOM only in the form a process dies with
/// (the exception line, or the message of a traceback's exception), never in prose.
/// cuBLAS that cannot create its handle on a full GPU says so only as
/// `CUBLAS_STATUS_NOT_INITIALIZED when calling cublasCreate(handle)` (the corpus's
/// cuda_oom-99); the same status from any other call is not about memory.
const GPU_OOM_AMBIGUOUS_SRC: &str = r"(?-u:\b)(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED|CUBLAS_STATUS_NOT_INITIALIZED\ when\ calling\ .?cublas(?:Lt)?Create";

pub(super) static GPU_OOM_AMBIGUOUS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(GPU_OOM_AMBIGUOUS_SRC).expect("ambiguous gpu pattern"));

/// Every OOM pattern at once, the sizes in other words too: one pass of the DFA says
/// whether any of them is worth looking for (most segments with an OOM word hold none).
pub(super) static ANY_OOM: LazyLock<Regex> = LazyLock::new(|| {
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
          # zsh: 'zsh: killed     python train.py', and a job's '[1]  + 26478 killed     python
          # train.py'; fish: 'fish: Job 1, (the command) terminated by signal SIGKILL'
          | zsh:\ killed\s
          | \[\d+\]\s+(?:[-+]\s+)?\d+\s+killed\s
          | terminated\ by\ signal\ SIGKILL
          # the shell's 'Killed' in other languages, alone or after a job's number
          | (?:^|\d\s+|\]\+?\s+)(?:已杀死|強制終了|強制結束|죽었음|Getötet|Убито|Processus\ arrêté)(?:\s|$)
        )
        | (?P<silent>Killing\ subprocess\ \d+)";

pub(super) static HOST_OOM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("(?x){HOST_OOM_SRC}")).expect("host pattern"));

/// Python exception lines: `torch.distributed.DistBackendError: ...`, `KeyboardInterrupt`,
/// also glued to text in another script (`报错：triton...OutOfResources: ...`).
pub(super) static EXCEPTION_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:^|[\s`'"\]\)>|*:]|[^\x00-\x7F])((?:[A-Za-z_][A-Za-z0-9_]*\.)*(?:[A-Z][A-Za-z0-9_]*)?(?:Error|Exception|Failure|OutOfResources))(?::(?:\s|$)|$)"#,
    )
    .expect("exception pattern")
});

/// Other telling error lines that are not `XError:` lines.
pub(super) static OTHER_ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
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
pub(super) static PEER_FAILURE: LazyLock<Regex> = LazyLock::new(|| {
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
pub(super) static CONSEQUENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"failed\ \(exitcode:|killed\ by\ signal|terminate\ called\ after\ throwing")
        .expect("consequence pattern")
});

/// Words one of which every [`PEER_FAILURE`] form contains (a cheap literal search
/// before the pattern, on error lines only).
pub(super) static PEER_WORDS: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
    regex::bytes::Regex::new(
        "by peer|by remote peer|gloo::|DistStore|likely closed|remote server|endezvous|was aborted|Watchdog caught|remote process|ncclRemote|Timed out waiting|Socket Timeout|workers joined",
    )
    .expect("peer words")
});

/// Whether an error line says a peer of the run failed (see [`PEER_FAILURE`]).
pub fn is_peer_failure(line: &str) -> bool {
    PEER_WORDS.is_match(line.as_bytes()) && PEER_FAILURE.is_match(line)
}

/// Whether `seg` comes from `source` (as [`source_of`] says), without allocating: asked of
/// every progress line while an OOM is pending.
pub(super) fn source_is(seg: &[u8], source: &str) -> bool {
    let Ok(head) = std::str::from_utf8(&seg[..seg.len().min(256)]) else {
        return source_of(seg) == source; // cut mid-character or not UTF-8: rare
    };
    let found = PREFIX.find(head).map_or("", |m| m.as_str());
    found
        .split_whitespace()
        .flat_map(str::chars)
        .eq(source.chars())
}

/// The launcher prefix a segment starts with (`[rank1]:`, `[1,0]<stderr>:`), spaces
/// removed, or "" — which process printed it, as far as the output says.
pub(super) fn source_of(seg: &[u8]) -> String {
    let head = String::from_utf8_lossy(&seg[..seg.len().min(256)]);
    PREFIX
        .find(&head)
        .map(|m| m.as_str().split_whitespace().collect())
        .unwrap_or_default()
}

/// Prefixes added by launchers, stripped from the decisive line.
pub(super) static PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:\s*(?:\[(?:rank|default)[0-9]+\]:|\[[0-9]+,[0-9]+\]<std(?:out|err)>:|\([A-Za-z_][A-Za-z0-9_]* pid=[0-9]+\)|SUBPROCESS:))+\s*",
    )
    .expect("prefix pattern")
});

pub(super) static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
        .expect("ansi pattern")
});

/// A line of Python code (a traceback's source line, a pasted snippet) that names an
/// exception class without raising it: `except torch.cuda.OutOfMemoryError:`.
pub(super) fn is_code(text: &str) -> bool {
    let trimmed = text.trim_start_matches(['`', '"', '\'', ' ']);
    ["raise ", "except ", "from ", "import ", "class ", "def "]
        .iter()
        .any(|k| trimmed.starts_with(k))
}

/// How much an OOM line says by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strength {
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
pub(super) fn oom_in(text: &str, boundary: Option<usize>) -> Option<(Kind, Strength)> {
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
pub(super) fn message_complete(text: &str) -> bool {
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

/// A segment (cleaned) that starts something else, not the rest of a wrapped message: an
/// empty line, a part of a traceback, an exception line, a line a logger or a progress
/// bar began (a timestamp; a level or a logger's name; a percentage and a bar). Without
/// this, a message cut short (`... of which 1.20 GiB is free.`, where
/// PyTorch's goes on `Including non-PyTorch memory ...`) took in the lines after it, up
/// to eight (wandb's farewell, torchrun's `failed (exitcode: 1)` record), and the line
/// shown for the OOM was all of them run together.
pub(super) fn starts_new_record(text: &str) -> bool {
    let t = text.trim_start();
    if t.is_empty()
        || [
            "Traceback",
            "File \"",
            "During handling",
            "The above exception",
        ]
        .iter()
        .any(|w| t.starts_with(w))
    {
        return true;
    }
    let bytes = t.trim_start_matches('[').as_bytes();
    let digits = |b: &[u8]| b.iter().all(u8::is_ascii_digit);
    // glog's `E1127 03:12:01.123000 140 api.py:869]`; `2026-11-27 03:12:01`.
    let glog = bytes.len() >= 11
        && matches!(bytes[0], b'I' | b'W' | b'E' | b'F')
        && digits(&bytes[1..5])
        && bytes[5] == b' '
        && digits(&bytes[6..8])
        && bytes[8] == b':';
    let date = bytes.len() >= 10
        && digits(&bytes[..4])
        && bytes[4] == b'-'
        && digits(&bytes[5..7])
        && bytes[7] == b'-'
        && digits(&bytes[8..10]);
    // tqdm: ` 45%|####5     | 9/20`
    let bar = t
        .find("%|")
        .is_some_and(|i| (1..=3).contains(&i) && digits(&t.as_bytes()[..i]));
    // Python's logging (`ERROR:root:`, `WARNING:torch...`), wandb, Slurm.
    let logger = [
        "wandb:",
        "INFO",
        "WARNING",
        "WARN",
        "ERROR",
        "DEBUG",
        "CRITICAL",
        "srun:",
        "slurmstepd:",
    ]
    .iter()
    .any(|w| {
        t.strip_prefix(w)
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_alphanumeric()))
    });
    glog || date || bar || logger || t.starts_with("{'") || EXCEPTION_START.is_match(t)
}

/// Decode, drop ANSI escapes and launcher prefixes, undo HTML escaping, read full-width
/// punctuation as ASCII (`：` is `:`), drop a paste's `> ` quote marks and markdown
/// emphasis around the line, trim. Borrows when there is nothing to rewrite (the common
/// case: no allocation).
pub(super) fn clean(seg: &[u8]) -> Cow<'_, str> {
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
    // A closing backtick is markdown's only when it closes one the trim above took, or is
    // left over (an odd count): "when calling `cublasCreate(handle)`" keeps its own.
    let body = text.trim_end_matches(|c: char| c.is_whitespace() || c == '*');
    let ticks = || memchr::memchr_iter(b'`', &body.as_bytes()[start.min(body.len())..]).count();
    let end = if body.ends_with('`') && (text[..start].contains('`') || ticks() % 2 == 1) {
        body.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '*' | '`'))
    } else {
        body
    }
    .len()
    .max(start);
    match text {
        Cow::Borrowed(s) => Cow::Borrowed(&s[start..end]),
        Cow::Owned(s) => Cow::Owned(s[start..end].to_string()),
    }
}
