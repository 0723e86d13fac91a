//! What an attempt showed, typed: how it ended (the outcome), the numbers in
//! its OOM message, whether it hung after the OOM, and the step it reached.
//!
//! `classify` turns a launch report into an [`Outcome`]; an OOM outcome becomes
//! the [`Evidence`] the policy decides from (and `plan` decides from an assumed
//! one). The words shown for it ("hung after OOM (tried to allocate ...)") are
//! built here, once, from the numbers, for the log, the decision's reason and
//! the summary alike.

use std::fmt;

use serde::Serialize;

use crate::detect::{Finding, Kind, OomNumbers, format_size};
use crate::launch;

/// How one attempt ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Success,
    GpuOom {
        finding: Option<Finding>,
        hung: bool,
    },
    HostOom {
        finding: Option<Finding>,
        code: i32,
    },
    /// An allocation far beyond the device or any machine: a bug, never shrunk for.
    AbsurdRequest {
        finding: Finding,
        code: i32,
    },
    Other {
        code: i32,
        exit: String,
    },
    Interrupted {
        signal: i32,
    },
}

/// An outcome's name, as the journal writes it (`"outcome": "cuda_oom"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Success,
    CudaOom,
    HungAfterOom,
    HostOom,
    /// An allocation far beyond the device or any machine (see `detect::absurd`).
    AbsurdRequest,
    OtherFailure,
    Interrupted,
    /// The command could not be started at all (not found, not executable).
    CannotExecute,
    /// `plan`'s dry run: nothing ran, an OOM is assumed.
    AssumedOom,
}

impl Outcome {
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Success => OutcomeKind::Success,
            Outcome::GpuOom { hung: false, .. } => OutcomeKind::CudaOom,
            Outcome::GpuOom { hung: true, .. } => OutcomeKind::HungAfterOom,
            Outcome::HostOom { .. } => OutcomeKind::HostOom,
            Outcome::AbsurdRequest { .. } => OutcomeKind::AbsurdRequest,
            Outcome::Other { .. } => OutcomeKind::OtherFailure,
            Outcome::Interrupted { .. } => OutcomeKind::Interrupted,
        }
    }

    /// The OOM line that decided, for a GPU or host OOM.
    pub fn finding(&self) -> Option<&Finding> {
        match self {
            Outcome::GpuOom { finding, .. } | Outcome::HostOom { finding, .. } => finding.as_ref(),
            Outcome::AbsurdRequest { finding, .. } => Some(finding),
            _ => None,
        }
    }
}

/// Classify a finished attempt. The user's signal wins; then a success; then,
/// for a non-zero exit, the pending OOM: the first one printed (the root cause, not
/// the errors that follow it) unless later output showed the process went on after
/// it (a caught OOM, see `detect`), so only an OOM that ended the process decides.
pub fn classify(r: &launch::Report) -> Outcome {
    if let Some(signal) = r.interrupted {
        return Outcome::Interrupted { signal };
    }
    let code = r.exit.status_code();
    // An absurd request is a bug however the attempt ended (a hang after it included).
    if let Some(f) = r
        .scanner
        .first_oom()
        .filter(|f| f.kind == Kind::AbsurdRequest)
        && (r.hung || code != 0)
    {
        return Outcome::AbsurdRequest {
            finding: f.clone(),
            code,
        };
    }
    if r.hung {
        return Outcome::GpuOom {
            finding: r.scanner.first_oom().cloned(),
            hung: true,
        };
    }
    if code == 0 {
        return Outcome::Success;
    }
    match r.scanner.first_oom() {
        Some(f) if f.kind == Kind::GpuOom => Outcome::GpuOom {
            finding: Some(f.clone()),
            hung: false,
        },
        Some(f) => Outcome::HostOom {
            finding: Some(f.clone()),
            code,
        },
        // Killed by SIGKILL with nobody asking: the kernel's OOM killer, most likely.
        None if matches!(r.exit, launch::Exit::Signal(9)) => Outcome::HostOom {
            finding: None,
            code,
        },
        None => Outcome::Other {
            code,
            exit: r.exit.to_string(),
        },
    }
}

/// What an OOM attempt showed, for the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// `CudaOom`, `HungAfterOom`, or `AssumedOom` for `plan`.
    pub outcome: OutcomeKind,
    /// The numbers in the OOM message (`None`: no message with numbers).
    pub oom: Option<OomNumbers>,
    /// The last training step the attempt printed, if any.
    pub step_reached: Option<u64>,
}

impl Evidence {
    /// `plan`: the OOM every rung after the first assumes.
    pub fn assumed() -> Evidence {
        Evidence {
            outcome: OutcomeKind::AssumedOom,
            oom: None,
            step_reached: None,
        }
    }

