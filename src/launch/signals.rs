//! Signals received by oomguard, counted by async-signal-safe handlers and read by `run()`.
//!
//! Each handled signal has a counter that the handler increments, plus a byte written to a
//! self-pipe (a socket pair) so that the `poll` in `run()` wakes up. No other work happens in
//! the handler. `run()` compares the counters with how many it has already handled; the
//! difference is what arrived since. The counters are process-wide, so `Signals` is a handle to
//! them and `install` may be called more than once (tests do); the handlers are registered once.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::signal::Signal;

/// Every signal oomguard handles (forwarded, or acted on by `run()`).
/// Raw numbers here and in the dispositions below: they index the handlers'
/// counters and go to signal-hook and `sigaction`; what leaves this module is a [`Signal`].
const HANDLED: [i32; 10] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTSTP,
    libc::SIGCONT,
    libc::SIGWINCH,
    libc::SIGCHLD,
];

const NSIG: usize = 65;

/// Signals whose inherited "ignored" disposition is not carried on: SIGCHLD (ignored, the
/// kernel would reap our children before we could wait for them) and SIGPIPE (Rust's
/// runtime ignores it before `main`, so what the shell gave us cannot be read).
const NEVER_KEPT_IGNORED: [i32; 2] = [libc::SIGCHLD, libc::SIGPIPE];

/// The signals this process inherited as ignored (bit N for signal N), read once, before
/// oomguard changes any disposition: `nohup` ignores SIGHUP, a non-interactive shell's `&`
/// ignores SIGINT and SIGQUIT. These stay ignored, for oomguard (no handler is installed)
/// and for the command it starts (`child_setup`), exactly as they would be without oomguard.
pub fn inherited_ignored() -> u64 {
    static INHERITED: OnceLock<u64> = OnceLock::new();
    *INHERITED.get_or_init(|| {
        let mut mask = 0u64;
        for sig in 1..NSIG as i32 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP || NEVER_KEPT_IGNORED.contains(&sig) {
                continue;
            }
            // SAFETY: a null new action only reads the current disposition into `old`.
            let ignored = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction == libc::SIG_IGN
            };
            if ignored {
                mask |= 1 << sig;
            }
        }
        mask
    })
}

struct Shared {
    counts: [AtomicUsize; NSIG],
    /// The read end of the self-pipe; made non-blocking.
    wake: UnixStream,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Process-wide signal handling for oomguard. Install once in `main`, before any attempt.
#[derive(Debug)]
pub struct Signals {
    /// How many of each signal `run()` (or the caller of `pending`) has already seen.
    handled: Mutex<[usize; NSIG]>,
}

fn install_handlers() -> io::Result<&'static Shared> {
    if let Some(shared) = SHARED.get() {
        return Ok(shared);
    }
    // Read before any handler below replaces an inherited SIG_IGN.
    let ignored = inherited_ignored();
    let (read, write) = UnixStream::pair()?;
    read.set_nonblocking(true)?;
    let shared = Shared {
        counts: std::array::from_fn(|_| AtomicUsize::new(0)),
        wake: read,
    };
    if SHARED.set(shared).is_err() {
        // Another thread won the race; its handlers are in place.
        return Ok(SHARED.get().expect("set above"));
    }
    let shared = SHARED.get().expect("set above");
    for &sig in &HANDLED {
        // Why: under `nohup` SIGHUP is ignored; a handler here would make a closed terminal
        // end the run (and the command would get SIGHUP back at its default).
        if ignored & (1 << sig) != 0 {
            continue;
        }
        let counter: &'static AtomicUsize = &shared.counts[sig as usize];
        // SAFETY: the action only does an atomic increment, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })?;
        }
        // Registered after the counter so the count is visible when poll wakes.
        signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
    }
    // Why: in tty mode a thread forwards our stdin to the child. If oomguard is put in the
    // background (`&`, Ctrl-Z + `bg`) a read from the terminal would stop the whole of oomguard
    // with SIGTTIN, and supervision with it. Ignored, the read fails with EIO instead, which the
    // forwarding thread treats as "not now". The child gets default dispositions back (pre_exec).
    // SAFETY: setting a disposition to SIG_IGN has no memory-safety implications.
    if unsafe { libc::signal(libc::SIGTTIN, libc::SIG_IGN) } == libc::SIG_ERR {
        tracing::warn!("could not ignore SIGTTIN: {}", io::Error::last_os_error());
    }
    Ok(shared)
}

impl Signals {
    /// Installs the handlers (once per process) and returns a handle.
    pub fn install() -> io::Result<Signals> {
        let shared = install_handlers()?;
        // Signals that arrived before this handle existed are not "pending" for it.
        let handled = std::array::from_fn(|i| shared.counts[i].load(Ordering::SeqCst));
        Ok(Signals {
            handled: Mutex::new(handled),
        })
    }

