//! `oomguard gpus [--json]` through the real binary: without a driver (one line, exit 69,
//! never a panic; with --json, `{"gpus": [], "error": ...}` on stdout), and with the fake probe (`OOMGUARD_FAKE_GPUS`, timelines in
//! tests/fixtures/gpu/).

mod common;
use common::OOMGUARD;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// `oomguard gpus` exit code when no GPU information can be had (gpu::NO_GPU_INFO).
const NO_GPU_INFO: i32 = 69;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu")
        .join(name)
        .display()
        .to_string()
}

struct Run {
    args: Vec<String>,
    envs: Vec<(String, Option<String>)>,
    out: Output,
}

/// Runs oomguard with `envs` set (`None`: removed); `OOMGUARD_FAKE_GPUS` and
/// `CUDA_VISIBLE_DEVICES` are removed unless given.
fn run(args: &[&str], envs: &[(&str, Option<&str>)]) -> Run {
    let mut cmd = Command::new(OOMGUARD);
    cmd.args(args)
        .stdin(Stdio::null())
        .env_remove("OOMGUARD_FAKE_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for (k, v) in envs {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("run oomguard");
    Run {
        args: args.iter().map(|s| s.to_string()).collect(),
        envs: envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect(),
        out,
    }
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn describe(&self, expected: &str) -> String {
        format!(
            "\ncommand: {OOMGUARD} {:?}\nenv: {:?}\ncwd: {}\nexpected: {expected}\nfound: status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args,
            self.envs,
            std::env::current_dir().unwrap().display(),
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.out.status.code(),
            Some(code),
            "{}",
            self.describe(&format!("exit {code}"))
        );
        self
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout())
            .unwrap_or_else(|e| panic!("{}", self.describe(&format!("one JSON object ({e})"))))
    }
}

#[test]
fn gpus_without_driver_says_so_in_one_line() {
    for args in [&["gpus"][..], &["gpus", "--json"][..]] {
        let r = run(args, &[]);
        if r.out.status.code() == Some(0) {
            // This machine has a driver: then the listing must be there.
            assert!(!r.stdout().is_empty(), "{}", r.describe("a GPU listing"));
            continue;
        }
        r.expect_code(NO_GPU_INFO);
        let err = r.stderr();
        assert_eq!(
            err.lines().count(),
            1,
            "{}",
            r.describe("exactly one line on stderr")
        );
        assert!(
            err.starts_with("oomguard: NVML not available (")
                && err.trim_end().ends_with("): GPU features off"),
            "{}",
            r.describe("the NVML line")
        );
        assert!(!err.contains("panicked"), "{}", r.describe("no panic"));
        if args.contains(&"--json") {
            // A script reading stdout still gets one JSON object: no GPU, and why.
            let v = r.json();
            assert_eq!(v["gpus"], serde_json::json!([]), "{}", r.describe("no GPU"));
            let error = v["error"].as_str().unwrap_or_default();
            assert_eq!(
                format!("oomguard: {error}"),
                err.trim_end(),
                "{}",
                r.describe("the stderr line as `error`")
            );
        } else {
            assert!(r.stdout().is_empty(), "{}", r.describe("nothing on stdout"));
        }
    }
}

#[test]
fn gpus_json_shape_with_fake() {
    let fake = fixture("two_gpus.json");
    let r = run(&["gpus", "--json"], &[("OOMGUARD_FAKE_GPUS", Some(&fake))]);
    r.expect_code(0);
    let v = r.json();
    assert_eq!(
        v["cuda_visible_devices"],
        serde_json::Value::Null,
        "{}",
        r.describe("null")
    );
    assert_eq!(
        v["error"],
        serde_json::Value::Null,
        "{}",
        r.describe("no error")
    );
    let gpus = v["gpus"].as_array().expect("gpus array");
    assert_eq!(gpus.len(), 2, "{}", r.describe("2 GPUs"));
    let g0 = &gpus[0];
    for key in [
        "index",
        "cuda_index",
        "uuid",
        "name",
        "total_bytes",
        "used_bytes",
        "free_bytes",
        "util_percent",
        "processes",
    ] {
        assert!(
            g0.get(key).is_some(),
            "{}",
            r.describe(&format!("key {key}"))
        );
    }
    assert_eq!(g0["uuid"], "GPU-aaaaaaaa-1111-2222-3333-444444444444");
    assert_eq!(g0["total_bytes"], 80u64 << 30);
    assert_eq!(g0["free_bytes"], 8u64 << 30);
    assert_eq!(g0["util_percent"], 97);
    assert_eq!(
        g0["processes"],
        serde_json::json!([
            {"pid": 4242, "used_bytes": (70u64 << 30) + (1u64 << 29), "user": "alice",
             "oomguard_attempt": "12345.0.1732000000000000000"},
            {"pid": 5151, "used_bytes": (3u64 << 30) / 2, "user": "bob", "oomguard_attempt": null}
        ])
    );
    assert_eq!(gpus[1]["processes"], serde_json::json!([]));
    // The TOML form of the same timeline gives the same answer.
    let t = run(
        &["gpus", "--json"],
        &[("OOMGUARD_FAKE_GPUS", Some(&fixture("two_gpus.toml")))],
    );
    t.expect_code(0);
    assert_eq!(t.json(), v);
}

