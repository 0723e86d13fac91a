//! The shared-server behaviour of a run, end to end through the binary, on the
//! fake GPU probe (`OOMGUARD_FAKE_GPUS`, a timeline of GPUs and processes):
//! waiting for memory before an attempt, another tenant's OOM retried with the
//! same settings, the fallback to the policy when it does not leave, and
//! `--gpus auto:N`.

mod common;
use common::OOMGUARD;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu")
        .join(name)
}

struct Run {
    args: Vec<String>,
    out: Output,
}

impl Run {
    fn new(cwd: &Path, timeline: &str, args: &[&str]) -> Run {
        let out = Command::new(OOMGUARD)
            .args(args)
            .current_dir(cwd)
            .env("OOMGUARD_FAKE_GPUS", fixture(timeline))
            .env("HOME", cwd) // the peak record goes under the test's folder
            .env_remove("XDG_CACHE_HOME")
            // So is the record of the settings that fit.
            .env_remove("XDG_STATE_HOME")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .output()
            .expect("run oomguard");
        Run {
            args: args.iter().map(|s| s.to_string()).collect(),
            out,
        }
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn ensure(&self, ok: bool, what: &str) {
        assert!(
            ok,
            "\ncommand: oomguard {:?}\nexpected: {what}\nstatus: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args,
            self.out.status,
            self.stdout(),
            self.stderr()
        );
    }
}

fn journal(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn events<'a>(j: &'a [Value], name: &str) -> Vec<&'a Value> {
    j.iter().filter(|e| e["event"] == name).collect()
}

/// First launch: wait `delay` s, die of a CUDA OOM; later launches succeed.
fn oom_once(marker: &Path, delay: f64) -> String {
    format!(
        "import os, sys, time\nm = {marker:?}\nif os.path.exists(m):\n    print('trained'); sys.exit(0)\nopen(m, 'w').close()\ntime.sleep({delay})\nprint('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which 1.00 GiB is free. Process 90002 has 39.00 GiB memory in use.', file=sys.stderr)\nsys.exit(1)\n",
        marker = marker.display().to_string()
    )
}

#[test]
fn another_tenants_oom_is_retried_with_the_same_settings() {
    let t = tempfile::tempdir().unwrap();
    let script = oom_once(&t.path().join("launched"), 1.5);
    let run_dir = t.path().join("run");
    let r = Run::new(
        t.path(),
        "tenant_then_free.json",
        &[
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--wait-timeout",
            "20",
            "--wait-status-every",
            "0.5",
            "python3",
            "-c",
            &script,
            "--per_device_train_batch_size",
            "8",
        ],
    );
    r.ensure(r.out.status.code() == Some(0), "exit 0");
    r.ensure(
        r.stderr().contains("not the run's own") && r.stderr().contains("bob"),
        "stderr says whose memory it was",
    );
    let j = journal(&run_dir);
    let foreign = events(&j, "foreign_oom");
    r.ensure(foreign.len() == 1, "one foreign_oom event");
    r.ensure(
        foreign[0]["tenants"][0]["pid"] == 90002 && foreign[0]["tenants"][0]["user"] == "bob",
        "the tenant is pid 90002 (bob)",
    );
    let decisions = events(&j, "decision");
    r.ensure(
        decisions.len() == 1 && decisions[0]["step"] == "retry_same_settings",
        "one decision: retry_same_settings (no shrinking)",
    );
    let starts = events(&j, "attempt_start");
    r.ensure(starts.len() == 2, "two attempts");
    r.ensure(
        starts[0]["argv"] == starts[1]["argv"],
        "the second attempt runs exactly the same argv",
    );
    r.ensure(
        starts[0]["gpu"]["preflight"]["gpus"][0]["processes"].is_array(),
        "the preflight is in the journal",
    );
    r.ensure(
        r.stderr().contains("GPU memory of the last attempt: peak"),
        "the summary gives the peak",
    );
}

