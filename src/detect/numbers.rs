//! The numbers an OOM message carries (sizes, device, processes), read from its text;
//! sizes parsed and printed as PyTorch prints them.

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use super::kernel;

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
    /// "Including non-PyTorch memory, this process has X memory in use" (PyTorch 2.1+):
    /// present when PyTorch told this process apart from the others it names.
    #[serde(skip)]
    pub this_process_bytes: Option<u64>,
}

impl OomNumbers {
    /// The process the message names as "Process N has X memory in use" that is this
    /// process itself: in a container PyTorch cannot match its own PID (another PID
    /// namespace) and prints no "this process has" clause, and the process holding at
    /// least what PyTorch reserved (allocated + reserved but unallocated), and at most
    /// its CUDA context more, is it.
    pub fn self_listed(&self) -> Option<u32> {
        if self.this_process_bytes.is_some() {
            return None;
        }
        let reserved = self.allocated_bytes? + self.reserved_unallocated_bytes?;
        let context = (2u64 << 30).max(reserved / 10);
        self.other_processes
            .iter()
            .filter(|p| p.bytes >= reserved && p.bytes - reserved <= context)
            .min_by_key(|p| p.bytes - reserved)
            .map(|p| p.pid)
    }

    /// What other processes hold on the GPU, as far as the message tells: the processes
    /// it names (less this one, see [`OomNumbers::self_listed`]); in the old wording,
    /// which names none ("X total capacity; Y already allocated; Z free; W reserved in
    /// total by PyTorch"), the total less what is free and what PyTorch reserved.
    pub fn others_bytes(&self) -> Option<u64> {
        if !self.other_processes.is_empty() {
            let me = self.self_listed();
            return Some(
                self.other_processes
                    .iter()
                    .filter(|p| Some(p.pid) != me)
                    .map(|p| p.bytes)
                    .sum(),
            );
        }
        if self.this_process_bytes.is_some() {
            return None;
        }
        let (total, free, reserved) = (
            self.total_bytes?,
            self.free_bytes?,
            self.reserved_total_bytes?,
        );
        // Before PyTorch 1.4 "X cached" was what the allocator held beyond what was
        // allocated (less than it); since, "reserved in total" holds both.
        let reserved = match self.allocated_bytes {
            Some(a) if reserved < a => reserved + a,
            _ => reserved,
        };
        Some(total.saturating_sub(free).saturating_sub(reserved))
    }
}

/// A size as PyTorch prints it: `1.50 GiB`, `0 bytes`, `147.24 MB`.
pub(super) const SIZE: &str = r"(\d+(?:\.\d+)?\s*(?:bytes|[KMGTPE]i?B|B))";

pub(super) struct NumberPatterns {
    pub(super) tried: Regex,
    pub(super) tried_more_than: Regex,
    pub(super) tried_async: Regex,
    pub(super) total_async: Regex,
    pub(super) free_async: Regex,
    pub(super) negative: Regex,
    pub(super) calloc: Regex,
    pub(super) total_old: Regex,
    pub(super) total_new: Regex,
    pub(super) total_mps: Regex,
    pub(super) allowed: Regex,
    pub(super) free_old: Regex,
    pub(super) free_new: Regex,
    pub(super) allocated_old: Regex,
    pub(super) allocated_new: Regex,
    pub(super) allocated_mps: Regex,
    pub(super) reserved_unallocated: Regex,
    pub(super) reserved_total: Regex,
    pub(super) device: Regex,
    pub(super) process: Regex,
    pub(super) this_process: Regex,
}

/// The numbers of XLA's (TPU) and Gaudi's allocators, in their own set: built at the
/// first such message, not with [`NUMBERS`] as every run starts (see `scanner::warm`).
pub(super) struct AcceleratorNumbers {
    tried_xla: Regex,
    free_xla: Regex,
    total_xla: Regex,
    tried_gaudi: Regex,
}

