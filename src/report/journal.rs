//! The journal listener: the run folder's `journal.jsonl`, one [`Event`] a line
//! with the time it happened added, and one folder per attempt.
//!
//! A leaf: it knows the event type and the run folder's file rules, nothing of
//! the pipeline. Writing the journal must never stop a healthy training: a
//! write error becomes one warning, which the supervisor takes
//! ([`Journal::take_warnings`]) and the terminal says, and supervision goes on.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

use serde_json::Value as Json;

use crate::events::{Event, Listener};
use crate::run_folder::{RunFolder, create_private_dir};

pub struct Journal {
    dir: Option<PathBuf>,
    file: Option<File>,
    warned: bool,
    /// Warnings not yet said (see [`Journal::take_warnings`]).
    warnings: Vec<String>,
}

/// A time as the journal writes it (RFC 3339, local, milliseconds).
pub fn stamp(at: SystemTime) -> String {
    let t: chrono::DateTime<chrono::Local> = at.into();
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, false)
}

impl Journal {
    /// Open the journal in `dir`. On failure, run without one: the warning
    /// waits in [`Journal::take_warnings`].
    pub fn open(dir: PathBuf) -> Journal {
        // Appended to (a run folder given again keeps every run's lines), but
        // never through a symlink or a link to another file.
        let result = create_private_dir(&dir)
            .and_then(|()| crate::run_folder::open_append(&RunFolder::at(&dir).journal()));
        match result {
            Ok(file) => Journal {
                dir: Some(dir),
                file: Some(file),
                warned: false,
                warnings: Vec::new(),
            },
            Err(e) => Journal {
                warnings: vec![format!(
                    "cannot write the run folder {}: {e}; supervising without a journal",
                    dir.display()
                )],
                dir: None,
                file: None,
                warned: true,
            },
        }
    }

    pub fn path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| RunFolder::at(d).journal())
    }

    /// The folder for attempt `n`, created on demand; `None` when it cannot be.
    pub fn attempt_dir(&mut self, n: u32) -> Option<PathBuf> {
        let d = RunFolder::at(self.dir.as_ref()?).attempt(n);
        match create_private_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                self.warn(&format!("cannot create {}: {e}", d.display()));
                None
            }
        }
    }

    /// Append one event: `{"event": name, "time": ..., ...fields}`.
    pub fn record(&mut self, at: SystemTime, event: &Event) {
        if self.file.is_none() {
            return;
        }
        let mut obj = match serde_json::to_value(event) {
            Ok(v) => v,
            Err(e) => {
                // Paths and argv are written lossily, so this is a field type
                // added later that cannot be JSON: say so once, keep supervising.
                self.warn(&format!("cannot write a journal event: {e}"));
                return;
            }
        };
        if let Json::Object(o) = &mut obj {
            o.insert("time".into(), Json::String(stamp(at)));
        }
        let mut line = obj.to_string();
        line.push('\n');
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            self.warn(&format!("cannot write the journal: {e}"));
        }
    }

    /// The warnings (one a run at most, and the folder that cannot be
    /// written) not yet said.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn warn(&mut self, msg: &str) {
        if !self.warned {
            self.warnings.push(format!("{msg}; supervision goes on"));
            self.warned = true;
        }
    }
}

impl Listener for Journal {
    fn on(&mut self, at: SystemTime, event: &Event) {
        self.record(at, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::OutcomeKind;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn events_are_json_lines_in_a_private_folder() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("runs/x");
        let mut j = Journal::open(dir.clone());
        let now = SystemTime::now();
        j.on(
            now,
            &Event::Suspect {
                attempt: 1,
                why: "a test".into(),
            },
        );
        j.on(
            now,
            &Event::AttemptEnd {
                attempt: 1,
                status: 0,
                exit: "exit code 0".into(),
                outcome: OutcomeKind::Success,
                why: None,
                kernel_oom_kill: None,
                duration_s: 1.5,
                error_line: None,
                gpu_peak: None,
                torchrun: None,
            },
        );
        let text = fs::read_to_string(dir.join("journal.jsonl")).unwrap();
        let lines: Vec<Json> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["outcome"], "success");
        assert_eq!(lines[0]["event"], "suspect");
        assert_eq!(lines[1]["event"], "attempt_end");
        assert_eq!(lines[1]["time"], stamp(now).as_str());
        // Every key of today's line, sorted, with "time" among them.
        let keys: Vec<&String> = lines[1].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "attempt",
                "duration_s",
                "error_line",
                "event",
                "exit",
                "gpu_peak",
                "outcome",
                "status",
                "time"
            ]
        );
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let mode = fs::metadata(dir.join("journal.jsonl"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(j.take_warnings().is_empty());
    }

    #[test]
    fn unwritable_folder_is_a_warning_not_an_error() {
        let mut j = Journal::open(PathBuf::from("/proc/oomguard-cannot-write"));
        j.on(
            SystemTime::now(),
            &Event::Suspect {
                attempt: 1,
                why: "x".into(),
            },
        );
        assert!(j.path().is_none());
        assert!(j.attempt_dir(1).is_none());
        let w = j.take_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("cannot write the run folder /proc/oomguard-cannot-write"));
        assert!(j.take_warnings().is_empty());
    }
}
