//! Who a GPU process is: its user and its oomguard attempt, from `/proc`.
//!
//! Looked up once per process and cached (keyed by PID and start time, so a reused PID is
//! looked up again): the sampler calls this for every process on every sample.

use std::collections::HashMap;
use std::io::Read;

use crate::launch::MARKER_VAR;

/// How far up the parent chain a marker is looked for. torchrun's workers are 2-3 levels
/// below the attempt's child; 32 is far more than any real tree.
const MAX_ANCESTORS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub user: Option<String>,
    pub attempt: Option<String>,
}

#[derive(Default)]
pub struct Cache {
    by_pid: HashMap<u32, (u64, Who)>,
    users: HashMap<u32, String>,
}

impl Cache {
    /// The process's user and attempt marker; both `None` when it is not in our /proc.
    pub fn who(&mut self, pid: u32) -> Who {
        let Some(stat) = read_stat(pid) else {
            self.by_pid.remove(&pid);
            return Who {
                user: None,
                attempt: None,
            };
        };
        if let Some((start, who)) = self.by_pid.get(&pid)
            && *start == stat.start_time
        {
            return who.clone();
        }
        let who = Who {
            user: read_uid(pid).map(|uid| self.user_name(uid)),
            attempt: attempt_of(pid, stat.ppid),
        };
        self.by_pid.insert(pid, (stat.start_time, who.clone()));
        who
    }

    /// Forget processes not in `seen` (bounded memory over a long run).
    pub fn retain(&mut self, seen: &[u32]) {
        self.by_pid.retain(|pid, _| seen.contains(pid));
    }

    fn user_name(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                // getpwuid_r: /etc/passwd and also LDAP/SSSD users, common on shared servers.
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
                    .unwrap_or_else(|| uid.to_string())
            })
            .clone()
    }
}

struct Stat {
    ppid: u32,
    start_time: u64,
}

fn read_stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ..."; comm may hold spaces and ')': split at the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is the state (field 3 of stat(5)); starttime is field 22.
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

fn read_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    // "Uid:\treal\teffective\tsaved\tfs": the real uid is who started it.
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// The marker of `pid`, else of its nearest marked ancestor. Only our own user's
/// environments are readable; others yield `None`, which is right: they are not ours.
fn attempt_of(pid: u32, ppid: u32) -> Option<String> {
    if let Some(m) = marker_in_environ(pid) {
        return Some(m);
    }
    let mut next = ppid;
    for _ in 0..MAX_ANCESTORS {
        if next <= 1 {
            return None;
        }
        if let Some(m) = marker_in_environ(next) {
            return Some(m);
        }
        next = read_stat(next)?.ppid;
    }
    None
}

fn marker_in_environ(pid: u32) -> Option<String> {
    let mut f = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut buf = Vec::new();
    // Bounded: environments are small; 4 MiB is far past any real one.
    f.by_ref().take(4 << 20).read_to_end(&mut buf).ok()?;
    let prefix = format!("{MARKER_VAR}=");
    buf.split(|&b| b == 0)
        .find_map(|e| e.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}
