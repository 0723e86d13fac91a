//! `oomguard diagnose --score DIR...`: how well the scanner tells labelled logs apart.
//!
//! Each file (`*.txt`, `*.log`) starts with `# key: value` header lines, among them
//! `# label:` (`cuda_oom`, `hang_after_oom`, `host_oom`, `not_oom`, or `unsettled`), then a
//! `# ---` line, then the log (the layout of `tests/fixtures/corpus/logs`). Every log is
//! classified as `diagnose` would, and per class the recall (of the logs with that label,
//! how many were found as such) and the precision (of the logs found as such, how many
//! have that label) are printed, then every log found otherwise, then every `unsettled`
//! log and what it was found as. An `unsettled` log is one whose thread does not settle
//! whether memory was the cause: it is in no class and counts in no precision (there is
//! no truth to score it against), but it is listed, never dropped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Kind, classify_log};

/// The label of a log whose thread does not settle whether memory was the cause.
pub const UNSETTLED: &str = "unsettled";

/// The kinds a label may be found as: a `not_oom` log is "left alone" when found as a
/// failure that is not memory (an absurd request is one: it never shrinks the run); an
/// `unsettled` log claims only that the run failed, so any failure will do.
pub fn expected(label: &str) -> Option<&'static [Kind]> {
    match label {
        "cuda_oom" | "hang_after_oom" => Some(&[Kind::GpuOom]),
        "host_oom" => Some(&[Kind::HostOom]),
        "not_oom" => Some(&[Kind::OtherFailure, Kind::AbsurdRequest]),
        UNSETTLED => Some(&[
            Kind::GpuOom,
            Kind::HostOom,
            Kind::AbsurdRequest,
            Kind::OtherFailure,
        ]),
        _ => None,
    }
}

/// One scored class: the labels in it and the kinds that count as finding it.
struct Class {
    name: &'static str,
    labels: &'static [&'static str],
    kinds: &'static [Kind],
}

const CLASSES: [Class; 3] = [
    Class {
        name: "GPU OOM",
        labels: &["cuda_oom", "hang_after_oom"],
        kinds: &[Kind::GpuOom],
    },
    Class {
        name: "host OOM",
        labels: &["host_oom"],
        kinds: &[Kind::HostOom],
    },
    Class {
        name: "not memory (left alone)",
        labels: &["not_oom"],
        kinds: &[Kind::OtherFailure, Kind::AbsurdRequest],
    },
];

/// One labelled log and what the scanner made of it.
#[derive(Debug, Clone)]
pub struct Scored {
    pub file: PathBuf,
    pub label: String,
    pub kind: Kind,
    pub line_no: u64,
    pub line: String,
}

/// Recall and precision of one class.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClassScore {
    pub class: &'static str,
    pub labels: &'static [&'static str],
    /// Logs with one of the labels.
    pub logs: usize,
    /// Of those, found as the class.
    pub found: usize,
    /// Logs found as the class, whatever their label.
    pub predicted: usize,
    pub recall: f64,
    pub precision: f64,
}

/// Why `diagnose --score` could not score the folders it was given.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: unknown label {label:?}", path.display())]
    UnknownLabel { path: PathBuf, label: String },
}

/// Classify every labelled log in `dirs`. An unreadable folder or a file without a
/// label is an error naming it.
pub fn score_dirs(dirs: &[PathBuf]) -> Result<Vec<Scored>, ScoreError> {
    let mut out = Vec::new();
    for dir in dirs {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| ScoreError::Read {
                path: dir.clone(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("txt" | "log")))
            .collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).map_err(|source| ScoreError::Read {
                path: path.clone(),
                source,
            })?;
            let Some((label, body)) = split_fixture(&bytes) else {
                continue; // INDEX.md-like files and unlabelled notes are not logs
            };
            if expected(&label).is_none() {
                return Err(ScoreError::UnknownLabel { path, label });
            }
            let f = classify_log(body);
            out.push(Scored {
                file: path,
                label,
                kind: f.kind,
                line_no: f.line_no,
                line: f.line,
            });
        }
    }
    Ok(out)
}

/// The label and the log of a fixture file; `None` without a `# label:` and `# ---`.
fn split_fixture(bytes: &[u8]) -> Option<(String, &[u8])> {
    let sep = b"# ---\n";
    let at = bytes.windows(sep.len()).position(|w| w == sep)?;
    let header = String::from_utf8_lossy(&bytes[..at]);
    let label = header
        .lines()
        .find_map(|l| l.strip_prefix("# label:"))?
        .trim()
        .to_string();
    Some((label, &bytes[at + sep.len()..]))
}

/// Whether a log has a settled label (one it can be scored against).
fn settled(s: &&Scored) -> bool {
    s.label != UNSETTLED
}

/// The logs whose thread does not settle whether memory was the cause.
pub fn unsettled(all: &[Scored]) -> Vec<&Scored> {
    all.iter().filter(|s| !settled(s)).collect()
}

/// Recall and precision per class, over the logs with a settled label.
pub fn scores(all: &[Scored]) -> Vec<ClassScore> {
    CLASSES
        .iter()
        .map(|c| {
            let labelled = |s: &&Scored| c.labels.contains(&s.label.as_str());
            let found_as = |s: &&Scored| c.kinds.contains(&s.kind);
            let logs = all.iter().filter(labelled).count();
            let found = all.iter().filter(labelled).filter(found_as).count();
            let predicted = all.iter().filter(settled).filter(found_as).count();
            let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
            ClassScore {
                class: c.name,
                labels: c.labels,
                logs,
                found,
                predicted,
                recall: ratio(found, logs),
                precision: ratio(found, predicted),
            }
        })
        .collect()
}

