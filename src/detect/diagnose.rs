//! `oomguard diagnose`: classify a saved log (or standard input) and say what to do next.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;

use super::numbers::format_size;
use super::{
    Finding, Kind, Scanner, Stream, absurd_what, kernel, phase, score, sizeless_thrust_alloc,
    with_kernel_record,
};

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
            let crowded =
                matches!((n.others_bytes(), n.total_bytes), (Some(o), Some(t)) if o >= t / 4);
            let capped = match (n.allowed_bytes, n.tried_to_allocate_bytes, n.free_bytes) {
                (Some(_), Some(tried), Some(free)) => free >= tried,
                (Some(_), _, None) => true,
                _ => false,
            };
            let beyond_gpu = matches!(
                (n.tried_to_allocate_bytes, n.total_bytes),
                (Some(tried), Some(total)) if tried > total
            );
            if capped {
                "the process hit its own memory cap (the message's \"allowed\": torch.cuda.set_per_process_memory_fraction), not the GPU's size, which had room: raise or remove the cap, or lower the micro-batch and raise gradient accumulation (oomguard does that when it runs your command)"
            } else if beyond_gpu {
                "one allocation alone asks for more than the whole GPU holds, so no allocator setting helps: lower the micro-batch and raise gradient accumulation, shorten sequences or shrink the inputs (images, audio) (oomguard does the first and shortens sequences when it runs your command); for weights or optimizer states, shard them (ZeRO-3, FSDP) or offload"
            } else if fragmented {
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

/// What `diagnose` says before it reads standard input: at a terminal, `oomguard diagnose`
/// alone would otherwise wait in silence, looking hung.
pub fn stdin_hint(reads_stdin: bool, stdin_is_terminal: bool) -> Option<&'static str> {
    (reads_stdin && stdin_is_terminal).then_some(
        "reading a log from standard input (paste it, then Ctrl-D); or give a file: oomguard diagnose FILE",
    )
}

