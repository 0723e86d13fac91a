//! Multi-node commands: the world size of `srun` / `mpirun` forms (and of a
//! launcher inside `srun`) as `plan --json` reports it, and a DeepSpeed
//! `train_batch_size` kept right with it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

fn plan(cwd: &Path, argv: &[&str], envs: &[(&str, &str)]) -> Value {
    let mut c = Command::new(common::OOMGUARD);
    c.arg("plan")
        .arg("--json")
        .arg("--")
        .args(argv)
        .current_dir(cwd);
    for var in [
        "SLURM_NTASKS",
        "SLURM_NNODES",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_JOB_ID",
    ] {
        c.env_remove(var);
    }
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().expect("run oomguard plan");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "oomguard plan --json {argv:?} in {}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("plan --json {argv:?} printed no JSON ({e}):\n{stdout}"))
}

const HF: [&str; 6] = [
    "train.py",
    "--per_device_train_batch_size",
    "8",
    "--gradient_accumulation_steps",
    "4",
    "--output_dir=out",
];

#[test]
fn srun_and_mpirun_world_sizes_in_plan_json() {
    let t = tempfile::tempdir().unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], u64);
    let cases: &[Case] = &[
        (&["srun", "-n2", "python3"], &[], 2),
        (&["srun", "--ntasks=2", "python3"], &[], 2),
        (&["srun", "-N2", "--ntasks-per-node=4", "python3"], &[], 8),
        (
            &[
                "srun",
                "-N2",
                "--ntasks-per-node=1",
                "torchrun",
                "--nnodes",
                "2",
                "--nproc_per_node",
                "4",
            ],
            &[],
            8,
        ),
        (&["srun", "python3"], &[("SLURM_NTASKS", "2")], 2),
        (&["mpirun", "--np", "2", "python3"], &[], 2),
    ];
    for (launch, envs, n) in cases {
        let argv: Vec<&str> = launch.iter().chain(HF.iter()).copied().collect();
        let v = plan(t.path(), &argv, envs);
        assert_eq!(
            v["world_size"], *n,
            "{argv:?} {envs:?}: {}",
            v["world_source"]
        );
        assert_eq!(
            v["world_uncertain"], false,
            "{argv:?}: {}",
            v["world_source"]
        );
        assert_eq!(v["global_batch"], 8 * 4 * n, "{argv:?}");
    }
}

#[test]
fn uncertain_task_counts_are_said_with_their_source() {
    let t = tempfile::tempdir().unwrap();
    let argv: Vec<&str> = ["srun", "python3"]
        .iter()
        .chain(HF.iter())
        .copied()
        .collect();
    let v = plan(t.path(), &argv, &[("SLURM_NTASKS_PER_NODE", "2(x3),1")]);
    assert_eq!(v["world_uncertain"], true, "{v}");
    let source = v["world_source"].as_str().unwrap();
    assert!(source.contains("SLURM_NTASKS_PER_NODE=2(x3),1"), "{source}");
    let argv: Vec<&str> = ["mpirun", "python3"]
        .iter()
        .chain(HF.iter())
        .copied()
        .collect();
    let v = plan(t.path(), &argv, &[]);
    assert_eq!(v["world_uncertain"], true, "{v}");
    assert!(v["world_source"].as_str().unwrap().contains("without -np"));
}

#[test]
fn deepspeed_train_batch_size_under_srun_torchrun() {
    let t = tempfile::tempdir().unwrap();
    // 2 nodes × 4 GPUs × micro 8 × accumulation 4 = 256.
    std::fs::write(
        t.path().join("ds.json"),
        r#"{"train_batch_size": 256, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2}}"#,
    )
    .unwrap();
    let argv = [
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "train.py",
        "--deepspeed",
        "ds.json",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "4",
        "--output_dir=out",
    ];
    let v = plan(t.path(), &argv, &[]);
    assert_eq!(v["world_size"], 8, "{}", v["world_source"]);
    assert_eq!(v["global_batch"], 256);
    for rung in v["ladder"].as_array().unwrap() {
        assert_eq!(rung["global_batch"], 256, "{rung}");
        // A copy of ds.json, where there is one, keeps train_batch_size 256
        // (the job's real global batch).
        for f in rung["files"].as_array().unwrap() {
            let diff = f["diff"].as_str().unwrap();
            for line in diff
                .lines()
                .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            {
                assert!(
                    !line.contains("train_batch_size")
                        || line.contains("\"train_batch_size\": 256"),
                    "{diff}"
                );
            }
        }
    }
}

#[test]
fn a_copy_per_slurm_task_counts_every_task_and_names_its_job() {
    let t = tempfile::tempdir().unwrap();
    let argv: Vec<&str> = ["python3"].iter().chain(HF.iter()).copied().collect();
    let env = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
    ];
    let v = plan(t.path(), &argv, &env);
    assert_eq!(v["world_size"], 2, "{}", v["world_source"]);
    assert_eq!(v["global_batch"], 64);
    let notes = v["notes"].to_string();
    assert!(notes.contains("job: copy 1 of 2"), "{notes}");
    assert!(notes.contains(".oomguard-job/slurm-77.0"), "{notes}");
}

