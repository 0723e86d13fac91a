//! A real Slurm cluster: `oomguard srun ...` on the one-host, two-node cluster
//! that `tests/slurm/start.sh` starts (munged, slurmctld, `slurmd -N n1`,
//! `slurmd -N n2`). Every test here is `#[ignore]`d: it needs root and Debian's
//! Slurm packages. `bash tests/run.sh` starts the cluster (installing the
//! packages when `CI=true`) and runs them with `--include-ignored`; by hand:
//! `sudo tests/slurm/start.sh && cargo test --test slurm -- --ignored`.
//!
//! Each test names its job (`srun -J <unique>`) and looks only at that job in
//! `squeue`, so the tests may run side by side.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);
const WHY: &str = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)";

/// The simulated trainer's flags where rank 1 alone runs out of memory at
/// micro-batch 16 (global batch kept by accumulation), saving every 5 steps.
const ONE_RANK_OOMS: &[&str] = &[
    "--per_device_train_batch_size",
    "16",
    "--gradient_accumulation_steps",
    "2",
    "--max_seq_length",
    "1024",
    "--max_steps",
    "20",
    "--save_steps",
    "5",
    "--step_seconds",
    "0.01",
    "--oom_rank",
    "1",
];

/// A job name no other test uses.
fn job_name(test: &str) -> String {
    format!("oomguard-test-{test}-{}", std::process::id())
}

/// This job's ids in `squeue` (any state).
fn jobs_named(name: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-n", name, "-o", "%i %T"])
        .output()
        .expect("squeue runs (is Slurm installed? tests/slurm/start.sh)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The tests take the cluster one at a time: two nodes of four CPUs, and a
/// requeued job must not queue behind another test's job.
static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Fails unless the cluster answers (start it with tests/slurm/start.sh);
/// holds the cluster for the calling test.
fn cluster_up() -> std::sync::MutexGuard<'static, ()> {
    let guard = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let up = || {
        let out = Command::new("sinfo")
            .args(["-h", "-N", "-o", "%N %T"])
            .output();
        let ok = out.as_ref().is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).matches("idle").count() >= 2
                || String::from_utf8_lossy(&o.stdout).contains("mix")
                || String::from_utf8_lossy(&o.stdout).contains("alloc")
        });
        (ok, out)
    };
    // A node still completing an earlier test's job comes back within seconds.
    if !wait_until(Duration::from_secs(30), || up().0) {
        let (_, out) = up();
        panic!("the test cluster is not up ({out:?}): {WHY}");
    }
    guard
}