    fn shared() -> &'static Shared {
        SHARED.get().expect("Signals exists only after install")
    }

    /// A user signal that arrived while NO child was running (between attempts) — the
    /// supervisor then stops. Does not consume it: asking twice gives the same answer.
    pub fn pending(&self) -> Option<Signal> {
        let shared = Self::shared();
        let handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        Signal::USER_INTERRUPTS.iter().copied().find(|s| {
            let sig = s.raw() as usize;
            shared.counts[sig].load(Ordering::SeqCst) > handled[sig]
        })
    }

    /// The fd that becomes readable when a handled signal arrives.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        Self::shared().wake.as_fd()
    }

    /// Empties the self-pipe (its bytes carry no information; the counters do).
    pub(crate) fn drain_wake(&self) {
        let mut buf = [0u8; 256];
        let mut wake = &Self::shared().wake;
        loop {
            match wake.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock: empty
            }
        }
    }

    /// Signals that arrived since last asked, as (signal, how many times), and marks them seen.
    pub(crate) fn take_new(&self) -> Vec<(Signal, usize)> {
        let shared = Self::shared();
        let mut handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for &sig in &HANDLED {
            let now = shared.counts[sig as usize].load(Ordering::SeqCst);
            let seen = handled[sig as usize];
            if now > seen {
                out.push((Signal::from_raw(sig), now - seen));
                handled[sig as usize] = now;
            }
        }
        out
    }

    /// Forgets signals that only make sense while a child runs (stale SIGUSR1 must not be
    /// forwarded to a fresh child, whose default action for it is to die). User interrupts
    /// are kept: one that arrives just before a spawn is forwarded to the new child.
    pub(crate) fn forget_stale(&self) {
        let shared = Self::shared();
        let mut handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        for &sig in &HANDLED {
            if !Signal::from_raw(sig).is_user_interrupt() {
                handled[sig as usize] = shared.counts[sig as usize].load(Ordering::SeqCst);
            }
        }
    }
}

/// Stops oomguard itself after a Ctrl-Z, by SIGTSTP with its default action, so that
/// its parent (the shell) sees the signal the user sent: 148, not SIGSTOP's 147.
///
/// Our SIGTSTP handler is set aside meanwhile (raised with it in place, the signal
/// would only be counted), and put back once we continue. The kernel discards SIGTSTP
/// in an orphaned process group (no member has a parent in another group of the
/// session), so there SIGSTOP stops us instead.
pub(crate) fn stop_self() {
    // SAFETY: plain signal calls on this process; the sigaction structs are ours,
    // zeroed then filled; return values are checked.
    unsafe {
        if !group_can_stop() {
            libc::kill(libc::getpid(), libc::SIGSTOP);
            return;
        }
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        let mut ours: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTSTP, &default, &mut ours) != 0 {
            libc::kill(libc::getpid(), libc::SIGSTOP);
            return;
        }
        // raise(3) sends to this thread, so the stop happens before it returns.
        libc::raise(libc::SIGTSTP);
        if libc::sigaction(libc::SIGTSTP, &ours, std::ptr::null_mut()) != 0 {
            tracing::warn!(
                "could not restore the SIGTSTP handler: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Whether our process group is not orphaned, so that SIGTSTP stops it: we, or an
/// ancestor in our group, have a parent in another group of our session (a shell).
fn group_can_stop() -> bool {
    // SAFETY: getpgrp and getsid(0) only read this process's ids.
    let (pgrp, sid) = unsafe { (libc::getpgrp(), libc::getsid(0)) };
    let mut pid = std::process::id() as libc::pid_t;
    for _ in 0..64 {
        let Some(parent) = parent_of(pid) else {
            return false;
        };
        if parent <= 1 {
            return false;
        }
        // SAFETY: getpgid/getsid on another pid only read its ids (or fail).
        let (ppgrp, psid) = unsafe { (libc::getpgid(parent), libc::getsid(parent)) };
        if ppgrp < 0 || psid < 0 {
            return false;
        }
        if ppgrp != pgrp {
            return psid == sid;
        }
        pid = parent;
    }
    false
}

/// The parent of `pid`, from /proc/PID/stat (the field after the state, after the
/// command name in parentheses, which may itself hold spaces or parentheses).
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_parent_is_read_from_proc_even_with_odd_command_names() {
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() };
        assert_eq!(
            super::parent_of(std::process::id() as libc::pid_t),
            Some(ppid)
        );
        assert_eq!(super::parent_of(-1), None);
    }
}
