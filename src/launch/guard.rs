//! The guardian: a tiny process that kills the child's group if oomguard dies.
//!
//! Protocol. oomguard creates a pipe (both ends close-on-exec, so the child never inherits
//! either) and starts `oomguard __guard <pgid> [<marker> [srun]]` with the read end as its stdin.
//! Only oomguard holds the write end. The guardian blocks reading one byte:
//!
//! * a byte arrives: oomguard finished the attempt cleanly and reaped the group; exit 0.
//! * end of file: oomguard died (even by SIGKILL, the kernel closes its fds); SIGKILL the
//!   group (-pgid) and every process carrying the attempt's marker (see `tree`), then exit.
//!
//! The guardian ignores SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGTSTP: it shares oomguard's process
//! group, so a Ctrl-C or Ctrl-Z on the terminal reaches it too, and it must outlive oomguard.
//!
//! One exception to "never outlives": a descendant that calls setsid()/setpgid() leaves the
//! group, and if it also clears its environment it carries no marker either; such a process
//! escapes (see `tree` for the marker, which catches torchrun's workers).

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};

/// Argument that selects the guardian in oomguard's main.
pub const GUARD_ARG: &str = "__guard";

/// Third argument: the group leader is `srun`, whose step is cancelled first (see `slurm`).
const SRUN_ARG: &str = "srun";

/// A running guardian, from oomguard's side.
pub(crate) struct Guardian {
    child: Child,
    /// Write end of the pipe; dropping it without writing means "oomguard died".
    pipe: Option<OwnedFd>,
}

impl Guardian {
    /// Starts a guardian for `pgid`.
    pub(crate) fn start(pgid: i32, marker: &str, srun: bool) -> io::Result<Guardian> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let mut cmd = guard_command();
        cmd.arg(pgid.to_string()).arg(marker);
        if srun {
            cmd.arg(SRUN_ARG);
        }
        cmd.stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn()?;
        Ok(Guardian {
            child,
            pipe: Some(write),
        })
    }

    /// Tells the guardian the group is gone; it exits without killing anything. It is
    /// reaped on a thread of its own (returned, for a caller that must know it has
    /// exited): the next attempt need not wait for it. A guardian started moments ago
    /// may still be loading (tens of milliseconds on a loaded machine) when a short
    /// attempt ends, and waiting for it here was most of the gap between an attempt's
    /// exit and the next one's exec. Once released it can only exit: it has the byte.
    pub(crate) fn release(mut self) -> Option<std::thread::JoinHandle<()>> {
        if let Some(pipe) = self.pipe.take() {
            let file = std::fs::File::from(pipe);
            if let Err(e) = io::Write::write_all(&mut &file, b"x") {
                tracing::debug!("guardian pipe: {e}");
            }
        }
        if let Ok(Some(_)) = self.child.try_wait() {
            return None;
        }
        // Drop reaps it, bounded; on this thread if no other can be started.
        let reaper = std::thread::Builder::new().name("oomguard-reap-guardian".into());
        // A closure that cannot be run is dropped, and with it `self`: reaped here.
        match reaper.spawn(move || drop(self)) {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::debug!("reaping the guardian here: {e}");
                None
            }
        }
    }
}

impl Drop for Guardian {
    /// Closes the pipe (without the byte, unless `release` sent it: then the guardian kills
    /// the group, as if oomguard had died) and reaps the guardian, bounded: no zombies.
    fn drop(&mut self) {
        self.pipe.take();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        // The guardian exits within a millisecond or so of the byte or the pipe's close:
        // look again soon, then less often (a fixed 5 ms sleep was most of the wait, on
        // the path from an attempt's exit to the next one's exec).
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(5));
                }
                Ok(None) => {
                    tracing::warn!("guardian {} did not exit; killing it", self.child.id());
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Err(e) => {
                    tracing::warn!("waiting for guardian: {e}");
                    return;
                }
            }
        }
    }
}

/// The command that starts a guardian: this very executable with `__guard`.
#[cfg(not(test))]
fn guard_command() -> Command {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(GUARD_ARG);
    cmd
}

/// In unit tests /proc/self/exe is the test harness, which has no `__guard`: run the one test
/// that is the guardian's entry point (`tests::guardian_entry`), with the arguments in the
/// environment. The guardian code that runs is the real `guard_main`.
#[cfg(test)]
fn guard_command() -> Command {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.args([
        "launch::tests::guardian_entry",
        "--exact",
        "--test-threads=1",
        "--nocapture",
    ])
    .env("OOMGUARD_TEST_GUARDIAN", "1");
    cmd
}

/// Entry of the guardian process. `args` are the arguments after the program name, with or
/// without the leading `__guard`.
pub fn guard_main(args: &[OsString]) -> ! {
    let mut args = args.iter();
    let mut first = args.next();
    if first.is_some_and(|a| a == GUARD_ARG) {
        first = args.next();
    }
    let pgid = first
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<i32>().ok())
        .filter(|&p| p > 1); // never kill(-1, ..) or kill(0, ..): that would hit everything
    let Some(pgid) = pgid else {
        crate::report::terminal::get().of("__guard", "expected a process group id > 1");
        std::process::exit(2);
    };
    let marker = args.next().and_then(|a| a.to_str()).map(str::to_owned);
    let srun = args.next().is_some_and(|a| a == SRUN_ARG);

    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
    ] {
        // SAFETY: setting SIG_IGN has no memory-safety implications.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }

    let mut stdin = io::stdin().lock();
    let mut byte = [0u8; 1];
    let parent_died = loop {
        match stdin.read(&mut byte) {
            Ok(0) => break true,
            Ok(_) => break false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Cannot tell; the safe side for GPU memory is to assume oomguard is gone.
            Err(_) => break true,
        }
    };
    if parent_died {
        if srun {
            // Before srun dies: its tasks run on the nodes, out of our reach.
            super::slurm::cancel_step_of(pgid as u32);
        }
        // One pass can miss a process forked while it scanned (a worker that calls
        // setsid and forks again, at the moment oomguard died): passes repeat until one
        // finds nothing alive, for 2 s at most.
        for _ in 0..100 {
            super::tree::kill_group(pgid, crate::signal::Signal::KILL);
            let marked = marker.as_deref().map_or(0, |m| {
                super::tree::kill_marked(m, crate::signal::Signal::KILL)
            });
            if marked == 0 && !super::tree::group_alive(pgid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    std::process::exit(0);
}
