//! One type for a Unix signal, shared by `launch` (what the child died of,
//! what the user sent), the outcome, `supervise`'s exit code and messages, and
//! `status` (which reads a run's exit code back). (watchexec's
//! `crates/signals`: one `Signal` with `Display` and a conversion to nix; no
//! `FromStr` until an option takes a signal's name.)
//!
//! A number, not an enum of the signals oomguard knows: a child can die of any
//! signal, real-time ones included, and what it died of is reported as it was.

use std::fmt;

use crate::exit;

/// A Unix signal, by its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signal(i32);

impl Signal {
    pub const HUP: Signal = Signal(libc::SIGHUP);
    pub const INT: Signal = Signal(libc::SIGINT);
    pub const QUIT: Signal = Signal(libc::SIGQUIT);
    pub const KILL: Signal = Signal(libc::SIGKILL);
    pub const TERM: Signal = Signal(libc::SIGTERM);
    pub const USR1: Signal = Signal(libc::SIGUSR1);
    pub const USR2: Signal = Signal(libc::SIGUSR2);
    pub const STOP: Signal = Signal(libc::SIGSTOP);
    pub const TSTP: Signal = Signal(libc::SIGTSTP);
    pub const CONT: Signal = Signal(libc::SIGCONT);
    pub const WINCH: Signal = Signal(libc::SIGWINCH);

    /// The signals a user (or a scheduler, or a closed terminal) sends to end
    /// a run: forwarded to the command, and never followed by a relaunch.
    pub const USER_INTERRUPTS: [Signal; 4] = [Signal::INT, Signal::TERM, Signal::HUP, Signal::QUIT];

    pub const fn from_raw(n: i32) -> Signal {
        Signal(n)
    }

    pub const fn raw(self) -> i32 {
        self.0
    }

    /// The shell's exit status for death by this signal: 128 + N.
    pub const fn exit_code(self) -> i32 {
        exit::SIGNAL_BASE + self.0
    }

    /// The signal an exit status of 128 + N says a process died of.
    pub fn from_exit_code(code: i32) -> Option<Signal> {
        (code > exit::SIGNAL_BASE).then(|| Signal(code - exit::SIGNAL_BASE))
    }

    pub fn is_user_interrupt(self) -> bool {
        Signal::USER_INTERRUPTS.contains(&self)
    }

    /// "SIGKILL"; `None` for a number nix does not know.
    pub fn name(self) -> Option<&'static str> {
        self.to_nix().map(|s| s.as_str())
    }

    pub fn to_nix(self) -> Option<nix::sys::signal::Signal> {
        nix::sys::signal::Signal::try_from(self.0).ok()
    }
}

/// "SIGTERM"; "signal N" for a number without a name.
impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "signal {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_exit_codes() {
        assert_eq!(Signal::KILL.to_string(), "SIGKILL");
        assert_eq!(Signal::from_raw(99).to_string(), "signal 99");
        assert_eq!(Signal::from_raw(99).name(), None);
        assert_eq!(Signal::INT.exit_code(), 130);
        assert_eq!(Signal::from_exit_code(143), Some(Signal::TERM));
        assert_eq!(Signal::from_exit_code(1), None);
        assert!(Signal::HUP.is_user_interrupt() && !Signal::KILL.is_user_interrupt());
    }
}