#[test]
fn a_tenant_that_stays_past_the_wait_timeout_falls_back_to_the_policy() {
    let t = tempfile::tempdir().unwrap();
    let script = oom_once(&t.path().join("launched"), 1.0);
    let run_dir = t.path().join("run");
    let r = Run::new(
        t.path(),
        "tenant_stays.json",
        &[
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--wait-timeout",
            "0.5",
            "--wait-status-every",
            "0.2",
            "python3",
            "-c",
            &script,
            "--per_device_train_batch_size",
            "8",
        ],
    );
    r.ensure(r.out.status.code() == Some(0), "exit 0");
    r.ensure(
        r.stderr().contains("falling back to the policy"),
        "stderr says it falls back",
    );
    let j = journal(&run_dir);
    let decisions = events(&j, "decision");
    r.ensure(
        decisions.len() == 1 && decisions[0]["step"] == "halve_micro_batch",
        "the policy halves the micro-batch",
    );
}

#[test]
fn wait_for_memory_holds_the_launch_until_memory_is_free() {
    let t = tempfile::tempdir().unwrap();
    let run_dir = t.path().join("run");
    let r = Run::new(
        t.path(),
        "frees_at_1s.json",
        &[
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--wait-for-memory",
            "40",
            "--wait-status-every",
            "0.2",
            "true",
        ],
    );
    r.ensure(r.out.status.code() == Some(0), "exit 0");
    let j = journal(&run_dir);
    let waited = events(&j, "attempt_start")[0]["gpu"]["memory_wait_s"]
        .as_f64()
        .unwrap_or(0.0);
    r.ensure(
        (0.8..10.0).contains(&waited),
        "the attempt waited about 1 s for bob's memory",
    );
    r.ensure(r.stderr().contains("waiting for 40.0 GiB"), "a status line");

    // Never enough: gives up after --wait-timeout and launches anyway.
    let run_dir = t.path().join("run2");
    let r = Run::new(
        t.path(),
        "frees_at_1s.json",
        &[
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--wait-for-memory",
            "90",
            "--wait-timeout",
            "0.3",
            "true",
        ],
    );
    r.ensure(r.out.status.code() == Some(0), "exit 0");
    let j = journal(&run_dir);
    r.ensure(
        events(&j, "attempt_start")[0]["gpu"]
            .get("memory_wait_timed_out")
            .is_some(),
        "the journal says the wait gave up",
    );
}

#[test]
fn gpus_auto_picks_the_freest_and_the_world_size_follows() {
    let t = tempfile::tempdir().unwrap();
    let r = Run::new(
        t.path(),
        "two_gpus.json",
        &[
            "--run-dir",
            t.path().join("run").to_str().unwrap(),
            "--gpus",
            "auto:1",
            "python3",
            "-c",
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ.get('CUDA_DEVICE_ORDER'))",
        ],
    );
    r.ensure(r.out.status.code() == Some(0), "exit 0");
    r.ensure(
        r.stdout().trim() == "1 PCI_BUS_ID",
        "GPU 1 (idle) is picked",
    );

    let r = Run::new(
        t.path(),
        "two_gpus.json",
        &[
            "plan",
            "--json",
            "--gpus",
            "auto:2",
            "torchrun",
            "--nproc_per_node",
            "gpu",
            "train.py",
            "--per_device_train_batch_size",
            "4",
        ],
    );
    let v: Value = serde_json::from_str(&r.stdout()).unwrap_or_default();
    r.ensure(v["world_size"] == 2, "world size 2 with --gpus auto:2");
    r.ensure(
        v["env"]["CUDA_VISIBLE_DEVICES"] == "0,1",
        "plan shows the choice",
    );

    let r = Run::new(t.path(), "two_gpus.json", &["--gpus", "auto:3", "true"]);
    r.ensure(
        r.out.status.code() == Some(2) && r.stderr().contains("only 2 GPU(s) visible"),
        "asking for more GPUs than there are is a usage error",
    );
}

#[test]
fn without_nvml_gpu_flags_say_so_once_and_the_run_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(OOMGUARD)
        .args(["--run-dir", "run", "--wait-for-memory", "10", "true"])
        .current_dir(t.path())
        .env_remove("OOMGUARD_FAKE_GPUS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // With a driver the GPU flags work and nothing is said; without one, once.
    let has_nvml = std::path::Path::new("/dev/nvidiactl").exists();
    let expected = if has_nvml { 0 } else { 1 };
    assert_eq!(err.matches("NVML not available").count(), expected, "{err}");
}
