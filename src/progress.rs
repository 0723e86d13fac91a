//! The training step an attempt reached, read from the tail of its saved output.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;

use regex::bytes::Regex;

/// tqdm bars (`  120/1000 [`), `step 120`, `step=120`, `'step': 120`,
/// `global_step=120`, `iter 120`, `iteration 120`.
static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:\b(?:global_)?step['\x22]?\s*[=: ]\s*(\d{1,12})|\biter(?:ation)?\s*[=: ]?\s*(\d{1,12})|(?:^|[\s|])(\d{1,12})/\d{1,12} \[)",
    )
    .expect("valid regex")
});

/// The last step number printed in the final 256 KiB of `log`.
pub fn step_reached(log: &Path) -> Option<u64> {
    let mut f = File::open(log).ok()?;
    let md = f.metadata().ok()?;
    // Only a regular file: a log path that is a device or a FIFO (/dev/full,
    // a pipe) would read forever.
    if !md.is_file() {
        return None;
    }
    const TAIL: u64 = 256 * 1024;
    f.seek(SeekFrom::Start(md.len().saturating_sub(TAIL)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(TAIL).read_to_end(&mut buf).ok()?;
    last_step(&buf)
}

pub fn last_step(buf: &[u8]) -> Option<u64> {
    STEP.captures_iter(buf).last().and_then(|c| {
        let m = c.get(1).or_else(|| c.get(2)).or_else(|| c.get(3))?;
        std::str::from_utf8(m.as_bytes()).ok()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::last_step;

    #[test]
    fn common_progress_formats() {
        assert_eq!(
            last_step(b"step 6/30 loss=2.5\nstep 7/30 loss=2.3\n"),
            Some(7)
        );
        assert_eq!(
            last_step(
                b" 12%|\xe2\x96\x88   | 120/1000 [00:10<01:20, 11.0it/s]\r 13%| 130/1000 [00:11"
            ),
            Some(130)
        );
        assert_eq!(last_step(b"{'loss': 2.1, 'step': 40}\n"), Some(40));
        assert_eq!(last_step(b"iter 1500: loss 2.3, time 120ms\n"), Some(1500));
        assert_eq!(last_step(b"global_step=77 lr=1e-4"), Some(77));
        assert_eq!(last_step(b"no progress here\n"), None);
    }
}
