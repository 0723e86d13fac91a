//! Spawning the child: PATH lookup with distinct errors, the pseudo-terminal, and what the
//! child does between fork and exec.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Error;

/// What execvp(3) searches when PATH is unset.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Finds the program the way execvp(3) would, but reports what it tried.
///
/// A name with a `/` is used as is; otherwise each PATH entry is tried in order (an empty
/// entry means the current directory). The first executable regular file wins. When only
/// non-executable candidates exist the error is NotExecutable (as execvp's EACCES).
pub(crate) fn resolve(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, Error> {
    if program.is_empty() {
        return Err(Error::NotFound {
            program: program.to_owned(),
            searched: Vec::new(),
        });
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match check_candidate(&path) {
            Candidate::Executable => Ok(path),
            Candidate::Missing => Err(Error::NotFound {
                program: program.to_owned(),
                searched: vec![path],
            }),
            Candidate::NotExecutable(reason) => Err(Error::NotExecutable {
                program: program.to_owned(),
                reason,
            }),
        };
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut searched = Vec::new();
    let mut first_refusal: Option<String> = None;
    for dir in path_var.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            PathBuf::from(".")
        } else {
            PathBuf::from(OsStr::from_bytes(dir))
        };
        let candidate = dir.join(program);
        match check_candidate(&candidate) {
            Candidate::Executable => return Ok(candidate),
            Candidate::Missing => {}
            Candidate::NotExecutable(reason) => {
                first_refusal.get_or_insert(format!("{}: {reason}", candidate.display()));
            }
        }
        searched.push(dir);
    }
    match first_refusal {
        Some(reason) => Err(Error::NotExecutable {
            program: program.to_owned(),
            reason,
        }),
        None => Err(Error::NotFound {
            program: program.to_owned(),
            searched,
        }),
    }
}

enum Candidate {
    Executable,
    Missing,
    NotExecutable(String),
}

fn check_candidate(path: &Path) -> Candidate {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Candidate::NotExecutable(format!("permission denied ({e})"));
        }
        Err(_) => return Candidate::Missing,
    };
    if meta.is_dir() {
        return Candidate::NotExecutable("is a directory".into());
    }
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Candidate::Missing;
    };
    // access(2) answers for our real uid, as exec would (root gets X_OK if any x bit is set).
    // SAFETY: c_path is a valid NUL-terminated string.
    if unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } != 0 {
        let mode = meta.permissions().mode();
        return Candidate::NotExecutable(format!(
            "permission denied (mode {:o}; try chmod +x)",
            mode & 0o7777
        ));
    }
    Candidate::Executable
}

/// Maps an error from spawn (exec failing in the child) for a program that `resolve` found.
pub(crate) fn map_spawn_error(program: &OsStr, resolved: &Path, e: io::Error) -> Error {
    let reason = match e.raw_os_error() {
        // The file exists (resolve saw it), so ENOENT is about its interpreter (`#!` line) or
        // its dynamic loader.
        Some(libc::ENOENT) => format!(
            "{}: bad interpreter or missing loader (check the #! line): {e}",
            resolved.display()
        ),
        Some(libc::ENOEXEC) => format!("{}: not an executable format: {e}", resolved.display()),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("{}: permission denied: {e}", resolved.display())
        }
        Some(libc::EISDIR) => format!("{}: is a directory", resolved.display()),
        _ => return Error::Io(e),
    };
    Error::NotExecutable {
        program: program.to_owned(),
        reason,
    }
}

/// A pseudo-terminal pair, both ends close-on-exec.
pub(crate) struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pty whose output is byte-exact (no `\n` -> `\r\n`: our own terminal does that when
/// we write to it) and which does not echo (our own terminal, in cooked mode, already echoes
/// what the user types before we forward it).
pub(crate) fn open_pty(size: Option<libc::winsize>) -> io::Result<Pty> {
    // SAFETY: plain libc calls on fds we own; return values are checked.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(master);
        if libc::grantpt(master.as_raw_fd()) != 0 || libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        let rc = libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let slave = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave < 0 {
            return Err(io::Error::last_os_error());
        }
        let slave = OwnedFd::from_raw_fd(slave);
        let mut tio: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(slave.as_raw_fd(), &mut tio) == 0 {
            tio.c_oflag &= !libc::OPOST;
            tio.c_lflag &= !(libc::ECHO | libc::ECHOE | libc::ECHOK | libc::ECHONL);
            if libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &tio) != 0 {
                tracing::warn!("could not set pty modes: {}", io::Error::last_os_error());
            }
        }
        let size = size.unwrap_or(libc::winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        });
        set_winsize(master.as_raw_fd(), &size);
        Ok(Pty { master, slave })
    }
}

