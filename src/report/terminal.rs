//! The terminal listener: the only writer of oomguard's own `oomguard:` lines
//! on stderr (the command's output passes through untouched, elsewhere).
//!
//! How much it says is decided once, when the run starts ([`Verbosity`]):
//! `--quiet` silences what a healthy run says (what it can change, each
//! decision, each relaunch), never a warning, an error, or the end summary;
//! `-v` adds every note. Callers say what kind of line they write, never test
//! the verbosity themselves.

use std::io::Write;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::events::{Event, Listener};

/// How much oomguard says, from `--quiet` and `-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// Warnings, errors and the summary only.
    Quiet,
    /// What a user must know of a night's run.
    Normal,
    /// And every note.
    Verbose,
}

impl Verbosity {
    /// `--quiet` wins over `-v`.
    pub fn of(quiet: bool, verbose: u8) -> Verbosity {
        match (quiet, verbose) {
            (true, _) => Verbosity::Quiet,
            (false, 0) => Verbosity::Normal,
            (false, _) => Verbosity::Verbose,
        }
    }
}

/// Writes `oomguard:` lines to a sink (stderr in a run, a buffer in tests).
pub struct Terminal {
    verbosity: Verbosity,
    sink: Mutex<Box<dyn Write + Send>>,
}

impl Terminal {
    /// oomguard's stderr.
    pub fn stderr(verbosity: Verbosity) -> Terminal {
        Terminal::to(verbosity, Box::new(std::io::stderr()))
    }

    pub fn to(verbosity: Verbosity, sink: Box<dyn Write + Send>) -> Terminal {
        Terminal {
            verbosity,
            sink: Mutex::new(sink),
        }
    }

    fn write(&self, text: &str) {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        // A reader that went away (`| head`) is not the run's failure.
        let _ = sink.write_all(text.as_bytes()).and_then(|()| sink.flush());
    }

    fn line(&self, text: &str) {
        self.write(&format!("oomguard: {text}\n"));
    }

    /// What a healthy run says (silenced by `--quiet`).
    pub fn info(&self, msg: &str) {
        if self.verbosity != Verbosity::Quiet {
            self.line(msg);
        }
    }

    /// A line for `-v` only (the command of the first attempt, the GPUs
    /// before each).
    pub fn detail(&self, msg: &str) {
        if self.verbosity == Verbosity::Verbose {
            self.line(msg);
        }
    }

    /// A note: said with `-v` only, or when `shown` (a note a user must see).
    pub fn note(&self, msg: &str, shown: bool) {
        if self.verbosity == Verbosity::Verbose || (shown && self.verbosity != Verbosity::Quiet) {
            self.line(&format!("note: {msg}"));
        }
    }

    /// Said whatever the verbosity: what went wrong, what oomguard does about
    /// it, why it stops.
    pub fn say(&self, msg: &str) {
        self.line(msg);
    }

    pub fn warn(&self, msg: &str) {
        self.line(&format!("warning: {msg}"));
    }

    pub fn error(&self, msg: &str) {
        self.line(&format!("error: {msg}"));
    }

    /// A block already in `oomguard:` lines (the end summary), as it is.
    pub fn block(&self, text: &str) {
        self.write(text);
    }
}

impl Listener for Terminal {
    /// The events a user follows live: each decision (the rest of the lines
    /// carry what only the supervisor knows, and are said where it knows it).
    fn on(&mut self, _at: SystemTime, event: &Event) {
        if let Event::Decision { step, reason, .. } = event {
            self.info(&format!("decision: {step} — {reason}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink the test can read back.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn said(v: Verbosity) -> String {
        let buf = Buf::default();
        let mut t = Terminal::to(v, Box::new(buf.clone()));
        t.info("attempt 2/8: python3 train.py");
        t.detail("GPUs before attempt 2: GPU 0 free");
        t.note("a note for -v", false);
        t.note("a note a user must see", true);
        t.warn("the kernel's log cannot be read");
        t.error("cannot prepare attempt 2");
        t.say("interrupted by SIGINT; not relaunching");
        t.on(
            SystemTime::now(),
            &Event::Decision {
                attempt: 1,
                step: crate::policy::StepKind::HalveMicroBatch,
                before: Default::default(),
                after: Default::default(),
                global_batch_before: None,
                global_batch_after: None,
                reason: "OOM: micro-batch 8 → 4".into(),
                resume: None,
                resume_step: None,
            },
        );
        t.on(
            SystemTime::now(),
            &Event::Suspect {
                attempt: 1,
                why: "x".into(),
            },
        );
        t.block("\noomguard: finished after 2 attempts\n");
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn verbosity_is_decided_once_and_quiet_keeps_warnings_errors_and_the_summary() {
        assert_eq!(Verbosity::of(true, 2), Verbosity::Quiet);
        assert_eq!(Verbosity::of(false, 0), Verbosity::Normal);
        assert_eq!(Verbosity::of(false, 1), Verbosity::Verbose);
        assert_eq!(
            said(Verbosity::Quiet),
            "oomguard: warning: the kernel's log cannot be read\n\
             oomguard: error: cannot prepare attempt 2\n\
             oomguard: interrupted by SIGINT; not relaunching\n\
             \noomguard: finished after 2 attempts\n"
        );
        assert_eq!(
            said(Verbosity::Normal),
            "oomguard: attempt 2/8: python3 train.py\n\
             oomguard: note: a note a user must see\n\
             oomguard: warning: the kernel's log cannot be read\n\
             oomguard: error: cannot prepare attempt 2\n\
             oomguard: interrupted by SIGINT; not relaunching\n\
             oomguard: decision: halve_micro_batch — OOM: micro-batch 8 → 4\n\
             \noomguard: finished after 2 attempts\n"
        );
        let verbose = said(Verbosity::Verbose);
        assert!(verbose.contains("oomguard: GPUs before attempt 2: GPU 0 free\n"));
        assert!(
            verbose.contains("oomguard: note: a note for -v\n"),
            "{verbose}"
        );
        assert!(verbose.contains("oomguard: note: a note a user must see\n"));
    }
}