/// The logs found as something their label does not allow.
pub fn misses(all: &[Scored]) -> Vec<&Scored> {
    all.iter()
        .filter(|s| !expected(&s.label).is_some_and(|k| k.contains(&s.kind)))
        .collect()
}

/// The table as text (markdown, so docs/internals/detection.md can hold it as printed).
pub fn render_text(all: &[Scored]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| class | labels | logs | recall | precision |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for c in scores(all) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} ({}/{}) | {:.2} ({}/{}) |",
            c.class,
            c.labels.join(", "),
            c.logs,
            c.recall,
            c.found,
            c.logs,
            c.precision,
            c.found,
            c.predicted
        );
    }
    let open = unsettled(all);
    let scored = all.len() - open.len();
    let wrong = misses(all);
    if wrong.is_empty() {
        let _ = writeln!(s, "\nevery labelled log found as labelled ({scored} logs)");
    } else {
        let _ = writeln!(
            s,
            "\nfound otherwise ({} of {} logs):",
            wrong.len(),
            all.len()
        );
        for w in wrong {
            list(&mut s, w, true);
        }
    }
    if !open.is_empty() {
        let _ = writeln!(
            s,
            "\nunsettled, not scored ({} of {} logs: the thread does not settle whether memory was the cause):",
            open.len(),
            all.len()
        );
        for u in open {
            list(&mut s, u, false);
        }
    }
    s
}

/// One log's line in the text: its name, (its label,) what it was found as and where.
fn list(s: &mut String, w: &Scored, with_label: bool) {
    let name = w.file.file_name().map(Path::new).unwrap_or(&w.file);
    let line: String = w.line.chars().take(120).collect();
    let label = if with_label {
        format!("{}, ", w.label)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  {}: {label}found {} at line {}: {line}",
        name.display(),
        w.kind.as_str(),
        w.line_no
    );
}

/// The scores as one JSON object: `logs` (all of them), `scored` (those with a settled
/// label), `classes` (as the table), `misses` and `unsettled` (each with what it was
/// found as).
pub fn render_json(all: &[Scored]) -> String {
    let entry = |w: &Scored| {
        serde_json::json!({
            "file": w.file.display().to_string(),
            "label": w.label,
            "kind": w.kind.as_str(),
            "line_no": w.line_no,
            "line": w.line,
        })
    };
    let misses: Vec<serde_json::Value> = misses(all).into_iter().map(entry).collect();
    let open: Vec<serde_json::Value> = unsettled(all).into_iter().map(entry).collect();
    serde_json::json!({
        "logs": all.len(),
        "scored": all.len() - open.len(),
        "classes": scores(all),
        "misses": misses,
        "unsettled": open,
    })
    .to_string()
}

/// `oomguard diagnose --score DIR...`: 0 when it scored, 2 when a folder cannot be read.
pub fn score_main(dirs: &[PathBuf], json: bool) -> i32 {
    match score_dirs(dirs) {
        Ok(all) => {
            let text = if json {
                render_json(&all) + "\n"
            } else {
                render_text(&all)
            };
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not a failure of the scoring.
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
            crate::exit::SUCCESS
        }
        Err(e) => {
            crate::report::terminal::get().of("diagnose --score", &format!("cannot read {e}"));
            crate::exit::USAGE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(name: &str, label: &str, kind: Kind) -> Scored {
        Scored {
            file: PathBuf::from(format!("logs/{name}")),
            label: label.to_string(),
            kind,
            line_no: 3,
            line: format!("the line of {name}"),
        }
    }

    /// An unsettled log is in no class and in no precision, whatever it was found as,
    /// yet the text and the JSON both name it with what it was found as.
    #[test]
    fn unsettled_logs_are_not_scored_but_reported() {
        let all = vec![
            log("gpu.txt", "cuda_oom", Kind::GpuOom),
            log("not.txt", "not_oom", Kind::OtherFailure),
            log("open.txt", UNSETTLED, Kind::GpuOom),
        ];
        let gpu = scores(&all)
            .into_iter()
            .find(|c| c.class == "GPU OOM")
            .unwrap();
        assert_eq!((gpu.logs, gpu.found, gpu.predicted), (1, 1, 1));
        assert_eq!(gpu.precision, 1.0);
        assert!(misses(&all).is_empty());
        assert_eq!(unsettled(&all).len(), 1);

        let text = render_text(&all);
        assert!(
            text.contains("every labelled log found as labelled (2 logs)"),
            "{text}"
        );
        assert!(
            text.contains("unsettled, not scored (1 of 3 logs"),
            "{text}"
        );
        assert!(
            text.contains("  open.txt: found cuda_oom at line 3: the line of open.txt"),
            "{text}"
        );

        let v: serde_json::Value = serde_json::from_str(&render_json(&all)).unwrap();
        assert_eq!(v["logs"], 3);
        assert_eq!(v["scored"], 2);
        assert_eq!(v["unsettled"][0]["file"], "logs/open.txt");
        assert_eq!(v["unsettled"][0]["kind"], "cuda_oom");
    }

    /// An unsettled log found as no failure is a miss: the label still says it failed.
    #[test]
    fn an_unsettled_log_found_as_no_failure_is_a_miss() {
        let all = vec![log("open.txt", UNSETTLED, Kind::NoFailure)];
        assert_eq!(misses(&all).len(), 1);
        assert!(render_text(&all).contains("found otherwise (1 of 1 logs)"));
    }
}
