//! The kernel's OOM-killer record: its lines parsed (from `/dev/kmsg`, `journalctl -k`,
//! `dmesg`, or a pasted excerpt), and read live when a process of a run died of SIGKILL.
//!
//! The lines it writes when it kills (Linux 4.x to 6.x; older kernels say "Kill process
//! ... or sacrifice child" first, then "Killed process"):
//!
//! ```text
//! oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=14981,uid=0
//! Memory cgroup out of memory: Killed process 14981 (python3) total-vm:75164kB, anon-rss:65152kB, file-rss:6480kB, shmem-rss:0kB, UID:0 pgtables:180kB oom_score_adj:0
//! Out of memory: Killed process 1234 (python) total-vm:…kB, anon-rss:…kB, …
//! ```
//!
//! A victim is a process of the run when its PID is one oomguard saw in the run's process
//! tree (sampled every 250 to 500 ms while it runs) or one the run's output named (a launcher's `exitcode: -9
//! (pid: N)`), and the kernel killed it after the attempt started.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

/// A process the kernel's OOM killer killed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Victim {
    pub pid: u32,
    /// The process name (`comm`, at most 15 bytes) as the kernel wrote it.
    pub name: String,
    /// Its anonymous memory when killed: what it had allocated itself.
    pub anon_rss_bytes: Option<u64>,
    /// Why the kernel chose to kill: `CONSTRAINT_MEMCG` (a cgroup's memory limit, as in
    /// a container or a Slurm job) or `CONSTRAINT_NONE` (the machine ran out).
    pub constraint: Option<String>,
    /// The memory cgroup the process was in (`task_memcg=` of the `oom-kill:` line),
    /// as the kernel names it: from the root of the hierarchy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcg: Option<String>,
    /// Seconds since boot, when the kernel wrote it (absent from a paste without times).
    #[serde(skip)]
    pub at_ms: Option<Millis>,
}

/// A time since boot in milliseconds (an integer keeps `Victim` `Eq`).
pub type Millis = u64;

impl Victim {
    /// Take what `other` (a line about the same process) adds.
    pub fn fill_from(&mut self, other: Victim) {
        if self.name.is_empty() {
            self.name = other.name;
        }
        self.anon_rss_bytes = self.anon_rss_bytes.or(other.anon_rss_bytes);
        if self.constraint.is_none() {
            self.constraint = other.constraint;
        }
        if self.memcg.is_none() {
            self.memcg = other.memcg;
        }
        self.at_ms = self.at_ms.or(other.at_ms);
    }

    /// "pid 14981 (python3), anon-rss 63.62 MiB, cgroup limit".
    pub fn describe(&self) -> String {
        let mut s = format!("pid {}", self.pid);
        if !self.name.is_empty() {
            s += &format!(" ({})", self.name);
        }
        if let Some(rss) = self.anon_rss_bytes {
            s += &format!(", anon-rss {}", super::format_size(rss));
        }
        match self.constraint.as_deref() {
            Some("CONSTRAINT_MEMCG") => s += ", over its cgroup's memory limit",
            Some("CONSTRAINT_NONE") => s += ", the machine was out of memory",
            _ => {}
        }
        s
    }
}

/// "Killed process 1234 (python) total-vm:…kB, anon-rss:65152kB" (also "Kill process
/// 1234 (python) score 900 or sacrifice child", which has no sizes).
static KILLED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Kill(?:ed)? process (\d+) \((.{0,64})\)(?:[\s,]|$)(?:.*?anon-rss:\s*(\d+)\s*kB)?")
        .expect("killed pattern")
});

/// "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3,pid=14981,uid=0"
static OOM_KILL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"oom-kill:constraint=(\w+).*?,task=(.{0,64}?),pid=(\d+)").expect("oom-kill pattern")
});

/// "task_memcg=/job/step_0," (the victim's memory cgroup), its first [`MAX_MEMCG`]
/// characters kept. (Bounded in the pattern, `{1,4096}`, its automaton was 8 MB.)
static TASK_MEMCG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[,:]task_memcg=([^,\s]+)").expect("memcg pattern"));

/// The most of a memory cgroup's name kept from a kernel record.
const MAX_MEMCG: usize = 4096;

/// A time stamp at the start of a line: dmesg's and journalctl's "[ 5219.962437]",
/// or /dev/kmsg's "6,1234,5219962437,-;".
static STAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:\[\s*(\d+)\.(\d{1,9})\]|\d+,\d+,(\d+),[^;]*;)").expect("stamp pattern")
});

