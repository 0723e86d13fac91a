//! The behaviour-preservation check for reshaping the supervisor (issue #20): a handful
//! of recorded runs of `examples/sim_trainer.py` (and two small scripts) under the real
//! binary, whose journals and whose own lines on stderr (every `oomguard:` line and the
//! end summary) are compared with the recorded ones in `tests/fixtures/golden/`, byte for
//! byte after what varies from run to run is normalized: times, durations, the temporary
//! folder, the repository's path, pids, the supervisor's identity and the GPU probe.
//!
//! A journal line must also be exactly what serde_json writes for its own value (keys
//! sorted, no spaces): a change in how a line is written shows here, not only a change in
//! what it says.
//!
//! To record them again after a change that is meant to change them:
//! `OOMGUARD_BLESS=1 cargo test --test journal_golden`, and read the diff.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{OOMGUARD, Run, Running, demo_args, repo, wait_until};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

fn golden_dir() -> PathBuf {
    repo().join("tests/fixtures/golden")
}

/// Starts oomguard in `cwd` with an environment that does not leak the host's: no
/// allocator settings, no Slurm job, no remembered settings or peaks (fresh state and
/// cache folders under `tmp`).
fn start(tmp: &Path, cwd: &Path, args: &[String]) -> Running {
    let mut c = Command::new(OOMGUARD);
    c.args(args).current_dir(cwd).stdin(Stdio::null());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("PYTORCH_")
            || k.starts_with("SLURM_")
            || k.starts_with("OOMGUARD_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI_")
            || k.starts_with("KUBERNETES_")
            || [
                "CUDA_VISIBLE_DEVICES",
                "TOKENIZERS_PARALLELISM",
                "WORLD_SIZE",
                "RANK",
                "LOCAL_RANK",
                "NPROC_PER_NODE",
                "NNODES",
                "SIM_CAPACITY_GIB",
                "SIM_GIB_PER_SAMPLE_TOKEN",
                "SIM_HOST_WORKERS",
            ]
            .contains(&k.as_str())
        {
            c.env_remove(&k);
        }
    }
    let state = tmp.join("state");
    std::fs::create_dir_all(&state).unwrap();
    c.env("XDG_STATE_HOME", &state)
        .env("XDG_CACHE_HOME", &state);
    let cmd = format!("oomguard {}", args.join(" "));
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let read = |r: &mut dyn std::io::Read| {
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

/// What replaces a value that varies from run to run, by the key it is under.
fn placeholder(key: &str) -> Option<&'static str> {
    Some(match key {
        "time" | "since" => "<time>",
        "duration_s" | "after_s" | "seconds" | "seconds_lost" | "lost_s" | "time_lost_s" => {
            "<secs>"
        }
        "supervisor" => "<supervisor>",
        // The GPU probe: null without a GPU, numbers with one.
        "gpu" | "gpu_peak" => "<gpu>",
        "pid" => "<pid>",
        _ => return None,
    })
}

struct Paths {
    tmp: String,
    repo: String,
}

impl Paths {
    fn text(&self, s: &str) -> String {
        // The temporary folder may sit under the repository (or the other way round):
        // the longer one first.
        let (a, b, an, bn) = if self.tmp.len() >= self.repo.len() {
            (&self.tmp, &self.repo, "<tmp>", "<repo>")
        } else {
            (&self.repo, &self.tmp, "<repo>", "<tmp>")
        };
        s.replace(a.as_str(), an).replace(b.as_str(), bn)
    }

    fn value(&self, key: &str, v: &mut Value) {
        if let Some(p) = placeholder(key)
            && (!v.is_null() || matches!(key, "gpu" | "gpu_peak"))
        {
            *v = Value::from(p);
            return;
        }
        match v {
            Value::String(s) => *s = self.text(s),
            Value::Array(a) => a.iter_mut().for_each(|x| self.value("", x)),
            Value::Object(o) => {
                for (k, x) in o.iter_mut() {
                    self.value(k, x);
                }
            }
            _ => {}
        }
    }
}

