//! `oomguard status` and `oomguard runs` through the real binary, on real runs of
//! `examples/sim_trainer.py`: finished ones (recovered from two OOMs, fitted at once
//! with a fake GPU, gave up) and a running one (an OOM, then slow training) queried
//! while it runs, followed with `--follow`, and then killed.

mod common;
use common::*;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const QUICK: Duration = Duration::from_secs(30);

/// The simulated trainer at micro-batch `micro` (16 and 8 OOM at sequence 1024, 4 fits),
/// global batch 32, saving every 5 steps.
fn trainer(out: &Path, micro: u64, max_steps: u64, step_seconds: f64) -> Vec<String> {
    let accum = (32 / micro).to_string();
    let micro = micro.to_string();
    let max_steps = max_steps.to_string();
    let step_seconds = step_seconds.to_string();
    let out = out.display().to_string();
    [
        "python3",
        &sim(),
        "--per_device_train_batch_size",
        &micro,
        "--gradient_accumulation_steps",
        &accum,
        "--max_seq_length",
        "1024",
        "--max_steps",
        &max_steps,
        "--save_steps",
        "5",
        "--step_seconds",
        &step_seconds,
        "--output_dir",
        &out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `oomguard ARGS` in `cwd`, expecting exit 0 and one JSON object on stdout.
fn json_of(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> (Run, Value) {
    let run = spawn_env(cwd, args, envs).wait(QUICK);
    run.check("exit code", Some(0), run.code);
    let v: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| run.fail("stdout is one JSON object", "JSON", &e.to_string()));
    (run, v)
}

/// A fake GPU (24 GiB) on which one process of the oomguard attempt `attempt` holds 20 GiB.
fn fake_gpu(dir: &Path, attempt: &str) -> String {
    let path = dir.join(format!("gpus-{}.json", attempt.replace('.', "_")));
    let timeline = serde_json::json!({"snapshots": [{"at_s": 0, "gpus": [{
        "index": 0, "name": "Fake 24GB", "total_gib": 24,
        "processes": [{"pid": 999_999, "used_gib": 20, "user": "me", "attempt": attempt}]
    }]}]});
    std::fs::write(&path, timeline.to_string()).unwrap();
    path.display().to_string()
}

#[test]
fn status_and_runs_on_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // Before any run: nothing to show.
    let none = oomguard(cwd, &["status"], None, QUICK);
    none.check("status without a run: exit code", Some(2), none.code);
    none.ensure(
        "status without a run says how to name one",
        none.stderr.contains("no run under .oomguard/runs") && none.stderr.contains("RUN_DIR"),
        "'no run under .oomguard/runs' and RUN_DIR",
        &none.stderr,
    );
    let (_, empty) = json_of(cwd, &["runs", "--json"], &[]);
    assert_eq!(empty, serde_json::json!({"runs": []}));

    // 1. Recovered: OOMs at micro-batch 16 and 8, finishes at 4 resuming from checkpoint-5.
    let run = oomguard(
        cwd,
        &strs(&trainer(&cwd.join("out1"), 16, 30, 0.005)),
        None,
        LIMIT,
    );
    run.check("the recovered run's exit code", Some(0), run.code);
    let (st, v) = json_of(cwd, &["status", "--json"], &[]);
    st.check("state", &Value::from("finished"), &v["state"]);
    st.check("exit_code", &Value::from(0), &v["exit_code"]);
    st.check("alive", &Value::from(false), &v["alive"]);
    st.check("attempt", &Value::from(3), &v["attempt"]);
    st.check(
        "original settings",
        &serde_json::json!({"micro_batch": 16, "grad_accum": 2, "seq_len": 1024, "grad_checkpointing": false}),
        &v["settings"]["original"],
    );
    st.check(
        "micro-batch now",
        &Value::from(4),
        &v["settings"]["current"]["micro_batch"],
    );
    st.check(
        "accumulation now",
        &Value::from(8),
        &v["settings"]["current"]["grad_accum"],
    );
    st.check(
        "changed knobs",
        &serde_json::json!(["micro_batch", "grad_accum"]),
        &v["settings"]["changed"],
    );
    st.check(
        "global batch kept",
        &serde_json::json!({"original": 32, "current": 32}),
        &v["global_batch"],
    );
    st.check("step reached", &Value::from(30), &v["step_reached"]);
    st.ensure(
        "resumed from checkpoint-5 at step 5",
        v["resumed_from"]
            .as_str()
            .is_some_and(|p| p.ends_with("out1/checkpoint-5"))
            && v["resumed_from_step"] == 5,
        "out1/checkpoint-5, step 5",
        (&v["resumed_from"], &v["resumed_from_step"]),
    );
    st.check(
        "the last OOM's attempt",
        &Value::from(2),
        &v["last_oom"]["attempt"],
    );
    st.ensure(
        "the last OOM's numbers",
        v["last_oom"]["tried_to_allocate_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
            && v["last_oom"]["cause"]
                .as_str()
                // When in the run it happened comes first ("OOM at step 6 (tried ...").
                .is_some_and(|c| {
                    c.starts_with("OOM at step ") && c.contains(" (tried to allocate")
                }),
        "bytes and the cause in words",
        &v["last_oom"],
    );
    st.check(
        "the decision",
        &Value::from("halve_micro_batch"),
        &v["last_decision"]["step"],
    );
    st.ensure(
        "time elapsed and lost",
        v["elapsed_s"].as_f64().is_some_and(|e| e > 0.0)
            && v["lost_s"].as_f64().is_some_and(|l| l > 0.0)
            && v["steps_lost"].as_u64().is_some_and(|n| n >= 2)
            && v["ended"].is_string(),
        "elapsed_s > 0, lost_s > 0, steps_lost >= 2, ended",
        &v,
    );
    st.check(
        "attempt rows",
        3,
        v["attempts"].as_array().map_or(0, Vec::len),
    );
    st.check(
        "how each attempt ended",
        &serde_json::json!(["cuda_oom", "cuda_oom", "success"]),
        &Value::from(
            v["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["outcome"].clone())
                .collect::<Vec<_>>(),
        ),
    );
    let text = oomguard(cwd, &["status"], None, QUICK);
    text.check("status: exit code", Some(0), text.code);
    for needle in [
        "state     finished after 3 attempts (exit 0)",
        "last OOM  attempt 2",
        "decision  after attempt 2: halve_micro_batch",
        "resumed from ",
        "micro_batch         16        4  (changed)",
        "global batch        32        32",
    ] {
        text.ensure(
            "the text status",
            text.stdout.contains(needle),
            &format!("{needle:?} in it"),
            &text.stdout,
        );
    }

    // 2. Fits at once, with a fake GPU on which the run holds 20 of 24 GiB.
    let fake = fake_gpu(cwd, "self");
    let run = spawn_env(
        cwd,
        &strs(&trainer(&cwd.join("out2"), 4, 10, 0.005)),
        &[("OOMGUARD_FAKE_GPUS", &fake)],
    )
    .wait(LIMIT);
    run.check("the run that fits: exit code", Some(0), run.code);
    let (st, v) = json_of(cwd, &["status", "--json"], &[]);
    st.check("state", &Value::from("finished"), &v["state"]);
    st.check("attempt", &Value::from(1), &v["attempt"]);
    st.check(
        "peak memory per GPU",
        &serde_json::json!([{"attempt": 1, "gpu": 0, "run_peak_bytes": 20u64 << 30, "total_bytes": 24u64 << 30}]),
        &v["gpu_peak"],
    );
    st.check("no OOM", &Value::Null, &v["last_oom"]);
    st.check(
        "nothing changed",
        &serde_json::json!([]),
        &v["settings"]["changed"],
    );
    let text = oomguard(cwd, &["status"], None, QUICK);
    text.ensure(
        "the peak in the text",
        text.stdout
            .contains("GPU peak  attempt 1: GPU 0: 20.0 of 24.0 GiB"),
        "'GPU peak  attempt 1: GPU 0: 20.0 of 24.0 GiB'",
        &text.stdout,
    );

    // 3. Gives up: one attempt allowed, and it OOMs.
    let mut args = vec!["--max-attempts".to_string(), "1".to_string()];
    args.extend(trainer(&cwd.join("out3"), 16, 30, 0.005));
    let run = oomguard(cwd, &strs(&args), None, LIMIT);
    run.check("the run that gives up: exit code", Some(75), run.code);

    // `runs`: one line each, oldest first; `status` shows the newest.
    let runs = oomguard(cwd, &["runs"], None, QUICK);
    runs.check("runs: exit code", Some(0), runs.code);
    let lines: Vec<&str> = runs.stdout.lines().collect();
    runs.check("one line per run", 3, lines.len());
    for (line, (state, attempts, out)) in lines.iter().zip([
        ("finished", "3 attempts", "out1"),
        ("finished", "1 attempt ", "out2"),
        ("gave up", "1 attempt ", "out3"),
    ]) {
        runs.ensure(
            "a run's line",
            line.contains(state) && line.contains(attempts) && line.contains(out),
            &format!("{state:?}, {attempts:?} and {out:?}"),
            line,
        );
    }
    let (rj, v) = json_of(cwd, &["runs", "--json"], &[]);
    let states: Vec<&Value> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["state"])
        .collect();
    rj.check(
        "runs --json states",
        vec!["finished", "finished", "gave_up"],
        states.iter().map(|s| s.as_str().unwrap_or("")).collect(),
    );
    let (st, v) = json_of(cwd, &["status", "--json"], &[]);
    st.check("the newest run", &Value::from("gave_up"), &v["state"]);
    st.check("its exit code", &Value::from(75), &v["exit_code"]);
    // An explicit run folder: the oldest one.
    let (st, v) = json_of(cwd, &["status", "--json", &oldest_run(cwd)], &[]);
    st.check("status RUN_DIR", &Value::from(3), &v["attempt"]);

    // A folder that is not a run folder.
    let bad = oomguard(cwd, &["status", cwd.to_str().unwrap()], None, QUICK);
    bad.check(
        "status of a folder without a journal: exit code",
        Some(2),
        bad.code,
    );
    bad.ensure(
        "it says what a run folder is",
        bad.stderr.contains("journal.jsonl") && bad.stderr.contains("oomguard runs"),
        "journal.jsonl and `oomguard runs` named",
        &bad.stderr,
    );
}

/// The oldest run folder under `cwd/.oomguard/runs` (the names are times).
fn oldest_run(cwd: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(cwd.join(".oomguard/runs"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    names.sort();
    names.remove(0)
}

/// SIGKILLs a process when the test ends early (a failed expectation), so that a
/// trainer meant to run until killed never outlives the test.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Harmless when it is gone already (and reaped: the test waited for it).
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

#[test]
fn status_follows_a_running_run_and_says_when_its_oomguard_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let run_dir = cwd.join("run");
    let rd = run_dir.display().to_string();
    // OOMs at micro-batch 8 (step 7), then trains at 4 from checkpoint-5 until killed.
    let mut args = vec!["--run-dir".to_string(), rd.clone()];
    args.extend(trainer(&cwd.join("out"), 8, 1_000_000, 0.05));
    let guard = spawn(cwd, &strs(&args), None);
    let pid = guard.child.id();
    let _kill_guard = KillOnDrop(pid);
    // Follow it from the start, as a second tmux pane would.
    let follow = spawn(
        cwd,
        &["status", "--follow", "--json", "--interval", "0.2", &rd],
        None,
    );
    let _kill_follow = KillOnDrop(follow.child.id());
    // Ask what the GPUs hold with a fake one on which a process of this oomguard's
    // attempt holds 20 GiB (NVML's view of the run's workers).
    let fake = fake_gpu(cwd, &format!("{pid}.0.1"));

    let mut last = Value::Null;
    let running = wait_until(LIMIT, || {
        let r = spawn_env(
            cwd,
            &["status", "--json", &rd],
            &[("OOMGUARD_FAKE_GPUS", &fake)],
        )
        .wait(QUICK);
        last = serde_json::from_str(&r.stdout).unwrap_or(Value::Null);
        last["state"] == "running"
            && last["attempt"] == 2
            && last["step_reached"].as_u64() >= Some(8)
    });
    if !running {
        let mut g = guard;
        let _ = g.child.kill();
        g.wait(QUICK).fail(
            "status shows attempt 2 running past step 8",
            "state running, attempt 2, step_reached >= 8",
            &last.to_string(),
        );
    }
    let st = spawn(cwd, &["status", "--json", &rd], None).wait(QUICK);
    st.check("alive", &Value::from(true), &last["alive"]);
    st.check(
        "the supervisor's pid",
        &Value::from(pid),
        &last["supervisor"]["pid"],
    );
    st.check(
        "not ended",
        (&Value::Null, &Value::Null),
        (&last["ended"], &last["exit_code"]),
    );
    st.check(
        "micro-batch now",
        &Value::from(4),
        &last["settings"]["current"]["micro_batch"],
    );
    st.check(
        "micro-batch before",
        &Value::from(8),
        &last["settings"]["original"]["micro_batch"],
    );
    st.check(
        "the last OOM",
        &Value::from(1),
        &last["last_oom"]["attempt"],
    );
    st.check(
        "the decision",
        &Value::from("halve_micro_batch"),
        &last["last_decision"]["step"],
    );
    st.ensure(
        "resumed from checkpoint-5",
        last["resumed_from"]
            .as_str()
            .is_some_and(|p| p.ends_with("out/checkpoint-5"))
            && last["resumed_from_step"] == 5,
        "out/checkpoint-5 at step 5",
        (&last["resumed_from"], &last["resumed_from_step"]),
    );
    st.check(
        "what the run holds now",
        &serde_json::json!([{"gpu": 0, "run_bytes": 20u64 << 30, "total_bytes": 24u64 << 30}]),
        &last["gpu_now"],
    );
    st.check(
        "the running attempt's row",
        (&Value::Null, &Value::from(2)),
        (
            &last["attempts"][1]["outcome"],
            &last["attempts"][1]["attempt"],
        ),
    );
    let text = spawn(cwd, &["status", &rd], None).wait(QUICK);
    text.ensure(
        "the text says who runs it",
        text.stdout.contains("running: attempt 2 of at most 8")
            && text
                .stdout
                .contains(&format!("oomguard (pid {pid}) is running it")),
        "running: attempt 2 ... oomguard (pid N) is running it",
        &text.stdout,
    );
    // Kill oomguard outright: no end in the journal, and its pid gone.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed = guard.wait(QUICK);
    killed.check("oomguard was killed", Some(libc::SIGKILL), killed.signal);
    let mut after = Value::Null;
    let seen = wait_until(QUICK, || {
        let r = spawn(cwd, &["status", "--json", &rd], None).wait(QUICK);
        after = serde_json::from_str(&r.stdout).unwrap_or(Value::Null);
        after["state"] == "killed"
    });
    killed.ensure("status says killed", seen, "state killed", &after);
    killed.check("not alive", &Value::from(false), &after["alive"]);
    killed.ensure(
        "an end time from the journal's last line, no exit code",
        after["ended"].is_string() && after["exit_code"].is_null(),
        "ended set, exit_code null",
        &after,
    );
    let text = spawn(cwd, &["status", &rd], None).wait(QUICK);
    text.ensure(
        "the text says it was killed",
        text.stdout.contains("killed: the journal has no end")
            && text
                .stdout
                .contains(&format!("its oomguard (pid {pid}) is gone")),
        "killed ... its oomguard (pid N) is gone",
        &text.stdout,
    );

    // --follow ended by itself once the run had: JSON lines, running, then killed.
    let f = follow.wait(QUICK);
    f.check("--follow: exit code", Some(0), f.code);
    let states: Vec<(String, u64)> = f
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| f.fail("each --follow line is JSON", "JSON", &e.to_string()));
            (
                v["state"].as_str().unwrap_or("").to_string(),
                v["attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    f.ensure(
        "--follow saw attempt 2 running, and ended with killed",
        states.contains(&("running".into(), 2))
            && states.last().is_some_and(|(s, _)| s == "killed"),
        "(running, 2) among the lines, (killed, _) last",
        &states,
    );
    expect_no_survivors(&f, &cwd.join("out").display().to_string());
}
