//! Real client (`OOMGUARD_REAL_PYTHON`, `-- --include-ignored`): the dtype
//! `oomguard estimate` says the weights load in, for a command that names
//! none, is the one the installed transformers' `from_pretrained` really
//! loads a checkpoint saved in bf16 in (transformers 5: config.json's; 4:
//! fp32), and `--torch_dtype auto` is config.json's (issue 21, item 1).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{spawn_env, venv_bin};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

const SAVE_AND_LOAD: &str = r#"
import sys, torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, vocab_size=256)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
print(str(AutoModelForCausalLM.from_pretrained(sys.argv[1]).dtype))
"#;

#[test]
#[ignore = "real client: needs OOMGUARD_REAL_PYTHON (bash tests/run.sh)"]
fn the_dtype_estimate_says_is_the_one_from_pretrained_loads() {
    let bin = venv_bin();
    let python = bin.join("python");
    let t = tempfile::tempdir().unwrap();
    let m = t.path().join("m");
    let out = Command::new(&python)
        .args(["-c", SAVE_AND_LOAD, m.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The last line: a library may print warnings before it.
    let loaded = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    let want = match loaded.as_str() {
        "torch.bfloat16" => "bf16",
        "torch.float32" => "fp32",
        other => panic!("from_pretrained loaded {other}"),
    };
    let estimate = |extra: &[&str]| {
        let mut args = vec![
            "estimate",
            "--json",
            "--gpu-memory",
            "80",
            python.to_str().unwrap(),
            "train.py",
            "--model_name_or_path",
            "m",
            "--bf16",
        ];
        args.extend_from_slice(extra);
        let r = spawn_env(t.path(), &args, &[]).wait(LIMIT);
        let v: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| r.fail("JSON on stdout", "a JSON object", &format!("{e}")));
        let facts: Vec<String> = v["model"]["facts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        (r, facts)
    };
    let (r, facts) = estimate(&[]);
    r.ensure(
        "estimate says the dtype from_pretrained loaded, and why",
        facts.iter().any(|f| {
            f.starts_with(&format!("weights {want} (transformers "))
                && f.contains("from_pretrained")
        }),
        &format!("weights {want} (transformers N's from_pretrained ...) for {loaded}"),
        &facts,
    );
    let (r, facts) = estimate(&["--torch_dtype", "auto"]);
    r.ensure(
        "--torch_dtype auto: config.json's bf16",
        facts
            .iter()
            .any(|f| f.starts_with("weights bf16 (--torch_dtype auto: config.json's dtype bf16")),
        "weights bf16 (--torch_dtype auto: config.json's dtype bf16 ...",
        &facts,
    );
}
