//! FSDP's CPU offload is a rung: a run sharded with FSDP that is out of memory at
//! a micro-batch of 1 with gradient checkpointing on is relaunched with FSDP's CPU
//! offload (parameters, their gradients and the optimizer step) in the command's
//! own setting, where it was a dead end (exit 75) before. The Trainer's
//! `--fsdp "full_shard auto_wrap"` gets the word `offload`; accelerate's FSDP
//! config gets `fsdp_offload_params: true` in the run's copy, the user's file
//! untouched. The program parses the real `TrainingArguments`, and under the
//! real `accelerate launch` reads what accelerate hands FSDP
//! (`tests/children/fsdp_offload_train.py`): both need the real-client venv.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Run, argv_of, events, oomguard, repo};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(240);
const NEEDS_VENV: &str = "needs the real-client venv: run bash tests/run.sh";

fn venv_python() -> PathBuf {
    let p = std::env::var_os("OOMGUARD_REAL_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| panic!("OOMGUARD_REAL_PYTHON is not set: {NEEDS_VENV}"));
    let p = PathBuf::from(p);
    assert!(p.exists(), "OOMGUARD_REAL_PYTHON: no {}", p.display());
    p
}

fn child() -> String {
    repo()
        .join("tests/children/fsdp_offload_train.py")
        .display()
        .to_string()
}

fn run(dir: &Path, path_first: Option<&Path>, args: &[&str]) -> (Run, Vec<Value>) {
    let run_dir = dir.join("run");
    let mut all = vec!["--run-dir", run_dir.to_str().unwrap()];
    all.extend_from_slice(args);
    let r = oomguard(dir, &all, path_first, LIMIT);
    let j = r.journal(&run_dir);
    (r, j)
}

/// The training flags both runs give: micro-batch 1 with checkpointing on, so
/// that the offload is the one step left that keeps the batch.
const TRAINING: [&str; 7] = [
    "--output_dir",
    "out",
    "--per_device_train_batch_size",
    "1",
    "--gradient_accumulation_steps",
    "4",
    "--gradient_checkpointing",
];

fn outcomes(j: &[Value]) -> Vec<&str> {
    j.iter()
        .filter(|e| e["event"] == "attempt_end")
        .map(|e| e["outcome"].as_str().unwrap_or(""))
        .collect()
}

/// The run was carried: an OOM, then success after one decision, FSDP's CPU
/// offload, said with what goes with it.
fn carried_by_the_offload(r: &Run, j: &[Value]) {
    r.check("exit code", Some(0), r.code);
    r.check("outcomes", vec!["cuda_oom", "success"], outcomes(j));
    let d = events(j, "decision");
    r.check("one decision", 1, d.len());
    r.check("the step", Some("offload_param"), d[0]["step"].as_str());
    let reason = d[0]["reason"].as_str().unwrap_or("");
    r.ensure(
        "the reason names FSDP's offload and what goes with it",
        reason.contains("FSDP's CPU offload") && reason.contains("optimizer step"),
        "FSDP's CPU offload ... optimizer step",
        reason,
    );
}

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn a_trainer_sharded_with_fsdp_words_is_carried_by_the_offload_word() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    let script = child();
    let (r, j) = run(
        dir.path(),
        None,
        &[
            &[python.to_str().unwrap(), &script][..],
            &TRAINING,
            &["--fsdp", "full_shard auto_wrap"],
        ]
        .concat(),
    );
    carried_by_the_offload(&r, &j);
    let argvs: Vec<Vec<String>> = events(&j, "attempt_start")
        .into_iter()
        .map(argv_of)
        .collect();
    let fsdp = |a: &[String]| {
        a.iter()
            .position(|x| x == "--fsdp")
            .map(|i| a[i + 1].clone())
    };
    r.check(
        "attempt 1 as written",
        Some("full_shard auto_wrap".to_string()),
        fsdp(&argvs[0]),
    );
    r.check(
        "attempt 2 with the offload word, the others kept",
        Some("full_shard auto_wrap offload".to_string()),
        fsdp(&argvs[1]),
    );
    r.ensure(
        "transformers read the offload from the words",
        r.stdout.contains("cpu_offload=True") && r.stdout.contains("step 2: loss"),
        "cpu_offload=True ... step 2: loss",
        &r.stdout,
    );
    r.ensure(
        "the batch is kept",
        argvs[1]
            .windows(2)
            .any(|w| w == ["--per_device_train_batch_size", "1"])
            && argvs[1]
                .windows(2)
                .any(|w| w == ["--gradient_accumulation_steps", "4"]),
        "micro-batch 1, accumulation 4",
        &argvs[1],
    );
}

const ACCELERATE_FSDP: &str = "compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_offload_params: false # CPU offload: off while it fits
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
mixed_precision: 'no'
num_machines: 1
num_processes: 1
use_cpu: true
";