/// The journal, normalized: one line per event as serde_json writes it.
fn journal(run: &Run, run_dir: &Path, paths: &Paths) -> String {
    let path = run_dir.join("journal.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| run.fail("the journal", &path.display().to_string(), &e.to_string()));
    // serde_json reads a float to the nearest f64 (not always the one written):
    // the comparison of the form leaves the floats' digits out.
    let floats = regex::Regex::new(r"-?\d+\.\d+(e[+-]?\d+)?").unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| run.fail("a JSON journal line", line, &e.to_string()));
        run.check(
            "the line is exactly what serde_json writes for it",
            floats.replace_all(&v.to_string(), "0.0").into_owned(),
            floats.replace_all(line, "0.0").into_owned(),
        );
        paths.value("", &mut v);
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// Durations as the terminal says them ("4.2 s", "3m 05s", "2h 03m", "1d 04h").
fn durations(s: &str) -> String {
    let re = regex::Regex::new(r"\b\d+(\.\d+)? s\b|\b\d+m \d\ds\b|\b\d+h \d\dm\b|\b\d+d \d\dh\b")
        .unwrap();
    re.replace_all(s, "<dur>").into_owned()
}

/// oomguard's own lines on stderr: every `oomguard:` line, and the end summary (all
/// that follows its first line: the command has ended by then), normalized. Lines that
/// depend on the host (a GPU's peak, a kernel log that cannot be read) are left out.
fn own_lines(run: &Run, paths: &Paths) -> String {
    let lines: Vec<&str> = run.stderr.lines().collect();
    let start = lines.iter().rposition(|l| {
        ["finished after ", "gave up: ", "stopped (exit "]
            .iter()
            .any(|w| l.starts_with(&format!("oomguard: {w}")))
    });
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let summary = start.is_some_and(|s| i >= s);
        if !(summary || l.starts_with("oomguard:")) {
            continue;
        }
        if l.starts_with("oomguard: GPU memory of the last attempt")
            || l.contains("cannot read the kernel's log")
        {
            continue;
        }
        out.push_str(&durations(&paths.text(l)));
        out.push('\n');
    }
    out
}

/// Compares `found` with `tests/fixtures/golden/<name>`, or records it under
/// OOMGUARD_BLESS=1.
fn compare(run: &Run, name: &str, found: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("OOMGUARD_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, found).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        run.fail(
            &format!("{} exists", path.display()),
            "a recorded file (OOMGUARD_BLESS=1 records it)",
            &e.to_string(),
        )
    });
    if expected != found {
        let diff = similar::TextDiff::from_lines(&expected, found)
            .unified_diff()
            .header("recorded", "this run")
            .to_string();
        run.fail(
            &format!("the same as {}", path.display()),
            "the recorded text",
            &format!("a difference:\n{diff}"),
        );
    }
}

/// Runs one scenario in a fresh folder: `args(tmp)` are oomguard's arguments after
/// `--run-dir`; `during` may act on the running oomguard (its run folder given).
fn scenario(
    name: &str,
    code: i32,
    args: impl FnOnce(&Path) -> Vec<String>,
    during: impl FnOnce(&Running, &Path),
) {
    let t = tempfile::tempdir().unwrap();
    // The canonical path: what oomguard writes when it resolves a path.
    let tmp = t.path().canonicalize().unwrap();
    let run_dir = tmp.join("run");
    let mut all = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    all.extend(args(&tmp));
    let running = start(&tmp, &tmp, &all);
    during(&running, &run_dir);
    let run = running.wait(LIMIT);
    run.check("exit code", Some(code), run.code);
    let paths = Paths {
        tmp: tmp.display().to_string(),
        repo: repo().display().to_string(),
    };
    let j = journal(&run, &run_dir, &paths);
    let own = own_lines(&run, &paths);
    compare(&run, &format!("{name}.jsonl"), &j);
    compare(&run, &format!("{name}.stderr"), &own);
    let dir = run_dir.display().to_string();
    let text = start(&tmp, &tmp, &["status".into(), dir.clone()]).wait(LIMIT);
    text.check("status: exit code", Some(0), text.code);
    compare(
        &text,
        &format!("{name}.status"),
        &status_text(&text.stdout, &paths),
    );
    let json = start(&tmp, &tmp, &["status".into(), "--json".into(), dir]).wait(LIMIT);
    json.check("status --json: exit code", Some(0), json.code);
    let mut v: Value = serde_json::from_str(&json.stdout)
        .unwrap_or_else(|e| json.fail("status --json", "one JSON object", &e.to_string()));
    status_value("", &mut v, &paths);
    let pretty = serde_json::to_string_pretty(&v).unwrap() + "\n";
    compare(&json, &format!("{name}.status.json"), &pretty);
}