#[test]
fn gpus_text_with_fake() {
    let r = run(
        &["gpus"],
        &[("OOMGUARD_FAKE_GPUS", Some(&fixture("two_gpus.json")))],
    );
    r.expect_code(0);
    let out = r.stdout();
    for needle in [
        "GPU 0  Fake H100 80GB HBM3  GPU-aaaaaaaa-1111-2222-3333-444444444444",
        "72.0 of 80.0 GiB used, 8.0 GiB free; utilisation 97%",
        "pid 4242  alice  70.5 GiB  oomguard run (attempt 12345.0.1732000000000000000)",
        "pid 5151  bob     1.5 GiB",
        "GPU 1  Fake H100",
        "no process holds memory",
    ] {
        assert!(
            out.contains(needle),
            "{}",
            r.describe(&format!("stdout containing {needle:?}"))
        );
    }
    assert!(r.stderr().is_empty(), "{}", r.describe("nothing on stderr"));
}

#[test]
fn gpus_honours_cuda_visible_devices_by_index_and_uuid() {
    let fake = fixture("two_gpus.json");
    for (cvd, want) in [
        ("1", vec![1]),
        ("1,0", vec![1, 0]),
        ("GPU-bbbbbbbb-1111-2222-3333-444444444444", vec![1]),
        ("GPU-bbbb,GPU-aaaa", vec![1, 0]),
        ("0,5,1", vec![0]),
        ("", vec![]),
    ] {
        let r = run(
            &["gpus", "--json"],
            &[
                ("OOMGUARD_FAKE_GPUS", Some(&fake)),
                ("CUDA_VISIBLE_DEVICES", Some(cvd)),
            ],
        );
        r.expect_code(0);
        let v = r.json();
        let got: Vec<u64> = v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["index"].as_u64().unwrap())
            .collect();
        assert_eq!(
            got,
            want,
            "{}",
            r.describe(&format!("CUDA_VISIBLE_DEVICES={cvd:?} → {want:?}"))
        );
        let cuda: Vec<u64> = v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["cuda_index"].as_u64().unwrap())
            .collect();
        assert_eq!(cuda, (0..want.len() as u64).collect::<Vec<_>>());
        assert_eq!(v["cuda_visible_devices"], cvd);
    }
    let r = run(
        &["gpus"],
        &[
            ("OOMGUARD_FAKE_GPUS", Some(&fake)),
            ("CUDA_VISIBLE_DEVICES", Some("1")),
        ],
    );
    r.expect_code(0);
    assert!(
        r.stdout()
            .starts_with("CUDA_VISIBLE_DEVICES=1: 1 of 2 GPUs visible\nGPU 1 (cuda:0)"),
        "{}",
        r.describe("the visible GPU only, with its cuda index")
    );
}

#[test]
fn gpus_probe_error_or_bad_fake_is_one_line_and_69() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        "{\"snapshots\": [{\"at_s\": 0, \"gpus\": [{\"name\": \"no total\"}]}]}",
    )
    .unwrap();
    let bad = bad.display().to_string();
    for (fake, needle) in [
        (
            fixture("lost.json"),
            "cannot read the GPUs: Unknown Error: GPU is lost",
        ),
        (bad.clone(), "bad JSON timeline"),
        ("/nonexistent/timeline.json".to_string(), "cannot read"),
    ] {
        let r = run(&["gpus", "--json"], &[("OOMGUARD_FAKE_GPUS", Some(&fake))]);
        r.expect_code(NO_GPU_INFO);
        assert_eq!(r.stderr().lines().count(), 1, "{}", r.describe("one line"));
        assert!(r.stderr().contains(needle), "{}", r.describe(needle));
        let v = r.json();
        assert_eq!(v["gpus"], serde_json::json!([]), "{}", r.describe("no GPU"));
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(needle)),
            "{}",
            r.describe(&format!("error containing {needle:?}"))
        );
        // Without --json, stdout stays empty.
        let t = run(&["gpus"], &[("OOMGUARD_FAKE_GPUS", Some(&fake))]);
        t.expect_code(NO_GPU_INFO);
        assert!(t.stdout().is_empty(), "{}", t.describe("nothing on stdout"));
    }
}
