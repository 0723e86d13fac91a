//! Issue 21, item 6: climb back. A run shrunk for a spike keeps the peak NVML
//! measured of its last attempt (in the journal and with the settings that fit);
//! the next run of the same command starts from the largest settings the
//! memory model, calibrated to that peak, predicts to fit — not from the halved
//! ones — and from the halved ones when the peak leaves no room.
//!
//! Driven through the real binary on the sizing benchmark's simulated trainer
//! (`benches/sizing_trainer.py`: its OOM names only the one allocation that
//! failed and the memory in use, as PyTorch's does), with the fake NVML probe
//! (`OOMGUARD_FAKE_GPUS`) showing the run's process on a 64 GiB GPU.

mod common;
use common::{Run, Running, events, llama_1b3_model, repo, spawn_env};

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);
const GIB: f64 = (1u64 << 30) as f64;

/// A fake GPU of 64 GiB; with `run_gib`, the supervised run's process holds
/// that much from `at_s` on (the first attempt, an OOM, has ended by then: no
/// wait for its memory to be released; the second holds its memory long enough
/// to be sampled).
fn timeline(dir: &Path, name: &str, run_gib: Option<f64>) -> PathBuf {
    let gpu = |procs: &str| {
        format!(
            r#"{{"index": 0, "uuid": "GPU-climb-0", "name": "Fake H100", "total_gib": 64, "processes": [{procs}]}}"#
        )
    };
    let mut snaps = vec![format!(r#"{{"at_s": 0, "gpus": [{}]}}"#, gpu(""))];
    if let Some(g) = run_gib {
        snaps.push(format!(
            r#"{{"at_s": 3, "gpus": [{}]}}"#,
            gpu(&format!(
                r#"{{"pid": 77001, "used_gib": {g}, "attempt": "self", "user": "me"}}"#
            ))
        ));
    }
    let p = dir.join(name);
    std::fs::write(&p, format!(r#"{{"snapshots": [{}]}}"#, snaps.join(","))).unwrap();
    p
}

struct Bench {
    dir: PathBuf,
    cmd: Vec<String>,
}

impl Bench {
    fn new(dir: &Path) -> Bench {
        // The sizing tests' 1.3B-parameter Llama-shaped model. On the simulated
        // trainer at sequence 1024 on 64 GiB: micro-batch 16 needs 67.6 GiB at its
        // longest batch (48.8 at a typical one: a spike), 12 needs 55.9, 8 44.2.
        let m = llama_1b3_model(dir);
        let cmd = [
            "python3",
            repo().join("benches/sizing_trainer.py").to_str().unwrap(),
            "--model_name_or_path",
            m.to_str().unwrap(),
            "--per_device_train_batch_size",
            "16",
            "--gradient_accumulation_steps",
            "3",
            "--max_seq_length",
            "1024",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Bench {
            dir: dir.to_path_buf(),
            cmd,
        }
    }

    fn results(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.jsonl"))
    }

    /// `oomguard [extra] CMD` with the run folder `name`; `gpus`: the fake
    /// timeline; `hold`: seconds the trainer holds its memory after training.
    fn run(&self, name: &str, extra: &[&str], gpus: &Path, hold: &str) -> Run {
        self.spawn(name, extra, gpus, hold, "state", &[])
            .wait(LIMIT)
    }

    /// As [`Bench::run`], not waited for, remembering in `state`, with `env` too.
    fn spawn(
        &self,
        name: &str,
        extra: &[&str],
        gpus: &Path,
        hold: &str,
        state: &str,
        env: &[(&str, &str)],
    ) -> Running {
        let run_dir = self.dir.join(name);
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["--run-dir".into(), run_dir.display().to_string()]);
        args.extend(["--hang-timeout".into(), "5".into()]);
        args.extend(self.cmd.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (results, state, cache) = (
            self.results(name).display().to_string(),
            self.dir.join(state).display().to_string(),
            self.dir.join("cache").display().to_string(),
        );
        let gpus = gpus.display().to_string();
        let mut envs = vec![
            ("SIM_GPU_GIB", "64"),
            ("SIM_SPIKE_STEPS", "12"),
            ("SIM_HOLD_S", hold),
            ("SIM_RESULT", results.as_str()),
            ("XDG_STATE_HOME", state.as_str()),
            ("XDG_CACHE_HOME", cache.as_str()),
            ("OOMGUARD_FAKE_GPUS", gpus.as_str()),
        ];
        envs.extend_from_slice(env);
        spawn_env(&self.dir, &args, &envs)
    }

    /// The micro-batch of each attempt, and whether it ran out of memory,
    /// as the trainer saw them.
    fn attempts(&self, name: &str) -> Vec<(u64, bool)> {
        std::fs::read_to_string(self.results(name))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["settings"]["micro_batch"].as_u64().unwrap(),
                    v["oom"] == Value::Bool(true),
                )
            })
            .collect()
    }

    /// Run 1: OOM as a spike at micro-batch 16 (after 12 good steps), carried
    /// to micro-batch 8, whose peak the fake NVML shows as `peak_gib`.
    fn shrunk_for_a_spike(&self, peak_gib: f64) {
        let gpus = timeline(&self.dir, "gpus1.json", Some(peak_gib));
        let r = self.run("run1", &[], &gpus, "6");
        r.check("run 1 finishes", Some(0), r.code);
        r.check(
            "run 1: a spike OOM at 16, then 8 fits",
            vec![(16, true), (8, false)],
            self.attempts("run1"),
        );
        r.ensure(
            "run 1 calls the OOM a spike",
            r.stderr.contains("after 12 good steps (a spike"),
            "after 12 good steps (a spike",
            common::tail(&r.stderr, 3000),
        );
        // The journal keeps the NVML peak of the attempt that ran to the end.
        let journal = r.journal(&self.dir.join("run1"));
        let ends = events(&journal, "attempt_end");
        let last = ends.last().expect("attempt_end events");
        r.check(
            "the last attempt succeeded",
            "success",
            last["outcome"].as_str().unwrap(),
        );
        let peak = &last["gpu_peak"]["per_gpu"][0];
        r.check(
            "the journal's peak of the attempt that fit, GiB",
            peak_gib,
            (peak["run_peak_bytes"].as_f64().unwrap_or(0.0) / GIB * 100.0).round() / 100.0,
        );
        r.check(
            "the journal's GPU memory, GiB",
            Some(64.0),
            peak["total_bytes"].as_f64().map(|b| b / GIB),
        );
        // And fits.json keeps it with the settings that fit, and what failed.
        let fits = r.read_json(&self.dir.join("state/oomguard/fits.json"));
        let entry = fits["fits"]
            .as_object()
            .and_then(|m| m.values().next())
            .cloned()
            .unwrap_or(Value::Null);
        r.check(
            "fits.json: the settings that fit",
            Some(8),
            entry["knobs"]["micro_batch"].as_u64(),
        );
        r.check(
            "fits.json: the peak, GiB",
            Some(peak_gib),
            entry["peak"]["bytes"]
                .as_f64()
                .map(|b| (b / GIB * 100.0).round() / 100.0),
        );
        r.check(
            "fits.json: the settings that ran out of memory",
            Some(16),
            entry["failed"][0]["micro_batch"].as_u64(),
        );
    }
}

/// The peak at micro-batch 8 leaves room: the next run of the same command
/// starts at 12 × 4 (16 failed), says so in one line, and fits at once; `plan`
/// shows the same start; `--fresh` starts as written.
#[test]
fn the_next_run_climbs_back_to_the_largest_settings_the_peak_leaves_room_for() {
    let t = tempfile::tempdir().unwrap();
    let b = Bench::new(t.path());
    b.shrunk_for_a_spike(44.16);

    let idle = timeline(t.path(), "idle.json", None);
    let plan = |what: &str| {
        let mut args = vec!["plan".to_string()];
        args.extend(b.cmd.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let state = t.path().join("state").display().to_string();
        let idle_s = idle.display().to_string();
        let envs = [
            ("XDG_STATE_HOME", state.as_str()),
            ("OOMGUARD_FAKE_GPUS", idle_s.as_str()),
        ];
        let p = spawn_env(t.path(), &args, &envs).wait(LIMIT);
        p.ensure(
            "plan shows the start a run would take",
            p.stdout.contains(what),
            what,
            &p.stdout,
        );
    };
    plan("start:        climbing back: micro_batch 12 × grad_accum 4, global batch 48 kept");

    let r = b.run("run2", &[], &idle, "0");
    r.check("run 2 finishes", Some(0), r.code);
    r.check(
        "run 2 starts at micro-batch 12 and fits",
        vec![(12, false)],
        b.attempts("run2"),
    );
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("climbing back"))
        .collect();
    r.check("one climbing-back line", 1, said.len());
    let want = "oomguard: climbing back: micro_batch 12 × grad_accum 4, global batch 48 kept (remembered peak 44.16 of 64.00 GiB at micro_batch 8 × grad_accum 6: micro_batch 8 → 12, grad_accum 6 → 4; the memory model (";
    r.ensure(
        "the climbing-back line says to what and from which peak",
        said[0].starts_with(want),
        want,
        said[0],
    );
    r.ensure(
        "no line about starting at the halved settings",
        !r.stderr.contains("starting from the settings that fit"),
        "none",
        &r.stderr,
    );
    let journal = r.journal(&t.path().join("run2"));
    let starts = events(&journal, "attempt_start");
    let argv = common::argv_of(starts[0]);
    let micro = argv
        .iter()
        .position(|a| a == "--per_device_train_batch_size")
        .map(|i| argv[i + 1].clone());
    r.check(
        "the journal's first attempt launched micro-batch 12",
        Some("12".to_string()),
        micro,
    );

    // Run 2 fit at 12 (no peak measured: the idle GPU): the next start is 12,
    // remembered, and 16 — which failed in run 1 — is never climbed to.
    plan(
        "start:        starting from the settings that fit the last run of this command on these GPUs (micro_batch=12 grad_accum=4)",
    );

    let r = b.run("run3", &["--fresh"], &idle, "0");
    r.check(
        "--fresh starts as written",
        Some(&(16, true)),
        b.attempts("run3").first(),
    );
    r.ensure(
        "--fresh does not climb",
        !r.stderr.contains("climbing back"),
        "no climbing-back line",
        &r.stderr,
    );
}

/// The peak at micro-batch 8 leaves no room for 12: the next run starts at 8,
/// and says why it does not climb.
#[test]
fn a_peak_that_leaves_no_room_starts_at_the_remembered_settings() {
    let t = tempfile::tempdir().unwrap();
    let b = Bench::new(t.path());
    b.shrunk_for_a_spike(58.0);

    // plan says the start before anything runs.
    let mut args = vec!["plan".to_string()];
    args.extend(b.cmd.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let state = t.path().join("state").display().to_string();
    let idle = timeline(t.path(), "idle.json", None);
    let idle_s = idle.display().to_string();
    let p = spawn_env(
        t.path(),
        &args,
        &[
            ("XDG_STATE_HOME", state.as_str()),
            ("OOMGUARD_FAKE_GPUS", idle_s.as_str()),
        ],
    )
    .wait(LIMIT);
    p.ensure(
        "plan says no climb and why",
        p.stdout.contains("remembered peak 58.00 of 64.00 GiB at micro_batch 8 × grad_accum 6 leaves no room for larger settings"),
        "remembered peak 58.00 of 64.00 GiB ... leaves no room",
        &p.stdout,
    );

    let r = b.run("run2", &[], &idle, "0");
    r.check("run 2 finishes", Some(0), r.code);
    r.check(
        "run 2 starts at micro-batch 8",
        vec![(8, false)],
        b.attempts("run2"),
    );
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("starting from the settings that fit"))
        .collect();
    r.check("one start line", 1, said.len());
    r.ensure(
        "it says the peak leaves no room",
        said[0].contains("micro_batch=8")
            && said[0].contains("remembered peak 58.00 of 64.00 GiB")
            && said[0].contains("leaves no room"),
        "micro_batch=8 ... remembered peak 58.00 of 64.00 GiB ... leaves no room",
        said[0],
    );
    r.ensure(
        "no climb",
        !r.stderr.contains("climbing back"),
        "no climbing-back line",
        &r.stderr,
    );
}

/// Two copies of one Slurm job (one per task, on one machine here): copy 0
/// remembers 8 × 6 with room to spare, copy 1's node remembers nothing. Both
/// start at copy 0's climbed-back settings, not at copy 1's own.
#[test]
fn the_copies_of_a_job_all_start_from_copy_0s_climbed_back_settings() {
    let t = tempfile::tempdir().unwrap();
    let mut b = Bench::new(t.path());
    let out = t.path().join("out");
    b.cmd
        .extend(["--output_dir".to_string(), out.display().to_string()]);
    let gpus = timeline(t.path(), "gpus1.json", Some(44.16));
    let idle = timeline(t.path(), "idle.json", None);
    let job = |round: &str, gpus: &Path, hold: &str| -> Vec<(String, Run)> {
        let copies: Vec<(String, Running)> = ["0", "1"]
            .iter()
            .map(|rank| {
                let name = format!("job{round}-{rank}");
                let env = [
                    ("SLURM_PROCID", *rank),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_JOB_ID", round),
                    ("SLURM_STEP_ID", "0"),
                    ("OOMGUARD_JOB_TIMEOUT", "30"),
                ];
                let state = format!("state{rank}");
                (name.clone(), b.spawn(&name, &[], gpus, hold, &state, &env))
            })
            .collect();
        copies
            .into_iter()
            .map(|(n, r)| (n, r.wait(LIMIT)))
            .collect()
    };
    // The first job: a spike at 16, carried at 8 by copy 0's one decision.
    for (name, r) in job("71", &gpus, "6") {
        r.check("a first job that finishes", Some(0), r.code);
        r.check(
            "the first job: 16 ran out, 8 fit",
            vec![(16, true), (8, false)],
            b.attempts(&name),
        );
    }
    // Copy 1's node measured another peak (no room at 8), then forgets what fit.
    let fits1 = t.path().join("state1/oomguard/fits.json");
    let text = std::fs::read_to_string(&fits1).expect("copy 1 remembered what fit");
    let mut v: Value = serde_json::from_str(&text).unwrap();
    for (_, e) in v["fits"].as_object_mut().unwrap().iter_mut() {
        e["peak"]["bytes"] = Value::from(58u64 << 30);
    }
    std::fs::write(&fits1, serde_json::to_string(&v).unwrap()).unwrap();
    for (round, forget) in [("72", false), ("73", true)] {
        if forget {
            std::fs::remove_file(&fits1).unwrap();
        }
        let copies = job(round, &idle, "0");
        for (name, r) in &copies {
            r.check(
                "both copies start at copy 0's climbed-back micro-batch",
                vec![(12, false)],
                b.attempts(name),
            );
        }
        let follow = &copies[1].1;
        follow.ensure(
            "copy 1 starts at copy 0's settings, not at its own record",
            !follow.stderr.contains("climbing back")
                && !follow
                    .stderr
                    .contains("starting from the settings that fit"),
            "no line about copy 1's own record",
            &follow.stderr,
        );
        if round == "72" {
            let lead = &copies[0].1;
            lead.ensure(
                "copy 0 says it climbs back",
                lead.stderr
                    .contains("climbing back: micro_batch 12 × grad_accum 4"),
                "climbing back: micro_batch 12 × grad_accum 4",
                &lead.stderr,
            );
            follow.ensure(
                "copy 1 says it starts at copy 0's settings",
                follow.stderr.contains("starting at copy 0's settings"),
                "starting at copy 0's settings",
                &follow.stderr,
            );
        }
    }
}
