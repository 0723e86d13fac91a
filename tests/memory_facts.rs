//! The memory model reads the run's own facts, as a user sees them in
//! `oomguard estimate`, `plan` and the start line: the architecture from
//! config.json (an unknown one said as such), the weights' dtype, the
//! optimizer, LoRA from a recipe's content whatever the file's name, FSDP; and
//! `--fit` starts a run the model says cannot fit at settings that do, with no
//! OOM (issue 21).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Run, repo, spawn_env};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

fn run(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Run {
    spawn_env(cwd, args, envs).wait(LIMIT)
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| r.fail("JSON on stdout", "a JSON object", &format!("{e}")))
}

fn model(dir: &Path, name: &str, cfg: &str) -> String {
    let m = dir.join(name);
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("config.json"), cfg).unwrap();
    m.display().to_string()
}

const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5504, "num_attention_heads": 16, "vocab_size": 32000}"#;
const NEOX: &str = r#"{"model_type": "gpt_neox", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 8192, "num_attention_heads": 16, "vocab_size": 50304, "rotary_pct": 0.25}"#;

/// Bytes of weights + gradients + optimizer states per GPU for the settings as given.
fn states(v: &Value) -> f64 {
    let e = &v["given"]["estimate"];
    ["weights", "gradients", "optimizer"]
        .iter()
        .map(|k| e[k].as_f64().unwrap())
        .sum()
}

#[test]
fn estimate_reads_the_family_the_dtype_the_optimizer_and_says_an_unknown_architecture() {
    let t = tempfile::tempdir().unwrap();
    let neox = model(t.path(), "neox", NEOX);
    let base = [
        "estimate",
        "--json",
        "--gpu-memory",
        "80",
        "python3",
        "train.py",
        "--model_name_or_path",
        &neox,
        "--per_device_train_batch_size",
        "4",
        "--bf16",
    ];
    let fp32 = run(t.path(), &base, &[]);
    let v = json(&fp32);
    fp32.check("family", "gpt_neox", v["model"]["family"].as_str().unwrap());
    let params = v["model"]["params"].as_f64().unwrap();
    fp32.ensure(
        "Pythia-1.4B's size",
        (params / 1e9 - 1.41).abs() < 0.03,
        "1.41e9",
        params,
    );
    // --bf16 over fp32 weights: 4 + 4 + 8 bytes per parameter.
    fp32.ensure(
        "16 bytes per parameter",
        (states(&v) / params - 16.0).abs() < 1e-6,
        "16",
        states(&v) / params,
    );

    let mut bf16 = base.to_vec();
    bf16.extend(["--torch_dtype", "bfloat16"]);
    let r = run(t.path(), &bf16, &[]);
    let v = json(&r);
    r.ensure(
        "8 bytes per parameter",
        (states(&v) / params - 8.0).abs() < 1e-6,
        "8",
        states(&v) / params,
    );
    r.ensure(
        "the fact is said",
        v["model"]["facts"]
            .to_string()
            .contains("weights bf16 (--torch_dtype bfloat16)"),
        "weights bf16 (--torch_dtype bfloat16)",
        &v["model"]["facts"],
    );
    let mut adam8 = base.to_vec();
    adam8.extend(["--optim", "paged_adamw_8bit"]);
    let r = run(t.path(), &adam8, &[]);
    let v = json(&r);
    r.ensure(
        "10 bytes per parameter",
        (states(&v) / params - 10.0).abs() < 1e-6,
        "10",
        states(&v) / params,
    );

    // The table names the family and the facts.
    let mut text = bf16.clone();
    text.remove(1);
    let r = run(t.path(), &text, &[]);
    r.ensure(
        "table",
        r.stdout.contains("gpt_neox") && r.stdout.contains("weights bf16"),
        "gpt_neox, weights bf16",
        &r.stdout,
    );

    // An architecture the model does not know is said, not taken for Llama.
    let mamba = model(
        t.path(),
        "mamba",
        r#"{"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280}"#,
    );
    let r = run(
        t.path(),
        &[
            "estimate",
            "--gpu-memory",
            "80",
            "python3",
            "train.py",
            "--model_name_or_path",
            &mamba,
            "--per_device_train_batch_size",
            "4",
        ],
        &[],
    );
    let said = r.stdout.replace('\n', " ");
    r.ensure(
        "unknown architecture said",
        said.contains("a 'mamba' model, an architecture the memory model does not know")
            && said.contains("policy's ladder"),
        "a 'mamba' model ... does not know ... policy's ladder",
        &r.stdout,
    );
}

