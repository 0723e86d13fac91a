//! Trust, round 3 (issue 22), through the real binary: the job folder where copies of
//! a job meet is private and the user's, and a message in it counts only with the
//! job's token; nothing oomguard deletes or writes follows a link; special files
//! (FIFOs, huge sparse files) never block oomguard or fill its memory; a requeue's
//! `fitting.json` must be the user's own and keep the global batch; a checkpoint
//! beyond the step the run reached is another run's; decisions name checkpoints by
//! absolute path; copies start at copy 0's remembered settings; the kernel's
//! OOM-killer record is tied to the run by more than a pid; a caught OOM followed by
//! another error is not relaunched; and the smaller promises (module lock, state
//! files, fallback folder, `--wait-status-every 0`). Where the attack is by another
//! user, it runs as `nobody` (`setpriv`), as root runs these tests.

mod common;
use common::*;

use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const OOM_LINE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free.";

fn root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Run `args` as the user `nobody` (the attacker), in `cwd`; panics when it fails.
fn as_nobody(cwd: &Path, args: &[&str]) {
    let o = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("setpriv");
    assert!(
        o.status.success(),
        "as nobody: {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A folder others may enter (the attacker needs to) and write with the sticky bit,
/// as /tmp is.
fn shared_tmp() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    chmod(t.path(), 0o1777);
    t
}

fn sim() -> String {
    repo().join("examples/sim_trainer.py").display().to_string()
}

fn sim_args(run_dir: &Path, out: &str, micro: &str, accum: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--run-dir".into(),
        run_dir.display().to_string(),
        "python3".into(),
        sim(),
    ];
    for a in [
        "--per_device_train_batch_size",
        micro,
        "--gradient_accumulation_steps",
        accum,
        "--max_seq_length",
        "1024",
        "--save_steps",
        "5",
        "--output_dir",
        out,
    ] {
        v.push(a.into());
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn task(rank: &str, job: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_NTASKS", "2".to_string()),
        ("SLURM_JOB_ID", job.to_string()),
        ("SLURM_STEP_ID", "0".to_string()),
        ("OOMGUARD_JOB_TIMEOUT", "20".to_string()),
    ]
}

fn envs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    v.iter().map(|(k, x)| (*k, x.as_str())).collect()
}

