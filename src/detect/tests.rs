use super::diagnose::*;
use super::numbers::*;
use super::scanner::*;
use super::wordings::*;
use super::*;
use std::path::{Path, PathBuf};

use regex::Regex;

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
fn the_needles_stay_few_enough_for_the_slim_search() {
    // 33 words or more make the SIMD search take its fat variant, about 0.6x as fast on
    // output with no failure in it (a microbenchmark on progress lines: 8.0 against 13.4
    // GB/s), which is nearly all the output of a run.
    let n = NEEDLES.words().len() + 1; // and Slurm's cancel word
    assert!(n <= 32, "{n} needle words: {:?}", NEEDLES.words());
    if cfg!(target_arch = "x86_64") {
        assert!(NEEDLES.is_simd() && LIFE.is_simd() && QUIET.is_simd());
        assert!(PENDING_NEEDLES.is_simd());
    }
}

#[test]
fn the_needles_find_every_word_of_both_lists() {
    // Merged words (`OutOf` for `OutOfMem` and `OutOfResources`) find what each did.
    for w in OOM_WORD_LIST.iter().chain(&ERROR_WORD_LIST) {
        for line in [
            w.to_string(),
            format!("[rank3]: x {w} y"),
            format!("{}{w}", "a".repeat(70)),
        ] {
            assert!(holds_word(&NEEDLES, line.as_bytes()), "{line:?}");
            assert!(holds_word(&PENDING_NEEDLES, line.as_bytes()), "{line:?}");
        }
    }
    assert_eq!(
        needle_words(&["OutOfMem", "emory", "OutOfResources", "emory"]),
        ["OutOf", "emory"]
    );
    assert_eq!(
        needle_words(&["Error", "Errors", "error 2"]),
        ["Error", "error 2"]
    );
    assert!(!holds_word(
        &NEEDLES,
        b"step 12 loss 2.1 CANCELLED AT 2026-01-01T00:00:00"
    ));
    assert!(holds_word(
        &NEEDLES,
        b"*** STEP 5.0 ON n1 CANCELLED AT 2026 *** Killed"
    ));
}

/// Every match of `set` in `hay` from `at` on, as (start, end, cancel).
fn all_hits(set: &Words, hay: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(h) = set.find_at(hay, at) {
        out.push((h.start, h.end, h.cancel));
        at = h.end;
    }
    out
}

