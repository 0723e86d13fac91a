//! Issue 19, points 8 and 10, driven through the real binary as a user runs it.
//!
//! Point 8: tools that start their own ranks (`llamafactory-cli train`,
//! `axolotl train`, `accelerate launch` without `--num_processes`) are counted by
//! the tool's own rules, on the real commands of `tests/fixtures/corpus/commands`
//! (their config files laid out where the command names them): `plan --json`
//! reports the world size and the global batch, and ZeRO is raised as on several
//! GPUs, not skipped as on one.
//!
//! Point 10: first contact — the README's "Try it" runs the installed `oomguard`
//! in a private folder, `pip install` says how to see its progress, the `estimate`
//! table fits a 100-column pane, "nothing fits" names the ways out, `plan` and
//! `estimate` pick the same settings, and a plan step names every knob it changes.

mod common;
use common::OOMGUARD;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value as J;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn corpus(case: &str) -> PathBuf {
    let dir = root().join("tests/fixtures/corpus/commands");
    fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{case}-"))
        })
        .unwrap_or_else(|| panic!("no corpus case {case} in {}", dir.display()))
}

/// Copy `file` of corpus `case` to `dest` (relative to `dir`), as the command names it.
fn lay(dir: &Path, case: &str, file: &str, dest: &str) {
    let to = dir.join(dest);
    fs::create_dir_all(to.parent().unwrap()).unwrap();
    fs::copy(corpus(case).join(file), &to).unwrap();
}

