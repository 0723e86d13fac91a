//! Is the oomguard that wrote a journal still running? The journal's `run_start`
//! names its supervisor ([`Supervisor`]: pid, the pid's start time, the boot, the
//! host); `oomguard status` checks it against `/proc`.
//!
//! A pid alone is not enough: after oomguard dies the kernel may give its pid to
//! any later process. The start time (`/proc/PID/stat` field 22, clock ticks
//! since boot) tells the two apart; the boot id, a reboot (where ticks start
//! again from zero); the host name, a run folder on a shared file system read
//! from another node, whose `/proc` says nothing about it.

use serde::{Deserialize, Serialize};

/// Who supervises a run: written in `run_start` under `"supervisor"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supervisor {
    pub pid: u32,
    /// `/proc/PID/stat` starttime: clock ticks after boot.
    pub start_ticks: Option<u64>,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: Option<String>,
    pub host: Option<String>,
}

/// What `/proc` says about a [`Supervisor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    /// Its pid runs, started at the recorded time, in this boot.
    Alive,
    /// No such process in this boot (or the pid is another process now).
    Gone,
    /// It runs on another host (a shared run folder): cannot be told from here.
    OtherHost,
    /// The journal does not say (a journal written before oomguard recorded it).
    Unknown,
}

impl Supervisor {
    /// This process.
    pub fn me() -> Supervisor {
        let pid = std::process::id();
        Supervisor {
            pid,
            start_ticks: start_ticks(pid),
            boot_id: boot_id(),
            host: host(),
        }
    }

    pub fn liveness(&self) -> Liveness {
        if let (Some(h), Some(here)) = (&self.host, host())
            && *h != here
        {
            return Liveness::OtherHost;
        }
        if let (Some(b), Some(now)) = (&self.boot_id, boot_id())
            && *b != now
        {
            return Liveness::Gone;
        }
        match (start_ticks(self.pid), self.start_ticks) {
            (None, _) => Liveness::Gone,
            (Some(now), Some(then)) if now != then => Liveness::Gone,
            (Some(_), _) => Liveness::Alive,
        }
    }
}

/// Field 22 of `/proc/PID/stat`; `None` when there is no such process. A
/// zombie (dead, not yet reaped) counts as gone.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and ')', so split at the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is the state (field 3); starttime is field 22.
    if matches!(fields.first(), Some(&"Z" | &"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The host name as this process's UTS namespace has it: a container has its
/// own, and its own pids too, so "another host" is right for it as well.
fn host() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_or_a_reboot_is_not() {
        let me = Supervisor::me();
        assert!(me.start_ticks.is_some() && me.boot_id.is_some());
        assert_eq!(me.liveness(), Liveness::Alive);
        let reused = Supervisor {
            start_ticks: me.start_ticks.map(|t| t + 1),
            ..me.clone()
        };
        assert_eq!(reused.liveness(), Liveness::Gone);
        let rebooted = Supervisor {
            boot_id: Some("another-boot".into()),
            ..me.clone()
        };
        assert_eq!(rebooted.liveness(), Liveness::Gone);
        let elsewhere = Supervisor {
            host: Some("another-host-that-is-not-this-one".into()),
            ..me.clone()
        };
        assert_eq!(elsewhere.liveness(), Liveness::OtherHost);
        // A pid above pid_max is never a process.
        let none = Supervisor {
            pid: u32::MAX,
            ..me
        };
        assert_eq!(none.liveness(), Liveness::Gone);
    }

    #[test]
    fn a_reaped_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let ticks = start_ticks(pid);
        child.wait().unwrap();
        let s = Supervisor {
            pid,
            start_ticks: ticks,
            boot_id: boot_id(),
            host: host(),
        };
        assert_eq!(s.liveness(), Liveness::Gone);
    }
}
