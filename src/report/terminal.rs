//! The terminal listener: the only writer of oomguard's own `oomguard:` lines
//! on stderr (the command's output passes through untouched, elsewhere).
//!
//! How much it says is decided once, when the run starts ([`Verbosity`]):
//! `--quiet` silences what a healthy run says (what it can change, each
//! decision, each relaunch), never a warning, an error, or the end summary;
//! `-v` adds every note. Callers say what kind of line they write, never test
//! the verbosity themselves.

use std::io::Write;
use std::sync::{Mutex, OnceLock};
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

/// This process's terminal on stderr.
static PROCESS: OnceLock<Terminal> = OnceLock::new();

/// This process's terminal, its verbosity decided here, once (from `--quiet`
/// and `-v`, where the subcommand has them): a later call keeps the first.
pub fn init(verbosity: Verbosity) -> &'static Terminal {
    let _ = PROCESS.set(Terminal::stderr(verbosity));
    get()
}

/// This process's terminal: every `oomguard:` line on stderr is written
/// through it. A subcommand without `--quiet`/`-v` says what a healthy run says.
pub fn get() -> &'static Terminal {
    PROCESS.get_or_init(|| Terminal::stderr(Verbosity::Normal))
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

    /// A line of a subcommand that names itself ("oomguard diagnose: ...").
    pub fn of(&self, who: &str, msg: &str) {
        self.write(&format!("oomguard {who}: {msg}\n"));
    }

    /// The events a user follows live: each decision (the rest of the lines
    /// carry what only the supervisor knows, and are said where it knows it).
    pub fn hear(&self, event: &Event) {
        if let Event::Decision { step, reason, .. } = event {
            self.info(&format!("decision: {step} — {reason}"));
        }
    }
}

impl Listener for Terminal {
    /// The events a user follows live: each decision (the rest of the lines
    /// carry what only the supervisor knows, and are said where it knows it).
    fn on(&mut self, _at: SystemTime, event: &Event) {
        self.hear(event);
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

    /// Every `oomguard:` line on stderr is written here: no other source file
    /// writes to stderr itself (`eprint!`, `eprintln!`, `io::stderr()`), test
    /// code aside.
    #[test]
    fn no_file_but_the_terminal_writes_to_stderr() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&src, &mut files);
        assert!(files.len() > 50, "{}", src.display());
        let mut writers = Vec::new();
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
            if rel == "report/terminal.rs" || rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(f).unwrap();
            // A file's own test module is test code.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (i, line) in code.lines().enumerate() {
                let l = line.trim_start();
                if l.starts_with("//") {
                    continue;
                }
                if ["eprintln!(", "eprint!(", "io::stderr()"]
                    .iter()
                    .any(|w| l.contains(w))
                {
                    writers.push(format!("{rel}:{}: {l}", i + 1));
                }
            }
        }
        assert!(
            writers.is_empty(),
            "write oomguard's lines through report::terminal:\n{}",
            writers.join("\n")
        );
    }
}
