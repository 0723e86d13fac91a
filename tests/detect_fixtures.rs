//! `oomguard diagnose` through the real binary, on the project's own small logs
//! (tests/fixtures/logs) and on the labelled set of real logs copied from public issue
//! threads (tests/fixtures/corpus/logs). The detection details are unit-tested in src/detect/tests.rs;
//! this checks the command: exit codes, the JSON contract, stdin, the error message.

mod common;
use common::OOMGUARD;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Run `oomguard ARGS` with `stdin` as input; on failure the caller prints `describe`.
fn oomguard(args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut child = Command::new(OOMGUARD)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn oomguard");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().expect("wait for oomguard")
}

fn describe(args: &[&str], out: &Output) -> String {
    format!(
        "command: {OOMGUARD} {}\nstatus: {}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// (file name, label, log body) for every fixture in `dir`.
fn fixtures(dir: &Path) -> Vec<(String, String, Vec<u8>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("txt" | "log")))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            let label = text
                .lines()
                .find_map(|l| l.strip_prefix("# label:"))
                .expect("a label")
                .trim()
                .to_string();
            let at = text.find("# ---\n").expect("a '# ---' line") + "# ---\n".len();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, label, bytes[at..].to_vec())
        })
        .collect()
}

/// The kinds `diagnose` may answer for a label: a `not_oom` log is a failure that is not
/// memory, an absurd request among them (it never shrinks the run); an `unsettled` log
/// (its thread does not settle whether memory was the cause) is some failure.
fn expected_kinds(label: &str) -> &'static [&'static str] {
    match label {
        "cuda_oom" | "hang_after_oom" => &["cuda_oom"],
        "host_oom" => &["host_oom"],
        "not_oom" => &["other_failure", "absurd_request"],
        "unsettled" => &["cuda_oom", "host_oom", "other_failure", "absurd_request"],
        other => panic!("unknown label {other}"),
    }
}

fn check_dir(dir: &Path) {
    let all = fixtures(dir);
    assert!(!all.is_empty(), "no fixtures in {}", dir.display());
    let tmp = tempfile::tempdir().unwrap();
    for (name, label, body) in all {
        let file = tmp.path().join(&name);
        std::fs::write(&file, &body).unwrap();
        let args = ["diagnose", "--json", file.to_str().unwrap()];
        let out = oomguard(&args, None);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}\n{}",
            describe(&args, &out)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name}: not JSON ({e})\n{}", describe(&args, &out)));
        let kind = v["kind"].as_str().unwrap_or_default();
        assert!(
            expected_kinds(&label).contains(&kind),
            "{name}: label {label}, found {kind}\n{}",
            describe(&args, &out)
        );
        for key in [
            "line",
            "line_no",
            "device",
            "tried_to_allocate_bytes",
            "total_bytes",
            "free_bytes",
            "allocated_bytes",
            "reserved_unallocated_bytes",
            "other_processes",
            "phase",
            "advice",
        ] {
            assert!(
                v.get(key).is_some(),
                "{name}: no {key}\n{}",
                describe(&args, &out)
            );
        }
    }
}

#[test]
fn own_logs_classify_as_labelled() {
    check_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs"));
}

#[test]
fn corpus_logs_classify_as_labelled() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus/logs");
    assert!(
        dir.is_dir(),
        "{} is missing: it is part of the repository (restore it with git checkout)",
        dir.display()
    );
    check_dir(&dir);
}

#[test]
fn stdin_and_dash_read_standard_input_in_human_form() {
    let log = b"step 3\n[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a total capacity of 10.00 GiB of which 4.00 MiB is free. Of the allocated memory 9.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\n";
    for args in [&["diagnose"][..], &["diagnose", "-"][..]] {
        let out = oomguard(args, Some(log));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", describe(args, &out));
        assert!(
            text.starts_with("kind: cuda_oom"),
            "{}",
            describe(args, &out)
        );
        assert!(
            text.contains("line 2: torch.OutOfMemoryError"),
            "{}",
            describe(args, &out)
        );
        assert!(text.contains("device: GPU 2"), "{}", describe(args, &out));
        assert!(
            text.contains("tried to allocate: 20.00 MiB"),
            "{}",
            describe(args, &out)
        );
        assert!(text.contains("advice: "), "{}", describe(args, &out));
    }
}

#[test]
fn clean_log_is_no_failure_with_null_numbers() {
    let args = ["diagnose", "--json"];
    let out = oomguard(&args, Some(b"epoch 1 loss 0.4\nsaved checkpoint-100\n"));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "no_failure");
    assert_eq!(v["line"], "");
    assert!(v["tried_to_allocate_bytes"].is_null());
    assert!(v["device"].is_null());
}

#[test]
fn unreadable_file_exits_2_naming_file_and_os_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such.log");
    let args = ["diagnose", missing.to_str().unwrap()];
    let out = oomguard(&args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    assert!(err.contains("no-such.log"), "{}", describe(&args, &out));
    assert!(
        err.contains("No such file or directory"),
        "{}",
        describe(&args, &out)
    );
    assert!(out.stdout.is_empty(), "{}", describe(&args, &out));
}