/// Our terminal's size, from whichever of stdout, stderr, stdin is a terminal.
pub(crate) fn our_winsize() -> Option<libc::winsize> {
    for fd in [1, 2, 0] {
        // SAFETY: TIOCGWINSZ writes a winsize into the struct we pass.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            return Some(ws);
        }
    }
    None
}

pub(crate) fn set_winsize(master: RawFd, ws: &libc::winsize) {
    // SAFETY: TIOCSWINSZ reads the struct we pass.
    if unsafe { libc::ioctl(master, libc::TIOCSWINSZ, ws) } != 0 {
        tracing::debug!("could not set pty size: {}", io::Error::last_os_error());
    }
}

/// How the child's stdio is connected.
pub(crate) enum Wiring {
    /// One pipe for stdout, another for stderr.
    Pipes,
    /// One pipe for both (our stdout and stderr are the same file or pipe): the order
    /// in which the child wrote to them is kept, as if it wrote to that file itself.
    Merged {
        read: OwnedFd,
        write: OwnedFd,
    },
    Pty(Pty),
}

impl Wiring {
    /// One pipe for the child's stdout and stderr, both close-on-exec here.
    pub(crate) fn merged() -> io::Result<Wiring> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(Wiring::Merged { read, write })
    }
}

/// Whether our stdout and stderr are one file (`> log 2>&1`: the same device and inode,
/// or the same pipe). Two pipes read in turn would reorder what the child wrote to it.
pub(crate) fn same_output() -> bool {
    let id = |fd: RawFd| {
        // SAFETY: fstat writes into the zeroed struct we pass; fd may be closed (then it fails).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    matches!((id(1), id(2)), (Some(a), Some(b)) if a == b)
}

/// Spawns the child. In pipe mode it is the leader of a new process group; in pty mode the
/// leader of a new session (hence also of a new group) with the pty as controlling terminal.
pub(crate) fn spawn_child(
    resolved: &Path,
    argv: &[OsString],
    env_set: &[(OsString, OsString)],
    wiring: &Wiring,
) -> io::Result<Child> {
    let mut cmd = Command::new(resolved);
    cmd.arg0(&argv[0]).args(&argv[1..]);
    for (k, v) in env_set {
        cmd.env(k, v);
    }
    let tty = match wiring {
        Wiring::Pipes => {
            cmd.stdin(Stdio::inherit())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // Why: a group of its own lets us signal the child and everything it starts at
            // once, and keeps the terminal's Ctrl-C from reaching it behind our back.
            cmd.process_group(0);
            false
        }
        Wiring::Merged { write, .. } => {
            cmd.stdin(Stdio::inherit())
                .stdout(File::from(write.try_clone()?))
                .stderr(File::from(write.try_clone()?));
            cmd.process_group(0); // as for Pipes
            false
        }
        Wiring::Pty(pty) => {
            cmd.stdin(File::from(pty.slave.try_clone()?))
                .stdout(File::from(pty.slave.try_clone()?))
                .stderr(File::from(pty.slave.try_clone()?));
            // No process_group here: setsid() fails for a process that already leads a group.
            true
        }
    };
    // SAFETY: getpid is async-signal-safe; the closure below only makes async-signal-safe
    // calls (sigaction, sigprocmask, setsid, ioctl, prctl, getppid, kill) and allocates nothing.
    let parent = unsafe { libc::getpid() };
    let ignored = super::signals::inherited_ignored();
    unsafe {
        cmd.pre_exec(move || child_setup(parent, tty, ignored));
    }
    cmd.spawn()
}

/// Runs in the child between fork and exec. Async-signal-safe calls only.
/// `ignored`: the signals oomguard itself inherited as ignored (bit N for signal N).
fn child_setup(parent: libc::pid_t, tty: bool, ignored: u64) -> io::Result<()> {
    // SAFETY: all calls are async-signal-safe and operate on this (child) process only.
    unsafe {
        // Give the child the dispositions oomguard inherited: what oomguard ignores for its
        // own sake (SIGTTIN, SIGPIPE) goes back to the default, what the user's shell or
        // `nohup` ignored (SIGHUP, SIGINT/SIGQUIT after `&`) stays ignored, as without
        // oomguard. Handlers are reset by exec anyway; ignored signals would not be.
        for sig in 1..65 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let action = if sig < 64 && ignored & (1 << sig) != 0 {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            libc::signal(sig, action); // fails harmlessly for glibc-reserved numbers
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if tty {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Why: if oomguard is SIGKILLed, the kernel kills the direct child right away. Note
        // it fires when the *thread* that forked exits, so run() must be called from a thread
        // that outlives the attempt (it does: run() blocks until the child is reaped).
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died before prctl took effect.
        if libc::getppid() != parent {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    Ok(())
}