fn journal(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn argvs(run_dir: &Path) -> Vec<Vec<String>> {
    journal(run_dir)
        .iter()
        .filter(|e| e["event"] == "attempt_start")
        .map(argv_of)
        .collect()
}

fn flag(argv: &[String], name: &str) -> Option<String> {
    argv.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

/// Issue 22, item 1: another user who can write the output folder plants the job
/// folder with a forged decision, ready and end files: neither copy 0 nor a follower
/// uses it; both refuse before anything runs, naming it.
#[test]
fn a_job_folder_another_user_planted_is_refused_before_anything_runs() {
    assert!(
        root(),
        "this test needs root (setpriv to the user nobody, the second user)"
    );
    let t = shared_tmp();
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    let planted = out.join(".oomguard-job/slurm-77.0");
    as_nobody(t.path(), &["mkdir", "-p", planted.to_str().unwrap()]);
    let forged =
        r#"{"action":"relaunch","knobs":{"micro_batch":1},"resume":"/tmp/evil/checkpoint-9"}"#;
    for (name, body) in [
        ("decision-1.json", forged),
        ("ready-1-0", ""),
        ("ready-1-1", ""),
        (
            "end-1-1.json",
            r#"{"rank":1,"outcome":"cuda_oom","oom_line":"CUDA out of memory"}"#,
        ),
    ] {
        let f = planted.join(name);
        as_nobody(
            t.path(),
            &[
                "sh",
                "-c",
                &format!("printf '%s' '{body}' > {}", f.display()),
            ],
        );
        as_nobody(
            t.path(),
            &["touch", "-d", "2030-01-01", f.to_str().unwrap()],
        );
    }
    for rank in ["0", "1"] {
        let run_dir = t.path().join(format!("run{rank}"));
        let args = sim_args(
            &run_dir,
            out.to_str().unwrap(),
            "4",
            "8",
            &["--max_steps", "2"],
        );
        let e = task(rank, "77");
        let r = spawn_env(t.path(), &strs(&args), &envs(&e)).wait(LIMIT);
        r.check(&format!("copy {rank}: exit 2 (refused)"), Some(2), r.code);
        r.ensure(
            "the planted folder is named as another user's",
            r.stderr.contains("owned by another user") && r.stderr.contains(".oomguard-job"),
            "owned by another user",
            &r.stderr,
        );
        r.check("nothing ran", 0, argvs(&run_dir).len());
    }
}

/// Issue 22, item 2: the job folder is a link another user planted to a folder of the
/// victim's (the user running oomguard): copy 0's cleanup never deletes through it.
#[test]
fn a_symlinked_job_folder_never_makes_oomguard_delete_through_it() {
    assert!(
        root(),
        "this test needs root (setpriv to the user nobody, the second user)"
    );
    let t = shared_tmp();
    let victim = t.path().join("victim");
    std::fs::create_dir_all(victim.join("slurm-78.0")).unwrap();
    let files = ["end-1-1.json", "decision-1.json", "ready-2-0"];
    for f in files {
        std::fs::write(victim.join("slurm-78.0").join(f), "precious").unwrap();
    }
    let out = t.path().join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    as_nobody(
        t.path(),
        &[
            "ln",
            "-s",
            victim.to_str().unwrap(),
            out.join(".oomguard-job").to_str().unwrap(),
        ],
    );
    let run_dir = t.path().join("run0");
    let args = sim_args(
        &run_dir,
        out.to_str().unwrap(),
        "4",
        "8",
        &["--max_steps", "2"],
    );
    let mut e = task("0", "78");
    e.push(("OOMGUARD_JOB_TIMEOUT", "2".into()));
    let r = spawn_env(t.path(), &strs(&args), &envs(&e)).wait(LIMIT);
    for f in files {
        r.ensure(
            "the victim's files are still there",
            victim.join("slurm-78.0").join(f).exists(),
            f,
            format!("{f} gone"),
        );
    }
    r.check("refused (exit 2)", Some(2), r.code);
    r.ensure(
        "said why",
        r.stderr.contains("symbolic link"),
        "is a symbolic link",
        &r.stderr,
    );
}

/// With RLIMIT_AS: `oomguard` run with `args` in `cwd`, killed after `limit`.
fn limited(cwd: &Path, args: &[&str], mem: u64, limit: Duration) -> (Option<i32>, String, String) {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(OOMGUARD);
    c.args(args).current_dir(cwd).stdin(Stdio::null());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    unsafe {
        c.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: mem,
                rlim_max: mem,
            };
            libc::setrlimit(libc::RLIMIT_AS, &r);
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let o = child.wait_with_output().unwrap();
    (
        status.and_then(|s| s.code()),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Issue 22, item 3: a FIFO as a journal does not hang `runs`, a 20 GB sparse journal
/// does not take `status` past 1 GiB of memory, a FIFO as a new checkpoint's
/// `trainer_state.json` does not hang a run, and a FIFO as a config file is refused
/// before anything runs.
#[test]
fn special_files_never_block_oomguard_or_fill_its_memory() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    // A real run's journal, then made 20 GB (sparse).
    let run = d.join(".oomguard/runs/20260101-000000");
    let r = spawn(
        d,
        &[
            "--run-dir",
            run.to_str().unwrap(),
            "python3",
            "-c",
            "print('done')",
        ],
        None,
    )
    .wait(LIMIT);
    r.check("a first run", Some(0), r.code);
    let j = run.join("journal.jsonl");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&j)
        .unwrap()
        .set_len(20 << 30)
        .unwrap();
    let (code, out, err) = limited(
        d,
        &["status", run.to_str().unwrap()],
        1 << 30,
        Duration::from_secs(60),
    );
    assert_eq!(
        code,
        Some(0),
        "status of a 20 GB sparse journal within 1 GiB\nstdout:\n{out}\nstderr:\n{err}"
    );
    // A FIFO journal among the runs.
    let fifo_run = d.join(".oomguard/runs/20260101-000001");
    std::fs::create_dir(&fifo_run).unwrap();
    nix::unistd::mkfifo(
        &fifo_run.join("journal.jsonl"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (code, out, err) = limited(d, &["runs"], 1 << 30, Duration::from_secs(30));
    assert!(
        code.is_some(),
        "runs returns with a FIFO journal\nstdout:\n{out}\nstderr:\n{err}"
    );
    // A FIFO as trainer_state.json in a checkpoint the attempt leaves.
    let out_dir = d.join("out");
    let script = d.join("trainer.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e {flag} ]; then echo finished; exit 0; fi\ntouch {flag}\nmkdir -p {out}/checkpoint-2\nmkfifo {out}/checkpoint-2/trainer_state.json\necho 'step 1'\necho 'step 2'\necho '{OOM_LINE}' >&2\nexit 1\n",
            flag = d.join("flag").display(),
            out = out_dir.display()
        ),
    )
    .unwrap();
    let r = spawn(
        d,
        &[
            "--run-dir",
            d.join("run-fifo").to_str().unwrap(),
            "--max-attempts",
            "2",
            "sh",
            script.to_str().unwrap(),
            "--per_device_train_batch_size",
            "8",
            "--output_dir",
            out_dir.to_str().unwrap(),
        ],
        None,
    )
    .wait(Duration::from_secs(60));
    r.check(
        "the run goes on past a FIFO in a checkpoint",
        Some(0),
        r.code,
    );
    // A FIFO as a config file the command names.
    nix::unistd::mkfifo(
        &d.join("ds.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (code, _, err) = limited(
        d,
        &[
            "--run-dir",
            d.join("run-ds").to_str().unwrap(),
            "python3",
            "-c",
            "pass",
            "--deepspeed",
            "ds.json",
        ],
        1 << 30,
        Duration::from_secs(30),
    );
    assert_eq!(
        code,
        Some(2),
        "a FIFO config is refused before anything runs\n{err}"
    );
}

/// Issue 22, item 4: a requeued job's `fitting.json` another user planted, or one
/// that would change the global batch, is not used, with a warning.
#[test]
fn a_requeued_jobs_fitting_must_be_the_users_own_and_keep_the_global_batch() {
    let t = shared_tmp();
    let fitting = r#"{"knobs":{"micro_batch":1,"grad_accum":1},"run_dir":"/elsewhere"}"#;
    let cases: Vec<(&str, bool)> = if root() {
        vec![("planted", true), ("global", false)]
    } else {
        vec![("global", false)]
    };
    for (name, by_nobody) in cases {
        let out = t.path().join(format!("out-{name}"));
        std::fs::create_dir(&out).unwrap();
        let folder = out.join(".oomguard-job/slurm-4243");
        if by_nobody {
            chmod(&out, 0o777);
            as_nobody(t.path(), &["mkdir", "-p", folder.to_str().unwrap()]);
            as_nobody(
                t.path(),
                &[
                    "sh",
                    "-c",
                    &format!(
                        "printf '%s' '{fitting}' > {}/fitting.json",
                        folder.display()
                    ),
                ],
            );
        } else {
            std::fs::create_dir_all(&folder).unwrap();
            chmod(&out.join(".oomguard-job"), 0o700);
            chmod(&folder, 0o700);
            std::fs::write(folder.join("fitting.json"), fitting).unwrap();
            chmod(&folder.join("fitting.json"), 0o600);
        }
        let run_dir = t.path().join(format!("run-{name}"));
        let args = sim_args(
            &run_dir,
            out.to_str().unwrap(),
            "16",
            "2",
            &["--max_steps", "3"],
        );
        let r = spawn_env(
            t.path(),
            &strs(&args),
            &[("SLURM_JOB_ID", "4243"), ("SLURM_RESTART_COUNT", "1")],
        )
        .wait(LIMIT);
        let a = argvs(&run_dir);
        let first = a.first().cloned().unwrap_or_default();
        r.check(
            &format!("{name}: attempt 1 at the command's micro-batch"),
            Some("16".to_string()),
            flag(&first, "--per_device_train_batch_size"),
        );
        r.ensure(
            &format!("{name}: said why the file is not used"),
            r.stderr.contains("not used"),
            "not used",
            &r.stderr,
        );
    }
}

fn safetensors(floats: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt"}},"w":{{"dtype":"F32","shape":[{floats}],"data_offsets":[0,{}]}}}}"#,
        floats * 4
    );
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, floats * 4));
    v
}

fn checkpoint(out: &Path, name: &str, step: u64) -> PathBuf {
    let d = out.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("model.safetensors"), safetensors(16)).unwrap();
    std::fs::write(
        d.join("trainer_state.json"),
        format!(r#"{{"global_step": {step}, "log_history": [], "max_steps": {step}}}"#),
    )
    .unwrap();
    d
}

/// Issue 22, item 5: while a run that reaches step 7 goes on, another process writes a
/// complete `checkpoint-26`, touches an old `checkpoint-500` and writes `checkpoint-+6`:
/// the relaunch resumes from the run's own `checkpoint-5`.
#[test]
fn checkpoints_written_or_touched_by_another_process_are_not_the_runs() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let old = checkpoint(&out, "checkpoint-500", 500);
    let past = std::time::SystemTime::now() - Duration::from_secs(86_400);
    for f in ["model.safetensors", "trainer_state.json"] {
        std::fs::File::options()
            .write(true)
            .open(old.join(f))
            .unwrap()
            .set_modified(past)
            .unwrap();
    }
    let run_dir = t.path().join("run");
    let args = sim_args(
        &run_dir,
        out.to_str().unwrap(),
        "16",
        "2",
        &["--max_steps", "20", "--step_seconds", "0.25"],
    );
    let mut args = args;
    args.splice(0..0, ["--max-attempts".to_string(), "2".to_string()]);
    let running = spawn(t.path(), &strs(&args), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run_dir.join("journal.jsonl").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    checkpoint(&out, "checkpoint-26", 26);
    checkpoint(&out, "checkpoint-+6", 6);
    let now = std::time::SystemTime::now();
    for f in ["model.safetensors", "trainer_state.json"] {
        std::fs::File::options()
            .write(true)
            .open(old.join(f))
            .unwrap()
            .set_modified(now)
            .unwrap();
    }
    let r = running.wait(LIMIT);
    let a = argvs(&run_dir);
    r.check("two attempts", 2, a.len());
    let resume = resume_arg(&a[1]).unwrap_or_default();
    r.ensure(
        "attempt 2 resumes from the run's own checkpoint-5",
        resume.ends_with("/checkpoint-5"),
        "…/checkpoint-5",
        &resume,
    );
}

/// Issue 22, item 6: copy 0 runs in one folder with a relative `--output_dir`, the
/// follower in another with an absolute one: the decision names the checkpoint by
/// its absolute path, and the follower resumes from it.
#[test]
fn a_follower_started_elsewhere_gets_the_checkpoint_by_its_absolute_path() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b/c"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let out = t.path().join("out");
    let mut runs = Vec::new();
    for (rank, cwd, outp) in [
        ("0", &a, "../out".to_string()),
        ("1", &b, out.display().to_string()),
    ] {
        let run_dir = t.path().join(format!("run{rank}"));
        let mut args = sim_args(
            &run_dir,
            &outp,
            "16",
            "2",
            &["--max_steps", "20", "--step_seconds", "0.01"],
        );
        args.splice(0..0, ["--max-attempts".to_string(), "2".to_string()]);
        let e = task(rank, "79");
        runs.push((run_dir, spawn_env(cwd, &strs(&args), &envs(&e))));
    }
    let mut done = Vec::new();
    for (run_dir, r) in runs {
        done.push((run_dir, r.wait(LIMIT)));
    }
    let (run1, r1) = &done[1];
    let a1 = argvs(run1);
    r1.check("the follower made two attempts", 2, a1.len());
    let resume = resume_arg(&a1[1]).unwrap_or_default();
    r1.ensure(
        "the follower resumes from copy 0's checkpoint by its absolute path",
        resume.starts_with('/') && resume.ends_with("checkpoint-5") && Path::new(&resume).exists(),
        &format!("{}/checkpoint-5", out.display()),
        &resume,
    );
}

