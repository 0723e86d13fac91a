//! Finding and signalling everything an attempt started.
//!
//! Two nets, because one is not enough for PyTorch:
//!
//! * the process group (-pgid): the child and every descendant that did not move itself;
//! * the attempt marker: the child's environment carries `OOMGUARD_ATTEMPT=<marker>`, which
//!   descendants inherit. torchrun starts its workers with `start_new_session=True`
//!   (torch/distributed/elastic/multiprocessing/subprocess_handler), so they are NOT in the
//!   child's group; they do inherit torchrun's environment, so the marker finds them even
//!   after they were reparented to init. /proc/PID/environ is the environment given to exec,
//!   so a later setenv/unsetenv in the process does not hide it. Only processes of our own
//!   user are readable, which are the only ones we could signal anyway.

use std::io::Read;

use crate::signal::Signal;

/// Name of the environment variable that marks an attempt's processes.
pub const MARKER_VAR: &str = "OOMGUARD_ATTEMPT";

/// Sends `sig` to the group. Returns false when the group is gone (ESRCH). Other errors are
/// logged, never ignored silently.
pub(crate) fn kill_group(pgid: i32, sig: Signal) -> bool {
    debug_assert!(pgid > 1);
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill has no memory-safety implications; pgid > 1 so this is one group.
    if unsafe { libc::kill(-pgid, sig.raw()) } == 0 {
        return true;
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ESRCH) {
        tracing::warn!("kill(-{pgid}, {}) failed: {e}", sig);
    }
    false
}

/// Sends `sig` to one process; ESRCH is "already gone".
pub(crate) fn kill_pid(pid: i32, sig: Signal) {
    // SAFETY: as above; pid > 0.
    if pid > 0 && unsafe { libc::kill(pid, sig.raw()) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!("kill({pid}, {}) failed: {e}", sig);
        }
    }
}

/// One entry of /proc.
struct ProcInfo {
    pgrp: i32,
    zombie: bool,
    /// It is exiting (`PF_EXITING` in field 9 of stat): once its memory map is
    /// released its environment reads empty, though it is not yet a zombie.
    exiting: bool,
    /// When it started, in clock ticks since boot (`starttime`, field 22 of stat).
    start: u64,
}

/// The kernel's `PF_EXITING` process flag (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

