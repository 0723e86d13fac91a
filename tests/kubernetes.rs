//! Kubernetes: a PyTorchJob (Kubeflow training operator, JobSet, Volcano) starts one
//! pod per node and configures torchrun through its `PET_*` variables, or a plain
//! `python train.py` per pod through `WORLD_SIZE`/`RANK`. oomguard reads the same
//! configuration: the world size and the global batch (`plan`), the job its copies
//! make one decision for, and a restarted pod starts at the settings the job decided.
//!
//! The tests with real torchrun (two "pods" as two process groups on this host,
//! configured only by the environment) are `#[ignore]`d like the rest of the
//! real-client tier: they need `OOMGUARD_REAL_PYTHON` (run `bash tests/run.sh`).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// Variables of the environment the tests run in that would change what they test.
const CLEARED: &[&str] = &[
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_RDZV_ID",
    "PET_RDZV_ENDPOINT",
    "PET_RDZV_BACKEND",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_MAX_RESTARTS",
    "OOMGUARD_JOB_NAME",
    "KUBERNETES_SERVICE_HOST",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_RESTART_COUNT",
];

/// `oomguard plan [--json] -- ARGV` with only these of the variables above.
fn plan(cwd: &Path, json: bool, argv: &[&str], envs: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new(OOMGUARD);
    c.arg("plan");
    if json {
        c.arg("--json");
    }
    c.arg("--").args(argv).current_dir(cwd);
    for v in CLEARED {
        c.env_remove(v);
    }
    c.envs(envs.iter().copied());
    let out = c.output().expect("run oomguard plan");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{envs:?} oomguard plan -- {argv:?}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

fn plan_json(cwd: &Path, argv: &[&str], envs: &[(&str, &str)]) -> Value {
    let (stdout, _) = plan(cwd, true, argv, envs);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON ({e}):\n{stdout}"))
}

const TORCHRUN_HF: &[&str] = &[
    "torchrun",
    "train.py",
    "--per_device_train_batch_size",
    "8",
    "--gradient_accumulation_steps",
    "4",
    "--output_dir",
    "out",
];

/// The first case: torchrun configured by the operator's `PET_*` variables
/// is the job's 8 processes and its global batch 256, not one process; the copy
/// knows its place and the job's key is the rendezvous id.
#[test]
fn plan_reads_torchruns_pet_variables_for_the_world_size_and_the_job() {
    let t = tempfile::tempdir().unwrap();
    let env = [
        ("PET_NNODES", "2"),
        ("PET_NPROC_PER_NODE", "4"),
        ("PET_NODE_RANK", "1"),
        ("PET_RDZV_ID", "llama-ft"),
        ("PET_RDZV_ENDPOINT", "llama-ft-worker-0:29400"),
        ("HOSTNAME", "llama-ft-worker-1-x7k2p"),
    ];
    let (text, _) = plan(t.path(), false, TORCHRUN_HF, &env);
    for said in [
        "world size:   8 (torchrun PET_NPROC_PER_NODE=4 × PET_NNODES=2)",
        "global batch: 256 = micro-batch 8 × accumulation 4 × world size 8",
        "job: copy 1 of 2 (torchrun PET_NODE_RANK=1 of PET_NNODES=2); copy 0 decides, through out/.oomguard-job/torchrun-llama-ft",
    ] {
        assert!(text.contains(said), "expected {said:?} in:\n{text}");
    }
    assert!(!text.contains("x7k2p"), "the pod's name is no key:\n{text}");
    let v = plan_json(t.path(), TORCHRUN_HF, &env);
    assert_eq!(v["world_size"], 8, "{v}");
    assert_eq!(v["global_batch"], 256, "{v}");
    assert_eq!(v["world_uncertain"], false, "{v}");
    // Without a rendezvous id, the job's name (the operator's job-name label
    // exposed as OOMGUARD_JOB_NAME) is the key.
    let env = [
        ("PET_NNODES", "2"),
        ("PET_NPROC_PER_NODE", "4"),
        ("PET_NODE_RANK", "0"),
        ("OOMGUARD_JOB_NAME", "llama-ft"),
    ];
    let (text, _) = plan(t.path(), false, TORCHRUN_HF, &env);
    assert!(
        text.contains("job: copy 0 of 2 (torchrun PET_NODE_RANK=0 of PET_NNODES=2); this copy decides, through out/.oomguard-job/torchrun-llama-ft"),
        "{text}"
    );
}

/// As in torchrun, an option on the command line wins over its `PET_` variable.
#[test]
fn plan_the_command_line_wins_over_pet_variables() {
    let t = tempfile::tempdir().unwrap();
    let argv = [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "2",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--output_dir",
        "out",
    ];
    let env = [("PET_NNODES", "4"), ("PET_NPROC_PER_NODE", "8")];
    let v = plan_json(t.path(), &argv, &env);
    assert_eq!(v["world_size"], 4, "{}", v["world_source"]);
    assert_eq!(
        v["world_source"], "torchrun --nproc_per_node 2 × --nnodes 2",
        "{v}"
    );
    assert_eq!(v["global_batch"], 32, "{v}");
    // One from each: torchrun reads each option on its own.
    let argv = [
        "torchrun",
        "--nproc-per-node=2",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--output_dir",
        "out",
    ];
    let v = plan_json(t.path(), &argv, &env);
    assert_eq!(v["world_size"], 8, "{}", v["world_source"]);
    assert_eq!(
        v["world_source"], "torchrun --nproc_per_node 2 × PET_NNODES=4",
        "{v}"
    );
}

/// An elastic job (`PET_NNODES=1:4`, the operator's `elasticPolicy` min and max
/// replicas): the range is said, the world is sized for its minimum, and the global
/// batch at its maximum is said too.
#[test]
fn plan_says_an_elastic_range_and_sizes_for_both_ends() {
    let t = tempfile::tempdir().unwrap();
    let env = [("PET_NNODES", "1:4"), ("PET_NPROC_PER_NODE", "4")];
    let (text, _) = plan(t.path(), false, TORCHRUN_HF, &env);
    for said in [
        "world size:   4 (torchrun PET_NPROC_PER_NODE=4 × PET_NNODES=1:4 (elastic: 1 to 4 nodes, 4 to 16 processes; sized for the fewest)) — uncertain",
        "global batch: 128 = micro-batch 8 × accumulation 4 × world size 4",
        "elastic: up to 512 with world size 16",
        "elastic torchrun (4 to 16 processes): the number of nodes is not fixed",
    ] {
        assert!(text.contains(said), "expected {said:?} in:\n{text}");
    }
    let v = plan_json(t.path(), TORCHRUN_HF, &env);
    assert_eq!(
        (
            &v["world_size"],
            &v["world_max"],
            &v["global_batch"],
            &v["global_batch_max"],
            &v["world_uncertain"]
        ),
        (
            &Value::from(4),
            &Value::from(16),
            &Value::from(128),
            &Value::from(512),
            &Value::from(true)
        ),
        "{v}"
    );
}

/// One plain `python train.py` per pod, as the operator configures it without
/// torchrun (`WORLD_SIZE`, `RANK`, `MASTER_ADDR`, `MASTER_PORT`): the world is
/// `WORLD_SIZE`, this pod is copy `RANK`, the key is where the ranks meet.
#[test]
fn plan_reads_world_size_and_rank_for_one_program_per_pod() {
    let t = tempfile::tempdir().unwrap();
    let argv = [
        "python",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "4",
        "--output_dir",
        "out",
    ];
    let env = [
        ("WORLD_SIZE", "8"),
        ("RANK", "3"),
        ("MASTER_ADDR", "llama-ft-master-0"),
        ("MASTER_PORT", "23456"),
    ];
    let (text, _) = plan(t.path(), false, &argv, &env);
    for said in [
        "world size:   8 (WORLD_SIZE=8 (RANK=3: one program per pod, configured by the environment))",
        "global batch: 256 = micro-batch 8 × accumulation 4 × world size 8",
        "job: copy 3 of 8",
        "copy 0 decides, through out/.oomguard-job/pods-llama-ft-master-0-23456",
    ] {
        assert!(text.contains(said), "expected {said:?} in:\n{text}");
    }
    let v = plan_json(t.path(), &argv, &env);
    assert_eq!(
        (&v["world_size"], &v["global_batch"]),
        (&Value::from(8), &Value::from(256))
    );
}

fn sim_args(run_dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["--run-dir".into(), run_dir.display().to_string()];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push("python3".into());
    v.push(repo().join("examples/sim_trainer.py").display().to_string());
    for a in [
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "1024",
        "--max_steps",
        "300",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.02",
        "--output_dir",
    ] {
        v.push(a.into());
    }
    v.push(out.display().to_string());
    v
}

/// oomguard started as a pod's container command: only `envs` of the variables above.
fn pod(cwd: &Path, args: &[String], envs: &[(&str, &str)]) -> Running {
    use std::io::Read;
    let mut c = Command::new(OOMGUARD);
    c.args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null());
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for v in CLEARED {
        c.env_remove(v);
    }
    c.envs(envs.iter().copied());
    let shown: Vec<String> = envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let cmd = format!("{} oomguard {}", shown.join(" "), args.join(" "));
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |r: &mut dyn Read| {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    };
    Running {
        cmd,
        cwd: cwd.to_path_buf(),
        child,
        out: std::thread::spawn(move || read(&mut so)),
        err: std::thread::spawn(move || read(&mut se)),
        started: std::time::Instant::now(),
    }
}

