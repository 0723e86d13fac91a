//! The weights' dtype when the command names none, as a user sees it in
//! `oomguard estimate`: config.json's `torch_dtype` is what transformers 5's
//! `from_pretrained` loads by default (and any version's `--torch_dtype
//! auto`), fp32 under transformers 4; the line says where the dtype came from
//! (issue 21).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Run, fake_venv, spawn_env};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

const LLAMA_BF16: &str = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5504, "num_attention_heads": 16, "vocab_size": 32000, "torch_dtype": "bfloat16"}"#;

fn estimate(cwd: &Path, python: &str, extra: &[&str]) -> (Run, Value, Run) {
    let mut args = vec![
        "estimate",
        "--gpu-memory",
        "80",
        python,
        "train.py",
        "--model_name_or_path",
        "m",
        "--per_device_train_batch_size",
        "4",
        "--bf16",
    ];
    args.extend(extra);
    let mut text = spawn_env(cwd, &args, &[]).wait(LIMIT);
    // The lines as one: the facts wrap.
    text.stdout = text.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    args.insert(1, "--json");
    let json = spawn_env(cwd, &args, &[]).wait(LIMIT);
    let v: Value = serde_json::from_str(&json.stdout)
        .unwrap_or_else(|e| json.fail("JSON on stdout", "a JSON object", &format!("{e}")));
    (json, v, text)
}

/// Bytes of weights + gradients + optimizer states per parameter, as given.
fn per_param(v: &Value) -> f64 {
    let e = &v["given"]["estimate"];
    let s: f64 = ["weights", "gradients", "optimizer"]
        .iter()
        .map(|k| e[k].as_f64().unwrap())
        .sum();
    s / v["model"]["params"].as_f64().unwrap()
}

#[test]
fn config_jsons_dtype_is_taken_where_from_pretrained_takes_it_and_said() {
    let t = tempfile::tempdir().unwrap();
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("config.json"), LLAMA_BF16).unwrap();
    let v5 = fake_venv(&t.path().join("v5"), "5.23.0");
    let v4 = fake_venv(&t.path().join("v4"), "4.57.1");

    // transformers 5, no dtype flag: config.json's bf16, 2 + 2 + 4 bytes.
    let (r, v, text) = estimate(t.path(), &v5, &[]);
    r.ensure(
        "8 bytes per parameter",
        (per_param(&v) - 8.0).abs() < 1e-6,
        "8",
        per_param(&v),
    );
    text.ensure(
        "the line says where the dtype came from",
        text.stdout
            .contains("weights bf16 (transformers 5's from_pretrained loads config.json's dtype (m/config.json))"),
        "weights bf16 (transformers 5's from_pretrained loads config.json's dtype (m/config.json))",
        &text.stdout,
    );

    // transformers 4: fp32 (--bf16 autocasts over it), 4 + 4 + 8.
    let (r, v, text) = estimate(t.path(), &v4, &[]);
    r.ensure(
        "16 bytes per parameter",
        (per_param(&v) - 16.0).abs() < 1e-6,
        "16",
        per_param(&v),
    );
    text.ensure(
        "the line says why fp32",
        text.stdout
            .contains("weights fp32 (transformers 4's from_pretrained default"),
        "weights fp32 (transformers 4's from_pretrained default ...",
        &text.stdout,
    );

    // --torch_dtype auto: config.json's, under either.
    let (r, v, text) = estimate(t.path(), &v4, &["--torch_dtype", "auto"]);
    r.ensure(
        "8 bytes per parameter",
        (per_param(&v) - 8.0).abs() < 1e-6,
        "8",
        per_param(&v),
    );
    text.ensure(
        "the line names the flag and config.json",
        text.stdout
            .contains("weights bf16 (--torch_dtype auto: config.json's dtype bf16"),
        "weights bf16 (--torch_dtype auto: config.json's dtype bf16 ...",
        &text.stdout,
    );

    // A flag wins over config.json.
    let (r, v, _) = estimate(t.path(), &v5, &["--torch_dtype", "float32"]);
    r.ensure(
        "16 bytes per parameter",
        (per_param(&v) - 16.0).abs() < 1e-6,
        "16",
        per_param(&v),
    );
}
