//! `oomguard estimate` against peaks PyTorch measured on a GPU: every row of
//! `tests/fixtures/measured/*.json` (written from `tests/real/gpu_estimate_check.py`'s
//! results on a lent GPU) is the same command, shape and flags, estimated again here.
//! The estimate must stay within the band the policy's margin absorbs: never more
//! than 10% under the measured peak (one more relaunch), never more than 15% over
//! (a smaller micro-batch than fits).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Run, fake_venv, spawn_env};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);
const GIB: f64 = (1u64 << 30) as f64;
const UNDER: f64 = -10.0;
const OVER: f64 = 15.0;

/// The estimate's total in GiB for one measured row; `said` false leaves out every
/// precision flag (`--bf16 true` and the row's own).
fn estimate(cwd: &Path, python: &str, gpu_gib: f64, row: &Value, said: bool) -> (Run, f64) {
    estimate_env(cwd, python, gpu_gib, row, said, &[])
}

/// [`estimate`] with `envs` set for oomguard.
fn estimate_env(
    cwd: &Path,
    python: &str,
    gpu_gib: f64,
    row: &Value,
    said: bool,
    envs: &[(&str, &str)],
) -> (Run, f64) {
    let model = cwd.join(row["model"].as_str().unwrap());
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), row["config"].to_string()).unwrap();
    let gpu = format!("{gpu_gib:.2}");
    let micro = row["micro_batch"].to_string();
    let seq = row["seq"].to_string();
    let gc = row["grad_checkpointing"].as_bool().unwrap().to_string();
    let mut args: Vec<&str> = vec![
        "estimate",
        "--json",
        "--gpu-memory",
        &gpu,
        python,
        "tests/real/gpu_hf_trainer.py",
        "--model_name_or_path",
        model.to_str().unwrap(),
        "--per_device_train_batch_size",
        &micro,
        "--gradient_accumulation_steps",
        "1",
        "--max_seq_length",
        &seq,
        "--gradient_checkpointing",
        &gc,
        "--max_steps",
        "4",
        "--save_strategy",
        "no",
        "--output_dir",
        "out",
        "--gpu_mem_gib",
        "0",
    ];
    let flags: Vec<&str> = row["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    if said {
        args.extend(["--bf16", "true"]);
        args.extend(flags);
    }
    let run = spawn_env(cwd, &args, envs).wait(LIMIT);
    let v: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| run.fail("JSON on stdout", "a JSON object", &format!("{e}")));
    let total: f64 = v["given"]["estimate"]
        .as_object()
        .unwrap_or_else(|| run.fail("an estimate", "given.estimate", &run.stdout))
        .values()
        .filter_map(Value::as_f64)
        .sum();
    (run, total / GIB)
}

#[test]
fn every_measured_peak_is_estimated_within_the_margins_band() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/measured");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no measurements in {}", dir.display());
    let mut rows = 0;
    let mut outside = Vec::new();
    for file in files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let python = fake_venv(&tmp.path().join("venv"), "5.17.0");
        let gpu = doc["gpu_gib"].as_f64().unwrap();
        for row in doc["rows"].as_array().unwrap() {
            let (run, est) = estimate(tmp.path(), &python, gpu, row, true);
            run.check("estimate exit code", Some(0), run.code);
            let peak = row["measured_peak_gib"].as_f64().unwrap();
            let err = 100.0 * (est - peak) / peak;
            let line = format!(
                "{} mb{} s{} gc={} {:?}: estimate {est:.2} GiB, measured {peak:.2} GiB ({err:+.1}%)",
                row["model"].as_str().unwrap(),
                row["micro_batch"],
                row["seq"],
                row["grad_checkpointing"],
                row["flags"].to_string(),
            );
            eprintln!("{line}");
            if !(UNDER..=OVER).contains(&err) {
                outside.push(line);
            }
            rows += 1;
        }
    }
    assert!(rows >= 10, "only {rows} measured rows");
    assert!(
        outside.is_empty(),
        "estimates outside {UNDER}%..+{OVER}% of the measured peak:\n{}",
        outside.join("\n")
    );
}

