//! Deciding from evidence, driven through the real binary: `oomguard estimate`'s
//! table, and a run whose OOM is fixed in one relaunch by the memory model's pick,
//! results first, against the simulated trainer of the sizing benchmark
//! (`benches/sizing_trainer.py`: its OOM names only the one allocation that failed).

mod common;
use common::{OOMGUARD, llama_1b3_model};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(OOMGUARD);
    c.args(args).current_dir(cwd);
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().expect("run oomguard");
    eprintln!(
        "command: {OOMGUARD} {args:?}\ncwd: {}\nstatus: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fake GPU timeline of tests/fixtures/gpu (`OOMGUARD_FAKE_GPUS`).
fn fake(name: &str) -> String {
    root()
        .join("tests/fixtures/gpu")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn trainer_args(m: &Path) -> Vec<String> {
    [
        "python3",
        root().join("benches/sizing_trainer.py").to_str().unwrap(),
        "--model_name_or_path",
        m.to_str().unwrap(),
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "2048",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn estimate_shows_the_memory_of_each_candidate_and_which_fit() {
    let t = tempfile::tempdir().unwrap();
    let m = llama_1b3_model(t.path());
    let cmd = trainer_args(&m);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();

    let mut args = vec!["estimate", "--gpu-memory", "24"];
    args.extend(&cmd);
    let out = run(t.path(), &args, &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("model/config.json: 1.3"), "{text}");
    assert!(text.contains("as given"), "{text}");
    assert!(text.contains("predicted not to fit"), "{text}");
    // Each row says why: how far over, or what is left to spare.
    assert!(text.contains("GiB over"), "{text}");
    assert!(text.contains("GiB to spare"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with('*')),
        "{text}"
    );

    let mut args = vec!["estimate", "--json", "--gpu-memory", "24"];
    args.extend(&cmd);
    let out = run(t.path(), &args, &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("estimate --json");
    assert_eq!(v["given"]["fits"], false);
    let pick = v["pick"].as_u64().expect("a pick") as usize;
    let best = &v["candidates"][pick];
    assert_eq!(best["fits"], true);
    // Results first: the pick keeps the sequence, and the global batch.
    assert_eq!(best["settings"]["knobs"]["seq_len"], 2048, "{best}");
    let knobs = &best["settings"]["knobs"];
    assert_eq!(
        knobs["micro_batch"].as_u64().unwrap() * knobs["grad_accum"].as_u64().unwrap(),
        32
    );
    // The model states match the formula: 16 bytes per parameter at ZeRO 0.
    let e = &v["given"]["estimate"];
    let states = e["weights"].as_f64().unwrap()
        + e["gradients"].as_f64().unwrap()
        + e["optimizer"].as_f64().unwrap();
    let params = v["model"]["params"].as_f64().unwrap();
    assert!((states / params - 16.0).abs() < 1e-6);

    // Without the GPU's size (NVML failing) it says so; NVML's is taken when
    // there is one; without a model, it says how to give one.
    let mut args = vec!["estimate"];
    args.extend(&cmd);
    let out = run(
        t.path(),
        &args,
        &[("OOMGUARD_FAKE_GPUS", &fake("lost.json"))],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--gpu-memory GIB"));
    let out = run(
        t.path(),
        &args,
        &[("OOMGUARD_FAKE_GPUS", &fake("two_gpus.json"))],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("GPU 80.0 GiB, 5% margin"));
    let out = run(
        t.path(),
        &[
            "estimate",
            "python3",
            "train.py",
            "--per_device_train_batch_size",
            "4",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--knob params=7e9"));
    let out = run(
        t.path(),
        &[
            "estimate",
            "--gpu-memory",
            "24",
            "--knob",
            "params=7e9",
            "python3",
            "train.py",
            "--per_device_train_batch_size",
            "4",
        ],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--knob params=7e9: 7.0"));
}

/// The OOM's numbers calibrate the model, and the fix that fits is taken in
/// one relaunch; the blind ladder (`memory_model = false`) takes more.
#[test]
fn an_oom_is_fixed_in_one_relaunch_by_the_models_pick() {
    let t = tempfile::tempdir().unwrap();
    let m = llama_1b3_model(t.path());
    let cmd = trainer_args(&m);
    let results = t.path().join("results.jsonl");
    let envs = [
        ("SIM_GPU_GIB", "24"),
        ("SIM_ACT_FACTOR", "1.3"),
        ("SIM_RESULT", results.to_str().unwrap()),
    ];
    let attempts = |policy: &str| {
        let _ = std::fs::remove_file(&results);
        let mut args = vec!["--policy", policy, "--hang-timeout", "5"];
        args.extend(cmd.iter().map(String::as_str));
        let out = run(t.path(), &args, &envs);
        assert_eq!(out.status.code(), Some(0));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&results)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (new, stderr) = attempts("default");
    assert_eq!(new.len(), 2, "one relaunch: {new:?}");
    let last = &new[1]["settings"];
    assert_eq!(last["seq_len"], 2048);
    assert_eq!(
        last["micro_batch"].as_u64().unwrap() * last["grad_accum"].as_u64().unwrap(),
        32
    );
    assert!(stderr.contains("the memory model"), "{stderr}");
    // One decision changed several knobs: each summary row names its own step.
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with("grad_checkpointing")
                && l.contains("enable_grad_checkpointing after the OOM in attempt 1")),
        "{stderr}"
    );

    let blind = t.path().join("blind.toml");
    std::fs::write(
        &blind,
        "memory_model = false\n[[step]]\nkind = \"halve_micro_batch\"\n[[step]]\nkind = \"enable_grad_checkpointing\"\n",
    )
    .unwrap();
    let (old, _) = attempts(blind.to_str().unwrap());
    assert!(old.len() > new.len(), "{old:?}");
}

/// `benches/sizing.py` on 12 scenarios of seed 12 (and `extra`), as JSON.
fn benchmark(extra: &[&str]) -> serde_json::Value {
    let script = root().join("benches/sizing.py");
    let mut args = vec![script.to_str().unwrap(), "--bin", OOMGUARD];
    args.extend(["--scenarios", "12", "--seed", "12", "--json"]);
    args.extend(extra);
    let out = Command::new("python3")
        .args(&args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The sizing benchmark's done-when targets, on a small draw of scenarios
/// (`benches/sizing.py`: model families, bf16 weights, 8-bit Adam, LoRA/QLoRA
/// and FSDP, with costs hidden from oomguard; docs/internals/memory-model.md has
/// the full table): every run finishes, median ≤ 1 relaunch and max ≤ 2, mean
/// ≥ 0.90 and worst ≥ 0.75 of the best fitting throughput, and no needless
/// shortening; with `--fit`, median 0 relaunches.
#[test]
fn the_sizing_benchmark_meets_its_targets_against_the_blind_ladder() {
    let v = benchmark(&[]);
    let new = &v["rows"][1];
    assert_eq!(new["finished"], new["runs"], "{v}");
    assert!(new["relaunches_median"].as_f64().unwrap() <= 1.0, "{v}");
    assert!(new["relaunches_max"].as_u64().unwrap() <= 2, "{v}");
    assert!(new["kept_mean"].as_f64().unwrap() >= 0.90, "{v}");
    assert!(new["kept_worst"].as_f64().unwrap() >= 0.75, "{v}");
    assert_eq!(new["shortened_needlessly"], 0, "{v}");
    let fit = &v["rows"][2];
    assert_eq!(fit["finished"], fit["runs"], "{v}");
    assert_eq!(fit["relaunches_median"].as_f64().unwrap(), 0.0, "{v}");
    assert_eq!(fit["shortened_needlessly"], 0, "{v}");
    // The blind ladder shortens where it need not, or takes more relaunches.
    let old = &v["rows"][0];
    assert!(
        old["shortened_needlessly"].as_u64().unwrap() > 0
            || old["relaunches_max"].as_u64().unwrap() > new["relaunches_max"].as_u64().unwrap(),
        "{v}"
    );
}

/// The model's config is found where users keep it: a hub name in the Hugging
/// Face cache (`$HF_HOME/hub/models--ORG--NAME/snapshots/*/config.json`), and a
/// recipe's `base_model:`.
#[test]
fn the_model_config_is_found_in_the_hf_cache_and_from_a_recipe() {
    let t = tempfile::tempdir().unwrap();
    let snap = t
        .path()
        .join("hf/hub/models--acme--tiny-llama/snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    let m = llama_1b3_model(t.path());
    std::fs::copy(m.join("config.json"), snap.join("config.json")).unwrap();
    let hf_home = t.path().join("hf");
    let out = run(
        t.path(),
        &[
            "estimate",
            "--json",
            "--gpu-memory",
            "24",
            "python3",
            "train.py",
            "--model_name_or_path",
            "acme/tiny-llama",
            "--per_device_train_batch_size",
            "4",
        ],
        &[("HF_HOME", hf_home.to_str().unwrap())],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["model"]["source"]
            .as_str()
            .unwrap()
            .ends_with("models--acme--tiny-llama/snapshots/0123abcd/config.json"),
        "{v}"
    );

    std::fs::write(
        t.path().join("config.yml"),
        format!(
            "base_model: {}\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\nsequence_len: 2048\noutput_dir: out\n",
            m.display()
        ),
    )
    .unwrap();
    let out = run(
        t.path(),
        &["estimate", "--json", "axolotl", "train", "config.yml"],
        &[("OOMGUARD_FAKE_GPUS", &fake("lost.json"))],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["model"]["source"]
            .as_str()
            .unwrap()
            .ends_with("model/config.json"),
        "{v}"
    );
    assert!(v["why"].as_str().unwrap().contains("--gpu-memory"), "{v}");
}

/// After a run that fit, the next run of the same command on the same GPUs
/// starts from the settings that fit, says so in one line, and needs no
/// relaunch; `--fresh` starts as written. (GPUs from the fake NVML probe: without
/// NVML nothing is remembered.)
#[test]
fn the_next_run_of_the_same_command_starts_from_what_fit_unless_fresh() {
    let t = tempfile::tempdir().unwrap();
    let m = llama_1b3_model(t.path());
    let cmd = trainer_args(&m);
    let results = t.path().join("results.jsonl");
    let state = t.path().join("state");
    let fake_gpus = fake("two_gpus.json");
    let envs = [
        ("SIM_GPU_GIB", "24"),
        ("SIM_ACT_FACTOR", "1.3"),
        ("SIM_RESULT", results.to_str().unwrap()),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
        ("OOMGUARD_FAKE_GPUS", fake_gpus.as_str()),
        ("CUDA_VISIBLE_DEVICES", "1"),
    ];
    let attempts = |extra: &[&str]| {
        let _ = std::fs::remove_file(&results);
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["--hang-timeout", "5"]);
        args.extend(cmd.iter().map(String::as_str));
        let out = run(t.path(), &args, &envs);
        assert_eq!(out.status.code(), Some(0));
        let n = std::fs::read_to_string(&results).unwrap().lines().count();
        (n, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (first, _) = attempts(&[]);
    assert_eq!(first, 2);
    assert!(state.join("oomguard/fits.json").is_file());
    let (again, stderr) = attempts(&[]);
    assert_eq!(again, 1, "{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("starting from the settings that fit"))
            .count(),
        1,
        "{stderr}"
    );
    // plan shows the same start, as a run would take it.
    let mut args = vec!["plan", "--json"];
    args.extend(cmd.iter().map(String::as_str));
    let out = run(t.path(), &args, &envs);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan --json");
    let remembered: u64 = stderr
        .split("(micro_batch=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the remembered micro-batch in the start line");
    assert_eq!(v["ladder"][0]["settings"]["micro_batch"], remembered, "{v}");
    let (fresh, stderr) = attempts(&["--fresh"]);
    assert_eq!(fresh, 2, "{stderr}");
    assert!(!stderr.contains("starting from the settings that fit"));
}

/// A host OOM after the CPU offload oomguard made is not a dead end: the
/// offload is undone and the next step taken, here the policy's NVMe offload.
#[test]
fn a_host_oom_after_a_cpu_offload_undoes_it_and_offloads_to_nvme() {
    let t = tempfile::tempdir().unwrap();
    let m = llama_1b3_model(t.path());
    std::fs::write(
        t.path().join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"}}}"#,
    )
    .unwrap();
    let policy = t.path().join("offload.toml");
    std::fs::write(
        &policy,
        "memory_model = false\n[[step]]\nkind = \"offload_optimizer\"\n[[step]]\nkind = \"offload_optimizer\"\nnvme_path = \"/local_nvme\"\n",
    )
    .unwrap();
    let results = t.path().join("results.jsonl");
    let trainer = root().join("benches/sizing_trainer.py");
    let out = run(
        t.path(),
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--hang-timeout",
            "5",
            "python3",
            trainer.to_str().unwrap(),
            "--model_name_or_path",
            m.to_str().unwrap(),
            "--deepspeed",
            "ds.json",
            "--per_device_train_batch_size",
            "1",
            "--max_seq_length",
            "512",
        ],
        &[
            ("SIM_GPU_GIB", "16"),
            ("SIM_HOST_OOM_ON_CPU_OFFLOAD", "1"),
            ("SIM_RESULT", results.to_str().unwrap()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let devices: Vec<String> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["settings"]["offload_optimizer"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(devices, ["none", "cpu", "nvme"], "{stderr}");
    assert!(stderr.contains("offload_optimizer cpu undone"), "{stderr}");
}

/// An OOM after many good steps is a spike: the step reached is read from the
/// trainer's `step N/M` lines, the decision says so, and the fix still fits in one
/// relaunch, with the sequence kept.
#[test]
fn an_oom_after_many_good_steps_is_calibrated_as_a_spike() {
    let t = tempfile::tempdir().unwrap();
    let m = llama_1b3_model(t.path());
    let cmd = trainer_args(&m);
    let results = t.path().join("results.jsonl");
    let run_dir = t.path().join("run");
    let mut args = vec![
        "--run-dir".to_string(),
        run_dir.display().to_string(),
        "--hang-timeout".into(),
        "5".into(),
    ];
    args.extend(cmd.iter().cloned());
    args.extend(["--max_steps".to_string(), "30".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // 90 GiB: micro-batch 16's typical batches (0.6 of the sequence, about 77 GiB)
    // fit, its longest one (about 114 GiB) does not.
    let out = run(
        t.path(),
        &args,
        &[
            ("SIM_GPU_GIB", "90"),
            ("SIM_ACT_FACTOR", "1.0"),
            ("SIM_SPIKE_STEPS", "20"),
            ("SIM_RESULT", results.to_str().unwrap()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "one relaunch: {lines:?}");
    assert_eq!(lines[0]["good_steps"], 20, "{lines:?}");
    assert_eq!(lines[1]["settings"]["seq_len"], 2048);
    assert!(
        stderr.contains("after 20 good steps (a spike: the model is calibrated to need the OOM's figure at its peak"),
        "{stderr}"
    );
    let journal = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap();
    let lost: serde_json::Value = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "work_lost")
        .unwrap();
    assert_eq!(lost["step_reached"], 20, "{lost}");
}

/// The same targets when every run's OOM is a spike (`--spikes 20`: the typical
/// batch fits, the longest does not, after 20 good steps), and no second relaunch.
#[test]
fn the_sizing_benchmark_meets_its_targets_when_the_oom_is_a_spike() {
    let v = benchmark(&["--spikes", "20"]);
    let new = &v["rows"][1];
    assert_eq!(new["finished"], new["runs"], "{v}");
    assert_eq!(new["relaunches_max"], 1, "{v}");
    assert!(new["kept_mean"].as_f64().unwrap() >= 0.95, "{v}");
    assert!(new["kept_worst"].as_f64().unwrap() >= 0.75, "{v}");
    assert_eq!(new["shortened_needlessly"], 0, "{v}");
}