fn micro_of(argv: &[String]) -> Option<String> {
    argv.windows(2)
        .find(|w| w[0] == "--per_device_train_batch_size")
        .map(|w| w[1].clone())
}

/// A pod the operator restarts (its container killed and started again, the same
/// job name) starts at the settings the job last launched and resumes from the
/// newest checkpoint, like a requeued Slurm job; a job that finished forgets them,
/// so the same job submitted again starts as its command says.
#[test]
fn a_restarted_pod_starts_at_the_settings_the_job_decided() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let runs: Vec<PathBuf> = (1..=3).map(|i| t.path().join(format!("run{i}"))).collect();
    let env = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("OOMGUARD_JOB_NAME", "sim-restart"),
    ];
    // The pod's first container: an OOM, a relaunch at smaller settings, then the
    // container is stopped (an eviction, a node drained: SIGTERM) mid-run.
    let mut first = pod(t.path(), &sim_args(&runs[0], &out, &[]), &env);
    let relaunched = wait_until(Duration::from_secs(90), || {
        let starts = std::fs::read_to_string(runs[0].join("journal.jsonl"))
            .unwrap_or_default()
            .matches("\"attempt_start\"")
            .count();
        let done = matches!(first.child.try_wait(), Ok(Some(_)));
        done || starts >= 2 && out.join("checkpoint-20/trainer_state.json").exists()
    });
    let pid = nix::unistd::Pid::from_raw(first.child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let r = first.wait(Duration::from_secs(60));
    r.ensure(
        "the first container relaunched after its OOM and saved checkpoint-20",
        relaunched,
        "two attempts and checkpoint-20",
        tail(&r.stderr, 3000),
    );
    r.ensure(
        "the stopped container failed (the operator restarts it)",
        r.code.is_some_and(|c| c != 0),
        "a non-zero exit",
        r.code,
    );
    let j = r.journal(&runs[0]);
    let last = *events(&j, "attempt_start").last().unwrap();
    let decided = micro_of(&argv_of(last)).unwrap();
    // The restarted container.
    let r = pod(t.path(), &sim_args(&runs[1], &out, &[]), &env).wait(Duration::from_secs(120));
    r.check("restarted pod's exit code", Some(0), r.code);
    r.ensure(
        "says it is a restarted pod starting at the job's settings",
        r.stderr
            .contains("restarted pod of a Kubernetes job (the job's last settings are in ")
            && r.stderr
                .contains(&format!("): starting at micro_batch={decided} ")),
        "'restarted pod of a Kubernetes job ...: starting at ... micro_batch=N'",
        tail(&r.stderr, 3000),
    );
    let j = r.journal(&runs[1]);
    let starts = events(&j, "attempt_start");
    r.check("one attempt after the restart", 1, starts.len());
    let argv = argv_of(starts[0]);
    r.check(
        "starts at the micro-batch the job decided",
        Some(decided.clone()),
        micro_of(&argv),
    );
    let resume = resume_arg(&argv).unwrap_or_default();
    r.ensure(
        "resumes from the newest checkpoint the first container saved",
        resume.contains("checkpoint-") && !resume.ends_with("checkpoint-5"),
        "a checkpoint after the relaunch",
        &resume,
    );
    let prev = std::fs::read_to_string(runs[1].join("previous-run")).unwrap_or_default();
    r.check(
        "previous-run names the first container's run folder",
        runs[0].display().to_string(),
        prev.trim().to_string(),
    );
    let fin = r.read_json(&out.join("final.json"));
    r.check("trained to the end", Some(300), fin["global_step"].as_u64());
    // The job finished: the same job submitted again starts as written.
    let r = pod(
        t.path(),
        &sim_args(&runs[2], &out, &["--max-attempts", "1"]),
        &env,
    )
    .wait(Duration::from_secs(120));
    r.ensure(
        "a new job of the same name is no restart",
        !r.stderr.contains("restarted pod"),
        "no 'restarted pod'",
        tail(&r.stderr, 3000),
    );
    let j = r.journal(&runs[2]);
    r.check(
        "starts at the command's micro-batch",
        Some("16".to_string()),
        micro_of(&argv_of(events(&j, "attempt_start")[0])),
    );
}

