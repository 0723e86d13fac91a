//! The training step an attempt reached, read from the tail of its saved output,
//! and the work an OOM cost (the steps redone since the checkpoint resumed from).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use regex::bytes::Regex;

/// tqdm bars (`  120/1000 [`), `step 120`, `step=120`, `'step': 120`,
/// `global_step=120`, `iter 120`, `iteration 120`.
static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:(?-u:\b)(?:global_)?step['\x22]?\s*[=: ]\s*(\d{1,12})|(?-u:\b)iter(?:ation)?\s*[=: ]?\s*(\d{1,12})|(?:^|[\s|])(\d{1,12})/\d{1,12} \[)",
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
    // Most lines hold no step: say so with the DFA before the slower captures.
    if !STEP.is_match(buf) {
        return None;
    }
    STEP.captures_iter(buf).last().and_then(|c| {
        let m = c.get(1).or_else(|| c.get(2)).or_else(|| c.get(3))?;
        std::str::from_utf8(m.as_bytes()).ok()?.parse().ok()
    })
}

/// The work one OOM cost: steps redone and the seconds they took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loss {
    pub steps: Option<u64>,
    pub seconds: f64,
}

impl Loss {
    /// `reached`: last step printed; `from`: the step this attempt started from;
    /// `back_to`: the step the next attempt resumes from.
    pub fn measure(
        reached: Option<u64>,
        from: Option<u64>,
        back_to: Option<u64>,
        ckpt_written: Option<SystemTime>,
        attempt_started: SystemTime,
        oom_after: Duration,
    ) -> Loss {
        let base = back_to.or(from).unwrap_or(0);
        let steps = reached.map(|r| r.saturating_sub(base));
        // Seconds: from the checkpoint resumed from (if this attempt wrote it)
        // to the OOM; otherwise the whole attempt up to the OOM.
        let oom_time = attempt_started + oom_after;
        let seconds = match ckpt_written {
            Some(w) if w > attempt_started => {
                oom_time.duration_since(w).unwrap_or_default().as_secs_f64()
            }
            _ => oom_after.as_secs_f64(),
        };
        Loss { steps, seconds }
    }
}

/// Say when the save interval costs more than the OOMs themselves, and what
/// interval would bound the loss.
pub fn save_interval_advice(
    losses: &[Loss],
    layout: Option<&crate::checkpoint::Layout>,
    total_lost: Duration,
) -> Option<String> {
    if losses.is_empty() {
        return None;
    }
    let steps: u64 = losses.iter().filter_map(|l| l.steps).sum();
    let secs: f64 = losses.iter().map(|l| l.seconds).sum();
    let mut out = format!(
        "oomguard: work lost to {} OOM{}: {} of redone training ({:.1} s)\n",
        losses.len(),
        if losses.len() == 1 { "" } else { "s" },
        // An OOM whose step was not seen counts as unknown, never as 0.
        match losses.iter().filter(|l| l.steps.is_none()).count() {
            0 => format!("{steps} steps"),
            n if n == losses.len() => "an unknown number of steps".into(),
            n => format!("at least {steps} steps (the step reached after {n} of them is unknown)"),
        },
        secs
    );
    if layout.is_none() {
        out.push_str("oomguard: no checkpoints: every OOM restarted training from the beginning\n");
    }
    let relaunch = total_lost.as_secs_f64() - secs;
    let per_oom = steps.div_ceil(losses.len() as u64);
    if secs > relaunch.max(0.0) && per_oom >= 4 {
        let bound = (per_oom / 4).max(1);
        out.push_str(&format!(
            "oomguard: the save interval costs more than the OOMs: each lost about {per_oom} steps; saving every {bound} steps would bound each loss to {bound} steps\n"
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::last_step;

    #[test]
    fn an_oom_whose_step_was_not_seen_is_unknown_not_zero() {
        use super::{Loss, save_interval_advice};
        let l = |steps| Loss {
            steps,
            seconds: 1.0,
        };
        let lost = std::time::Duration::from_secs(2);
        let both = save_interval_advice(&[l(Some(3)), l(None)], None, lost).unwrap();
        assert!(
            both.contains("at least 3 steps (the step reached after 1 of them is unknown)"),
            "{both}"
        );
        let none = save_interval_advice(&[l(None)], None, lost).unwrap();
        assert!(none.contains("an unknown number of steps"), "{none}");
        let known = save_interval_advice(&[l(Some(0))], None, lost).unwrap();
        assert!(known.contains(": 0 steps of redone"), "{known}");
    }

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