/// `oomguard diagnose [--json] [FILE|-]`: classify the file (or stdin when None or "-"),
/// print the result to stdout. Returns 0 when it classified (any kind), 2 for an
/// unreadable file (message on stderr naming the file and the OS error).
pub(super) fn classify_file(path: Option<&Path>, kernel_log: Option<&Path>, json: bool) -> i32 {
    let stdin = path.is_none_or(|p| p.as_os_str() == "-");
    if let Some(hint) = stdin_hint(stdin, std::io::stdin().is_terminal()) {
        crate::report::terminal::get().say(hint);
    }
    let victims = match kernel_log.map(std::fs::read) {
        None => None,
        Some(Ok(bytes)) => Some(kernel::victims(&String::from_utf8_lossy(&bytes))),
        Some(Err(e)) => {
            let name = kernel_log.expect("a path").display();
            crate::report::terminal::get().of(
                "diagnose",
                &format!("cannot read the kernel log {name}: {e}"),
            );
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
    // A file's end is read again for the phase (`phase::from_log`), so the scan keeps
    // nothing; standard input's is kept as it is read.
    let (scanner, tail) = match reader.and_then(|r| scan_reader(r, stdin)) {
        Ok(s) => s,
        Err(e) => {
            crate::report::terminal::get().of("diagnose", &format!("cannot read {name}: {e}"));
            return crate::exit::USAGE;
        }
    };
    let mut finding = scanner.finding();
    if let Some(victims) = victims {
        finding = with_kernel_record(finding, scanner.named_pids(), &victims);
    }
    let seen = match path.filter(|_| !stdin) {
        Some(p) if finding.kind == Kind::GpuOom => phase::from_log(p, &finding.line),
        _ => phase_of(&finding, &tail),
    };
    let text = if json {
        render_json(&finding, seen.as_ref()) + "\n"
    } else {
        render_human(&finding, seen.as_ref())
    };
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not a failure of the diagnosis.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    0
}

/// `diagnose`, or its `--score DIR...` form.
pub fn diagnose_main(
    path: Option<&Path>,
    kernel_log: Option<&Path>,
    score: &[std::path::PathBuf],
    json: bool,
) -> i32 {
    if score.is_empty() {
        classify_file(path, kernel_log, json)
    } else {
        score::score_main(score, json)
    }
}

/// Stream a reader through a scanner in 1 MiB chunks (memory stays flat on huge logs).
/// The scanner over all of `reader`, and the last [`TAIL`] bytes or more it read (where
/// the OOM's traceback tells its phase). The reads go round a ring of chunks, so the
/// bytes are never copied while the scan runs; the tail is put together once, at the end.
pub(super) fn scan_reader(
    mut reader: Box<dyn Read>,
    keep_tail: bool,
) -> std::io::Result<(Scanner, Vec<u8>)> {
    const CHUNK: usize = 1 << 20;
    // Without a tail to keep, one chunk read over and over (it stays in the cache).
    let ring_len = if keep_tail { TAIL / CHUNK + 1 } else { 1 };
    let mut scanner = Scanner::new();
    let mut ring: Vec<(Vec<u8>, usize)> = Vec::with_capacity(ring_len);
    let mut at = 0;
    loop {
        if ring.len() < ring_len {
            ring.push((vec![0u8; CHUNK], 0));
        }
        let (buf, len) = &mut ring[at];
        match reader.read(&mut buf[*len..]) {
            Ok(0) => break,
            Ok(n) => {
                scanner.feed(Stream::Out, &buf[*len..*len + n]);
                *len += n;
                // A slot is left only when full: a pipe's short reads fill it in pieces.
                if *len == CHUNK {
                    at = (at + 1) % ring_len;
                    if let Some(next) = ring.get_mut(at) {
                        next.1 = 0;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    scanner.finish();
    // Oldest first: the slot after the one being filled, round to it.
    let n = ring.len();
    let tail = (1..=n)
        .flat_map(|i| {
            let (buf, len) = &ring[(at + i) % n];
            &buf[..*len]
        })
        .copied()
        .collect();
    Ok((scanner, tail))
}

/// How much of a log's end `diagnose` reads for the OOM's phase (as a run reads its
/// attempt's output: `phase::from_log`).
const TAIL: usize = 4 << 20;

/// When in the run the finding's OOM happened, from the log's end `tail`.
pub(super) fn phase_of(f: &Finding, tail: &[u8]) -> Option<phase::Seen> {
    if !matches!(f.kind, Kind::GpuOom) {
        return None;
    }
    phase::classify(&String::from_utf8_lossy(tail), &f.line)
}

/// The JSON form of `diagnose --json`: one flat object, null where a number is missing.
pub fn render_json(f: &Finding, seen: Option<&phase::Seen>) -> String {
    let n = &f.numbers;
    serde_json::json!({
        "phase": seen.map(|s| s.phase),
        "phase_how": seen.map(|s| s.how.as_str()),
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
        "advice": advice_in(f, seen),
    })
    .to_string()
}

/// The human form of `diagnose`: kind, decisive line, numbers, advice.
pub fn render_human(f: &Finding, seen: Option<&phase::Seen>) -> String {
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
    if let Some(p) = seen {
        let _ = writeln!(s, "phase: {} ({})", p.phase.as_str(), p.how);
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
    let _ = writeln!(s, "advice: {}", advice_in(f, seen));
    s
}

/// [`advice`], for an OOM whose phase is known: one that no smaller training batch
/// lowers says so.
pub fn advice_in(f: &Finding, seen: Option<&phase::Seen>) -> &'static str {
    use phase::Phase;
    match seen.map(|s| s.phase) {
        Some(Phase::Evaluation) => {
            "GPU memory ran out during evaluation: lower the evaluation batch (the Hugging Face Trainer's per_device_eval_batch_size; eval_accumulation_steps moves predictions to the CPU as they gather), or generate shorter outputs; the training batch is not the cause (oomguard halves the evaluation batch when it runs your command and can change it)"
        }
        Some(Phase::Saving) => {
            "GPU memory ran out while saving a checkpoint (a full state dict gathered on one GPU): save sharded (FSDP SHARDED_STATE_DICT; DeepSpeed stage3_gather_16bit_weights_on_model_save: false) or gather on the CPU; a smaller batch does not lower a save's peak"
        }
        Some(Phase::Loading) => {
            "GPU memory ran out while loading a checkpoint or weights (the optimizer's state and the weights are loaded beside the model): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, load to the CPU first (map_location=\"cpu\"), or offload the optimizer's state; a smaller batch does not lower a load's peak"
        }
        _ => advice(f),
    }
}
