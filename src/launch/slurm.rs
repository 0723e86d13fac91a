//! Slurm steps: ending one the way Slurm needs.
//!
//! When the command oomguard runs is `srun` itself, the processes that hold GPU
//! memory are Slurm tasks on other nodes, not in srun's process group: killing
//! srun alone leaves them training and the job RUNNING. So:
//!
//! * a user's Ctrl-C is forwarded as srun needs it to end the step: SIGINT, and
//!   a second SIGINT [`SECOND_SIGINT`] later (srun ignores one SIGINT — "one more
//!   within 1 sec to abort" — and only reports the tasks' status);
//! * before srun gets SIGKILL (a second Ctrl-C, the grace period over, oomguard
//!   itself killed: the guardian), the step is cancelled through the controller:
//!   `scancel JOB.STEP` when oomguard runs inside an allocation (`SLURM_JOB_ID`),
//!   else `scancel JOB`, the allocation srun made for itself. The step is found
//!   by srun's host and pid, which `scontrol show step` lists (`SrunHost:Pid=`).
//!
//! Nothing here looks at /proc for tasks: on a real cluster they are on other
//! hosts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// srun aborts a step on a second SIGINT within one second of the first.
pub(crate) const SECOND_SIGINT: Duration = Duration::from_millis(300);

/// How long a Slurm client may take before it is given up on (a controller
/// that does not answer must not hang oomguard).
const CLIENT_LIMIT: Duration = Duration::from_secs(10);

/// Whether argv[0] is Slurm's `srun`.
pub(crate) fn is_srun(program: &std::ffi::OsStr) -> bool {
    std::path::Path::new(program)
        .file_name()
        .is_some_and(|n| n == "srun")
}

/// Runs a Slurm client with a time limit: its stdout, or None.
fn client(program: &str, args: &[&str]) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut out = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let deadline = Instant::now() + CLIENT_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let s = reader.join().unwrap_or_default();
                return status.success().then_some(s);
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("{program} {args:?} did not answer within {CLIENT_LIMIT:?}");
                return None;
            }
        }
    }
}

fn hostname() -> Option<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(h.trim().to_string()).filter(|h| !h.is_empty())
}

/// The step srun `pid` on this host runs (`JOB.STEP`), from `scontrol show step -o`.
pub(crate) fn step_of(listing: &str, host: &str, pid: u32) -> Option<String> {
    let short = host.split('.').next().unwrap_or(host);
    listing.lines().find_map(|line| {
        let mut step = None;
        let mut ours = false;
        for field in line.split_whitespace() {
            if let Some(id) = field.strip_prefix("StepId=") {
                step = Some(id.to_string());
            } else if let Some(hp) = field.strip_prefix("SrunHost:Pid=")
                && let Some((h, p)) = hp.rsplit_once(':')
            {
                let h = h.split('.').next().unwrap_or(h);
                ours = h == short && p.parse::<u32>().ok() == Some(pid);
            }
        }
        if ours { step } else { None }
    })
}

/// What to cancel for step `step` (`JOB.STEP`): the step inside an allocation
/// oomguard runs in (`SLURM_JOB_ID` is that job), else the whole job, which
/// srun allocated for itself.
pub(crate) fn cancel_target(step: &str, own_job: Option<&str>) -> String {
    let job = step.split('.').next().unwrap_or(step);
    match own_job {
        Some(j) if j == job => step.to_string(),
        _ => job.to_string(),
    }
}

/// The step (`JOB.STEP`) that srun `pid` on this host runs, if the controller
/// lists it.
pub(crate) fn step_of_srun(pid: u32) -> Option<String> {
    let host = hostname()?;
    let listing = client("scontrol", &["show", "step", "-o"])?;
    step_of(&listing, &host, pid)
}

/// Cancels the step (or the job) that srun `pid` runs, if the controller knows
/// one; says what it did. Called before srun is killed.
pub(crate) fn cancel_step_of(pid: u32) -> Option<String> {
    let step = step_of_srun(pid)?;
    let own = std::env::var("SLURM_JOB_ID").ok();
    let target = cancel_target(&step, own.as_deref());
    tracing::info!("scancel {target} (srun {pid} runs step {step})");
    client("scancel", &[&target])?;
    Some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "StepId=7.0 UserId=0 State=RUNNING Nodes=2 Tasks=2 Name=sleep SrunHost:Pid=vm:18248\n\
StepId=7.1 UserId=0 State=RUNNING Nodes=1 Tasks=1 Name=python3 SrunHost:Pid=vm.example.org:4242\n\
StepId=9.0 UserId=0 State=RUNNING Name=x SrunHost:Pid=other:4242\n";

    #[test]
    fn the_step_is_found_by_host_and_pid() {
        assert_eq!(step_of(LISTING, "vm", 18248).as_deref(), Some("7.0"));
        assert_eq!(step_of(LISTING, "vm", 4242).as_deref(), Some("7.1"));
        assert_eq!(
            step_of(LISTING, "other.example.org", 4242).as_deref(),
            Some("9.0")
        );
        assert_eq!(step_of(LISTING, "vm", 1), None);
        assert_eq!(step_of("", "vm", 1), None);
    }

    #[test]
    fn a_step_inside_our_allocation_the_job_otherwise() {
        assert_eq!(cancel_target("7.0", Some("7")), "7.0");
        assert_eq!(cancel_target("7.0", None), "7");
        assert_eq!(cancel_target("7.0", Some("3")), "7");
    }

    #[test]
    fn srun_is_recognised_by_name() {
        assert!(is_srun("srun".as_ref()));
        assert!(is_srun("/usr/bin/srun".as_ref()));
        assert!(!is_srun("sruns".as_ref()));
        assert!(!is_srun("python3".as_ref()));
    }
}