/// A fake GPU, so that settings that fit are remembered.
fn fake_gpus(dir: &Path) -> PathBuf {
    let p = dir.join("gpus.json");
    std::fs::write(
        &p,
        r#"{"snapshots":[{"at_s":0.0,"gpus":[{"index":0,"uuid":"GPU-fake-0","name":"Fake H100","total_gib":80,"used_gib":0}]}]}"#,
    )
    .unwrap();
    p
}

/// Issue 22, item 7: copy 1 remembers other settings than copy 0 (another
/// `fits.json`): both copies start attempt 1 at copy 0's.
#[test]
fn copies_of_a_job_start_at_copy_0s_remembered_settings() {
    let t = tempfile::tempdir().unwrap();
    let gpus = fake_gpus(t.path());
    let out = t.path().join("out");
    let go = |round: &str| -> Vec<(PathBuf, Run)> {
        let mut runs = Vec::new();
        for rank in ["0", "1"] {
            let run_dir = t.path().join(format!("run{round}-{rank}"));
            let args = sim_args(
                &run_dir,
                out.to_str().unwrap(),
                "4",
                "8",
                &["--max_steps", "2", "--step_seconds", "0.01"],
            );
            let mut e = task(rank, &format!("8{round}"));
            e.push(("OOMGUARD_FAKE_GPUS", gpus.display().to_string()));
            e.push((
                "XDG_STATE_HOME",
                t.path().join(format!("state{rank}")).display().to_string(),
            ));
            runs.push((run_dir, spawn_env(t.path(), &strs(&args), &envs(&e))));
        }
        runs.into_iter().map(|(d, r)| (d, r.wait(LIMIT))).collect()
    };
    for (_, r) in go("1") {
        r.check("a first job that fits", Some(0), r.code);
    }
    // Copy 1's node remembers 16×2 (same global batch) for this command.
    let fits = t.path().join("state1/oomguard/fits.json");
    let text = std::fs::read_to_string(&fits).expect("copy 1 remembered its settings");
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut v2 = v.clone();
    for (_, e) in v2["fits"].as_object_mut().unwrap().iter_mut() {
        e["knobs"]["micro_batch"] = Value::from(16);
        e["knobs"]["grad_accum"] = Value::from(2);
    }
    std::fs::write(&fits, serde_json::to_string(&v2).unwrap()).unwrap();
    let second = go("2");
    let micro: Vec<Option<String>> = second
        .iter()
        .map(|(d, _)| {
            argvs(d)
                .first()
                .and_then(|a| flag(a, "--per_device_train_batch_size"))
        })
        .collect();
    second[1].1.check(
        "both copies start attempt 1 at copy 0's micro-batch",
        vec![Some("4".to_string()), Some("4".to_string())],
        micro,
    );
}