/// `oomguard run` is not a command (oomguard runs `oomguard COMMAND...`): no advice may
/// name it. Every kind of advice is reached: each labelled log, and a clean one.
#[test]
fn advice_never_names_a_command_that_does_not_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for dir in ["tests/fixtures/logs", "tests/fixtures/corpus/logs"] {
        for (name, _, body) in fixtures(&root.join(dir)) {
            inputs.push((name, body));
        }
    }
    inputs.push(("a clean log".into(), b"epoch 1 loss 0.4\n".to_vec()));
    let args = ["diagnose", "--json"];
    let mut seen = std::collections::BTreeSet::new();
    for (name, body) in &inputs {
        let out = oomguard(&args, Some(body));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}\n{}",
            describe(&args, &out)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let advice = v["advice"].as_str().unwrap_or_default().to_string();
        assert!(
            !advice.is_empty() && !advice.contains("oomguard run"),
            "{name}: advice {advice:?}\n{}",
            describe(&args, &out)
        );
        seen.insert(advice);
    }
    // Fragmented, crowded, a per-process cap, one request beyond the GPU, plain GPU OOM,
    // an OOM while loading and one while saving (their tracebacks say so), host OOM,
    // absurd request, thrust's sizeless bad_alloc, other failure, no failure. (An
    // evaluation's advice: src/detect/tests.rs::diagnose_says_the_phase_and_advises_for_it.)
    assert_eq!(seen.len(), 12, "expected all twelve advices, saw {seen:#?}");
}

/// The "done when", on the project's whole fixture set, by the command the docs
/// give (`oomguard diagnose --score`): GPU-OOM recall ≥ 0.98 with precision 1.00, host-OOM
/// recall ≥ 0.90, failures that are not memory left alone 1.00 — over every log with a
/// settled label. The `unsettled` logs (the thread does not settle whether memory was the
/// cause) are in no score, but the command reports each of them, text and JSON, with what
/// it was found as. docs/internals/detection.md shows the command's table as printed
/// (the test keeps its name from when the README held it).
#[test]
fn fixture_scores_meet_the_thresholds_and_the_readme_shows_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = ["tests/fixtures/corpus/logs", "tests/fixtures/logs"];
    let mut args = vec!["diagnose", "--score"];
    args.extend(dirs);
    let run = |json: bool| {
        let mut a = args.clone();
        if json {
            a.insert(1, "--json");
        }
        let mut c = Command::new(OOMGUARD);
        let out = c.args(&a).current_dir(root).output().expect("run oomguard");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&a, &out));
        (a, out)
    };
    let (a, out) = run(true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e})\n{}", describe(&a, &out)));
    let name_of = |m: &serde_json::Value| {
        let file = m["file"].as_str().unwrap();
        file.rsplit('/').next().unwrap().to_string()
    };
    let misses: Vec<String> = v["misses"]
        .as_array()
        .unwrap()
        .iter()
        .map(name_of)
        .collect();
    assert!(
        misses.is_empty(),
        "logs found otherwise than labelled: {misses:?}\n{}",
        describe(&a, &out)
    );

    // Every unsettled log is reported (none hidden), with what it was found as.
    let mut open: Vec<String> = Vec::new();
    let mut logs = 0;
    for dir in dirs {
        for (name, label, _) in fixtures(&root.join(dir)) {
            logs += 1;
            if label == "unsettled" {
                open.push(name);
            }
        }
    }
    let mut reported: Vec<String> = v["unsettled"]
        .as_array()
        .unwrap()
        .iter()
        .map(name_of)
        .collect();
    reported.sort();
    open.sort();
    assert_eq!(reported, open, "{}", describe(&a, &out));
    assert_eq!(v["logs"], logs, "{}", describe(&a, &out));
    assert_eq!(v["scored"], logs - open.len(), "{}", describe(&a, &out));
    for u in v["unsettled"].as_array().unwrap() {
        assert!(
            u["kind"].as_str().is_some_and(|k| k != "no_failure"),
            "{u}\n{}",
            describe(&a, &out)
        );
    }

    let score = |name: &str| {
        let c = v["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["class"] == name)
            .unwrap_or_else(|| panic!("no class {name}\n{}", describe(&a, &out)));
        (
            c["recall"].as_f64().unwrap(),
            c["precision"].as_f64().unwrap(),
        )
    };
    let (gpu_recall, gpu_precision) = score("GPU OOM");
    let (host_recall, _) = score("host OOM");
    let (left_alone, _) = score("not memory (left alone)");
    let scores = format!(
        "GPU recall {gpu_recall:.3} precision {gpu_precision:.3}, host recall {host_recall:.3}, left alone {left_alone:.3}"
    );
    assert!(gpu_recall >= 0.98, "{scores}");
    assert!(gpu_precision >= 1.0, "{scores}");
    assert!(host_recall >= 0.90, "{scores}");
    assert!(left_alone >= 1.0, "{scores}");

    let (a, out) = run(false);
    let table = String::from_utf8_lossy(&out.stdout);
    for name in &open {
        assert!(
            table.contains(&format!("  {name}: found ")),
            "{name} is not reported in the text:\n{table}"
        );
    }
    let readme = std::fs::read_to_string(root.join("docs/internals/detection.md")).unwrap();
    assert!(
        readme.contains(table.trim_end()),
        "docs/internals/detection.md does not show the scores as `oomguard {}` prints them now:\n{table}",
        a.join(" ")
    );
}
