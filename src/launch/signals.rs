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

/// Signals that end an attempt when forwarded; `pending()` reports these.
pub(crate) const USER_INTERRUPTS: [i32; 4] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Every signal oomguard handles (forwarded, or acted on by `run()`).
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
    pub fn pending(&self) -> Option<i32> {
        let shared = Self::shared();
        let handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        USER_INTERRUPTS
            .iter()
            .copied()
            .find(|&sig| shared.counts[sig as usize].load(Ordering::SeqCst) > handled[sig as usize])
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
    pub(crate) fn take_new(&self) -> Vec<(i32, usize)> {
        let shared = Self::shared();
        let mut handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for &sig in &HANDLED {
            let now = shared.counts[sig as usize].load(Ordering::SeqCst);
            let seen = handled[sig as usize];
            if now > seen {
                out.push((sig, now - seen));
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
            if !USER_INTERRUPTS.contains(&sig) {
                handled[sig as usize] = shared.counts[sig as usize].load(Ordering::SeqCst);
            }
        }
    }
}
