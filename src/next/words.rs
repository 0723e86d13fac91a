//! How a verdict's typed reason is said, for the terminal and the journal: the
//! rules in `next` decide with [`Because`]; the words are made here, from it and
//! the OOM's evidence.

use std::fmt;

use super::{Because, PeakNot};
use crate::evidence::{Evidence, When};

impl fmt::Display for PeakNot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeakNot::Offloaded(o) => write!(f, "the optimizer's state is already offloaded ({o})"),
            PeakNot::NotOffloadable => f.write_str(
                "the optimizer's state cannot be offloaded at these settings (ZeRO stage 0 with more than one process)",
            ),
            PeakNot::NoOffloadSetting => f.write_str("the command has no optimizer offload setting"),
            PeakNot::GatherOff => f.write_str("the 16-bit gather is already off"),
            PeakNot::NoSavingSetting => {
                f.write_str("the command has no saving setting oomguard can change")
            }
        }
    }
}

/// The reason of a verdict after an OOM while loading or saving that takes no
/// step (a retry at the same settings, a stop), starting with the evidence's
/// own words; `None` for any other.
pub fn phase_reason(because: &Because, ev: &Evidence) -> Option<String> {
    let how = ev.phase_how().unwrap_or("its traceback");
    let peak = |when| {
        if when == When::Loading {
            "a load's"
        } else {
            "a save's"
        }
    };
    Some(match because {
        Because::PhaseRetry { not: None, .. } => format!(
            "{ev} ({how}): a load's peak is transient and no smaller batch lowers it; the same settings once more, with the allocator set against fragmentation"
        ),
        Because::PhaseRetry {
            when,
            not: Some(not),
        } => format!(
            "{ev} ({how}), and {not}: a smaller batch does not lower {} peak; the same settings once more, with the allocator set against fragmentation",
            peak(*when)
        ),
        Because::PhaseStop { when, not } => format!(
            "{ev} ({how}), again after a retry at the same settings, and {not}: a smaller batch does not lower {} peak",
            peak(*when)
        ),
        _ => return None,
    })
}