static ACCELERATOR_NUMBERS: LazyLock<AcceleratorNumbers> = LazyLock::new(|| {
    let re = |p: &str| Regex::new(p).expect("accelerator number pattern");
    AcceleratorNumbers {
        // XLA prints sizes as "6.48G", "180.59M", "0B".
        tried_xla: re(r"Attempting\s*to\s*(?:reserve|allocate)\s*(\d+(?:\.\d+)?[KMGTP]?i?B?)\b"),
        free_xla: re(r"There\s*are\s*(\d+(?:\.\d+)?[KMGTP]?i?B?)\s*free"),
        total_xla: re(r"HBM\s*capacity\s*(\d+(?:\.\d+)?[KMGTP]?i?B?)"),
        tried_gaudi: re(r"Allocation\s*failed\s*for\s*size::\s*(\d+)"),
    }
});

pub(super) static NUMBERS: LazyLock<NumberPatterns> = LazyLock::new(|| {
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
        // Also the old wording with its parentheses lost in a paste ("20.00 MiBGPU 0;
        // 8.00 GiB total capacity"), and NCCL's warning's "[2]", the local device.
        device: re(
            r"\(GPU\s*(\d+)\s*;|\bGPU\s?(\d*)\s*has\s*a\s*total|Allocation\s*on\s*device\s*(\d+)|GPU\s*(\d+)\s*;\s*SIZE\s*total|\[(\d+)\]\s*\S+\.cc:\d+\s*NCCL\s*WARN",
        ),
        process: re(r"Process\s*(\d+)\s*has\s*SIZE"),
        this_process: re(r"this\s*process\s*has\s*SIZE"),
    }
});

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

pub(super) fn gpu_numbers(text: &str) -> OomNumbers {
    let n = &*NUMBERS;
    let device = if text.contains("GPU") || text.contains("device") || text.contains("NCCL") {
        n.device.captures(text).and_then(|c| {
            // The first group that holds a device number (the old wording's SIZE
            // group, a size, is no number).
            (1..c.len()).find_map(|i| {
                c.get(i)
                    .filter(|m| !m.as_str().is_empty())
                    .and_then(|m| m.as_str().parse().ok())
            })
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
        .or_else(|| size_if("Requested", &n.tried_async, text))
        .or_else(|| size_if("Attempting", &ACCELERATOR_NUMBERS.tried_xla, text))
        .or_else(|| {
            text.contains("size::")
                .then(|| ACCELERATOR_NUMBERS.tried_gaudi.captures(text))
                .flatten()
                .and_then(|c| c[1].parse::<u64>().ok())
        });
    OomNumbers {
        device,
        tried_to_allocate_bytes: tried,
        total_bytes: size_if("capac", &n.total_new, text)
            .or_else(|| size_if("capac", &n.total_old, text))
            .or_else(|| size_if("allowed", &n.total_mps, text))
            .or_else(|| size_if("limit", &n.total_async, text))
            .or_else(|| size_if("HBM", &ACCELERATOR_NUMBERS.total_xla, text)),
        free_bytes: size_if("which", &n.free_new, text)
            .or_else(|| size_if("free", &n.free_old, text))
            .or_else(|| size_if("according", &n.free_async, text))
            .or_else(|| size_if("There are", &ACCELERATOR_NUMBERS.free_xla, text)),
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
        this_process_bytes: size_if("this", &n.this_process, text),
    }
}

pub(super) fn host_numbers(text: &str) -> OomNumbers {
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

pub(super) fn fill_missing(into: &mut OomNumbers, from: OomNumbers) {
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
    into.this_process_bytes = into.this_process_bytes.or(from.this_process_bytes);
    if into.other_processes.is_empty() {
        into.other_processes = from.other_processes;
    }
    match (&mut into.victim, from.victim) {
        (None, v) => into.victim = v,
        (Some(a), Some(b)) if a.pid == b.pid => a.fill_from(b),
        _ => {}
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
        // XLA's "6.48G", "180.59M".
        "KiB" | "KB" | "kB" | "K" => 10,
        "MiB" | "MB" | "M" => 20,
        "GiB" | "GB" | "G" => 30,
        "TiB" | "TB" | "T" => 40,
        "PiB" | "PB" | "P" => 50,
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