#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn an_accelerate_fsdp_config_is_carried_by_fsdp_offload_params_in_the_runs_copy() {
    let python = venv_python();
    let bin = python.parent().unwrap().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fsdp.yaml");
    std::fs::write(&cfg, ACCELERATE_FSDP).unwrap();
    let script = child();
    let (r, j) = run(
        dir.path(),
        Some(&bin),
        &[
            &[
                "accelerate",
                "launch",
                "--config_file",
                "fsdp.yaml",
                &script,
            ][..],
            &TRAINING,
        ]
        .concat(),
    );
    carried_by_the_offload(&r, &j);
    r.ensure(
        "accelerate handed FSDP the offload",
        r.stdout.contains("FSDP_OFFLOAD_PARAMS=false")
            && r.stdout.contains("FSDP_OFFLOAD_PARAMS=true")
            && r.stdout.contains("step 2: loss"),
        "FSDP_OFFLOAD_PARAMS=false, then =true, then step 2",
        &r.stdout,
    );
    r.check(
        "the user's config is untouched",
        ACCELERATE_FSDP.to_string(),
        std::fs::read_to_string(&cfg).unwrap(),
    );
    let argv2 = argv_of(events(&j, "attempt_start")[1]);
    let copy = argv2
        .iter()
        .position(|a| a == "--config_file")
        .map(|i| PathBuf::from(&argv2[i + 1]))
        .expect("--config_file in attempt 2");
    let text = std::fs::read_to_string(dir.path().join(&copy)).unwrap();
    r.ensure(
        "the run's copy offloads, with the comment and the other keys as written",
        text.contains("fsdp_offload_params: true # CPU offload: off while it fits")
            && text.contains("fsdp_sharding_strategy: FULL_SHARD"),
        "fsdp_offload_params: true # CPU offload ...",
        &text,
    );
}

/// Without the venv: `plan` binds the offload to `--fsdp`'s words and its last
/// rung before a shorter sequence adds the word; a run on `--fsdp true` gets none.
#[test]
fn plan_shows_the_offload_rung_in_fsdps_words() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("train.py"),
        "from transformers import HfArgumentParser, TrainingArguments\n",
    )
    .unwrap();
    let plan = |fsdp: &str| {
        oomguard(
            dir.path(),
            &[
                "plan",
                "torchrun",
                "--nproc_per_node",
                "4",
                "train.py",
                "--per_device_train_batch_size",
                "2",
                "--gradient_accumulation_steps",
                "4",
                "--fsdp",
                fsdp,
                "--output_dir",
                "out",
            ],
            None,
            LIMIT,
        )
    };
    let r = plan("shard_grad_op auto_wrap");
    r.check("exit code", Some(0), r.code);
    r.ensure(
        "the knob is the flag's words",
        r.stdout.lines().any(|l| {
            l.starts_with("  offload_param ") && l.contains("none") && l.contains("flag --fsdp")
        }),
        "offload_param none flag --fsdp",
        &r.stdout,
    );
    r.ensure(
        "a rung adds the word, the batch kept",
        r.stdout
            .contains("offload_param (offload_param none → cpu)")
            && r.stdout
                .contains("--fsdp 'shard_grad_op auto_wrap offload'")
            && r.stdout.contains("FSDP's CPU offload"),
        "offload_param (offload_param none → cpu) ... --fsdp 'shard_grad_op auto_wrap offload'",
        &r.stdout,
    );
    r.ensure(
        "offload_optimizer is said not to apply, and why",
        r.stdout
            .contains("offload_optimizer: FSDP has no optimizer-only offload"),
        "offload_optimizer: FSDP has no optimizer-only offload",
        &r.stdout,
    );
    let r = plan("true");
    r.check("exit code", Some(0), r.code);
    r.ensure(
        "`--fsdp true` holds no offload: nothing bound, nothing written",
        r.stdout
            .lines()
            .any(|l| l.starts_with("  offload_param ") && l.contains("not found"))
            && !r.stdout.contains("offload'"),
        "offload_param - not found",
        &r.stdout,
    );
}

/// When nothing fits, the ways out of an FSDP run do not offer what it already
/// does: it is sharded (no "ZeRO-3 or FSDP: shard"), and once its offload is on,
/// no CPU offload either.
#[test]
fn the_ways_out_of_an_fsdp_run_do_not_offer_what_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("m")).unwrap();
    std::fs::write(
        d.join("m/config.json"),
        r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("train.py"),
        "from transformers import HfArgumentParser, TrainingArguments\n",
    )
    .unwrap();
    let estimate = |fsdp: &str| {
        let r = oomguard(
            d,
            &[
                "estimate",
                "--gpu-memory",
                "2",
                "torchrun",
                "--nproc_per_node",
                "4",
                "train.py",
                "--model_name_or_path",
                "m",
                "--bf16",
                "true",
                "--per_device_train_batch_size",
                "1",
                "--gradient_accumulation_steps",
                "8",
                "--gradient_checkpointing",
                "--fsdp",
                fsdp,
                "--output_dir",
                "out",
            ],
            None,
            LIMIT,
        );
        r.check("estimate exit code", Some(0), r.code);
        r
    };
    for fsdp in ["full_shard auto_wrap", "full_shard auto_wrap offload"] {
        let r = estimate(fsdp);
        r.ensure(
            "nothing fits, and the ways out are said",
            r.stdout.contains("ways out"),
            "ways out",
            &r.stdout,
        );
        r.ensure(
            "a sharded run is not told to shard, nor an offloading one to offload",
            !r.stdout.contains("ZeRO-3 or FSDP: shard")
                && !r
                    .stdout
                    .contains("CPU offload: optimizer states and parameters"),
            "no sharding and no CPU offload among the ways out",
            &r.stdout,
        );
    }
}