/// The same axolotl recipe under any name: LoRA from its `adapter:` line; a
/// full fine-tune named `lora.yml` is a full fine-tune.
#[test]
fn lora_comes_from_the_recipe_content_never_its_file_name() {
    let t = tempfile::tempdir().unwrap();
    let m = model(t.path(), "model", LLAMA);
    let lora = format!(
        "base_model: {m}\nadapter: lora\nlora_r: 16\nlora_target_linear: true\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\nsequence_len: 2048\noutput_dir: out\n"
    );
    let full = format!(
        "base_model: {m}\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\nsequence_len: 2048\noutput_dir: out\n"
    );
    let est = |file: &str, text: &str| {
        std::fs::write(t.path().join(file), text).unwrap();
        let r = run(
            t.path(),
            &[
                "estimate",
                "--json",
                "--gpu-memory",
                "80",
                "axolotl",
                "train",
                file,
            ],
            &[],
        );
        let v = json(&r);
        (r, v)
    };
    let (r1, a) = est("my.yml", &lora);
    let (_, b) = est("qlora-free.yml", &lora);
    let (_, c) = est("lora.yml", &full);
    r1.check("the same recipe, the same states", states(&a), states(&b));
    let trainable = a["model"]["trainable"].as_f64().unwrap();
    r1.ensure(
        "LoRA r=16 on every linear layer: about 1-2%",
        trainable > 0.005 && trainable < 0.03,
        "0.005..0.03",
        trainable,
    );
    r1.ensure(
        "LoRA said with where it was read",
        a["model"]["facts"]
            .to_string()
            .contains("adapter: lora in my.yml"),
        "adapter: lora in my.yml",
        &a["model"]["facts"],
    );
    r1.check(
        "a full fine-tune named lora.yml",
        1.0,
        c["model"]["trainable"].as_f64().unwrap(),
    );
}

/// `--fsdp full_shard` under torchrun shards the model states over the GPUs.
#[test]
fn fsdp_full_shard_is_read_and_shards_the_states() {
    let t = tempfile::tempdir().unwrap();
    let m = model(t.path(), "model", LLAMA);
    let args = |fsdp: bool| {
        let mut a: Vec<&str> = vec![
            "estimate",
            "--json",
            "--gpu-memory",
            "80",
            "torchrun",
            "--nproc_per_node=8",
            "train.py",
            "--model_name_or_path",
            &m,
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "2",
            "--bf16",
        ];
        if fsdp {
            a.extend(["--fsdp", "full_shard auto_wrap"]);
        }
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let go = |fsdp| {
        let a = args(fsdp);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let r = run(t.path(), &a, &[]);
        let v = json(&r);
        (r, v)
    };
    let (r, ddp) = go(false);
    let (_, sharded) = go(true);
    let ratio = states(&ddp) / states(&sharded);
    r.ensure(
        "8 GPUs share the states",
        (ratio - 8.0).abs() < 1e-6,
        "8",
        ratio,
    );
    r.ensure(
        "FSDP said",
        sharded["model"]["facts"]
            .to_string()
            .contains("FSDP full shard"),
        "FSDP full shard",
        &sharded["model"]["facts"],
    );
}

fn trainer_args(m: &str) -> Vec<String> {
    [
        "python3",
        repo().join("benches/sizing_trainer.py").to_str().unwrap(),
        "--model_name_or_path",
        m,
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "2048",
        "--bf16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Without `--fit` the start says the command is likely to OOM and what
/// `--fit` would start at; with it the run starts there and needs no relaunch;
/// `plan --fit` shows the same start.
#[test]
fn fit_starts_at_settings_that_fit_and_without_it_the_start_says_so() {
    let t = tempfile::tempdir().unwrap();
    let m = model(t.path(), "model", LLAMA);
    let results = t.path().join("results.jsonl");
    let envs = [
        ("SIM_GPU_GIB", "24"),
        ("SIM_ACT_FACTOR", "1.1"),
        ("SIM_RESULT", results.to_str().unwrap()),
    ];
    let cmd = trainer_args(&m);
    let attempts = |extra: &[&str]| {
        let _ = std::fs::remove_file(&results);
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["--gpu-memory", "24", "--hang-timeout", "5"]);
        args.extend(cmd.iter().map(String::as_str));
        let r = run(t.path(), &args, &envs);
        r.check("exit", Some(0), r.code);
        let n = std::fs::read_to_string(&results).unwrap().lines().count();
        (n, r)
    };
    let (n, r) = attempts(&[]);
    r.check("one relaunch without --fit", 2, n);
    r.ensure(
        "the start line",
        r.stderr.lines().any(|l| l.contains("GiB per GPU for the settings as given: likely OOM; `--fit` would start at micro_batch 16 →")),
        "likely OOM; `--fit` would start at micro_batch 16 → ...",
        &r.stderr,
    );
    let (n, r) = attempts(&["--fit"]);
    r.check("no relaunch with --fit", 1, n);
    r.ensure(
        "the --fit line",
        r.stderr
            .contains("likely OOM; --fit starts at micro_batch 16 →"),
        "--fit starts at micro_batch 16 → ...",
        &r.stderr,
    );
    let mut args = vec!["plan", "--fit", "--gpu-memory", "24"];
    args.extend(cmd.iter().map(String::as_str));
    let p = run(t.path(), &args, &envs);
    p.ensure(
        "plan's start",
        p.stdout
            .lines()
            .any(|l| l.starts_with("start:") && l.contains("--fit starts at")),
        "start: ... --fit starts at",
        &p.stdout,
    );
}