/// The binary in `cwd` with a clean GPU environment: `HOME` is `cwd` (no
/// accelerate default config unless the test writes one), no
/// `CUDA_VISIBLE_DEVICES`, no NVML (a fake probe that has no GPU), then `env`.
fn oomguard(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(OOMGUARD);
    cmd.args(args).current_dir(cwd).stdin(Stdio::null());
    for v in [
        "HF_HOME",
        "XDG_CACHE_HOME",
        "CUDA_VISIBLE_DEVICES",
        "FORCE_TORCHRUN",
        "NPROC_PER_NODE",
        "NNODES",
        "USE_RAY",
        "WORLD_SIZE",
        "OOMGUARD_FAKE_GPUS",
        "XDG_STATE_HOME",
        "COLUMNS",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("HOME", cwd);
    cmd.env("XDG_STATE_HOME", cwd.join(".state"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run oomguard")
}

fn plan_json(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> J {
    let mut a = vec!["plan", "--json"];
    a.extend(args);
    let out = oomguard(cwd, &a, env);
    assert_eq!(
        out.status.code(),
        Some(0),
        "oomguard {a:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("plan --json: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn steps(plan: &J) -> Vec<String> {
    plan["ladder"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["step"].as_str().unwrap().to_string())
        .collect()
}

/// (world size, uncertain, global batch, where the world size comes from).
fn world(plan: &J) -> (u64, bool, Option<u64>, String) {
    (
        plan["world_size"].as_u64().unwrap(),
        plan["world_uncertain"].as_bool().unwrap(),
        plan["global_batch"].as_u64(),
        plan["world_source"].as_str().unwrap().to_string(),
    )
}

/// A fake NVML timeline with `n` 80 GiB GPUs.
fn fake_gpus(dir: &Path, n: usize) -> String {
    let gpus: Vec<String> = (0..n).map(|_| r#"{"total_gib": 80}"#.to_string()).collect();
    let path = dir.join("gpus.json");
    fs::write(
        &path,
        format!(
            r#"{{"snapshots": [{{"at_s": 0, "gpus": [{}]}}]}}"#,
            gpus.join(",")
        ),
    )
    .unwrap();
    path.display().to_string()
}

// ---------------------------------------------------------------------------
// Point 8: tools that launch their own ranks
// ---------------------------------------------------------------------------

/// Corpus 27, `FORCE_TORCHRUN=1 llamafactory-cli train qwen3_full_sft.yaml`:
/// LLaMA-Factory starts `torchrun --nproc_per_node $NPROC_PER_NODE`; with 4, the
/// global batch is 1 × 2 × 4, and the ZeRO-3 JSON is a knob as on 4 GPUs.
#[test]
fn llamafactory_force_torchrun_counts_nproc_per_node() {
    let t = tempfile::tempdir().unwrap();
    lay(
        t.path(),
        "27",
        "qwen3_full_sft.yaml",
        "examples/train_full/qwen3_full_sft.yaml",
    );
    lay(
        t.path(),
        "27",
        "ds_z3_config.json",
        "examples/deepspeed/ds_z3_config.json",
    );
    let cmd = [
        "llamafactory-cli",
        "train",
        "examples/train_full/qwen3_full_sft.yaml",
    ];
    let p = plan_json(
        t.path(),
        &cmd,
        &[("FORCE_TORCHRUN", "1"), ("NPROC_PER_NODE", "4")],
    );
    let (n, unsure, gb, src) = world(&p);
    assert_eq!((n, unsure, gb), (4, false, Some(8)), "{src}");
    assert!(src.contains("NPROC_PER_NODE=4"), "{src}");
    // Without NPROC_PER_NODE: one process per visible GPU; NNODES multiplies.
    let p = plan_json(
        t.path(),
        &cmd,
        &[
            ("FORCE_TORCHRUN", "1"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2"),
            ("NNODES", "2"),
        ],
    );
    let (n, unsure, gb, src) = world(&p);
    assert_eq!((n, unsure, gb), (6, false, Some(12)), "{src}");
}

/// Corpus 26, `CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train qwen3_lora_sft.yaml
/// learning_rate=1e-5 logging_steps=1`: two visible GPUs are enough for
/// LLaMA-Factory to start torchrun with 2 processes; with the GPUs NVML sees
/// (no CUDA_VISIBLE_DEVICES), as many as it sees; with one GPU, one process.
#[test]
fn llamafactory_with_several_visible_gpus_starts_one_process_per_gpu() {
    let t = tempfile::tempdir().unwrap();
    lay(
        t.path(),
        "26",
        "qwen3_lora_sft.yaml",
        "examples/train_lora/qwen3_lora_sft.yaml",
    );
    let cmd = [
        "llamafactory-cli",
        "train",
        "examples/train_lora/qwen3_lora_sft.yaml",
        "learning_rate=1e-5",
        "logging_steps=1",
    ];
    let p = plan_json(t.path(), &cmd, &[("CUDA_VISIBLE_DEVICES", "0,1")]);
    let (n, unsure, gb, src) = world(&p);
    // per_device_train_batch_size 1 × gradient_accumulation_steps 8 × 2.
    assert_eq!((n, unsure, gb), (2, false, Some(16)), "{src}");
    let gpus = fake_gpus(t.path(), 4);
    let p = plan_json(t.path(), &cmd, &[("OOMGUARD_FAKE_GPUS", &gpus)]);
    let (n, unsure, gb, src) = world(&p);
    assert_eq!((n, unsure, gb), (4, false, Some(32)), "{src}");
    assert!(src.contains("NVML"), "{src}");
    let p = plan_json(t.path(), &cmd, &[("CUDA_VISIBLE_DEVICES", "0")]);
    let (n, unsure, _, src) = world(&p);
    assert_eq!((n, unsure), (1, false), "{src}");
}

/// Corpus 22's configs (`fft.yml`, a ZeRO-2 JSON), run both ways axolotl is
/// run: its real command `accelerate launch -m axolotl.cli.train ...` and
/// `axolotl train ... --deepspeed ...` (which starts accelerate launch itself).
/// With 4 visible GPUs and no accelerate config, accelerate starts 4 processes:
/// the world is 4 and the ladder raises ZeRO 2 → 3 before offloading, instead of
/// skipping it as on one GPU.
#[test]
fn axolotl_and_accelerate_without_a_count_start_one_process_per_gpu_and_zero_is_raised() {
    let t = tempfile::tempdir().unwrap();
    lay(
        t.path(),
        "22",
        "fft.yml",
        "examples/stablelm-2/1.6b/fft.yml",
    );
    lay(t.path(), "22", "zero2.json", "deepspeed_configs/zero2.json");
    let cvd = [("CUDA_VISIBLE_DEVICES", "0,1,2,3")];
    for cmd in [
        &[
            "accelerate",
            "launch",
            "-m",
            "axolotl.cli.train",
            "examples/stablelm-2/1.6b/fft.yml",
            "--deepspeed",
            "deepspeed_configs/zero2.json",
        ][..],
        &[
            "axolotl",
            "train",
            "examples/stablelm-2/1.6b/fft.yml",
            "--deepspeed",
            "deepspeed_configs/zero2.json",
        ][..],
    ] {
        let p = plan_json(t.path(), cmd, &cvd);
        let (n, unsure, gb, src) = world(&p);
        // micro_batch_size 1 × gradient_accumulation_steps 1 × 4.
        assert_eq!((n, unsure, gb), (4, false, Some(4)), "{cmd:?}: {src}");
        let s = steps(&p);
        assert_eq!(
            s.get(1).map(String::as_str),
            Some("raise_zero_stage"),
            "{cmd:?}: {s:?}"
        );
        assert_eq!(p["ladder"][1]["settings"]["zero_stage"], 3, "{cmd:?}");
    }
    // axolotl's own count and launcher options.
    let base = ["axolotl", "train", "examples/stablelm-2/1.6b/fft.yml"];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend(extra);
        world(&plan_json(t.path(), &v, &cvd))
    };
    assert_eq!(with(&["--num-processes", "2"]).0, 2);
    assert_eq!(
        with(&[
            "--launcher",
            "torchrun",
            "--",
            "--nproc_per_node",
            "2",
            "--nnodes",
            "2"
        ])
        .0,
        4
    );
    assert_eq!(with(&["--launcher", "python"]).0, 1);
}

/// Corpus 21, `axolotl train examples/llama-3/lora-1b.yml`, with the accelerate
/// default config of corpus 13 (`num_processes: 2`) in `~/.cache/huggingface`:
/// axolotl's accelerate launch reads it, so the world is 2 whatever the GPUs.
#[test]
fn axolotl_train_reads_the_accelerate_default_config() {
    let t = tempfile::tempdir().unwrap();
    lay(
        t.path(),
        "21",
        "lora-1b.yml",
        "examples/llama-3/lora-1b.yml",
    );
    lay(
        t.path(),
        "13",
        "default_config.yaml",
        ".cache/huggingface/accelerate/default_config.yaml",
    );
    let p = plan_json(
        t.path(),
        &["axolotl", "train", "examples/llama-3/lora-1b.yml"],
        &[("CUDA_VISIBLE_DEVICES", "0,1,2,3")],
    );
    let (n, unsure, gb, src) = world(&p);
    // micro_batch_size 2 × gradient_accumulation_steps 2 × 2.
    assert_eq!((n, unsure, gb), (2, false, Some(8)), "{src}");
    assert!(src.contains("num_processes: 2"), "{src}");
}

// ---------------------------------------------------------------------------
// Point 10: first contact
// ---------------------------------------------------------------------------

fn readme() -> String {
    fs::read_to_string(root().join("README.md")).unwrap()
}

/// The text of a README section, from its heading to the next heading of the same level.
fn section(readme: &str, heading: &str) -> String {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let level = heading.chars().take_while(|c| *c == '#').count();
    let rest = &readme[start + heading.len()..];
    let end = rest
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|i| {
            let line = &rest[*i..];
            let hashes = line.chars().take_while(|c| *c == '#').count();
            hashes > 0 && hashes <= level && line[hashes..].starts_with(' ')
        })
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The indented code lines (4 spaces) of a section, joined per block.
fn code_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for line in text.lines() {
        if let Some(code) = line.strip_prefix("    ") {
            cur.push(code);
        } else if !line.trim().is_empty() && !cur.is_empty() {
            blocks.push(cur.join("\n"));
            cur.clear();
        }
    }
    if !cur.is_empty() {
        blocks.push(cur.join("\n"));
    }
    blocks
}

/// The README's "Try it" runs the `oomguard` on the PATH (just installed by pip),
/// builds nothing, and writes into a fresh private folder of its own (`mktemp -d`),
/// so a second user on the same server runs it too; run as written by bash, it
/// finishes after 3 attempts with the global batch kept.
#[test]
fn readme_try_it_runs_the_installed_oomguard_in_a_private_folder() {
    let text = section(&readme(), "## Try it");
    let blocks = code_blocks(&text);
    let demo = blocks
        .iter()
        .find(|b| b.contains("sim_trainer.py"))
        .unwrap_or_else(|| panic!("no demo command in Try it:\n{text}"));
    assert!(
        !demo.contains("cargo") && !demo.contains("target/release"),
        "the demo rebuilds oomguard instead of running the installed one:\n{demo}"
    );
    assert!(
        !demo.contains("/tmp/"),
        "the demo writes to a fixed /tmp path another user may own:\n{demo}"
    );
    // As a user in a clone: examples/ here, `oomguard` on the PATH, TMPDIR ours.
    let t = tempfile::tempdir().unwrap();
    let clone = t.path().join("clone");
    fs::create_dir_all(clone.join("examples")).unwrap();
    fs::copy(
        root().join("examples/sim_trainer.py"),
        clone.join("examples/sim_trainer.py"),
    )
    .unwrap();
    let tmp = t.path().join("tmp");
    fs::create_dir_all(&tmp).unwrap();
    let bin_dir = Path::new(OOMGUARD).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!("set -e\n{demo}\necho \"DEMO_DIR=$demo\"\n");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&clone)
        .env("PATH", path)
        .env("TMPDIR", &tmp)
        .env("HOME", t.path())
        .env("XDG_STATE_HOME", t.path().join("state"))
        .env_remove("OOMGUARD_FAKE_GPUS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{script}\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("finished after 3 attempts"),
        "{stdout}\n{stderr}"
    );
    let dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("DEMO_DIR="))
        .map(PathBuf::from)
        .expect("the demo names its folder $demo");
    assert!(
        dir.starts_with(&tmp),
        "{} is not under TMPDIR",
        dir.display()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the demo folder is not private");
    assert!(
        fs::read_dir(&dir).unwrap().next().is_some(),
        "nothing written in {}",
        dir.display()
    );
}

/// `pip install .` compiles for minutes and pip shows nothing meanwhile: the
/// README says so before the user waits, and how to see cargo's progress.
#[test]
fn readme_install_says_pip_compiles_for_minutes_and_how_to_see_progress() {
    let text = section(&readme(), "## Install");
    assert!(text.contains("pip install -v ."), "{text}");
    assert!(text.contains("minutes"), "{text}");
}

/// A model the memory model reads: `--knob params=1.3e9` on a 20 GiB GPU, a plain
/// Hugging Face-style script (the simulated trainer).
fn sized(extra: &[&'static str], params: &'static str, gpu: &'static str) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--gpu-memory".into(),
        gpu.into(),
        "--knob".into(),
        format!("params={params}"),
        "--".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(
        [
            "python3",
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "2",
            "--max_seq_length",
            "2048",
            "--gradient_checkpointing",
            "false",
            "--output_dir",
            "out",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v
}

fn run_text(cwd: &Path, sub: &str, args: &[String]) -> String {
    let mut a: Vec<&str> = vec![sub];
    a.extend(args.iter().map(String::as_str));
    let out = oomguard(cwd, &a, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every line `oomguard estimate` prints fits a 100-column pane (counted in
/// characters, as a terminal shows them), the command line included (continued
/// with ` \`), and so does the table at the end of `plan`.
#[test]
fn estimate_fits_a_100_column_pane() {
    let t = tempfile::tempdir().unwrap();
    for (params, gpu) in [("1.3e9", "20"), ("70e9", "24")] {
        let args = sized(&[], params, gpu);
        let est = run_text(t.path(), "estimate", &args);
        assert!(est.contains("as given"), "{est}");
        for l in est.lines() {
            assert!(
                l.chars().count() <= 100,
                "{} columns:\n{l}\n\n{est}",
                l.chars().count()
            );
        }
        let plan = run_text(t.path(), "plan", &args);
        let table = &plan[plan
            .find("memory per GPU")
            .expect("plan ends with the table")..];
        for l in table.lines() {
            assert!(
                l.chars().count() <= 100,
                "{} columns:\n{l}",
                l.chars().count()
            );
        }
    }
}

/// A 70B model on one 24 GiB GPU: nothing the policy can reach fits, and
/// `estimate` says what would — ZeRO-3/FSDP over the GPUs there are, CPU offload,
/// LoRA, more GPUs — each with what it would need, in text and JSON.
#[test]
fn nothing_fits_names_the_ways_out_that_apply() {
    let t = tempfile::tempdir().unwrap();
    let args = sized(&["torchrun", "--nproc_per_node", "2"], "70e9", "24");
    let text = run_text(t.path(), "estimate", &args);
    assert!(text.contains("nothing the policy can reach"), "{text}");
    for way in ["ZeRO-3", "FSDP", "CPU offload", "LoRA", "more GPUs"] {
        assert!(text.contains(way), "no {way:?} in:\n{text}");
    }
    let mut a = vec!["--json".to_string()];
    a.extend(args.iter().cloned());
    let v: J = serde_json::from_str(&run_text(t.path(), "estimate", &a)).unwrap();
    let advice: Vec<&str> = v["advice"]
        .as_array()
        .expect("estimate --json has advice")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        advice.iter().any(|a| a.starts_with("more GPUs")),
        "{advice:?}"
    );
    assert!(
        advice.iter().any(|a| a.contains("GiB per GPU")),
        "{advice:?}"
    );
    // Settings that fit get no advice.
    let ok = sized(&[], "1.3e9", "80");
    let mut a = vec!["--json".to_string()];
    a.extend(ok);
    let v: J = serde_json::from_str(&run_text(t.path(), "estimate", &a)).unwrap();
    assert_eq!(v["advice"], J::Array(vec![]), "{v}");
}

/// `plan`'s rung 2 (what a run relaunches with after the first OOM) and
/// `estimate`'s pick (`*`) are the same settings for the same command: on a GPU
/// where nothing is predicted to fit, under a policy without the memory model,
/// and where the model picks.
#[test]
fn plan_and_estimate_pick_the_same_settings() {
    let t = tempfile::tempdir().unwrap();
    let policy = t.path().join("ladder-only.toml");
    let default = fs::read_to_string(root().join("policies/default.toml")).unwrap();
    fs::write(
        &policy,
        default.replace("memory_model = true", "memory_model = false"),
    )
    .unwrap();
    let policy = policy.display().to_string();
    for (pre, gpu) in [
        (vec![], "20"),
        (vec!["--policy".to_string(), policy.clone()], "40"),
        (vec![], "40"),
    ] {
        let mut args = pre.clone();
        args.push("--json".into());
        args.extend(sized(&[], "1.3e9", gpu));
        let mut e = vec!["estimate".to_string()];
        e.extend(args.iter().cloned());
        let mut p = vec!["plan".to_string()];
        p.extend(args.iter().cloned());
        let e: Vec<&str> = e.iter().map(String::as_str).collect();
        let p: Vec<&str> = p.iter().map(String::as_str).collect();
        let est: J = serde_json::from_slice(&oomguard(t.path(), &e, &[]).stdout).unwrap();
        let plan: J = serde_json::from_slice(&oomguard(t.path(), &p, &[]).stdout).unwrap();
        let pick = est["pick"]
            .as_u64()
            .unwrap_or_else(|| panic!("estimate picks nothing: {}", est["why"]));
        let picked = &est["candidates"][pick as usize]["settings"]["knobs"];
        let rung2 = &plan["ladder"][1]["settings"];
        assert_eq!(
            picked, rung2,
            "{pre:?} gpu {gpu}: estimate * vs plan rung 2"
        );
    }
}

/// A plan step names every knob it changes: halving the micro-batch names the
/// accumulation it doubles, an offload on one GPU the ZeRO stage it raises, in
/// the text's rung line and in `ladder[].changes`.
#[test]
fn a_plan_step_names_every_knob_it_changes() {
    let t = tempfile::tempdir().unwrap();
    lay(t.path(), "22", "zero2.json", "ds.json");
    let argv = [
        "python3",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
        "--deepspeed",
        "ds.json",
        "--output_dir",
        "out",
    ];
    let mut a = vec!["plan"];
    a.extend(argv);
    let out = oomguard(t.path(), &a, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("halve_micro_batch (micro_batch 8 → 4, grad_accum 2 → 4)"),
        "{text}"
    );
    assert!(
        text.contains("offload_param (zero_stage 2 → 3, offload_param none → cpu)"),
        "{text}"
    );
    let p = plan_json(t.path(), &argv, &[]);
    for r in p["ladder"].as_array().unwrap().iter().skip(1) {
        let changes: Vec<&str> = r["changes"]
            .as_array()
            .expect("every rung lists its changes")
            .iter()
            .map(|c| c["knob"].as_str().unwrap())
            .collect();
        assert!(!changes.is_empty(), "{r}");
        if r["step"] == "offload_param" {
            assert!(changes.contains(&"zero_stage"), "{r}");
        }
        if r["step"] == "halve_micro_batch" {
            assert!(changes.contains(&"grad_accum"), "{r}");
        }
    }
}