/// Two pods of one job that are not about to launch the same thing (here their
/// manifests give different micro-batches) launch nothing: both stop with a
/// non-zero status, so the operator's failure policy applies to the whole job,
/// and say how they differ.
#[test]
fn pods_that_disagree_stop_the_job_with_a_non_zero_exit() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let pods: Vec<(Running, PathBuf)> = [("0", "16"), ("1", "8")]
        .into_iter()
        .map(|(rank, micro)| {
            let run_dir = t.path().join(format!("run{rank}"));
            let mut args = sim_args(&run_dir, &out, &[]);
            let i = args
                .iter()
                .position(|a| a == "--per_device_train_batch_size")
                .unwrap();
            args[i + 1] = micro.into();
            let env = [
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("WORLD_SIZE", "2"),
                ("RANK", rank),
                ("MASTER_ADDR", "sim-master-0"),
                ("MASTER_PORT", "23456"),
                ("OOMGUARD_JOB_TIMEOUT", "60"),
            ];
            (pod(t.path(), &args, &env), run_dir)
        })
        .collect();
    for (i, (p, run_dir)) in pods.into_iter().enumerate() {
        let r = p.wait(Duration::from_secs(90));
        r.check("exit code", Some(2), r.code);
        r.ensure(
            "says the copies disagree and how",
            r.stderr.contains("the copies of this job disagree before attempt 1: ")
                && r.stderr.contains("micro_batch=16")
                && r.stderr.contains("micro_batch=8")
                && r.stderr.contains("nothing was launched; stopping with status 2 so that the job fails as a whole"),
            "'the copies of this job disagree before attempt 1: ... micro_batch=16 ... micro_batch=8 ...'",
            tail(&r.stderr, 3000),
        );
        r.ensure(
            "well before the job's timeout",
            r.elapsed < Duration::from_secs(30),
            "< 30 s",
            r.elapsed,
        );
        let j = r.journal(&run_dir);
        r.check(
            &format!("pod {i} launched nothing"),
            0,
            events(&j, "attempt_start").len(),
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// tests/real/ddp_oom.py's arguments: rank of the pod whose `DDP_OOM=1` raises a
/// real `torch.OutOfMemoryError` at step 3, after checkpoint-2.
fn ddp_args(out: &Path) -> Vec<String> {
    [
        "tests/real/ddp_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--budget",
        "4",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--oom_at_step",
        "3",
        "--oom_env",
        "DDP_OOM",
        "--output_dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

/// Both pods' copies ran to the end, made one decision (copy 0's), and relaunched
/// with the same settings from the same checkpoint.
fn check_one_decision(runs: &[(Run, PathBuf)], out: &Path, world: u64) {
    for (run, _) in runs {
        run.check("exit code", Some(0), run.code);
    }
    let (leader, follower) = (&runs[0].0, &runs[1].0);
    let fin = leader.read_json(&out.join("final.json"));
    let fin1 = leader.read_json(&out.join("final-rank1.json"));
    leader.check("world size", Some(world), fin["world"].as_u64());
    leader.check("final micro-batch", Some(4), fin["micro"].as_u64());
    leader.check(
        "rank 1's final micro-batch",
        Some(4),
        fin1["micro"].as_u64(),
    );
    leader.check(
        "global batch kept",
        Some(8 * world),
        fin["global_batch"].as_u64(),
    );
    let resumed = |f: &Value| {
        f["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .map(|s| s["resumed_from"].clone())
    };
    leader.check(
        "same checkpoint on both pods",
        resumed(&fin),
        resumed(&fin1),
    );
    leader.ensure(
        "resumed from checkpoint-2",
        resumed(&fin).is_some_and(|p| p.as_str().is_some_and(|p| p.ends_with("checkpoint-2"))),
        "checkpoint-2",
        resumed(&fin),
    );
    let decisions: Vec<Value> = events(&leader.journal(&runs[0].1), "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    leader.check(
        "copy 0 decided once",
        vec![Value::from("halve_micro_batch")],
        decisions,
    );
    follower.ensure(
        "copy 1 followed copy 0",
        follower.stderr.contains("copy 0 of the job decided"),
        "'copy 0 of the job decided'",
        tail(&follower.stderr, 3000),
    );
    let fj = follower.journal(&runs[1].1);
    let argvs: Vec<Vec<String>> = events(&fj, "attempt_start")
        .iter()
        .map(|e| argv_of(e))
        .collect();
    follower.check("copy 1's attempts", 2, argvs.len());
    follower.check(
        "copy 1 relaunched at micro-batch 4",
        Some("4".into()),
        micro_of(&argvs[1]),
    );
}

/// Two "pods" on this host, each `oomguard torchrun tests/real/ddp_oom.py ...` with
/// torchrun configured only by the environment, as the Kubeflow operator
/// configures it (`PET_NNODES=2`, `PET_NODE_RANK=0|1`, `PET_NPROC_PER_NODE=1`, a c10d
/// rendezvous at `PET_RDZV_ENDPOINT` with `PET_RDZV_ID`). Pod 1's rank raises a real
/// `torch.OutOfMemoryError`; copy 0 decides for the job through the shared output
/// folder; both relaunch at the same settings from the same checkpoint.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn two_pods_torchrun_configured_by_pet_variables_make_one_decision() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let endpoint = format!("localhost:{}", free_port());
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let rdzv_id = format!("pj-{}", std::process::id());
    let pods: Vec<(Running, PathBuf)> = (0..2)
        .map(|r| {
            let run_dir = tmp.path().join(format!("run{r}"));
            let mut args: Vec<String> = ["--hang-timeout", "5", "--grace", "3", "--run-dir"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.push(run_dir.display().to_string());
            args.push("torchrun".into());
            args.extend(ddp_args(&out));
            let rank = r.to_string();
            let env = [
                ("PATH", path.as_str()),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", rank.as_str()),
                ("PET_NPROC_PER_NODE", "1"),
                ("PET_RDZV_BACKEND", "c10d"),
                ("PET_RDZV_ENDPOINT", endpoint.as_str()),
                ("PET_RDZV_ID", rdzv_id.as_str()),
                ("OOMGUARD_JOB_TIMEOUT", "180"),
                // c10d numbers the ranks by arrival: the pod that runs out is picked
                // by its environment.
                ("DDP_OOM", if r == 1 { "1" } else { "0" }),
            ];
            (pod(&repo(), &args, &env), run_dir)
        })
        .collect();
    let runs: Vec<(Run, PathBuf)> = pods
        .into_iter()
        .map(|(p, d)| (p.wait(Duration::from_secs(420)), d))
        .collect();
    let leader = &runs[0].0;
    let j = leader.journal(&runs[0].1);
    let start = events(&j, "run_start")[0];
    leader.check(
        "world size from PET_*",
        Some(2),
        start["world_size"].as_u64(),
    );
    leader.ensure(
        "the job's folder is keyed by the rendezvous id",
        start["notes"]
            .to_string()
            .contains(&format!(".oomguard-job/torchrun-{rdzv_id}")),
        "torchrun-<PET_RDZV_ID>",
        &start["notes"],
    );
    check_one_decision(&runs, &out, 2);
}

/// One plain `python tests/real/ddp_oom.py` per "pod", configured as the operator
/// configures a PyTorchJob without torchrun: `WORLD_SIZE=2`, `RANK=0|1`,
/// `MASTER_ADDR`, `MASTER_PORT` (the env:// rendezvous). Pod 1's rank raises a real
/// `torch.OutOfMemoryError`; the two copies are one job.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn two_pods_one_process_each_by_world_size_and_rank_make_one_decision() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let port = free_port().to_string();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pods: Vec<(Running, PathBuf)> = (0..2)
        .map(|r| {
            let run_dir = tmp.path().join(format!("run{r}"));
            let mut args: Vec<String> = ["--hang-timeout", "5", "--grace", "3", "--run-dir"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.push(run_dir.display().to_string());
            args.push("python".into());
            args.extend(ddp_args(&out));
            let rank = r.to_string();
            let env = [
                ("PATH", path.as_str()),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("WORLD_SIZE", "2"),
                ("RANK", rank.as_str()),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
                ("OOMGUARD_JOB_NAME", "pj-plain"),
                ("OOMGUARD_JOB_TIMEOUT", "180"),
                ("DDP_OOM", if r == 1 { "1" } else { "0" }),
            ];
            (pod(&repo(), &args, &env), run_dir)
        })
        .collect();
    let runs: Vec<(Run, PathBuf)> = pods
        .into_iter()
        .map(|(p, d)| (p.wait(Duration::from_secs(420)), d))
        .collect();
    let leader = &runs[0].0;
    let j = leader.journal(&runs[0].1);
    let start = events(&j, "run_start")[0];
    leader.check(
        "world size from WORLD_SIZE",
        Some(2),
        start["world_size"].as_u64(),
    );
    leader.ensure(
        "the job's folder is keyed by the job's name",
        start["notes"]
            .to_string()
            .contains(".oomguard-job/pods-pj-plain"),
        "pods-pj-plain",
        &start["notes"],
    );
    check_one_decision(&runs, &out, 2);
}
