//! The run's record: a folder with `journal.jsonl` (one JSON object a line) and
//! one folder per attempt, plus the end-of-run summary table.
//!
//! Writing the journal must never stop a healthy training: every write error
//! becomes one warning on stderr and supervision goes on.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

pub struct Journal {
    dir: Option<PathBuf>,
    file: Option<File>,
    warned: bool,
}

/// Create `dir` and its parents readable by the user only (configs can hold tokens).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Write `bytes` to `path` (created or truncated) readable by the user only.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// `.oomguard/runs/<local time>`, with `-2`, `-3`... when two runs start in the same second.
pub fn default_run_dir() -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let base = Path::new(".oomguard").join("runs");
    let mut dir = base.join(&stamp);
    let mut n = 2;
    while dir.exists() {
        dir = base.join(format!("{stamp}-{n}"));
        n += 1;
    }
    dir
}

impl Journal {
    /// Open the journal in `dir`. On failure, warn once and run without one.
    pub fn open(dir: PathBuf) -> Journal {
        let result = create_private_dir(&dir).and_then(|()| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(dir.join("journal.jsonl"))
        });
        match result {
            Ok(file) => Journal {
                dir: Some(dir),
                file: Some(file),
                warned: false,
            },
            Err(e) => {
                eprintln!(
                    "oomguard: warning: cannot write the run folder {}: {e}; supervising without a journal",
                    dir.display()
                );
                Journal {
                    dir: None,
                    file: None,
                    warned: true,
                }
            }
        }
    }

    pub fn path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("journal.jsonl"))
    }

    /// The folder for attempt `n`, created on demand; `None` when it cannot be.
    pub fn attempt_dir(&mut self, n: u32) -> Option<PathBuf> {
        let d = self.dir.as_ref()?.join(format!("attempt-{n}"));
        match create_private_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                self.warn(&format!("cannot create {}: {e}", d.display()));
                None
            }
        }
    }

    /// Append one event: `{"event": name, "time": ..., ...fields}`.
    pub fn event(&mut self, name: &str, fields: Json) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut obj = json!({
            "event": name,
            "time": chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, false),
        });
        if let (Some(o), Json::Object(f)) = (obj.as_object_mut(), fields) {
            o.extend(f);
        }
        let mut line = obj.to_string();
        line.push('\n');
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            self.warn(&format!("cannot write the journal: {e}"));
        }
    }

    fn warn(&mut self, msg: &str) {
        if !self.warned {
            eprintln!("oomguard: warning: {msg}; supervision goes on");
            self.warned = true;
        }
    }
}

/// One row of the summary table.
pub struct Row {
    pub knob: String,
    pub before: String,
    pub after: String,
    pub why: String,
}

/// Render the summary table (knob, before, after, why) as aligned text.
pub fn table(rows: &[Row]) -> String {
    let w0 = rows.iter().map(|r| r.knob.len()).max().unwrap_or(0).max(4);
    let w1 = rows
        .iter()
        .map(|r| r.before.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let w2 = rows.iter().map(|r| r.after.len()).max().unwrap_or(0).max(5);
    let mut out = format!("  {:w0$}  {:w1$}  {:w2$}  why\n", "knob", "before", "after");
    for r in rows {
        out.push_str(&format!(
            "  {:w0$}  {:w1$}  {:w2$}  {}\n",
            r.knob, r.before, r.after, r.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn events_are_json_lines_in_a_private_folder() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("runs/x");
        let mut j = Journal::open(dir.clone());
        j.event("attempt_start", json!({"attempt": 1}));
        j.event("attempt_end", json!({"attempt": 1, "outcome": "success"}));
        let text = fs::read_to_string(dir.join("journal.jsonl")).unwrap();
        let lines: Vec<Json> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["outcome"], "success");
        assert_eq!(lines[0]["event"], "attempt_start");
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let mode = fs::metadata(dir.join("journal.jsonl"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn unwritable_folder_is_a_warning_not_an_error() {
        let mut j = Journal::open(PathBuf::from("/proc/oomguard-cannot-write"));
        j.event("x", json!({}));
        assert!(j.path().is_none());
        assert!(j.attempt_dir(1).is_none());
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&[Row {
            knob: "micro_batch".into(),
            before: "16".into(),
            after: "4".into(),
            why: "OOM".into(),
        }]);
        assert_eq!(
            t,
            "  knob         before  after  why\n  micro_batch  16      4      OOM\n"
        );
    }
}