/// The measured H200 run with mixed precision said off (`--bf16 false`), the GPU's
/// size, and a fake transformers 5.17 venv's python in `tmp`.
fn fp32_row(tmp: &Path) -> (Value, f64, String) {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/measured/h200-2026-11-28.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let python = fake_venv(&tmp.join("venv"), "5.17.0");
    let fp32 = |r: &&Value| r["flags"] == serde_json::json!(["--bf16", "false"]);
    let row = doc["rows"].as_array().unwrap().iter().find(fp32).unwrap();
    (row.clone(), doc["gpu_gib"].as_f64().unwrap(), python)
}

/// A Trainer command that names no precision at all trains in fp32 (TrainingArguments'
/// default): estimated as the measured `--bf16 false` row, not as autocast.
#[test]
fn a_trainer_command_naming_no_precision_is_estimated_as_the_measured_fp32_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (row, gpu, python) = fp32_row(tmp.path());
    let (run, said) = estimate(tmp.path(), &python, gpu, &row, true);
    run.check("estimate exit code", Some(0), run.code);
    let (run, unsaid) = estimate(tmp.path(), &python, gpu, &row, false);
    run.check("estimate exit code", Some(0), run.code);
    let peak = row["measured_peak_gib"].as_f64().unwrap();
    let err = 100.0 * (unsaid - peak) / peak;
    assert!(
        (unsaid - said).abs() < 0.01 && (UNDER..=OVER).contains(&err),
        "no precision flag: {unsaid:.2} GiB, --bf16 false: {said:.2} GiB, measured {peak:.2} GiB ({err:+.1}%)\n{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("neither --bf16 nor --fp16 said"),
        "the estimate says why it took fp32:\n{}",
        run.stdout
    );
}

/// `accelerate launch` hands its mixed precision to the script as
/// ACCELERATE_MIXED_PRECISION, which the Trainer takes when neither --bf16 nor
/// --fp16 is said: the same command is then estimated as autocast, as with
/// `--bf16 true`, and with `no` as the fp32 run.
#[test]
fn the_environments_accelerate_mixed_precision_is_the_runs_precision() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut row, gpu, python) = fp32_row(tmp.path());
    row["flags"] = serde_json::json!([]);
    let (run, bf16) = estimate(tmp.path(), &python, gpu, &row, true);
    run.check("estimate exit code", Some(0), run.code);
    let (run, unsaid) = estimate(tmp.path(), &python, gpu, &row, false);
    run.check("estimate exit code", Some(0), run.code);
    let (run, env_bf16) = estimate_env(
        tmp.path(),
        &python,
        gpu,
        &row,
        false,
        &[("ACCELERATE_MIXED_PRECISION", "bf16")],
    );
    run.check("estimate exit code", Some(0), run.code);
    assert!(
        (env_bf16 - bf16).abs() < 0.01 && unsaid > bf16 + 0.5,
        "ACCELERATE_MIXED_PRECISION=bf16: {env_bf16:.2} GiB, --bf16 true: {bf16:.2} GiB, neither: {unsaid:.2} GiB\n{}",
        run.stdout
    );
    let (run, env_no) = estimate_env(
        tmp.path(),
        &python,
        gpu,
        &row,
        false,
        &[("ACCELERATE_MIXED_PRECISION", "no")],
    );
    run.check("estimate exit code", Some(0), run.code);
    assert!(
        (env_no - unsaid).abs() < 0.01,
        "ACCELERATE_MIXED_PRECISION=no: {env_no:.2} GiB, neither said: {unsaid:.2} GiB"
    );
    assert!(
        run.stdout
            .contains("mixed_precision: no in the environment's ACCELERATE_MIXED_PRECISION"),
        "the estimate says where it read it:\n{}",
        run.stdout
    );
}