fn read_stat(pid: i32) -> Option<ProcInfo> {
    // One read into a buffer on the stack: a stat line is a few hundred bytes, and the
    // fields read here (up to the 22nd) lie well within the first 1024; and `fs::read` of a /proc file (which says its size is 0) grows its
    // buffer over five reads: this runs for every process of the machine, several times
    // between an attempt's end and the next attempt's start.
    let mut buf = [0u8; 1024];
    let mut f = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    // The line ends with '\n': no read for the end of file after it.
    while len < buf.len() && !buf[..len].ends_with(b"\n") {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(&buf[..len])
}

/// The fields of one /proc/PID/stat line that [`ProcInfo`] keeps.
fn parse_stat(stat: &[u8]) -> Option<ProcInfo> {
    // "pid (comm) S ppid pgrp ..."; comm may contain spaces and parentheses: split at the
    // last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    // Fields 6 to 8, then flags.
    let flags: u64 = fields.nth(3)?.parse().ok()?;
    // Fields 10 to 21, then starttime.
    let start = fields.nth(12)?.parse().ok()?;
    Some(ProcInfo {
        pgrp,
        zombie: state == "Z" || state == "X",
        exiting: flags & PF_EXITING != 0,
        start,
    })
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// True while the group has a member that is not a zombie. A zombie member cannot hold GPU
/// memory, and it may stay around until its (possibly foreign) parent reaps it.
pub(crate) fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    if unsafe { libc::kill(-pgid, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    if std::fs::metadata("/proc/self/stat").is_err() {
        return true; // no /proc: trust kill
    }
    all_pids()
        .into_iter()
        .filter_map(read_stat)
        .any(|p| p.pgrp == pgid && !p.zombie)
}

/// Whether the environment read from `f` (`/proc/PID/environ`) holds the entry `needle`.
/// `buf` and `carry` are the caller's, reused from one process to the next (a fresh zeroed
/// 64 KiB buffer per process was a good part of the scan).
fn has_marker(mut f: std::fs::File, needle: &[u8], buf: &mut [u8], carry: &mut Vec<u8>) -> bool {
    carry.clear();
    // Bounded read: environments are small; a huge one is read in fixed chunks.
    loop {
        let n = match f.read(buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        carry.extend_from_slice(&buf[..n]);
        if carry.split(|&b| b == 0).any(|entry| entry == needle) {
            return true;
        }
        // Keep only the unfinished last entry.
        match carry.iter().rposition(|&b| b == 0) {
            Some(i) => {
                carry.drain(..=i);
            }
            None if carry.len() > 1024 * 1024 => return false,
            None => {}
        }
    }
}

/// When process `pid` started (clock ticks since boot), if it exists.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    read_stat(pid).map(|p| p.start)
}

/// Live (non-zombie) processes carrying the marker, other than ourselves; with `born`,
/// only processes started at or after it (the attempt's child's start time, see
/// [`start_time`]): only the child's descendants carry its marker,
/// and they all started after it. Reading a process's environment waits for its memory
/// map's lock, which a busy process (a compiler, a trainer allocating) holds for long
/// stretches; its stat does not. On a loaded machine reading every environment was most
/// of the time from an attempt's end to the next attempt's start.
pub(crate) fn marked_pids_born(marker: &str, born: Option<u64>) -> Vec<i32> {
    let needle = format!("{MARKER_VAR}={marker}").into_bytes();
    let me = std::process::id() as i32;
    let (mut buf, mut carry) = (vec![0u8; 16 * 1024], Vec::new());
    all_pids()
        .into_iter()
        .filter(|&pid| pid != me)
        // Opening another user's (or another container's) environment is refused at
        // once: the cheapest test first. Then its start time; then its environment.
        .filter_map(|pid| {
            let environ = match std::fs::File::open(format!("/proc/{pid}/environ")) {
                Ok(f) => Some(f),
                // A process that is exiting has released its memory, environment
                // included, before it becomes a zombie: opening its environment then
                // fails with ESRCH (for a few milliseconds, longer for a big process on a
                // busy machine). One of ours born after the attempt started may be the
                // attempt's, and counts as alive until it is a zombie. Not counting it
                // said "gone" while a worker was still closing its files (its GPU memory
                // included): the launch tests caught one alive after the run returned.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) && ours(pid) => None,
                Err(_) => return None,
            };
            let stat = read_stat(pid)?;
            let young = !stat.zombie && born.is_none_or(|b| stat.start >= b);
            (young && (environ.is_some() || stat.exiting)).then_some((pid, environ, stat.exiting))
        })
        .filter_map(|(pid, environ, exiting)| {
            let marked = match environ {
                Some(f) => has_marker(f, &needle, &mut buf, &mut carry),
                None => false,
            };
            (exiting || marked).then_some(pid)
        })
        // A process that died while being looked at is not alive.
        .filter(|&pid| read_stat(pid).is_some_and(|p| !p.zombie))
        .collect()
}

/// Whether process `pid` is our user's (the owner of its /proc folder).
fn ours(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == me)
}

/// Sends `sig` to every live process carrying the marker; returns how many.
pub(crate) fn kill_marked(marker: &str, sig: Signal) -> usize {
    kill_marked_born(marker, None, sig)
}

/// [`kill_marked`], looking only at processes started at or after `born` (see
/// [`marked_pids_born`]).
pub(crate) fn kill_marked_born(marker: &str, born: Option<u64>, sig: Signal) -> usize {
    let pids = marked_pids_born(marker, born);
    for &pid in &pids {
        kill_pid(pid, sig);
    }
    pids.len()
}

/// At most this many processes of one attempt are remembered.
const MAX_REMEMBERED: usize = 65_536;

/// Adds `root` and its descendants to `into`: each process's children as its main thread
/// lists them (/proc/PID/task/PID/children; a child forked by another thread is found only
/// through the main thread's). Processes that left the tree (reparented) are not found.
pub(crate) fn descendants(
    root: i32,
    into: &mut std::collections::BTreeSet<u32>,
    names: &mut std::collections::BTreeSet<String>,
    cgroups: &mut std::collections::BTreeSet<String>,
) {
    let mut stack = vec![root];
    let mut walked = 0;
    while let Some(pid) = stack.pop() {
        walked += 1;
        if pid <= 0 || walked > 4096 || into.len() >= MAX_REMEMBERED {
            break;
        }
        into.insert(pid as u32);
        // Its name as the kernel's OOM-killer record writes it (`comm`), read on
        // every sample: seen first between fork and exec, it still has oomguard's.
        if names.len() < 256
            && let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        {
            names.insert(comm.trim_end_matches('\n').to_string());
        }
        // Its memory cgroup, which the kernel's record names too (kept across exec),
        // read on every sample like its name: a process can move itself (or be moved:
        // a job step's task, a systemd scope) into another cgroup after it was first
        // seen, and the kernel then names the new one.
        if cgroups.len() < 64
            && let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            && let Some(cg) = crate::detect::kernel::memory_cgroup(&text)
        {
            cgroups.insert(cg);
        }
        let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        else {
            continue;
        };
        stack.extend(
            children
                .split_ascii_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
}

#[cfg(test)]
pub(crate) fn pid_alive(pid: i32) -> bool {
    read_stat(pid).is_some_and(|p| !p.zombie)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marked process killed while it holds much memory spends milliseconds exiting
    /// (its environment unreadable, not yet a zombie): all that time it is still the
    /// attempt's. Three tries to see it exiting at least once.
    #[test]
    fn an_exiting_process_of_the_attempt_is_still_found() {
        let marker = format!(
            "{}.exiting.{}",
            std::process::id(),
            start_time(std::process::id() as i32).unwrap()
        );
        let mut seen_exiting = 0;
        for _ in 0..3 {
            let mut child = std::process::Command::new("python3")
                .args(["-c", "b = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ready', flush=True)\nimport time; time.sleep(60)"])
                .env(MARKER_VAR, &marker)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = [0u8; 6];
            std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut line).unwrap();
            let pid = child.id() as i32;
            assert_eq!(marked_pids_born(&marker, None), vec![pid]);
            kill_pid(pid, Signal::KILL);
            while let Some(p) = read_stat(pid).filter(|p| !p.zombie) {
                let found = marked_pids_born(&marker, None);
                // Read again: it may have become a zombie meanwhile.
                if read_stat(pid).is_some_and(|p| !p.zombie) {
                    assert_eq!(found, vec![pid], "exiting {}", p.exiting);
                    seen_exiting += usize::from(p.exiting);
                }
            }
            child.wait().unwrap();
            if seen_exiting > 0 {
                break;
            }
        }
        assert!(seen_exiting > 0, "never saw the process exiting");
    }

    #[test]
    fn stat_lines_give_group_state_exiting_and_start() {
        // A worker named with spaces and parentheses, exiting (flags 0x404444), not yet a
        // zombie: counted as possibly the attempt's until it is one.
        let line = b"4242 (pt_main (x) y) R 1 4200 4200 0 -1 4211780 90 0 0 0 5 1 0 0 20 0 \
                     1 0 987654 0 0 18446744073709551615\n";
        let p = parse_stat(line).unwrap();
        assert_eq!(
            (p.pgrp, p.zombie, p.exiting, p.start),
            (4200, false, true, 987654)
        );
        let line = b"7 (sleep) S 1 7 7 0 -1 4194304 90 0 0 0 5 1 0 0 20 0 1 0 12 0 0\n";
        let p = parse_stat(line).unwrap();
        assert_eq!(
            (p.pgrp, p.zombie, p.exiting, p.start),
            (7, false, false, 12)
        );
        let line = b"8 (python3) Z 1 8 8 0 -1 4227084 90 0 0 0 5 1 0 0 20 0 1 0 13 0 0\n";
        assert!(parse_stat(line).unwrap().zombie);
        // This process: not exiting, started.
        let me = read_stat(std::process::id() as i32).unwrap();
        assert!(!me.zombie && !me.exiting && me.start > 0);
    }
}