#[test]
fn sbatch_is_refused_with_where_to_put_oomguard_and_salloc_warned() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(common::OOMGUARD)
        .args(["sbatch", "job.sh"])
        .current_dir(t.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("in front of the srun line inside the batch script"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let argv: Vec<&str> = ["salloc", "-N2", "srun", "python3"]
        .iter()
        .chain(HF.iter())
        .copied()
        .collect();
    let v = plan(t.path(), &argv, &[]);
    let warnings = v["warnings"].to_string();
    assert!(warnings.contains("salloc -N2 oomguard srun"), "{warnings}");
}

/// srun's per-task output files are read (a note names them); output srun
/// throws away (`none`, a single task's number) is named in a warning.
#[test]
fn per_task_output_files_are_read_and_discarded_output_is_warned_of() {
    let t = tempfile::tempdir().unwrap();
    let with = |opt: &[&str], envs: &[(&str, &str)]| {
        let argv: Vec<&str> = ["srun", "-n2"]
            .iter()
            .chain(opt.iter())
            .chain(["python3"].iter())
            .chain(HF.iter())
            .copied()
            .collect();
        plan(t.path(), &argv, envs)
    };
    for (opt, envs) in [
        (&["--output=logs/%j-%t.out"][..], &[][..]),
        (&["-o", "logs/%j-%t.out"][..], &[][..]),
        (&["-ologs/%j-%t.out"][..], &[][..]),
        (&[][..], &[("SLURM_STDOUTMODE", "logs/%j-%t.out")][..]),
    ] {
        let v = with(opt, envs);
        let notes = v["notes"].to_string();
        assert!(
            notes.contains(
                "srun writes the tasks' output to logs/%j-%t.out: oomguard reads those files"
            ),
            "{opt:?} {envs:?}: {notes}"
        );
        assert!(
            !v["warnings"].to_string().contains("%t"),
            "{}",
            v["warnings"]
        );
    }
    let v = with(&["--error", "err-%t.log", "--output=out-%t.log"], &[]);
    let notes = v["notes"].to_string();
    assert!(notes.contains("out-%t.log and err-%t.log"), "{notes}");
    for (opt, said) in [
        (
            "--output=none",
            "--output=none: the tasks' output is thrown away",
        ),
        (
            "--error=0",
            "--error=0: only task 0's output comes through srun",
        ),
    ] {
        let v = with(&[opt], &[]);
        let warnings = v["warnings"].to_string();
        assert!(warnings.contains(said), "{opt}: {warnings}");
    }
}

fn sim_args(run_dir: &Path, out: &Path, max_steps: &str) -> Vec<String> {
    let mut v: Vec<String> = vec!["--run-dir".into(), run_dir.display().to_string()];
    v.push("python3".into());
    v.push(
        common::repo()
            .join("examples/sim_trainer.py")
            .display()
            .to_string(),
    );
    for a in [
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "1024",
        "--max_steps",
        max_steps,
        "--save_steps",
        "5",
        "--step_seconds",
        "0.005",
        "--output_dir",
    ] {
        v.push(a.into());
    }
    v.push(out.display().to_string());
    v
}

/// A requeued Slurm job (`SLURM_RESTART_COUNT=1`, same `SLURM_JOB_ID`) starts at
/// the settings that fit and resumes from the run's newest checkpoint, in a new
/// run folder that names the old one.
#[test]
fn a_requeued_job_starts_at_the_fitting_settings_and_resumes() {
    let t = tempfile::tempdir().unwrap();
    let (out, run1, run2) = (
        t.path().join("out"),
        t.path().join("run1"),
        t.path().join("run2"),
    );
    let first = sim_args(&run1, &out, "20");
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let r = common::spawn_env(t.path(), &first, &[("SLURM_JOB_ID", "4242")])
        .wait(Duration::from_secs(120));
    r.check("first run's exit code", Some(0), r.code);
    let second = sim_args(&run2, &out, "30");
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let r = common::spawn_env(
        t.path(),
        &second,
        &[("SLURM_JOB_ID", "4242"), ("SLURM_RESTART_COUNT", "1")],
    )
    .wait(Duration::from_secs(120));
    r.check("requeued run's exit code", Some(0), r.code);
    let journal = r.journal(&run2);
    let starts = common::events(&journal, "attempt_start");
    r.check("one attempt after the requeue", 1, starts.len());
    let argv = common::argv_of(starts[0]);
    r.ensure(
        "starts at the micro-batch that fit",
        argv.windows(2)
            .any(|w| w == ["--per_device_train_batch_size", "4"]),
        "--per_device_train_batch_size 4",
        &argv,
    );
    let resume = common::resume_arg(&argv).unwrap_or_default();
    r.ensure(
        "resumes from the newest checkpoint",
        resume.ends_with("checkpoint-20"),
        "checkpoint-20",
        &resume,
    );
    let prev = std::fs::read_to_string(run2.join("previous-run")).unwrap_or_default();
    r.check(
        "previous-run names the old folder",
        run1.display().to_string(),
        prev.trim().to_string(),
    );
    let fin = r.read_json(&out.join("final.json"));
    r.check("trained to the end", Some(30), fin["global_step"].as_u64());
}