#[test]
fn each_word_set_finds_what_a_regex_alternation_of_its_words_finds() {
    // The sets were regexes (`a|b|...`, leftmost first); the scanner reads where each
    // match starts and whether it is Slurm's cancel word. Over every fixture log, whole
    // (the SIMD search), line by line (short haystacks take another search) and through
    // the automaton the sets fall back on where the CPU has no SIMD search, the hits are
    // the regex's.
    let mut text: Vec<u8> = fixtures_in(&corpus_dir())
        .into_iter()
        .flat_map(|f| f.body)
        .collect();
    text.extend_from_slice(b"*** STEP 5.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\nstep 3/9 [00:01<00:02, 3.1it/s]\n");
    for (name, set) in [
        ("needles", &*NEEDLES),
        ("life", &*LIFE),
        ("pending", &*PENDING_NEEDLES),
        ("quiet", &*QUIET),
    ] {
        let alternation = set
            .words()
            .iter()
            .map(|w| regex::escape(w))
            .chain([regex::escape("CANCELLED AT ")])
            .collect::<Vec<_>>()
            .join("|");
        let re = regex::bytes::Regex::new(&alternation).unwrap();
        let regex_hits = |hay: &[u8]| -> Vec<(usize, usize, bool)> {
            re.find_iter(hay)
                .map(|m| (m.start(), m.end(), m.as_bytes() == CANCEL_WORD))
                .collect()
        };
        let want = regex_hits(&text);
        assert!(want.len() > 20, "{name}: {} hits", want.len());
        assert_eq!(all_hits(set, &text), want, "{name}, whole text");
        assert_eq!(all_hits(&set.automaton(), &text), want, "{name}, automaton");
        for line in text.split(|&b| b == b'\n') {
            assert_eq!(all_hits(set, line), regex_hits(line), "{name}: {line:?}");
        }
    }
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
    let kill =
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0\n";
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
        let line = format!("[rank1]: {class}: CUDA out of memory. Tried to allocate 20.00 MiB.\n");
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
    // Bars with a postfix (Lightning's `v_num`, `set_postfix(loss=...)`) and in seconds
    // per iteration, as the trainers print them.
    for bars in [
        "Epoch 0:  30%|###       | 3/10 [00:01<00:03,  2.10it/s, v_num=0]\rEpoch 0:  40%|####      | 4/10 [00:01<00:03,  2.10it/s, v_num=0]\r",
        " 40%|####      | 40/100 [00:10<00:15,  3.98it/s, loss=2.1]\r 41%|####      | 41/100 [00:10<00:15,  3.98it/s, loss=2.0]\r",
        "Training: 12/50 [00:30<01:35, 2.5s/it]\nTraining: 13/50 [00:32<01:33, 2.5s/it, loss=1.9]\n",
    ] {
        let s = scan(&format!("{caught}{bars}RuntimeError: something else\n"));
        assert!(s.first_oom().is_none(), "{bars:?}");
        assert_eq!(s.finding().kind, Kind::OtherFailure, "{bars:?}");
    }
    // A bar counting something else (examples, bytes) is not the training going on.
    let s = scan(&format!(
        "{caught}Map:  50%|#####     | 500/1000 [00:01<00:01, 480.2 examples/s]\rMap:  60%|######    | 600/1000 [00:01<00:01, 480.2 examples/s]\r"
    ));
    assert!(s.armed(), "a dataset's map bar");
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
    let oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n";
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

/// Slurm's cancel line is found by the search that finds the scanner's words, whatever the
/// scanner is looking for at the time (nothing yet, a pending mention, a settled fatal
/// OOM), in any chunking; lines around it are counted as before.
#[test]
fn slurms_cancel_line_is_found_in_every_state_of_the_scan() {
    let cancel_job = "slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2026-11-24T00:15:00 DUE TO TIME LIMIT ***\n";
    let cancel_step =
        "slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-11-24T00:14:26 ***\n";
    let quiet_lines = "[rank0]: waiting for the others\n".repeat(60);
    let fatal = format!(
        "{TRACEBACK}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free.\n"
    );
    let mention = "INFO: last run: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n";
    let progress = "step 1/10 loss 2.0\nstep 2/10 loss 1.9\n";
    for (state, before) in [
        ("nothing found", progress.to_string()),
        ("a settled fatal OOM", format!("{fatal}{quiet_lines}")),
        ("a settled mention", format!("{mention}{quiet_lines}")),
        ("a pending OOM", fatal.clone()),
    ] {
        for cancel in [cancel_job, cancel_step] {
            let log = format!("{before}{cancel}[rank0]: after\n");
            let whole = scan_chunked(log.as_bytes(), log.len());
            for chunk in [1, 7, 64, 4096, log.len()] {
                let mut s = Scanner::new();
                for c in log.as_bytes().chunks(chunk) {
                    s.feed(Stream::Err, c);
                }
                s.finish();
                assert_eq!(
                    s.slurm_cancelled(),
                    Some(cancel.trim()),
                    "after {state}, in chunks of {chunk}"
                );
                assert_eq!(
                    s.lines_seen(),
                    log.matches('\n').count() as u64,
                    "after {state}, in chunks of {chunk}"
                );
                let got = (
                    s.first_oom().cloned(),
                    s.error_line().map(str::to_string),
                    s.lines_seen(),
                );
                assert_eq!(got, whole, "after {state}, in chunks of {chunk}");
            }
        }
    }
    // A line with the word and a needle of its own is read for both.
    let s = scan("RuntimeError: worker CANCELLED AT step 3\n");
    assert_eq!(s.slurm_cancelled(), None, "not Slurm's line");
    assert!(s.error_line().is_some_and(|l| l.contains("RuntimeError")));
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
    let v: serde_json::Value = serde_json::from_str(&render_json(&f, None)).unwrap();
    assert_eq!(v["kind"], "cuda_oom");
    assert_eq!(v["line_no"], 4);
    assert_eq!(v["device"], 0);
    assert_eq!(v["tried_to_allocate_bytes"], 200u64 << 20);
    assert!(v["reserved_unallocated_bytes"].is_null());
    assert_eq!(v["other_processes"], serde_json::json!([]));
    assert_eq!(v["advice"], advice(&f));
    let v: serde_json::Value =
        serde_json::from_str(&render_json(&classify_log(b""), None)).unwrap();
    assert_eq!(v["kind"], "no_failure");
    assert!(v["total_bytes"].is_null());
}

#[test]
fn human_form_names_kind_line_numbers_and_advice() {
    let f = classify_log(&own("own-gpu_rank_prefixed_then_nccl.log"));
    let text = render_human(&f, None);
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
    assert_eq!(classify_file(Some(&log), None, true), 0);
    assert_eq!(classify_file(Some(&log), None, false), 0);
    assert_eq!(
        classify_file(Some(&dir.path().join("missing.log")), None, false),
        crate::exit::USAGE
    );
    assert_eq!(
        classify_file(Some(dir.path()), None, false),
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
        let human = render_human(&f, None);
        assert!(
            human.contains("kind: absurd_request (a GPU allocation by thrust"),
            "{human}"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&f, None)).unwrap();
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

#[test]
fn the_wider_worlds_wordings_of_a_gpu_oom_are_one_rule_each() {
    // (line as a process dies with it, a GPU OOM?)
    let cases = [
        // PyTorch's words pasted with a word changed or put in.
        ("RuntimeError: CUDA: out of memory", true),
        (
            "RuntimeError: cuda Out Of Memory. Tried to allocate 2.00 GiB",
            true,
        ),
        ("RuntimeError: CUDA ran out of memory on device 0", true),
        ("RuntimeError: CUDA error. out of GPU memory", true),
        // CUDA's error 2 in an extension's own CUDA check.
        (
            "RuntimeError: mmdet3d/ops/spconv/src/indice_cuda.cu 124\ncuda execution failed with error 2",
            true,
        ),
        (
            "RuntimeError: TensorStorage /io/include/tensorview/tensor.h 168\ncuda failed with error 2 out of memory.",
            true,
        ),
        ("RuntimeError: CUDA error 2 at kernel.cu:88", true),
        // ... and not another code in the same words.
        (
            "RuntimeError: src/spconv/indice.cu 120 cuda execution failed with error 98",
            false,
        ),
        (
            "RuntimeError: .../indice.cu 274\ncuda execution failed with error 3 initialization error",
            false,
        ),
        (
            "RuntimeError: cuda execution failed with error 700 an illegal memory access was encountered",
            false,
        ),
        ("RuntimeError: CUDA error 2.5 is not a code", false),
        // cuBLAS creating its handle on a full GPU; the same status elsewhere is not memory.
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
            true,
        ),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasSgemm( handle, opa, opb)`",
            false,
        ),
    ];
    for (line, oom) in cases {
        let f = classify_log(
            format!(
                "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n{line}\n"
            )
            .as_bytes(),
        );
        assert_eq!(f.kind == Kind::GpuOom, oom, "{line}: {:?}", f.kind);
    }
}

/// A GPU OOM message cut short (`... is free.`, where PyTorch's goes on), then a line
/// that starts a record of its own: the line shown is the message alone, its numbers
/// its own. These lines were taken for the rest of a wrapped message and run together
/// with it (up to eight of them).
#[test]
fn a_message_cut_short_takes_no_record_that_follows_it() {
    let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 \
               has a total capacity of 79.15 GiB of which 1.20 GiB is free.";
    let after = [
        "wandb: Waiting for W&B process to finish... (failed 1).",
        "E1127 03:12:01.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] \
         failed (exitcode: 1) local_rank: 0 (pid: 140) of binary: /usr/bin/python3",
        "[2026-11-27 03:12:01,123] torch.distributed.elastic.multiprocessing.api: [ERROR] \
         failed (exitcode: 1) local_rank: 0 (pid: 140)",
        " 45%|####5     | 9/20 [00:01<00:02,  4.10it/s]",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)",
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Terminated.",
        "[rank1]: Process 4243 has 3.00 GiB memory in use",
        "{'loss': 2.1, 'learning_rate': 1e-05, 'epoch': 0.5}",
        "srun: error: node1: task 0: Exited with exit code 1",
    ];
    for next in after {
        let f = classify_log(format!("step 10 loss 2.1\n{oom}\n{next}\n").as_bytes());
        assert_eq!(f.kind, Kind::GpuOom, "{next}");
        assert_eq!(f.line_no, 2);
        assert_eq!(f.line, oom, "after {next:?}");
        assert_eq!(f.numbers.other_processes, vec![], "{next}");
        assert_eq!(f.numbers.free_bytes, parse_size("1.20 GiB"));
    }
}

/// A message printed over several lines by one process of a torchrun job (the
/// cudaMallocAsync allocator's): every line carries the rank's prefix, and they are one
/// message, read whole and shown with its lines apart. Another rank's line between them
/// is not part of it and does not end it (the ranks' output interleaves).
#[test]
fn a_message_over_lines_of_its_own_rank_is_read_whole() {
    let log = "[rank0]: torch.OutOfMemoryError: Allocation on device 0 would exceed allowed \
               memory. (out of memory)\n\
               [rank0]: Currently allocated     : 15.16 GiB\n\
               [rank1]: Process 4243 has 3.00 GiB memory in use\n\
               [rank0]: Requested               : 512.00 KiB\n\
               [rank0]: Device limit            : 15.99 GiB\n\
               [rank0]: Free (according to CUDA): 0 bytes\n\
               [rank0]: step 5\n";
    let f = classify_log(log.as_bytes());
    assert_eq!(f.kind, Kind::GpuOom);
    assert_eq!(f.line_no, 1);
    assert_eq!(
        f.line,
        "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of \
         memory) Currently allocated     : 15.16 GiB Requested               : 512.00 KiB \
         Device limit            : 15.99 GiB Free (according to CUDA): 0 bytes"
    );
    assert_eq!(f.numbers.tried_to_allocate_bytes, parse_size("512.00 KiB"));
    assert_eq!(f.numbers.total_bytes, parse_size("15.99 GiB"));
    assert_eq!(f.numbers.free_bytes, Some(0));
    assert_eq!(f.numbers.other_processes, vec![]);

    // Other ranks' lines count toward the join's limit (8 lines in all): a line of the
    // message's process far below it is not taken for the message's rest.
    let cut = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.";
    let others = "[rank1]: Process 4243 has 3.00 GiB memory in use\n".repeat(7);
    let f = classify_log(
        format!("{cut}\n{others}[rank0]: GPU 0 has a total capacity of 79.15 GiB\n").as_bytes(),
    );
    assert_eq!(f.line, &cut["[rank0]: ".len()..]);
    assert_eq!(f.numbers.total_bytes, None);
    let others = "[rank1]: Process 4243 has 3.00 GiB memory in use\n".repeat(6);
    let f = classify_log(
        format!("{cut}\n{others}[rank0]: GPU 0 has a total capacity of 79.15 GiB\n").as_bytes(),
    );
    assert_eq!(f.numbers.total_bytes, parse_size("79.15 GiB"));
}

/// A message hard-wrapped by a terminal joins as it was: mid-word and mid-number with
/// nothing put in, where the wrap fell on a space (which the next line starts with) with
/// it.
#[test]
fn a_hard_wrapped_message_joins_without_a_space_put_in() {
    let log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 2 h\n\
               as a total capacity of 23.68 GiB of which 50.81 MiB is free.\n \
               Including non-PyTorch memory, this process has 23.62 GiB memory in use. Of th\n\
               e allocated memory 21\n\
               .40 GiB is allocated by PyTorch, and 1.88 GiB is reserved by PyTorch but unalloc\n\
               ated.\n";
    let f = classify_log(log.as_bytes());
    assert_eq!(
        f.line,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 2 has a \
         total capacity of 23.68 GiB of which 50.81 MiB is free. Including non-PyTorch memory, \
         this process has 23.62 GiB memory in use. Of the allocated memory 21.40 GiB is \
         allocated by PyTorch, and 1.88 GiB is reserved by PyTorch but unallocated."
    );
    assert_eq!(f.numbers.allocated_bytes, parse_size("21.40 GiB"));
    assert_eq!(f.numbers.reserved_unallocated_bytes, parse_size("1.88 GiB"));
}

/// Real lines from public threads that `diagnose` once read wrong (intel-extension-for-
/// pytorch#640, Baichuan2#138, Firefly-LLaMA2-Chinese#9, DenseMatchingBenchmark#20).
#[test]
fn a_caught_exception_report_is_not_a_handled_oom() {
    // oneCCL logs the exception its worker caught, then aborts: the OOM is the death.
    let ccl = "[rank=3]: step=29 memory peak_mem_gib=2.08\n2024:05:29-19:16:18:(202165) |CCL_ERROR| worker.cpp:338 ccl_worker_func: worker 0 caught internal exception: oneCCL: ze_call.cpp:28 do_call: EXCEPTION: ze error at zeCommandQueueExecuteCommandLists, code: ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY\nterminate called after throwing an instance of 'ccl::v1::exception'\n";
    let f = scan(ccl).finding();
    assert_eq!(f.kind, Kind::GpuOom, "{f:?}");
    assert!(f.line.contains("OUT_OF_DEVICE_MEMORY"), "{}", f.line);
    // A handling says so in other words, or "caught" stands alone.
    for line in [
        "WARNING: caught CUDA out of memory, retrying with batch size 16",
        "Caught exception: CUDA out of memory. Skipping batch",
        "caught CUDA out of memory at batch 32",
    ] {
        assert_eq!(
            scan(&format!("{line}\n")).finding().kind,
            Kind::NoFailure,
            "{line}"
        );
    }
}

#[test]
fn zsh_and_fish_say_a_sigkill_their_own_way() {
    for line in [
        "Loading checkpoint shards:   0%|          | 0/3 [00:00<?, ?it/s][1]    26478 killed     python test.py",
        "[1]  + 26478 killed     python train.py",
        "zsh: killed     python train.py --per_device_train_batch_size 8",
        "fish: Job 1, 'python train.py' terminated by signal SIGKILL (Forced quit)",
        "Killed",
    ] {
        let f = scan(&format!("step 3 loss 2.1\n{line}\n")).finding();
        assert_eq!(f.kind, Kind::HostOom, "{line}");
    }
    // Prose that says "killed" is not a signal.
    for line in [
        "the job was killed by the scheduler last night, resuming",
        "[2] 1234 processes killed so far",
    ] {
        assert_eq!(
            scan(&format!("{line}\n")).finding().kind,
            Kind::NoFailure,
            "{line}"
        );
    }
}

#[test]
fn a_launchers_word_that_a_process_died_does_not_hide_the_error_before_it() {
    let log = "Error operation not supported at line 351 in file /home/tim/git/bitsandbytes/csrc/pythonInterface.c\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 31779) of binary: /usr/bin/python\n";
    let s = scan(log);
    assert_eq!(s.finding().kind, Kind::OtherFailure);
    assert_eq!(
        s.error_line(),
        Some(
            "Error operation not supported at line 351 in file /home/tim/git/bitsandbytes/csrc/pythonInterface.c"
        )
    );
    // Alone, the launcher's record is the line shown.
    let s = scan(
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 9) of binary: /usr/bin/python\n",
    );
    assert!(
        s.error_line()
            .is_some_and(|l| l.contains("failed (exitcode: 1)"))
    );
}

#[test]
fn a_quoted_line_keeps_its_own_closing_backtick() {
    let f = scan("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n").finding();
    assert!(f.line.ends_with("`cublasCreate(handle)`"), "{}", f.line);
    // Markdown's own backticks around a pasted line go.
    for pasted in [
        "`RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB`",
        "MemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory`",
    ] {
        let f = scan(&format!("{pasted}\n")).finding();
        assert!(!f.line.contains('`'), "{}", f.line);
    }
}

#[test]
fn advice_names_a_per_process_cap_and_a_request_beyond_the_gpu() {
    // ROCm/TheRock#2118: 2 MiB refused with 275 GiB free, under a 1.05 GiB cap.
    let capped = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 287.98 GiB of which 275.86 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, and 54.99 MiB is reserved by PyTorch but unallocated.\n";
    let f = scan(capped).finding();
    assert_eq!(f.kind, Kind::GpuOom);
    assert!(advice(&f).contains("memory cap"), "{}", advice(&f));
    // intel/torch-xpu-ops#3157: 32 GiB asked of an 11.6 GiB device.
    let beyond = "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 11.60 GiB. Of the allocated memory 2.00 KiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.\n";
    let f = scan(beyond).finding();
    assert_eq!(f.kind, Kind::GpuOom);
    assert!(
        advice(&f).contains("more than the whole GPU"),
        "{}",
        advice(&f)
    );
    // An ordinary OOM gets neither.
    let plain = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB is free.\n";
    let a = advice(&scan(plain).finding());
    assert!(!a.contains("cap") && !a.contains("whole GPU"), "{a}");
}

/// PyTorch/XLA on a TPU (the corpus's cuda_oom-102 to -105) and Intel Gaudi (-106) run
/// out of device memory in their allocators' own words: GPU OOMs, with the sizes read.
#[test]
fn xla_and_gaudi_device_memory_are_gpu_ooms_with_their_sizes() {
    let dir = corpus_dir();
    for (name, tried, free) in [
        ("cuda_oom-102.txt", "6.48G", Some("6.78G")),
        ("cuda_oom-103.txt", "180.59M", Some("142.58M")),
        ("cuda_oom-104.txt", "3.95G", Some("1.92G")),
        ("cuda_oom-105.txt", "10.51G", Some("8.97G")),
    ] {
        let f = classify_log(&load_fixture(&dir.join(name)).body);
        assert_eq!(f.kind, Kind::GpuOom, "{name}: {}", f.line);
        assert_eq!(
            f.numbers.tried_to_allocate_bytes,
            parse_size(tried),
            "{name}"
        );
        assert_eq!(f.numbers.free_bytes, free.and_then(parse_size), "{name}");
    }
    let f = classify_log(&load_fixture(&dir.join("cuda_oom-106.txt")).body);
    assert_eq!(f.kind, Kind::GpuOom, "{}", f.line);
    assert_eq!(f.numbers.tried_to_allocate_bytes, Some(2_123_366_400));
    assert_eq!(
        parse_size("6.48G"),
        Some((6.48 * (1u64 << 30) as f64).round() as u64)
    );
}

/// In a container PyTorch names its own process "Process N has X memory in use" (its
/// PID is another namespace's), with no "this process has" clause: that process is not
/// another tenant, and the advice is the batch's, not "free the GPU".
#[test]
fn a_process_listing_itself_in_a_container_is_not_another_tenant() {
    let dir = corpus_dir();
    for name in ["cuda_oom-107.txt", "cuda_oom-108.txt"] {
        let f = classify_log(&load_fixture(&dir.join(name)).body);
        assert_eq!(f.kind, Kind::GpuOom);
        let me = f.numbers.self_listed();
        assert_eq!(
            me,
            f.numbers.other_processes.first().map(|p| p.pid),
            "{name}"
        );
        assert_eq!(f.numbers.others_bytes(), Some(0), "{name}");
        assert!(
            !advice(&f).contains("other processes"),
            "{name}: {}",
            advice(&f)
        );
    }
    // With "this process has", the processes named are the others (other ranks' contexts).
    let f = classify_log(&load_fixture(&dir.join("cuda_oom-57.txt")).body);
    assert_eq!(f.numbers.self_listed(), None);
    assert!(f.numbers.others_bytes().is_some_and(|b| b > 0));
    // A process holding far more than PyTorch reserved is another tenant.
    let crowded = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.00 GiB is free. Process 4242 has 60.00 GiB memory in use. Process 4243 has 18.00 GiB memory in use. Of the allocated memory 16.50 GiB is allocated by PyTorch, and 500.00 MiB is reserved by PyTorch but unallocated.\n";
    let f = scan(crowded).finding();
    assert_eq!(f.numbers.self_listed(), Some(4243));
    assert_eq!(f.numbers.others_bytes(), parse_size("60.00 GiB"));
    assert!(advice(&f).contains("other processes"), "{}", advice(&f));
}

/// The old wording names no process: what the GPU holds beyond what is free and what
/// PyTorch reserved is others' (the corpus's cuda_oom-109: 14.75 MiB free of 31.75 GiB,
/// 622 MiB reserved; -110: 3.85 GiB free of 11.77, 40 MiB reserved).
#[test]
fn the_old_wordings_memory_held_by_others_is_the_total_less_free_and_reserved() {
    let dir = corpus_dir();
    for name in ["cuda_oom-109.txt", "cuda_oom-110.txt"] {
        let f = classify_log(&load_fixture(&dir.join(name)).body);
        assert_eq!(f.kind, Kind::GpuOom);
        let n = &f.numbers;
        assert_eq!(
            n.others_bytes(),
            Some(n.total_bytes.unwrap() - n.free_bytes.unwrap() - n.reserved_total_bytes.unwrap()),
            "{name}"
        );
        assert!(
            advice(&f).contains("other processes"),
            "{name}: {}",
            advice(&f)
        );
    }
    // Most of the GPU reserved by PyTorch itself: the batch's.
    let f = classify_log(&own("own-gpu_old_cached.log"));
    assert!(
        !advice(&f).contains("other processes"),
        "{:?} {:?}: {}",
        f.numbers,
        f.numbers.others_bytes(),
        advice(&f)
    );
}

/// The device of an old message whose parentheses a paste lost (cuda_oom-111), and of
/// NCCL's warning ("[2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'": -112).
#[test]
fn the_device_of_a_reflowed_message_and_of_an_nccl_warning() {
    let dir = corpus_dir();
    let f = classify_log(&load_fixture(&dir.join("cuda_oom-111.txt")).body);
    assert_eq!((f.kind, f.numbers.device), (Kind::GpuOom, Some(0)));
    let f = classify_log(&load_fixture(&dir.join("cuda_oom-112.txt")).body);
    assert_eq!((f.kind, f.numbers.device), (Kind::GpuOom, Some(2)));
}

/// `diagnose` says when in the run the OOM happened, and an evaluation's OOM gets the
/// evaluation batch's advice.
#[test]
fn diagnose_says_the_phase_and_advises_for_it() {
    let log = "\
Traceback (most recent call last):
  File \"train.py\", line 90, in <module>
    trainer.train()
  File \"/x/transformers/trainer.py\", line 2400, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss)
  File \"/x/transformers/trainer.py\", line 3100, in evaluation_loop
    losses, logits, labels = self.prediction_step(model, inputs)
  File \"/x/transformers/trainer.py\", line 3300, in prediction_step
    outputs = model(**inputs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 22.45 GiB memory in use. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB is reserved by PyTorch but unallocated.
";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eval.log");
    std::fs::write(&path, log).unwrap();
    let (scanner, tail) = scan_reader(Box::new(std::fs::File::open(&path).unwrap()), true).unwrap();
    let f = scanner.finding();
    let seen = phase_of(&f, &tail);
    let v: serde_json::Value = serde_json::from_str(&render_json(&f, seen.as_ref())).unwrap();
    assert_eq!(v["phase"], "evaluation");
    assert!(
        v["phase_how"].as_str().unwrap().contains("prediction_step"),
        "{v}"
    );
    assert!(
        v["advice"]
            .as_str()
            .unwrap()
            .contains("per_device_eval_batch_size"),
        "{v}"
    );
    let human = render_human(&f, seen.as_ref());
    assert!(
        human.contains("phase: evaluation (the traceback runs through prediction_step)"),
        "{human}"
    );
    // Without a phase, the plain advice.
    let v: serde_json::Value = serde_json::from_str(&render_json(&f, None)).unwrap();
    assert!(v["phase"].is_null());
    assert_eq!(v["advice"], advice(&f));
}

/// `diagnose` keeps the end of what it read, in order, for the phase: at least the last
/// 4 MiB of a longer log, all of a shorter one.
#[test]
fn diagnose_keeps_the_logs_end_in_order() {
    // Lines with no word the scanner looks at: only its literal search runs, so this
    // test takes no pattern's cache from the allocation test running beside it.
    let long: Vec<u8> = (0..600_000u32)
        .flat_map(|i| format!("row {i}\n").into_bytes())
        .collect();
    assert!(long.len() > 5 << 20);
    for input in [long.clone(), long[..3000].to_vec()] {
        // A reader that hands out odd-sized pieces, as a pipe does.
        struct Pieces(std::io::Cursor<Vec<u8>>);
        impl std::io::Read for Pieces {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(300_007);
                self.0.read(&mut buf[..n])
            }
        }
        let (_, tail) =
            scan_reader(Box::new(Pieces(std::io::Cursor::new(input.clone()))), true).unwrap();
        assert!(input.ends_with(&tail));
        assert!(tail.len() >= (4 << 20).min(input.len()), "{}", tail.len());
    }
}
