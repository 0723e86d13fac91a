//! Sharding as a remedy for a plain `accelerate launch` (issue 21, item 5): a
//! script that goes through accelerate, on several GPUs, whose command sets no
//! DeepSpeed or FSDP gets FSDP full-shard through accelerate's own launcher
//! flags (`--use_fsdp --fsdp_sharding_strategy FULL_SHARD
//! --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP`, before the script) where
//! the memory model says the states do not fit one GPU and sharding does;
//! `plan` says so, and a run relaunches with them after an OOM. One process,
//! a config that already shards, or a script that never builds an
//! Accelerator gets nothing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Run, spawn_env};

const LIMIT: Duration = Duration::from_secs(60);

/// A 6.7B Llama: its weights, gradients and Adam states (about 100 GiB) do not
/// fit one 80 GiB GPU; sharded over 2 they are about 50 GiB.
const LLAMA_7B: &str = r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000}"#;

const SCRIPT: &str = "import argparse\nfrom accelerate import Accelerator\n\
p = argparse.ArgumentParser()\n\
p.add_argument('--model_name_or_path')\n\
p.add_argument('--per_device_train_batch_size', type=int)\n\
p.add_argument('--gradient_accumulation_steps', type=int)\n\
p.add_argument('--output_dir')\n\
a = p.parse_args()\n\
accelerator = Accelerator(gradient_accumulation_steps=a.gradient_accumulation_steps)\n";

const FLAGS: &str =
    "--use_fsdp --fsdp_sharding_strategy FULL_SHARD --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP";

fn setup(dir: &Path, script: &str) {
    std::fs::create_dir_all(dir.join("m")).unwrap();
    std::fs::write(dir.join("m/config.json"), LLAMA_7B).unwrap();
    std::fs::write(dir.join("train.py"), script).unwrap();
}

fn args<'a>(launcher: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["accelerate", "launch"];
    a.extend_from_slice(launcher);
    a.extend_from_slice(&[
        "train.py",
        "--model_name_or_path",
        "m",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--output_dir",
        "out",
    ]);
    a
}

fn plan(dir: &Path, launcher: &[&str]) -> Run {
    let mut a = vec!["plan", "--gpu-memory", "80", "--"];
    a.extend(args(launcher));
    let home = dir.display().to_string();
    let r = spawn_env(dir, &a, &[("HF_HOME", &home), ("HOME", &home)]).wait(LIMIT);
    r.ensure("plan exits 0", r.code == Some(0), "0", r.code);
    r
}

#[test]
fn accelerate_launch_on_two_gpus_is_planned_with_accelerates_fsdp_flags() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path(), SCRIPT);
    let r = plan(t.path(), &["--num_processes", "2"]);
    let out = &r.stdout;
    r.ensure(
        "the knob, in accelerate's own spelling",
        out.contains(&format!(
            "fsdp                false   absent; would add {FLAGS} before the script"
        )),
        "fsdp false absent; would add --use_fsdp ... before the script",
        out,
    );
    r.ensure(
        "the note says when and that the results are unchanged",
        out.contains("2 GPUs under accelerate launch and no DeepSpeed or FSDP setting")
            && out.contains("the updates are the same"),
        "a note: 2 GPUs under accelerate launch ... the updates are the same",
        out,
    );
    // The relaunch's command line: the flags between the launcher's options and the script.
    let want = format!(
        "argv: accelerate launch --num_processes 2 {FLAGS} train.py --model_name_or_path m --per_device_train_batch_size 1 --gradient_accumulation_steps 8 --output_dir out"
    );
    r.ensure(
        "the rung after an OOM shards, with the global batch kept",
        out.contains("fsdp false → true") && out.contains(&want),
        &want,
        out,
    );
}

/// accelerate takes one distributed type at a time: `--use_fsdp` replaces
/// the user's `--multi_gpu` instead of standing beside it (which accelerate
/// refuses).
#[test]
fn accelerates_fsdp_takes_the_place_of_multi_gpu() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path(), SCRIPT);
    let r = plan(t.path(), &["--multi_gpu", "--num_processes", "2"]);
    let want = format!(
        "argv: accelerate launch {FLAGS} --num_processes 2 train.py --model_name_or_path m --per_device_train_batch_size 1 --gradient_accumulation_steps 8 --output_dir out"
    );
    r.ensure(
        "--multi_gpu replaced by accelerate's FSDP flags",
        r.stdout.contains(&want),
        &want,
        &r.stdout,
    );
}

#[test]
fn one_process_a_sharding_config_or_a_script_without_accelerator_never_gets_fsdp() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path(), SCRIPT);
    let one = plan(t.path(), &["--num_processes", "1"]);
    one.ensure(
        "one GPU: nothing added",
        !one.stdout.contains("--use_fsdp"),
        "no --use_fsdp",
        &one.stdout,
    );
    let ds = plan(t.path(), &["--num_processes", "2", "--use_deepspeed"]);
    ds.ensure(
        "the user's own DeepSpeed: nothing added",
        !ds.stdout.contains("--use_fsdp"),
        "no --use_fsdp",
        &ds.stdout,
    );
    // accelerate's default config already says FSDP.
    let cfg = t.path().join("accelerate");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("default_config.yaml"),
        "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n",
    )
    .unwrap();
    let default = plan(t.path(), &["--num_processes", "2"]);
    default.ensure(
        "a default config that shards: nothing added",
        !default.stdout.contains("would add --use_fsdp"),
        "no --use_fsdp",
        &default.stdout,
    );
    std::fs::remove_dir_all(&cfg).unwrap();
    // A script that never builds an Accelerator would ignore the flags.
    std::fs::write(t.path().join("train.py"), "import argparse\nimport torch\n").unwrap();
    let plain = plan(t.path(), &["--num_processes", "2"]);
    plain.ensure(
        "no Accelerator: nothing added",
        !plain.stdout.contains("--use_fsdp"),
        "no --use_fsdp",
        &plain.stdout,
    );
}

/// A run: a stand-in `accelerate` OOMs unless it is given FSDP; oomguard
/// relaunches it once, with accelerate's FSDP flags before the script.
#[test]
fn a_run_that_ooms_is_relaunched_with_accelerates_fsdp_flags() {
    let t = tempfile::tempdir().unwrap();
    setup(t.path(), SCRIPT);
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stand_in = bin.join("accelerate");
    std::fs::write(
        &stand_in,
        "#!/bin/sh\necho \"$*\" >> argv.log\ncase \" $* \" in *\" --use_fsdp \"*) echo done; exit 0;; esac\n\
echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home = t.path().display().to_string();
    let mut a = vec!["--run-dir", "run", "--"];
    a.extend(args(&["--num_processes", "2"]));
    let r = spawn_env(
        t.path(),
        &a,
        &[("PATH", &path), ("HF_HOME", &home), ("HOME", &home)],
    )
    .wait(LIMIT);
    r.ensure("the run ends well", r.code == Some(0), "0", r.code);
    let log = std::fs::read_to_string(t.path().join("argv.log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    r.check("two attempts", 2, lines.len());
    r.check(
        "the first as given",
        "launch --num_processes 2 train.py --model_name_or_path m --per_device_train_batch_size 8 --gradient_accumulation_steps 1 --output_dir out",
        lines[0],
    );
    r.check(
        "the relaunch with accelerate's FSDP flags before the script, the global batch kept",
        format!("launch --num_processes 2 {FLAGS} train.py --model_name_or_path m --per_device_train_batch_size 1 --gradient_accumulation_steps 8 --output_dir out").as_str(),
        lines[1],
    );
}
