//! An allocation far beyond the GPU (a corrupted size) is a bug, not a lack of memory:
//! through the real binary, oomguard stops at once with the command's status, says it is
//! not fixable by smaller settings, and never shrinks the run — also when the run hangs
//! after it. So does thrust's `bad_alloc` for a device allocation, which prints no size
//! (usually an extension built for another GPU).

mod common;
use common::OOMGUARD;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn oomguard(cwd: &Path, args: &[&str]) -> Output {
    Command::new(OOMGUARD)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run oomguard")
}

fn describe(cwd: &Path, args: &[&str], out: &Output) -> String {
    format!(
        "command: {OOMGUARD} {}\ncwd: {}\nstatus: {}\nstdout: {}\nstderr: {}",
        args.join(" "),
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn events(run_dir: &Path, name: &str) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == name)
        .collect()
}

#[test]
fn an_absurd_request_stops_with_the_commands_status_and_never_shrinks_the_run() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/absurd_oom.py");
    let tmp = tempfile::tempdir().unwrap();
    for (mode, status) in [("exit", Some(1)), ("hang", None::<i32>)] {
        let run_dir = tmp.path().join(format!("run-{mode}"));
        let args = [
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--hang-timeout",
            "1",
            "--grace",
            "1",
            "python3",
            script.to_str().unwrap(),
            mode,
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "4",
        ];
        let out = oomguard(tmp.path(), &args);
        let why = describe(tmp.path(), &args, &out);
        let err = String::from_utf8_lossy(&out.stderr);
        if let Some(status) = status {
            assert_eq!(
                out.status.code(),
                Some(status),
                "{mode}: the command's status\n{why}"
            );
        } else {
            // Killed by oomguard after the hang: SIGTERM's 143 (or SIGKILL's 137).
            assert!(
                matches!(out.status.code(), Some(143 | 137)),
                "{mode}: the status of the command oomguard stopped\n{why}"
            );
        }
        assert!(
            err.contains("not fixable by smaller settings — likely a bug"),
            "{mode}\n{why}"
        );
        let ends = events(&run_dir, "attempt_end");
        assert_eq!(
            ends.len(),
            1,
            "{mode}: one attempt, never relaunched\n{why}"
        );
        assert_eq!(ends[0]["outcome"], "absurd_request", "{mode}\n{why}");
        assert!(
            events(&run_dir, "decision").is_empty(),
            "{mode}: no step taken\n{why}"
        );
        let oom = events(&run_dir, "oom");
        assert_eq!(
            oom[0]["finding"]["kind"], "absurd_request",
            "{mode}: the journal says why\n{why}"
        );
        assert_eq!(
            oom[0]["finding"]["tried_to_allocate_bytes"]
                .as_f64()
                .map(|b| (b / 1073741824.0).round()),
            Some(131062.0),
            "{mode}\n{why}"
        );
    }
}

/// oomguard around `tests/children/absurd_oom.py MODE` at micro-batch 8 (and
/// accumulation 1): its run folder, output and a description for failures.
struct ThrustRun {
    _tmp: tempfile::TempDir,
    run_dir: std::path::PathBuf,
    out: Output,
    why: String,
}

fn thrust_run(mode: &str) -> ThrustRun {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/absurd_oom.py");
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python3",
        script.to_str().unwrap(),
        mode,
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
    ];
    let out = oomguard(tmp.path(), &args);
    let why = describe(tmp.path(), &args, &out);
    ThrustRun {
        _tmp: tmp,
        run_dir,
        out,
        why,
    }
}

#[test]
fn thrusts_sizeless_bad_alloc_stops_with_the_commands_status_and_never_shrinks_the_run() {
    let ThrustRun {
        _tmp: _keep,
        run_dir,
        out,
        why,
    } = thrust_run("thrust");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the command's status\n{why}");
    for words in [
        "cudaErrorMemoryAllocation: out of memory",
        "not fixable by smaller settings — likely a bug",
        "TORCH_CUDA_ARCH_LIST",
        "If the GPU really was full",
    ] {
        assert!(err.contains(words), "{words:?}\n{why}");
    }
    let ends = events(&run_dir, "attempt_end");
    assert_eq!(ends.len(), 1, "one attempt, never relaunched\n{why}");
    assert_eq!(ends[0]["outcome"], "absurd_request", "{why}");
    assert!(
        events(&run_dir, "decision").is_empty(),
        "no step taken\n{why}"
    );
    let oom = events(&run_dir, "oom");
    assert_eq!(oom[0]["finding"]["kind"], "absurd_request", "{why}");
    assert!(
        oom[0]["finding"]["tried_to_allocate_bytes"].is_null(),
        "no size printed\n{why}"
    );
}

/// The same sizeless thrust failure after training steps ran is memory running out
/// (a mis-built extension fails at its first call): the run is shrunk and finishes.
#[test]
fn thrusts_sizeless_bad_alloc_after_training_steps_is_taken_for_a_gpu_oom() {
    let ThrustRun {
        _tmp: _keep,
        run_dir,
        out,
        why,
    } = thrust_run("thrust-after-steps");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{why}");
    assert!(
        err.contains("after training reached step 3: taken for a GPU OOM"),
        "{why}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("done at micro-batch 4"),
        "{why}"
    );
    let decisions = events(&run_dir, "decision");
    assert_eq!(decisions.len(), 1, "{why}");
    assert_eq!(decisions[0]["after"]["micro_batch"], 4, "{why}");
    assert_eq!(decisions[0]["after"]["grad_accum"], 2, "{why}");
}
