//! `oomguard diagnose --score DIR...`: how well the scanner tells labelled logs apart.
//!
//! Each file (`*.txt`, `*.log`) starts with `# key: value` header lines, among them
//! `# label:` (`cuda_oom`, `hang_after_oom`, `host_oom`, `not_oom`), then a `# ---` line,
//! then the log (the layout of `tests/fixtures/corpus/logs`). Every log is classified as
//! `diagnose` would, and per class the recall (of the logs with that label, how many were
//! found as such) and the precision (of the logs found as such, how many have that label)
//! are printed, then every log found otherwise.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Kind, classify_log};

/// The kinds a label may be found as: a `not_oom` log is "left alone" when found as a
/// failure that is not memory (an absurd request is one: it never shrinks the run).
pub fn expected(label: &str) -> Option<&'static [Kind]> {
    match label {
        "cuda_oom" | "hang_after_oom" => Some(&[Kind::GpuOom]),
        "host_oom" => Some(&[Kind::HostOom]),
        "not_oom" => Some(&[Kind::OtherFailure, Kind::AbsurdRequest]),
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

/// Classify every labelled log in `dirs`. An unreadable folder or a file without a
/// label is an error naming it.
pub fn score_dirs(dirs: &[PathBuf]) -> Result<Vec<Scored>, String> {
    let mut out = Vec::new();
    for dir in dirs {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("txt" | "log")))
            .collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let Some((label, body)) = split_fixture(&bytes) else {
                continue; // INDEX.md-like files and unlabelled notes are not logs
            };
            if expected(&label).is_none() {
                return Err(format!("{}: unknown label {label:?}", path.display()));
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

/// Recall and precision per class.
pub fn scores(all: &[Scored]) -> Vec<ClassScore> {
    CLASSES
        .iter()
        .map(|c| {
            let labelled = |s: &&Scored| c.labels.contains(&s.label.as_str());
            let found_as = |s: &&Scored| c.kinds.contains(&s.kind);
            let logs = all.iter().filter(labelled).count();
            let found = all.iter().filter(labelled).filter(found_as).count();
            let predicted = all.iter().filter(found_as).count();
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

/// The table as text (markdown, so the README can hold it as printed).
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
    let wrong = misses(all);
    if wrong.is_empty() {
        let _ = writeln!(s, "\nevery log found as labelled ({} logs)", all.len());
    } else {
        let _ = writeln!(
            s,
            "\nfound otherwise ({} of {} logs):",
            wrong.len(),
            all.len()
        );
        for w in wrong {
            let name = w.file.file_name().map(Path::new).unwrap_or(&w.file);
            let line: String = w.line.chars().take(120).collect();
            let _ = writeln!(
                s,
                "  {}: {}, found {} at line {}: {line}",
                name.display(),
                w.label,
                w.kind.as_str(),
                w.line_no
            );
        }
    }
    s
}

/// The scores as one JSON object: `classes` (as the table) and `misses`.
pub fn render_json(all: &[Scored]) -> String {
    let misses: Vec<serde_json::Value> = misses(all)
        .into_iter()
        .map(|w| {
            serde_json::json!({
                "file": w.file.display().to_string(),
                "label": w.label,
                "kind": w.kind.as_str(),
                "line_no": w.line_no,
                "line": w.line,
            })
        })
        .collect();
    serde_json::json!({
        "logs": all.len(),
        "classes": scores(all),
        "misses": misses,
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
            eprintln!("oomguard diagnose --score: cannot read {e}");
            crate::exit::USAGE
        }
    }
}