/// The victim a kernel line names, if it is an OOM-killer line that names one.
pub fn victim_in(line: &str) -> Option<Victim> {
    // The literal words each pattern needs, first: the captures below run the PikeVM, which
    // cost about a fifth of `diagnose`'s time on OOM-dense logs when asked of every host
    // OOM line ("Killed"), most of which name no process (callgrind, benches/run.sh).
    let oom_kill = line.contains("oom-kill:constraint=");
    if !oom_kill && !line.contains("Kill process ") && !line.contains("Killed process ") {
        return None;
    }
    let at_ms = stamp(line);
    if oom_kill && let Some(c) = OOM_KILL.captures(line) {
        return Some(Victim {
            pid: c[3].parse().ok()?,
            name: c[2].to_string(),
            constraint: Some(c[1].to_string()),
            memcg: TASK_MEMCG
                .captures(line)
                .map(|m| m[1].chars().take(MAX_MEMCG).collect()),
            at_ms,
            ..Victim::default()
        });
    }
    // "oom_reaper: reaped process N (x), now anon-rss:0kB" is after the kill: not a size.
    if line.contains("oom_reaper") {
        return None;
    }
    let c = KILLED.captures(line)?;
    Some(Victim {
        pid: c[1].parse().ok()?,
        name: c[2].to_string(),
        anon_rss_bytes: c
            .get(3)
            .and_then(|m| m.as_str().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024)),
        at_ms,
        ..Victim::default()
    })
}

fn stamp(line: &str) -> Option<Millis> {
    let c = STAMP.captures(line)?;
    if let Some(usec) = c.get(3) {
        return usec.as_str().parse::<u64>().ok().map(|u| u / 1000);
    }
    let secs: u64 = c.get(1)?.as_str().parse().ok()?;
    let frac = c.get(2)?.as_str();
    let millis: u64 = format!("{frac:0<3}")[..3].parse().ok()?;
    Some(secs * 1000 + millis)
}

/// Every victim a kernel log names, one per kill, in order (the `oom-kill:` and the
/// `Killed process` lines of one kill are merged).
pub fn victims(log: &str) -> Vec<Victim> {
    let mut out: Vec<Victim> = Vec::new();
    for line in log.lines() {
        let Some(v) = victim_in(line) else {
            continue;
        };
        // The two lines of one kill are next to each other; a PID killed again later
        // (reused) is a new kill.
        match out.last_mut() {
            Some(last)
                if last.pid == v.pid
                    && (last.anon_rss_bytes.is_none() || v.anon_rss_bytes.is_none()) =>
            {
                last.fill_from(v)
            }
            _ => out.push(v),
        }
    }
    out
}

/// Whether a victim in memory cgroup `memcg` (as the kernel names it) was in one of
/// the run's cgroups (`/proc/PID/cgroup` of its processes: the memory controller's
/// path, or cgroup v2's). Inside a cgroup namespace a process sees its path from the
/// namespace's root, so the kernel's path may end with it. `None`: it cannot be told
/// (no `task_memcg=` in the record, no cgroup of the run seen, or only the
/// namespace's root `/`, which every path ends in).
pub fn in_run_cgroup(memcg: Option<&str>, run: &BTreeSet<String>) -> Option<bool> {
    let memcg = memcg?.trim_end_matches('/');
    let known: Vec<&str> = run
        .iter()
        .map(|p| p.trim_end_matches('/'))
        .filter(|p| !p.is_empty())
        .collect();
    if known.is_empty() {
        return None;
    }
    Some(known.iter().any(|p| {
        memcg == *p
            || memcg
                .strip_suffix(p)
                .is_some_and(|head| head.ends_with('/') || p.starts_with('/'))
    }))
}

/// The memory cgroup in a `/proc/PID/cgroup` text: cgroup v1's `memory` controller
/// line, else cgroup v2's `0::PATH`.
pub fn memory_cgroup(text: &str) -> Option<String> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctl.split(',').any(|c| c == "memory") {
            return Some(path.to_string());
        }
        if id == "0" && ctl.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    v2
}

/// The run's processes, as far as oomguard knows them: those it saw in the run's tree
/// and those the output named.
pub type RunPids = BTreeSet<u32>;

/// How long before an attempt's start a kernel record may be and still be looked at:
/// the kernel's clock and ours are both "since boot", but not the same clock.
const CLOCK_SLACK_MS: u64 = 10_000;