/// A child that writes a kernel log (for `OOMGUARD_FAKE_KERNEL_LOG`) naming `pid` and
/// `name` as killed now, then SIGKILLs itself. `pid` None: its own.
fn killed_by(log: &Path, pid: Option<u32>, name: &str) -> String {
    let pid = pid.map_or("os.getpid()".to_string(), |p| p.to_string());
    format!(
        "import os,time,signal\ntime.sleep(0.8)\nt=time.clock_gettime(time.CLOCK_MONOTONIC)\nopen({log:?},'w').write('[%12.6f] Out of memory: Killed process %d ({name}) total-vm:75164kB, anon-rss:65152kB, file-rss:6480kB, shmem-rss:0kB, UID:0 pgtables:180kB oom_score_adj:0\\n' % (t, {pid}))\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
}

/// Issue 22, item 8: a kernel record of a process by the run's name whose pid is not
/// the run's (a PID namespace's host pid) is "cannot confirm", never "not by the OOM
/// killer"; a record with the run's pid and another name (another tenant's process
/// in another namespace) is not the run's.
#[test]
fn a_kernel_record_is_tied_to_the_run_by_more_than_its_pid() {
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("kern.log");
    let log_s = log.display().to_string();
    for (pid, name, want, never) in [
        (
            Some(3_999_999),
            "python3",
            "cannot confirm",
            "not by the OOM killer",
        ),
        (
            None,
            "tenant_job",
            "not by the OOM killer",
            "the kernel's OOM killer killed",
        ),
    ] {
        let r = spawn_env(
            t.path(),
            &[
                "--run-dir",
                t.path().join(format!("run-{name}")).to_str().unwrap(),
                "python3",
                "-c",
                &killed_by(&log, pid, name),
            ],
            &[("OOMGUARD_FAKE_KERNEL_LOG", log_s.as_str())],
        )
        .wait(LIMIT);
        r.ensure(
            name,
            r.stderr.contains(want) && !r.stderr.contains(never),
            want,
            &r.stderr,
        );
    }
}

/// Issue 22, item 9: a caught OOM, then Trainer log dicts, then another error; and a
/// caught OOM's traceback followed by another traceback: the command's status, one
/// attempt.
#[test]
fn a_caught_oom_followed_by_another_error_is_not_relaunched() {
    let t = tempfile::tempdir().unwrap();
    let tb = |cls: &str, msg: &str| {
        format!(
            "sys.stderr.write('Traceback (most recent call last):\\n  File \"train.py\", line 3, in step\\n    loss = model(x)\\n{cls}: {msg}\\n')\n"
        )
    };
    let dicts = "for e in (0.1, 0.2, 0.3):\n    print(\"{'loss': 1.5, 'grad_norm': 0.3, 'learning_rate': 5e-05, 'epoch': %s}\" % e, flush=True)\n";
    let scripts = [
        format!(
            "import sys\nsys.stderr.write('{OOM_LINE}\\n')\n{dicts}{}sys.exit(3)\n",
            tb("ValueError", "label 7 is out of range")
        ),
        format!(
            "import sys\n{}{}sys.exit(3)\n",
            tb(
                "torch.OutOfMemoryError",
                "CUDA out of memory. Tried to allocate 2.00 GiB."
            ),
            tb("ValueError", "label 7 is out of range")
        ),
    ];
    for (i, code) in scripts.iter().enumerate() {
        let run_dir = t.path().join(format!("run{i}"));
        let r = spawn(
            t.path(),
            &[
                "--run-dir",
                run_dir.to_str().unwrap(),
                "python3",
                "-c",
                code,
                "--per_device_train_batch_size",
                "8",
            ],
            None,
        )
        .wait(LIMIT);
        r.check(
            &format!("script {i}: the command's status"),
            Some(3),
            r.code,
        );
        r.check(
            &format!("script {i}: one attempt"),
            1,
            argvs(&run_dir).len(),
        );
    }
}

/// Issue 22, item 10: `fits.json` keeps every entry of 24 runs finishing at once, is
/// 0600 and holds no token; `--wait-status-every 0` is refused; the fallback folder
/// is removed at the end of the run.
#[test]
fn state_files_merge_under_a_lock_private_and_redacted_and_small_promises() {
    let t = tempfile::tempdir().unwrap();
    let gpus = fake_gpus(t.path());
    let state = t.path().join("state");
    let gpus_s = gpus.display().to_string();
    let state_s = state.display().to_string();
    let runs: Vec<Running> = (1..=24)
        .map(|i| {
            let n = i.to_string();
            let run_dir = t.path().join(format!("r{i}"));
            spawn_env(
                t.path(),
                &[
                    "--run-dir",
                    run_dir.to_str().unwrap(),
                    "python3",
                    "-c",
                    "pass",
                    "--per_device_train_batch_size",
                    &n,
                    "--hub_token",
                    "hf_abcdefghijklmnopqrstuvwxyz0123",
                ],
                &[
                    ("OOMGUARD_FAKE_GPUS", gpus_s.as_str()),
                    ("XDG_STATE_HOME", state_s.as_str()),
                ],
            )
        })
        .collect();
    for r in runs {
        let r = r.wait(LIMIT);
        r.check("a run that fits", Some(0), r.code);
    }
    let fits = state.join("oomguard/fits.json");
    let text = std::fs::read_to_string(&fits).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    assert_eq!(
        v["fits"].as_object().map_or(0, |m| m.len()),
        24,
        "every run's entry kept:\n{text}"
    );
    assert!(!text.contains("hf_abc"), "no token in fits.json:\n{text}");
    assert_eq!(
        std::fs::metadata(&fits).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // --wait-status-every 0 would print in a busy loop.
    let r = spawn(
        t.path(),
        &["--wait-status-every", "0", "python3", "-c", "pass"],
        None,
    )
    .wait(LIMIT);
    r.check("--wait-status-every 0 refused", Some(2), r.code);
    // No run folder: config copies in a fresh temp folder, removed at the end.
    let tmpdir = t.path().join("tmp");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::write(
        t.path().join("ds.json"),
        "{\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"gradient_accumulation_steps\": 1\n}\n",
    )
    .unwrap();
    let flagf = t.path().join("flag");
    let code = format!(
        "import os,sys\nf={:?}\nif not os.path.exists(f):\n    open(f,'w').close(); sys.stderr.write('{OOM_LINE}\\n'); sys.exit(1)\nprint('finished')\n",
        flagf.display().to_string()
    );
    let tmp_s = tmpdir.display().to_string();
    let r = spawn_env(
        t.path(),
        &[
            "--run-dir",
            "/proc/oomguard-cannot-write-here",
            "python3",
            "-c",
            &code,
            "--deepspeed",
            "ds.json",
        ],
        &[("TMPDIR", tmp_s.as_str())],
    )
    .wait(LIMIT);
    r.check("finished after a relaunch", Some(0), r.code);
    let left: Vec<_> = std::fs::read_dir(&tmpdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    r.check(
        "no fallback folder left in $TMPDIR",
        Vec::<PathBuf>::new(),
        left,
    );
}

/// Item 10: the in-place edit lock is the module file's own, not a per-user lock file: a
/// second user's run that would edit the same shared module while the first user's run
/// holds it is refused (exit 2) before its command starts, and the first run puts the
/// module back byte for byte.
#[test]
fn a_second_users_run_cannot_edit_a_module_another_users_run_holds() {
    assert!(root(), "this test needs root (setpriv to the user nobody)");
    const MODULE: &str = "# model settings\nMAX_SEQ_LENGTH = 1536  # tokens\nLR = 3e-4\n";
    let t = shared_tmp();
    let proj = t.path().join("proj");
    std::fs::create_dir_all(proj.join("config")).unwrap();
    std::fs::write(proj.join("config/__init__.py"), "").unwrap();
    std::fs::write(proj.join("config/config.py"), MODULE).unwrap();
    std::fs::write(
        proj.join("train.py"),
        format!(
            "import os,sys,time\nfrom config import config\nprint('seq', config.MAX_SEQ_LENGTH, flush=True)\n\
             if config.MAX_SEQ_LENGTH > 1000:\n    print({OOM_LINE:?}, file=sys.stderr)\n    sys.exit(1)\n\
             print('ready', flush=True)\nwhile 'stay' in sys.argv and not os.path.exists('stop'):\n    time.sleep(0.02)\n"
        ),
    )
    .unwrap();
    // A module both users may write, in a project both may enter and write, sticky as
    // /tmp is (a run folder's parent others can write without it is refused).
    chmod(&proj, 0o1777);
    chmod(&proj.join("config"), 0o1777);
    chmod(&proj.join("config/config.py"), 0o666);
    let xdg_root = t.path().join("xdg-root");
    let xdg_nobody = t.path().join("xdg-nobody");
    std::fs::create_dir(&xdg_nobody).unwrap();
    std::os::unix::fs::chown(&xdg_nobody, Some(65534), Some(65534)).unwrap();
    chmod(&xdg_nobody, 0o700);
    let args = |run: &str, stay: bool| {
        let mut v = vec![
            "--run-dir".to_string(),
            run.to_string(),
            "--edit-in-place".into(),
            "--knob".into(),
            "seq_len=config/config.py:MAX_SEQ_LENGTH".into(),
            "python3".into(),
            "train.py".into(),
        ];
        if stay {
            v.push("stay".into());
        }
        v
    };
    let xdg_root_s = xdg_root.display().to_string();
    let first_args = args("run-a", true);
    let first = spawn_env(
        &proj,
        &strs(&first_args),
        &[("XDG_RUNTIME_DIR", xdg_root_s.as_str())],
    );
    // The first run edits the module after its OOM and holds it while its relaunch runs.
    let module = proj.join("config/config.py");
    assert!(
        wait_until(LIMIT, || std::fs::read_to_string(&module)
            .is_ok_and(|m| !m.contains("1536"))),
        "the first run never edited the module"
    );
    let second = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
            OOMGUARD,
        ])
        .args(args("run-b", false))
        .current_dir(&proj)
        .env("XDG_RUNTIME_DIR", &xdg_nobody)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", &xdg_nobody)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&second.stderr);
    let out = String::from_utf8_lossy(&second.stdout);
    assert_eq!(
        second.status.code(),
        Some(2),
        "the second user's run is refused; stderr:\n{err}\nstdout:\n{out}"
    );
    assert!(
        err.contains("config.py is being edited in place by another oomguard run"),
        "{err}"
    );
    assert!(
        !out.contains("seq"),
        "the second run's command started: {out}"
    );
    std::fs::write(proj.join("stop"), "").unwrap();
    let first = first.wait(LIMIT);
    first.check("the first run finishes", Some(0), first.code);
    assert_eq!(
        std::fs::read_to_string(&module).unwrap(),
        MODULE,
        "the module back byte for byte"
    );
}