    /// A CUDA OOM that ended the attempt, with the message's numbers if any.
    #[cfg(test)]
    pub fn cuda_oom(oom: Option<OomNumbers>) -> Evidence {
        Evidence {
            outcome: OutcomeKind::CudaOom,
            oom,
            step_reached: None,
        }
    }

    /// The evidence of an [`Outcome::GpuOom`].
    pub fn gpu_oom(finding: Option<&Finding>, hung: bool, step_reached: Option<u64>) -> Evidence {
        Evidence {
            outcome: if hung {
                OutcomeKind::HungAfterOom
            } else {
                OutcomeKind::CudaOom
            },
            oom: finding.map(|f| f.numbers.clone()),
            step_reached,
        }
    }

    /// The attempt hung (its peers waiting in NCCL) after printing the OOM.
    pub fn hung(&self) -> bool {
        self.outcome == OutcomeKind::HungAfterOom
    }

    /// The size of the allocation that failed.
    pub fn tried_to_allocate(&self) -> Option<u64> {
        self.oom.as_ref()?.tried_to_allocate_bytes
    }
}

/// "OOM", "OOM (tried to allocate 2.00 GiB on GPU 0, 1.06 GiB free)",
/// "hung after OOM (...)", "assumed OOM": the cause that leads a decision's reason.
impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.outcome {
            OutcomeKind::AssumedOom => return f.write_str("assumed OOM"),
            OutcomeKind::HungAfterOom => f.write_str("hung after ")?,
            _ => {}
        }
        f.write_str("OOM")?;
        let Some(n) = &self.oom else {
            return Ok(());
        };
        if let Some(t) = n.tried_to_allocate_bytes {
            write!(f, " (tried to allocate {}", format_size(t))?;
            if let Some(d) = n.device {
                write!(f, " on GPU {d}")?;
            }
            if let Some(fr) = n.free_bytes {
                write!(f, ", {} free", format_size(fr))?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_worded_from_the_numbers() {
        assert_eq!(Evidence::assumed().to_string(), "assumed OOM");
        assert_eq!(Evidence::cuda_oom(None).to_string(), "OOM");
        let n = OomNumbers {
            device: Some(0),
            tried_to_allocate_bytes: Some(2 << 30),
            free_bytes: Some(1 << 30),
            ..Default::default()
        };
        let mut e = Evidence::cuda_oom(Some(n));
        assert_eq!(
            e.to_string(),
            "OOM (tried to allocate 2.00 GiB on GPU 0, 1.00 GiB free)"
        );
        e.outcome = OutcomeKind::HungAfterOom;
        assert!(e.hung());
        assert!(e.to_string().starts_with("hung after OOM (tried"));
        // Numbers without the allocation size say nothing more than "OOM".
        let e = Evidence::cuda_oom(Some(OomNumbers {
            free_bytes: Some(1),
            ..Default::default()
        }));
        assert_eq!(e.to_string(), "OOM");
    }

    fn report(log: &str, exit: launch::Exit) -> launch::Report {
        let mut scanner = crate::detect::Scanner::new();
        scanner.feed(crate::detect::Stream::Err, log.as_bytes());
        scanner.finish();
        launch::Report {
            pid: 1,
            exit,
            interrupted: None,
            hung: false,
            scanner,
            duration: std::time::Duration::ZERO,
            oom_at: None,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn only_an_oom_that_ended_the_process_decides() {
        let caught = "caught torch.OutOfMemoryError: CUDA out of memory; retrying with batch size 4\nstep 1\nstep 2\nValueError: bad label\n";
        let o = classify(&report(caught, launch::Exit::Code(3)));
        assert!(matches!(o, Outcome::Other { code: 3, .. }), "{o:?}");
        let survived =
            "torch.OutOfMemoryError: CUDA out of memory.\nstep 1\nstep 2\nValueError: x\n";
        let o = classify(&report(survived, launch::Exit::Code(3)));
        assert!(matches!(o, Outcome::Other { code: 3, .. }), "{o:?}");
        // A mention, then death with no sign of life: the OOM decides.
        let logged = "ERROR: training failed: CUDA out of memory. Tried to allocate 2.00 GiB\n";
        let o = classify(&report(logged, launch::Exit::Code(1)));
        assert_eq!(o.kind(), OutcomeKind::CudaOom);
        // A mention in a run that ends well is a success.
        let o = classify(&report(logged, launch::Exit::Code(0)));
        assert_eq!(o.kind(), OutcomeKind::Success);
    }

    #[test]
    fn outcome_names_are_the_journal_words() {
        for (k, name) in [
            (OutcomeKind::CudaOom, "cuda_oom"),
            (OutcomeKind::HungAfterOom, "hung_after_oom"),
            (OutcomeKind::OtherFailure, "other_failure"),
            (OutcomeKind::CannotExecute, "cannot_execute"),
        ] {
            assert_eq!(serde_json::json!(k), name);
        }
    }
}