/// The victims that are processes of the run, killed at or after `since` (ms since boot).
pub fn of_run(victims: &[Victim], run: &RunPids, since: Option<Millis>) -> Vec<Victim> {
    victims
        .iter()
        .filter(|v| run.contains(&v.pid))
        .filter(|v| match (v.at_ms, since) {
            (Some(at), Some(since)) => at + CLOCK_SLACK_MS >= since,
            _ => true,
        })
        .cloned()
        .collect()
}

/// Milliseconds since boot now, on the clock the kernel's log uses (CLOCK_MONOTONIC is
/// what `printk` stamps follow; both stop during suspend).
pub fn now_ms() -> Option<Millis> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; no other memory is touched.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return None;
    }
    Some(t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000)
}

/// Where the kernel's log is read from.
pub trait Source {
    /// The log's text, or why it cannot be read.
    fn read(&self) -> Result<String, Unreadable>;
}

/// Why the kernel's log could not be read (shown after a kill the output does not explain).
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    /// The file `OOMGUARD_FAKE_KERNEL_LOG` names (tests).
    #[error("{}: {source}", path.display())]
    Fake {
        path: PathBuf,
        source: std::io::Error,
    },
    /// None of the machine's readers, each with why.
    #[error("{}", .0.iter().map(|(name, why)| format!("{name}: {why}")).collect::<Vec<_>>().join("; "))]
    Nowhere(Vec<(&'static str, ReaderFailed)>),
    /// A test's kernel log that cannot be read, and the words it says why in.
    #[cfg(test)]
    #[error("{0}")]
    Test(&'static str),
}

/// Why one reader of the kernel's log (`/dev/kmsg`, `journalctl -k`, `dmesg`) failed.
#[derive(Debug, thiserror::Error)]
pub enum ReaderFailed {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The program ran and failed: its standard error and exit status.
    #[error("{} ({status})", stderr.trim())]
    Status {
        stderr: String,
        status: std::process::ExitStatus,
    },
    #[error("no kernel messages in the journal")]
    NoKernelMessages,
    #[error("empty")]
    Empty,
}

/// The machine's kernel log: `/dev/kmsg`, else `journalctl -k`, else `dmesg`, whichever is
/// readable; `OOMGUARD_FAKE_KERNEL_LOG=FILE` (for tests) reads FILE instead.
pub struct System;

impl Source for System {
    fn read(&self) -> Result<String, Unreadable> {
        if let Some(fake) = std::env::var_os("OOMGUARD_FAKE_KERNEL_LOG") {
            let path = PathBuf::from(fake);
            return crate::untrusted::read_config(&path)
                .map_err(|source| Unreadable::Fake { path, source });
        }
        let mut why = Vec::new();
        for (name, read) in [
            (
                "/dev/kmsg",
                read_kmsg as fn() -> Result<String, ReaderFailed>,
            ),
            ("journalctl -k", read_journalctl),
            ("dmesg", read_dmesg),
        ] {
            match read() {
                Ok(text) => return Ok(text),
                Err(e) => why.push((name, e)),
            }
        }
        Err(Unreadable::Nowhere(why))
    }
}

/// The ring buffer through /dev/kmsg: one record per read, non-blocking, up to its end.
/// Needs CAP_SYSLOG (or kernel.dmesg_restrict=0).
fn read_kmsg() -> Result<String, ReaderFailed> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    let mut text = String::new();
    // A record is at most 8 KiB (PRINTK_MESSAGE_MAX / CONSOLE_EXT_LOG_MAX); a smaller
    // buffer makes read fail with EINVAL.
    let mut buf = vec![0u8; 16 * 1024];
    // A bound, in case records keep arriving as fast as they are read.
    for _ in 0..1_000_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // Records overwritten while we read: go on with the next one.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(text)
}

fn read_journalctl() -> Result<String, ReaderFailed> {
    // short-monotonic: "[ 5219.962437] host kernel: ..." (seconds since boot, as dmesg).
    let text = run_capture(
        "journalctl",
        &["-k", "-b", "-q", "--no-pager", "-o", "short-monotonic"],
    )?;
    if text.trim().is_empty() {
        return Err(ReaderFailed::NoKernelMessages);
    }
    Ok(text)
}

fn read_dmesg() -> Result<String, ReaderFailed> {
    let text = run_capture("dmesg", &[])?;
    if text.trim().is_empty() {
        return Err(ReaderFailed::Empty);
    }
    Ok(text)
}

/// Run a reader (never through a shell), its stdout as text; a failure says why.
fn run_capture(program: &str, args: &[&str]) -> Result<String, ReaderFailed> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if !out.status.success() {
        return Err(ReaderFailed::Status {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            status: out.status,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A kernel log given as text (a test's fake).
#[cfg(test)]
pub struct Text(pub String);

#[cfg(test)]
impl Source for Text {
    fn read(&self) -> Result<String, Unreadable> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMCG: &str = "[ 5219.962417] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/oomtest,task_memcg=/oomtest,task=python3,pid=14981,uid=0\n[ 5219.962437] Memory cgroup out of memory: Killed process 14981 (python3) total-vm:75164kB, anon-rss:65152kB, file-rss:6480kB, shmem-rss:0kB, UID:0 pgtables:180kB oom_score_adj:0\n";

    #[test]
    fn the_kernels_lines_name_the_victim_old_and_new() {
        let v = victims(MEMCG);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].pid, 14981);
        assert_eq!(v[0].name, "python3");
        assert_eq!(v[0].anon_rss_bytes, Some(65152 * 1024));
        assert_eq!(v[0].constraint.as_deref(), Some("CONSTRAINT_MEMCG"));
        assert_eq!(v[0].at_ms, Some(5_219_962));
        // The old global form, and /dev/kmsg's record format.
        let old = "Out of memory: Kill process 2222 (python) score 901 or sacrifice child\nKilled process 2222 (python) total-vm:9000kB, anon-rss:4096kB, file-rss:0kB\n";
        let v = victims(old);
        assert_eq!(
            (v.len(), v[0].pid, v[0].anon_rss_bytes),
            (1, 2222, Some(4 << 20))
        );
        let kmsg = "3,1210,5219962437,-;Out of memory: Killed process 77 (pt_data_worker) total-vm:1kB, anon-rss:2048kB, file-rss:0kB\n";
        let v = victims(kmsg);
        assert_eq!(
            (v[0].pid, v[0].name.as_str(), v[0].at_ms),
            (77, "pt_data_worker", Some(5_219_962))
        );
        // The reaper's line comes after the kill and reports what is left: not a size.
        assert!(
            victim_in("oom_reaper: reaped process 77 (x), now anon-rss:0kB, file-rss:0kB")
                .is_none()
        );
        // A name with spaces and parentheses.
        let v = victim_in("Killed process 9 (my (odd) name) total-vm:1kB, anon-rss:1kB").unwrap();
        assert_eq!(v.name, "my (odd) name");
        assert_eq!(v.describe(), "pid 9 (my (odd) name), anon-rss 1.00 KiB");
    }

    #[test]
    fn only_victims_of_the_run_after_it_started_count() {
        let v = victims(MEMCG);
        let mut run = RunPids::new();
        assert!(
            of_run(&v, &run, None).is_empty(),
            "not a process of the run"
        );
        run.insert(14981);
        assert_eq!(of_run(&v, &run, Some(5_000_000)).len(), 1);
        assert!(
            of_run(&v, &run, Some(6_000_000)).is_empty(),
            "killed long before the attempt started: another process with that PID"
        );
    }

    #[test]
    fn a_victims_cgroup_is_matched_to_the_runs() {
        let run: BTreeSet<String> = ["/process_api/abc".to_string()].into();
        assert_eq!(in_run_cgroup(Some("/process_api/abc"), &run), Some(true));
        // Seen from inside a cgroup namespace: the kernel's path ends with ours.
        assert_eq!(
            in_run_cgroup(Some("/kubepods/x/process_api/abc"), &run),
            Some(true)
        );
        assert_eq!(
            in_run_cgroup(Some("/kubepods/x/process_api/abcd"), &run),
            Some(false)
        );
        assert_eq!(in_run_cgroup(Some("/other/job"), &run), Some(false));
        assert_eq!(in_run_cgroup(None, &run), None);
        // Only the namespace's root: nothing to tell.
        assert_eq!(in_run_cgroup(Some("/a"), &["/".to_string()].into()), None);
        let v = victims(MEMCG);
        assert_eq!(v[0].memcg.as_deref(), Some("/oomtest"));
        assert_eq!(
            memory_cgroup("5:devices:/\n4:cpu,memory:/job/1\n0::/\n").as_deref(),
            Some("/job/1")
        );
        assert_eq!(
            memory_cgroup("0::/user.slice/x\n").as_deref(),
            Some("/user.slice/x")
        );
    }
}
