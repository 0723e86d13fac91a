//! The documentation cannot drift from the program: every option and subcommand of
//! `oomguard --help` is in docs/reference.md, every test the docs name (`file::test`)
//! exists, every relative link resolves, the README's `plan` command plans, and the
//! README's test command is the one `.ci/run` runs.

mod common;
use common::OOMGUARD;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use regex::Regex;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, ARCHITECTURE.md, benches/README.md and every Markdown file under docs/.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![
        root().join("README.md"),
        root().join("ARCHITECTURE.md"),
        root().join("benches/README.md"),
    ];
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

fn help(args: &[&str]) -> String {
    let out = Command::new(OOMGUARD)
        .args(args)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "oomguard {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `oomguard --help` lists (less `help`).
fn subcommands(top: &str) -> Vec<String> {
    let Some(list) = top.split("\nCommands:\n").nth(1) else {
        return Vec::new();
    };
    list.lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

/// The long options a `--help` text defines (`--name`), less `--help` and `--version`.
fn long_options(text: &str) -> Vec<String> {
    let re = Regex::new(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)").unwrap();
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| re.captures(l).map(|c| c[1].to_string()))
        .filter(|o| o != "--help" && o != "--version")
        .collect();
    v.dedup();
    v
}

/// Every option and subcommand clap defines (through the real binary's `--help`, so
/// a new one cannot be left out of the reference) is named in docs/reference.md: each
/// subcommand as `oomguard NAME`, each option as `--name` (a subcommand's option in
/// a row or line that names the subcommand too).
#[test]
fn every_cli_option_and_subcommand_is_in_the_reference() {
    let reference = fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let top = help(&[]);
    let subs = subcommands(&top);
    assert!(
        subs.len() >= 9,
        "too few subcommands in --help: {subs:?}\n{top}"
    );
    let mut missing = Vec::new();
    let run_options = long_options(&top);
    for o in &run_options {
        if !reference.contains(&format!("`{o}")) && !reference.contains(&format!(" {o}")) {
            missing.push(format!("option {o}"));
        }
    }
    for s in &subs {
        if !reference.contains(&format!("oomguard {s}")) {
            missing.push(format!("subcommand `oomguard {s}`"));
        }
        let takes_run_options = reference
            .lines()
            .any(|l| l.contains(&format!("oomguard {s}`")) && l.contains("every option of a run"));
        for o in long_options(&help(&[s])) {
            if takes_run_options && run_options.contains(&o) {
                continue;
            }
            let named = reference.lines().any(|l| {
                (l.contains(&format!("{s} ")) || l.contains(&format!("{s}`")))
                    && (l.contains(&format!("{o} "))
                        || l.contains(&format!("{o}`"))
                        || l.contains(&format!("{o}]"))
                        || l.contains(&format!("{o},")))
            });
            if !named {
                missing.push(format!("`oomguard {s} {o}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/reference.md does not name: {}",
        missing.join(", ")
    );
}

/// A test function `name` in `file`: `fn name(` in the file itself, or for a unit
/// test in `src/x.rs`, in `src/x/tests.rs` or `src/x/*.rs`.
fn test_exists(file: &str, name: &str) -> bool {
    let needle = format!("fn {name}(");
    let path = root().join(file);
    if fs::read_to_string(&path).is_ok_and(|t| t.contains(&needle)) {
        return true;
    }
    let dir = path.with_extension("");
    fs::read_dir(&dir).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&needle)))
    })
}

/// Every test the documentation names exists: each `file::test` (a Guarantees line, a
/// benchmark's check), and each bare `test_name` listed right after one in the same
/// list (`tests/x.rs::a`, `b`, `c`), in that file.
#[test]
fn every_test_named_in_the_docs_exists() {
    let span = Regex::new(r"`([^`\n]+)`").unwrap();
    let named = Regex::new(r"^((?:tests|src)/[\w/]+\.rs)::(\w+)$").unwrap();
    let bare = Regex::new(r"^[a-z0-9]+(?:_[a-z0-9]+){3,}$").unwrap();
    let glue = Regex::new(r"^[\s,;]*$").unwrap();
    let mut count = 0;
    let mut missing = Vec::new();
    for md in markdown_files() {
        let text = fs::read_to_string(&md).unwrap();
        let mut last: Option<(String, usize)> = None;
        for m in span.captures_iter(&text) {
            let whole = m.get(0).unwrap();
            let s = &m[1];
            if let Some(c) = named.captures(s) {
                count += 1;
                if !test_exists(&c[1], &c[2]) {
                    missing.push(format!("{}: {s}", md.display()));
                }
                last = Some((c[1].to_string(), whole.end()));
                continue;
            }
            match &last {
                Some((file, end))
                    if bare.is_match(s) && glue.is_match(&text[*end..whole.start()]) =>
                {
                    count += 1;
                    if !test_exists(file, s) {
                        missing.push(format!("{}: {file}::{s}", md.display()));
                    }
                    last = Some((file.clone(), whole.end()));
                }
                _ => last = None,
            }
        }
    }
    assert!(count >= 150, "only {count} tests named in the docs");
    assert!(
        missing.is_empty(),
        "named but not found:\n{}",
        missing.join("\n")
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut v = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fence = !fence;
        }
        if !fence && l.starts_with('#') {
            v.push(slug(l.trim_start_matches('#')));
        }
    }
    v
}

/// Every relative link in the docs names a file that exists, and an anchor a heading
/// of that file has.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let link = Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    for md in markdown_files() {
        let text = fs::read_to_string(&md).unwrap();
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                md.clone()
            } else {
                md.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", md.display()));
                continue;
            }
            if !frag.is_empty() && path.is_file() {
                let t = fs::read_to_string(&path).unwrap();
                if !anchors(&t).iter().any(|a| a == frag) {
                    broken.push(format!("{}: {target} (no such heading)", md.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README's test command is `bash tests/run.sh`, and `.ci/run` runs it.
#[test]
fn the_readmes_test_command_is_the_one_ci_runs() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.lines().any(|l| l == "    bash tests/run.sh"),
        "the README does not show `bash tests/run.sh` as a command"
    );
    let ci = fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "bash tests/run.sh"),
        ".ci/run does not run the README's test command"
    );
}

/// The README's "run `oomguard plan` first" command, run as written (with `--json`)
/// in a folder holding its script: it plans, and finds the micro-batch and the
/// accumulation where the command sets them.
#[test]
fn the_readmes_plan_command_plans_as_written() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let mut cmd = String::new();
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if let Some(code) = l.strip_prefix("    oomguard plan ") {
            cmd = code.to_string();
            while cmd.ends_with('\\') {
                cmd.pop();
                cmd.push(' ');
                cmd.push_str(lines.next().unwrap().trim());
            }
            break;
        }
    }
    assert!(
        !cmd.is_empty(),
        "the README shows no `oomguard plan` command"
    );
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("train.py"), "").unwrap();
    let out = Command::new(OOMGUARD)
        .current_dir(t.path())
        .env("HOME", t.path())
        .stdin(Stdio::null())
        .args(["plan", "--json"])
        .args(cmd.split_whitespace())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`oomguard plan {cmd}`: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["knobs"]["micro_batch"]["binding"], "flag --per_device_train_batch_size",
        "{stdout}"
    );
    assert_eq!(
        v["knobs"]["grad_accum"]["binding"], "flag --gradient_accumulation_steps",
        "{stdout}"
    );
}