/// `srun -J NAME -N2 -n2 python3 sim_trainer.py ARGS... --output_dir OUT`.
fn srun_sim(name: &str, out: &Path, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["srun", "-J", name, "-N2", "-n2", "python3", &sim()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(args.iter().map(|s| s.to_string()));
    v.push("--output_dir".into());
    v.push(out.display().to_string());
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The output of `cmd` (an `srun` of the job `name`), which must end within
/// `limit`: past it, the job is cancelled and the test fails saying so.
fn output_within(
    cmd: &mut Command,
    name: &str,
    limit: Duration,
) -> (std::process::Output, Duration) {
    use std::process::Stdio;
    let started = std::time::Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("srun runs");
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (done, name) = (done.clone(), name.to_string());
        std::thread::spawn(move || {
            while started.elapsed() < limit {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = Command::new("scancel").args(["-n", &name]).status();
            unsafe { libc::kill(pid, libc::SIGKILL) };
            true
        })
    };
    let output = child.wait_with_output().expect("srun's output");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let timed_out = watchdog.join().unwrap_or(false);
    assert!(
        !timed_out,
        "{cmd:?} did not end within {limit:?} (a copy waited for its peers' timeout?)\n--- stderr ---\n{}",
        tail(&String::from_utf8_lossy(&output.stderr), 8000)
    );
    (output, started.elapsed())
}

fn expect_job_gone(run: &Run, name: &str) {
    if !wait_until(Duration::from_secs(20), || jobs_named(name).is_empty()) {
        let left = jobs_named(name);
        let _ = Command::new("scancel").args(["-n", name]).status();
        run.fail("no job left in squeue", "none", &format!("{left:?}"));
    }
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_rank_ooms_and_both_relaunch_on_the_same_settings() {
    around_srun(false);
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_rank_hangs_after_its_oom_and_both_relaunch_on_the_same_settings() {
    around_srun(true);
}

/// oomguard srun -N2 -n2 python3 sim ...: rank 1 OOMs, and rank 0 dies of its
/// peer; or, when `hang`, rank 1 hangs after its OOM and rank 0 hangs too, waiting
/// for it for 600 s (the test's limit is 180 s). One copy, one decision for both.
fn around_srun(hang: bool) {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let name = job_name(if hang { "one-rank-hang" } else { "one-rank" });
    let mut args: Vec<String> = ["--hang-timeout", "3", "--grace", "2", "--run-dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(run_dir.display().to_string());
    args.extend(srun_sim(&name, &out, ONE_RANK_OOMS));
    if hang {
        for a in ["--hang_after_oom", "--peer_wait", "600"] {
            args.push(a.into());
        }
    }
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
    if hang {
        run.ensure(
            "the hang after the OOM was seen",
            run.stderr.contains("hung after OOM"),
            "'hung after OOM'",
            tail(&run.stderr, 3000),
        );
    }
    run.check("exit code", Some(0), run.code);
    // Both ranks ended on the same settings and the same resumed checkpoint.
    let r0 = run.read_json(&out.join("final.json"));
    let r1 = run.read_json(&out.join("final-rank1.json"));
    run.check("rank 0 micro-batch", Some(4), r0["micro"].as_u64());
    run.check(
        "rank 1 micro-batch",
        r0["micro"].as_u64(),
        r1["micro"].as_u64(),
    );
    run.check(
        "rank 1 accumulation",
        r0["accum"].as_u64(),
        r1["accum"].as_u64(),
    );
    run.check("world size", Some(2), r0["world"].as_u64());
    let last = |r: &serde_json::Value| r["attempts"].as_array().and_then(|a| a.last()).cloned();
    run.check(
        "the last segment's resume checkpoint, rank 0 vs rank 1",
        last(&r0).map(|s| s["resumed_from"].clone()),
        last(&r1).map(|s| s["resumed_from"].clone()),
    );
    // The global batch (micro × accumulation × 2 tasks) was kept.
    run.check("global batch", Some(64), r0["global_batch"].as_u64());
    let journal = run.journal(&run_dir);
    let starts = events(&journal, "attempt_start");
    run.ensure(
        "relaunched",
        starts.len() >= 2,
        "at least two attempts",
        starts.len(),
    );
    for s in &starts {
        let argv = argv_of(s);
        run.check(
            "every attempt is one srun of both tasks",
            Some("srun"),
            argv.first().map(String::as_str),
        );
    }
    expect_job_gone(&run, &name);
}

/// Starts `oomguard srun -J name -N2 -n2 python3 sim ...` that trains for a long time.
fn long_run(tmp: &Path, name: &str, grace: &str, extra: &[&str]) -> (Running, std::path::PathBuf) {
    let (out, run_dir) = (tmp.join("out"), tmp.join("run"));
    let mut args: Vec<String> = ["--grace", grace, "--run-dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(run_dir.display().to_string());
    let mut sim_args = vec![
        "--per_device_train_batch_size",
        "4",
        "--max_seq_length",
        "1024",
        "--max_steps",
        "100000",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.05",
    ];
    sim_args.extend_from_slice(extra);
    args.extend(srun_sim(name, &out, &sim_args));
    let running = spawn(tmp, &strs(&args), None);
    (running, run_dir)
}

fn wait_for_training(running: &Running, tmp: &Path) {
    let ckpt = tmp.join("out/checkpoint-5");
    assert!(
        wait_until(Duration::from_secs(60), || ckpt.exists()),
        "{}: no checkpoint-5 within 60 s",
        running.cmd
    );
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_ctrl_c_leaves_no_job() {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let name = job_name("ctrl-c");
    // A grace period longer than the wait: the step must end from the Ctrl-C
    // itself (srun's two SIGINTs), not from oomguard's SIGKILL and scancel.
    let (running, run_dir) = long_run(tmp.path(), &name, "600", &[]);
    wait_for_training(&running, tmp.path());
    // One Ctrl-C, as a terminal sends it to oomguard.
    unsafe { libc::kill(running.child.id() as i32, libc::SIGINT) };
    let run = running.wait(Duration::from_secs(60));
    run.check("exit code (interrupted)", Some(130), run.code);
    expect_job_gone(&run, &name);
    let journal = run.journal(&run_dir);
    run.check("one attempt", 1, events(&journal, "attempt_start").len());
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_oomguard_killed_leaves_no_job() {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let name = job_name("kill-9");
    let (running, _) = long_run(tmp.path(), &name, "5", &[]);
    wait_for_training(&running, tmp.path());
    unsafe { libc::kill(running.child.id() as i32, libc::SIGKILL) };
    let mut child = running.child;
    let _ = child.wait();
    // The guardian cancels the job srun allocated before it kills srun.
    if !wait_until(Duration::from_secs(20), || jobs_named(&name).is_empty()) {
        let left = jobs_named(&name);
        let _ = Command::new("scancel").args(["-n", &name]).status();
        panic!("oomguard was killed and the job stayed: {left:?}");
    }
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_a_cancel_after_an_oom_is_never_relaunched() {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let name = job_name("scancel");
    // Rank 1 OOMs at step 7; rank 0 waits for it. Long hang timeout: the cancel comes first.
    let (running, run_dir) = long_run(
        tmp.path(),
        &name,
        "5",
        &[
            "--per_device_train_batch_size",
            "16",
            "--oom_at_step",
            "7",
            "--oom_rank",
            "1",
        ],
    );
    wait_for_training(&running, tmp.path());
    // The OOM has been printed by rank 1 (it is past step 7 by now, or soon).
    std::thread::sleep(Duration::from_millis(1500));
    let status = Command::new("scancel")
        .args(["-n", &name])
        .status()
        .unwrap();
    assert!(status.success());
    let run = running.wait(Duration::from_secs(60));
    run.ensure(
        "oomguard failed",
        run.code.is_some_and(|c| c != 0),
        "a non-zero exit",
        run.code,
    );
    let journal = run.journal(&run_dir);
    run.check(
        "never relaunched",
        1,
        events(&journal, "attempt_start").len(),
    );
    expect_job_gone(&run, &name);
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_copy_per_task_makes_one_decision() {
    per_task(PerTask {
        oom_rank: 1,
        hang: false,
    });
}

/// Rank 1 hangs after its OOM and rank 0 waits for it for 600 s: copy 1's hang
/// timer ends its rank, and copy 0 hears copy 1's end while its own rank still
/// waits, stops it, and decides.
#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_copy_per_task_makes_one_decision_when_the_oom_rank_hangs() {
    per_task(PerTask {
        oom_rank: 1,
        hang: true,
    });
}

/// Rank 0 hangs after its OOM and rank 1 waits for it for 600 s: copy 0's hang
/// timer ends its rank, and copy 1 hears copy 0's end (or its decision) while its
/// own rank still waits, stops it, and relaunches with copy 0's decision.
#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_one_copy_per_task_follows_copy_0_while_its_rank_hangs() {
    per_task(PerTask {
        oom_rank: 0,
        hang: true,
    });
}

struct PerTask {
    /// The rank that runs out of memory.
    oom_rank: u32,
    /// It hangs after its OOM, and its peer waits for it for 600 s (as NCCL
    /// ranks do); else its peer dies of gloo's "Connection closed by peer".
    hang: bool,
}

/// srun -N2 -n2 oomguard python3 sim ...: two copies; one rank OOMs, the other
/// dies of "Connection closed by peer" or hangs waiting for it. Copy 0 decides
/// for both; both end on the same settings, resumed from the same checkpoint,
/// long before the 600 s a hung peer would wait.
fn per_task(case: PerTask) {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let name = job_name(&format!(
        "per-task-{}{}",
        case.oom_rank,
        if case.hang { "-hang" } else { "" }
    ));
    let oom_rank = case.oom_rank.to_string();
    let mut cmd = Command::new("srun");
    cmd.args([
        "-J",
        &name,
        "-N2",
        "-n2",
        OOMGUARD,
        "--hang-timeout",
        "3",
        "--grace",
        "2",
    ])
    .args(["python3", &sim()])
    .args(if case.hang {
        &["--hang_after_oom", "--peer_wait", "600"][..]
    } else {
        &[][..]
    })
    .args([
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "1024",
        "--max_steps",
        "20",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.01",
        "--oom_rank",
        &oom_rank,
        "--output_dir",
    ])
    .arg(&out)
    .current_dir(tmp.path())
    .env("OOMGUARD_JOB_TIMEOUT", "120");
    let (output, elapsed) = output_within(&mut cmd, &name, LIMIT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let describe = || format!("{cmd:?}\n--- stderr ---\n{}", tail(&stderr, 8000));
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        describe()
    );
    let read = |f: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}\n{}", describe()));
        serde_json::from_str(&text).unwrap()
    };
    let (r0, r1) = (read("final.json"), read("final-rank1.json"));
    assert_eq!(r0["micro"], 4, "{}", describe());
    assert_eq!(r1["micro"], r0["micro"], "{}", describe());
    assert_eq!(r1["accum"], r0["accum"]);
    let segments = |r: &serde_json::Value| r["attempts"].as_array().unwrap().clone();
    let (s0, s1) = (segments(&r0), segments(&r1));
    // Every launch of each rank ran on the same settings and checkpoint as its peer's.
    let pairs = |s: &[serde_json::Value]| -> Vec<(serde_json::Value, serde_json::Value)> {
        s.iter()
            .map(|x| (x["micro"].clone(), x["resumed_from"].clone()))
            .collect()
    };
    assert_eq!(pairs(&s0).last(), pairs(&s1).last(), "{}", describe());
    assert!(
        s0.last().unwrap()["resumed_from"]
            .as_str()
            .is_some_and(|p| p.ends_with("checkpoint-5")),
        "{}",
        describe()
    );
    assert!(
        stderr.contains("copy 0 of the job decided"),
        "{}",
        describe()
    );
    if case.hang {
        // The OOM rank hung: its copy's hang timer ended it; the other copy's
        // rank, waiting for it, was stopped when the job moved on.
        let hung = format!("hung_after_oom on copy {}", case.oom_rank);
        if case.oom_rank == 1 {
            assert!(stderr.contains(&hung), "{}", describe());
            assert!(
                stderr.contains(
                    "copy 1 of the job ended attempt 1 (hung_after_oom) while this copy's ranks still ran; stopped them"
                ),
                "{}",
                describe()
            );
        } else {
            // Copy 0 writes its end before it decides: either ends copy 1's attempt.
            assert!(
                stderr.contains(
                    "copy 0 of the job ended attempt 1 (hung_after_oom) while this copy's ranks still ran; stopped them"
                ) || stderr.contains(
                    "copy 0 of the job decided to relaunch after attempt 1 while this copy's ranks still ran; stopped them"
                ),
                "{}",
                describe()
            );
        }
        // Far from the 600 s the waiting rank would have waited (three attempts).
        assert!(
            elapsed < Duration::from_secs(120),
            "{elapsed:?}: {}",
            describe()
        );
    }
    assert!(
        !stderr.contains("not an out-of-memory error"),
        "a copy stopped on the peer's error: {}",
        describe()
    );
    assert!(
        jobs_named(&name).is_empty()
            || wait_until(Duration::from_secs(20), || jobs_named(&name).is_empty())
    );
}

/// `oomguard srun --output=logs/%j-%t.out` (or `--error` with a name that every
/// step reuses): the OOM goes only to rank 1's file, nothing of it
/// through srun. oomguard reads the files as the step runs, says which one held the
/// OOM, and relaunches both ranks on the same settings from the same checkpoint.
fn per_task_files(test: &str, output_option: &str, file_of_rank1: &str) {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    std::fs::create_dir(tmp.path().join("logs")).unwrap();
    let name = job_name(test);
    let mut args: Vec<String> = ["--hang-timeout", "3", "--grace", "2", "--run-dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(run_dir.display().to_string());
    let mut sim_args = srun_sim(&name, &out, ONE_RANK_OOMS);
    sim_args.insert(1, output_option.to_string());
    args.extend(sim_args);
    let run = oomguard(tmp.path(), &strs(&args), None, LIMIT);
    run.check("exit code", Some(0), run.code);
    run.ensure(
        "the OOM was not in srun's own output",
        !run.stdout.contains("OutOfMemoryError") && !run.stderr.contains("Traceback"),
        "no traceback through srun",
        tail(&run.stderr, 3000),
    );
    let journal = run.journal(&run_dir);
    let ooms = events(&journal, "oom");
    run.ensure(
        "an OOM per failed attempt",
        ooms.len() >= 2,
        ">= 2",
        ooms.len(),
    );
    let logs = tmp.path().join("logs").display().to_string();
    for o in &ooms {
        let file = o["file"].as_str().unwrap_or("");
        run.ensure(
            "the journal names rank 1's file",
            file.starts_with(&logs)
                && std::path::Path::new(file)
                    .file_name()
                    .is_some_and(|n| regex_like(&n.to_string_lossy(), file_of_rank1)),
            file_of_rank1,
            file,
        );
    }
    run.ensure(
        "says where the OOM was",
        run.stderr.contains("attempt 1: the OOM was found in ")
            && run.stderr.contains("(srun's per-task output file)"),
        "'attempt 1: the OOM was found in ... (srun's per-task output file)'",
        tail(&run.stderr, 3000),
    );
    let r0 = run.read_json(&out.join("final.json"));
    let r1 = run.read_json(&out.join("final-rank1.json"));
    run.check("rank 0 micro-batch", Some(4), r0["micro"].as_u64());
    run.check("rank 1 micro-batch", Some(4), r1["micro"].as_u64());
    let last = |r: &serde_json::Value| r["attempts"].as_array().and_then(|a| a.last()).cloned();
    run.check(
        "the last launch's checkpoint, rank 0 vs rank 1",
        last(&r0).map(|s| s["resumed_from"].clone()),
        last(&r1).map(|s| s["resumed_from"].clone()),
    );
    run.ensure(
        "resumed from checkpoint-5",
        last(&r0).is_some_and(|s| {
            s["resumed_from"]
                .as_str()
                .is_some_and(|p| p.ends_with("checkpoint-5"))
        }),
        "checkpoint-5",
        last(&r0),
    );
    let starts = events(&journal, "attempt_start");
    run.check("attempts", 3, starts.len());
    expect_job_gone(&run, &name);
}

/// `name` matches `shape`, where `#` stands for one or more digits.
fn regex_like(name: &str, shape: &str) -> bool {
    let mut n = name;
    let mut parts = shape.split('#').peekable();
    while let Some(p) = parts.next() {
        let Some(rest) = n.strip_prefix(p) else {
            return false;
        };
        n = rest;
        if parts.peek().is_some() {
            let digits = n.len() - n.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                return false;
            }
            n = &n[digits..];
        }
    }
    n.is_empty()
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_an_oom_only_in_per_task_output_files_is_found_and_relaunched() {
    per_task_files("task-files", "--output=logs/%j-%t.out", "#-1.out");
}

#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_an_oom_only_in_per_task_error_files_reused_by_every_step_is_found() {
    per_task_files("task-error-files", "--error=logs/err-%t.log", "err-1.log");
}

/// The per-node recipe of docs/clusters.md on the cluster, with real torch on gloo:
/// `srun -N2 -n2 bash -c 'exec oomguard torchrun --nnodes 2 --node_rank $SLURM_NODEID ...'`.
/// Copy 1's node OOMs at step 3, after checkpoint-2; node 0 dies of its peer. Needs the real-client venv too (`OOMGUARD_REAL_PYTHON`, set by tests/run.sh).
#[test]
#[ignore = "needs a Slurm cluster and the real-client venv: bash tests/run.sh"]
fn slurm_one_oomguard_per_node_around_torchrun() {
    per_node(false);
}

/// As above, but rank 1 hangs after its OOM (a rank stuck in NCCL's teardown), and
/// rank 0, whose all-reduce then fails, hangs silently (NCCL without async error
/// handling; the process group's timeout is 600 s): node 1's copy ends its rank on
/// its hang timer, and node 0's copy hears that end while its rank still hangs,
/// stops it, and decides for both. With torchrun's static rendezvous
/// (`--master_addr`, `--master_port`; node 0's torchrun holds the store, as with a
/// c10d endpoint on node 0), node 0's torchrun does not end with node 1's.
#[test]
#[ignore = "needs a Slurm cluster and the real-client venv: bash tests/run.sh"]
fn slurm_one_oomguard_per_node_around_torchrun_when_the_oom_rank_hangs() {
    per_node(true);
}

fn per_node(hang: bool) {
    let _cluster = cluster_up();
    let python = std::env::var_os("OOMGUARD_REAL_PYTHON")
        .filter(|p| !p.is_empty())
        .expect("OOMGUARD_REAL_PYTHON is not set: run bash tests/run.sh");
    let bin = Path::new(&python).parent().unwrap().to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let name = job_name(if hang { "per-node-hang" } else { "per-node" });
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let oomguard_dir = Path::new(OOMGUARD).parent().unwrap();
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        oomguard_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!(
        "DDP_OOM=$SLURM_PROCID exec oomguard --hang-timeout 5 --grace 3 --run-dir {tmp}/run$SLURM_PROCID torchrun --nnodes 2 --node_rank $SLURM_NODEID \
         --nproc_per_node 1 {rdzv} \
         tests/real/ddp_oom.py --per_device_train_batch_size 8 --gradient_accumulation_steps 1 \
         --budget 4 --max_steps 6 --save_steps 2 --oom_at_step 3 --oom_env DDP_OOM {hang} --output_dir {out}",
        tmp = tmp.path().display(),
        out = out.display(),
        hang = if hang {
            "--hang_after_oom --peer_hangs"
        } else {
            ""
        },
        rdzv = if hang {
            format!("--master_addr 127.0.0.1 --master_port {port}")
        } else {
            format!("--rdzv_backend c10d --rdzv_endpoint localhost:{port} --rdzv_id $SLURM_JOB_ID")
        }
    );
    let mut cmd = Command::new("srun");
    cmd.args(["-J", &name, "-N2", "-n2", "bash", "-c", &script])
        .current_dir(repo())
        .env("PATH", &path)
        .env("OOMGUARD_JOB_TIMEOUT", "180");
    let (output, elapsed) = output_within(&mut cmd, &name, Duration::from_secs(300));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let describe = || format!("{cmd:?}\n--- stderr ---\n{}", tail(&stderr, 8000));
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        describe()
    );
    let read = |f: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}\n{}", describe()));
        serde_json::from_str(&text).unwrap()
    };
    let (r0, r1) = (read("final.json"), read("final-rank1.json"));
    assert_eq!(r0["micro"], 4, "{}", describe());
    assert_eq!(r1["micro"], 4, "{}", describe());
    assert_eq!(r0["world"], 2);
    assert_eq!(r0["global_batch"], 16);
    // Both ranks' last launch resumed from the same checkpoint: checkpoint-2.
    let resumed = |r: &serde_json::Value| {
        r["attempts"].as_array().unwrap().last().unwrap()["resumed_from"].clone()
    };
    assert_eq!(resumed(&r0), resumed(&r1), "{}", describe());
    assert!(
        resumed(&r0)
            .as_str()
            .is_some_and(|p| p.ends_with("checkpoint-2")),
        "{}",
        describe()
    );
    assert!(
        stderr.contains("copy 0 of the job decided"),
        "{}",
        describe()
    );
    assert!(
        !stderr.contains("not an out-of-memory error"),
        "{}",
        describe()
    );
    if hang {
        assert!(
            stderr.contains("hung_after_oom on copy 1"),
            "{}",
            describe()
        );
        assert!(
            stderr.contains(
                "copy 1 of the job ended attempt 1 (hung_after_oom) while this copy's ranks still ran; stopped them"
            ),
            "{}",
            describe()
        );
        // Far from the process group's 600 s.
        assert!(
            elapsed < Duration::from_secs(240),
            "{elapsed:?}: {}",
            describe()
        );
    }
    assert!(wait_until(Duration::from_secs(20), || jobs_named(&name).is_empty()));
}

/// `scontrol requeue` of a batch job whose `oomguard srun ...` had relaunched
/// down to a micro-batch that fits: the restarted script starts there and
/// resumes from the newest checkpoint.
#[test]
#[ignore = "needs a Slurm cluster: sudo tests/slurm/start.sh (tests/run.sh does it)"]
fn slurm_a_requeued_job_resumes_at_the_fitting_settings() {
    let _cluster = cluster_up();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let name = job_name("requeue");
    let log = dir.join("slurm.out");
    let script = format!(
        "#!/bin/bash\ncd {dir}\nexec {oomguard} --hang-timeout 3 --grace 2 srun python3 {sim} \
         --per_device_train_batch_size 16 --gradient_accumulation_steps 2 --max_seq_length 1024 \
         --max_steps 300 --save_steps 5 --step_seconds 0.05 --oom_rank 1 --output_dir {dir}/out\n",
        dir = dir.display(),
        oomguard = OOMGUARD,
        sim = sim()
    );
    std::fs::write(dir.join("job.sh"), script).unwrap();
    let out = Command::new("sbatch")
        .args([
            "--parsable",
            "-N2",
            "--ntasks-per-node=1",
            "--open-mode=append",
            "-J",
            &name,
            "-o",
        ])
        .arg(&log)
        .arg(dir.join("job.sh"))
        .output()
        .expect("sbatch runs");
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success(), "sbatch: {out:?}");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let fail = |what: &str| -> ! {
        // Slurm's own view of the job, for a run that did not go as expected.
        let shown = Command::new("scontrol")
            .args(["show", "job", &job])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let _ = Command::new("scancel").arg(&job).status();
        panic!(
            "{what}\n--- scontrol show job ---\n{shown}\n--- job output ---\n{}",
            tail(&read(), 6000)
        );
    };
    // Down to the micro-batch that fits, and a checkpoint past the OOM's.
    if !wait_until(Duration::from_secs(90), || {
        read().contains("attempt 3/") && dir.join("out/checkpoint-20").exists()
    }) {
        fail("no third attempt with checkpoint-20");
    }
    let ok = Command::new("scontrol")
        .args(["requeue", &job])
        .status()
        .unwrap();
    assert!(ok.success());
    // Slurm holds a requeued job back for a while: let it start now. The job
    // first has to finish completing: on a loaded 2-core machine (the whole
    // Slurm tier at once) its steps' termination alone has taken minutes.
    // Slurm's hold is what keeps the new launch's credential from falling in
    // the second the old one was revoked in (slurmd compares whole seconds:
    // "Killing non-startable batch JobId=N: Job credential revoked", the job
    // then ends with exit 1 and never restarts). So the start is pulled
    // forward only once the job has been pending again (done completing, so its
    // old credential is revoked) for two seconds.
    let mut pending_since = None;
    let started = wait_until(Duration::from_secs(480), || {
        if read().contains("SLURM_RESTART_COUNT=1") {
            return true;
        }
        let state = Command::new("squeue")
            .args(["-h", "-j", &job, "-o", "%T"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if state != "PENDING" {
            pending_since = None;
        } else if pending_since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
            > Duration::from_secs(2)
        {
            let _ = Command::new("scontrol")
                .args(["update", &format!("jobid={job}"), "StartTime=now"])
                .stderr(std::process::Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(200));
        false
    });
    if !started {
        fail("the requeued job did not start");
    }
    if !wait_until(Duration::from_secs(240), || {
        dir.join("out/final.json").exists()
    }) {
        fail("the requeued job did not finish");
    }
    let text = read();
    let requeued = text
        .lines()
        .find(|l| l.contains("requeued job (SLURM_RESTART_COUNT=1)"))
        .unwrap_or_else(|| fail("no requeue line"));
    assert!(requeued.contains("micro_batch=4"), "{requeued}");
    let fin: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/final.json")).unwrap())
            .unwrap();
    assert_eq!(fin["micro"], 4);
    assert_eq!(fin["global_step"], 300);
    let last = fin["attempts"].as_array().unwrap().last().unwrap().clone();
    let resumed = last["resumed_from"].as_str().unwrap_or("");
    assert!(
        !resumed.is_empty() && !resumed.ends_with("checkpoint-5"),
        "the requeued launch resumed from {resumed:?}, not the newest checkpoint"
    );
    // One launch after the requeue: no OOM again at the old settings.
    let after = text.split("SLURM_RESTART_COUNT=1").nth(1).unwrap_or("");
    assert!(!after.contains("attempt 2/"), "{}", tail(after, 3000));
    assert!(wait_until(Duration::from_secs(20), || jobs_named(&name).is_empty()));
}