/// Times of day ("2026-11-27 08:20:03", RFC 3339) as `<time>`.
fn times(s: &str) -> String {
    let re =
        regex::Regex::new(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?").unwrap();
    re.replace_all(s, "<time>").into_owned()
}

/// `oomguard status`'s text, normalized.
fn status_text(s: &str, paths: &Paths) -> String {
    durations(&times(&paths.text(s)))
}

/// `oomguard status --json`, normalized (its keys sorted: the content is compared,
/// not the form).
fn status_value(key: &str, v: &mut Value, paths: &Paths) {
    let secs = [
        "elapsed_s",
        "lost_s",
        "time_lost_s",
        "attempt_elapsed_s",
        "after_s",
        "seconds",
        "started",
        "ended",
        "since",
        "time",
    ];
    if secs.contains(&key) && !v.is_null() {
        *v = Value::from("<varies>");
        return;
    }
    if let Some(p) = placeholder(key)
        && (!v.is_null() || matches!(key, "gpu" | "gpu_peak"))
    {
        *v = Value::from(p);
        return;
    }
    match v {
        Value::String(s) => *s = status_text(s, paths),
        Value::Array(a) => a.iter_mut().for_each(|x| status_value("", x, paths)),
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                status_value(k, x, paths);
            }
        }
        _ => {}
    }
}

fn nothing(_: &Running, _: &Path) {}

/// The demo with micro-batch `micro` and accumulation `accum` (global batch 32 at
/// 16 × 2), and `extra` flags.
fn demo(tmp: &Path, micro: &str, accum: &str, extra: &[&str]) -> Vec<String> {
    let mut a = demo_args(&tmp.join("out"));
    let set = |a: &mut Vec<String>, flag: &str, v: &str| {
        let i = a.iter().position(|x| x == flag).unwrap();
        a[i + 1] = v.to_string();
    };
    set(&mut a, "--per_device_train_batch_size", micro);
    set(&mut a, "--gradient_accumulation_steps", accum);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

#[test]
fn one_oom_then_a_relaunch_that_finishes() {
    scenario("one_oom", 0, |t| demo(t, "8", "4", &[]), nothing);
}

#[test]
fn two_ooms_then_a_relaunch_that_finishes() {
    scenario("two_ooms", 0, |t| demo(t, "16", "2", &[]), nothing);
}

#[test]
fn a_hang_after_the_oom_is_killed_and_relaunched() {
    scenario(
        "hang_after_oom",
        0,
        |t| {
            let mut a: Vec<String> = ["--hang-timeout", "1", "--grace", "1"]
                .map(String::from)
                .to_vec();
            a.extend(demo(t, "8", "4", &["--hang_after_oom"]));
            a
        },
        nothing,
    );
}

#[test]
fn a_host_oom_halves_the_dataloader_workers() {
    scenario(
        "host_oom",
        0,
        |t| {
            demo(
                t,
                "4",
                "8",
                &["--dataloader_num_workers", "8", "--host_workers", "2"],
            )
        },
        nothing,
    );
}

#[test]
fn a_failure_that_is_not_an_oom_stops() {
    scenario(
        "other_failure",
        3,
        |t| demo(t, "16", "2", &["--fail_with", "3"]),
        nothing,
    );
}

#[test]
fn an_interrupted_relaunch() {
    scenario(
        "interrupted",
        130,
        |t| demo(t, "8", "4", &["--step_seconds", "0.5"]),
        |running, run_dir| {
            // Interrupted once the relaunch trains (resumed, in its steps): not while
            // Python starts, where a SIGINT ends it without a traceback.
            let log = run_dir.join("attempt-2/output.log");
            assert!(
                wait_until(LIMIT, || std::fs::read_to_string(&log)
                    .is_ok_and(|l| l.contains("resuming from checkpoint-5"))),
                "attempt 2 never resumed: {}",
                running.cmd
            );
            // SAFETY: a signal to the oomguard this test started.
            unsafe { libc::kill(running.child.id() as i32, libc::SIGINT) };
        },
    );
}

/// A plain argparse script whose `evaluate()` runs out of memory while its evaluation
/// batch is above 2: two halvings of the evaluation batch.
#[test]
fn an_oom_during_evaluation_halves_the_evaluation_batch() {
    scenario(
        "eval_oom",
        0,
        |t| {
            std::fs::copy(golden_dir().join("eval_train.py"), t.join("train.py")).unwrap();
            [
                "python3",
                "train.py",
                "--per_device_train_batch_size",
                "8",
                "--gradient_accumulation_steps",
                "2",
                "--eval_batch_size",
                "8",
            ]
            .map(String::from)
            .to_vec()
        },
        nothing,
    );
}

/// argparse refuses the accumulation flag oomguard adds: oomguard's doing, the knob is
/// dropped and the run goes on with gradient checkpointing.
#[test]
fn a_rejected_flag_is_dropped_and_the_run_goes_on() {
    scenario(
        "rejected_flag",
        0,
        |_| {
            let script = repo().join("tests/children/flags/argparse_helper.py");
            [
                "python3",
                script.to_str().unwrap(),
                "--per_device_train_batch_size",
                "8",
                "--output_dir",
                "out",
            ]
            .map(String::from)
            .to_vec()
        },
        nothing,
    );
}
