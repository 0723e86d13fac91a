//! The one harness of the integration tests: every test file takes the binary's path
//! ([`OOMGUARD`]), process checks ([`alive`], [`proc_state`]) and waits ([`wait_until`])
//! from here, and the files that drive the real binary on Python trainers
//! (`tests/sim_trainer.rs`, `tests/real_clients.rs`, ...) its runner ([`spawn`], [`oomguard`]).
#![allow(dead_code)] // each test file uses a different part
// Runs the real oomguard binary with a time limit and, on any failed expectation, panics with
// the command, its cwd, what was expected and what was found, and oomguard's stderr.

use std::fmt::Debug;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const OOMGUARD: &str = env!("CARGO_BIN_EXE_oomguard");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A running oomguard whose output is being collected.
pub struct Running {
    pub cmd: String,
    pub cwd: PathBuf,
    pub child: Child,
    pub out: std::thread::JoinHandle<String>,
    pub err: std::thread::JoinHandle<String>,
    pub started: Instant,
}

/// A finished oomguard.
pub struct Run {
    pub cmd: String,
    pub cwd: PathBuf,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

pub fn spawn(cwd: &Path, args: &[&str], path_first: Option<&Path>) -> Running {
    let path = path_first.map(|dir| {
        let path = std::env::var("PATH").unwrap_or_default();
        format!("{}:{path}", dir.display())
    });
    let envs: Vec<(&str, &str)> = path.iter().map(|p| ("PATH", p.as_str())).collect();
    spawn_env(cwd, args, &envs)
}

/// As [`spawn`], with these environment variables set (shown in the command on failure).
pub fn spawn_env(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Running {
    let mut c = Command::new(OOMGUARD);
    c.args(args).current_dir(cwd).stdin(Stdio::null());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        c.env(k, v);
    }
    let shown_env = envs
        .iter()
        .filter(|(k, _)| *k != "PATH")
        .map(|(k, v)| format!("{k}={v}"));
    let cmd = shown_env
        .chain(std::iter::once("oomguard".to_string()))
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| {
            if a.contains(' ') || a.is_empty() {
                format!("'{a}'")
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
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
        started: Instant::now(),
    }
}

impl Running {
    pub fn wait(mut self, limit: Duration) -> Run {
        use std::os::unix::process::ExitStatusExt;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for oomguard") {
                break Some(s);
            }
            if self.started.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let run = Run {
            cmd: self.cmd,
            cwd: self.cwd,
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stdout: self.out.join().unwrap_or_default(),
            stderr: self.err.join().unwrap_or_default(),
            elapsed: self.started.elapsed(),
        };
        if status.is_none() {
            run.fail(
                "oomguard finishes in time",
                &format!("within {limit:?}"),
                "still running: killed",
            );
        }
        run
    }
}

pub fn oomguard(cwd: &Path, args: &[&str], path_first: Option<&Path>, limit: Duration) -> Run {
    spawn(cwd, args, path_first).wait(limit)
}

pub fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

impl Run {
    pub fn fail(&self, what: &str, expected: &str, found: &str) -> ! {
        panic!(
            "\n=== expectation failed: {what}\n  expected: {expected}\n  found:    {found}\n\
             command: {}\ncwd: {}\nexit code: {:?}, signal: {:?}, after {:.1?}\n\
             --- oomguard stderr (last 6000 bytes) ---\n{}\n--- stdout (last 3000 bytes) ---\n{}\n",
            self.cmd,
            self.cwd.display(),
            self.code,
            self.signal,
            self.elapsed,
            tail(&self.stderr, 6000),
            tail(&self.stdout, 3000),
        )
    }

    /// Expect `expected == found`.
    pub fn check<T: PartialEq + Debug>(&self, what: &str, expected: T, found: T) {
        if expected != found {
            self.fail(what, &format!("{expected:?}"), &format!("{found:?}"));
        }
    }

    /// Expect a condition that is not an equality; `expected` says it in words.
    pub fn ensure(&self, what: &str, ok: bool, expected: &str, found: impl Debug) {
        if !ok {
            self.fail(what, expected, &format!("{found:?}"));
        }
    }

    pub fn read_json(&self, path: &Path) -> Value {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            self.fail(
                &format!("read {}", path.display()),
                "a readable file",
                &e.to_string(),
            )
        });
        serde_json::from_str(&text).unwrap_or_else(|e| {
            self.fail(
                &format!("parse {}", path.display()),
                "JSON",
                &format!("{e}: {text}"),
            )
        })
    }

    /// The journal of a run folder, one JSON value per line.
    pub fn journal(&self, run_dir: &Path) -> Vec<Value> {
        let path = run_dir.join("journal.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            self.fail(
                "the journal exists",
                &path.display().to_string(),
                &e.to_string(),
            )
        });
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| self.fail("journal line is JSON", l, &e.to_string()))
            })
            .collect()
    }
}

pub fn events<'a>(journal: &'a [Value], name: &str) -> Vec<&'a Value> {
    journal.iter().filter(|e| e["event"] == name).collect()
}

/// The argv of an `attempt_start` event, as strings.
pub fn argv_of(event: &Value) -> Vec<String> {
    event["argv"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The checkpoint an argv resumes from (`--resume_from_checkpoint X` or `=X`).
pub fn resume_arg(argv: &[String]) -> Option<String> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == "--resume_from_checkpoint" {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix("--resume_from_checkpoint=")
                .map(str::to_string)
        }
    })
}

/// Every value stored under `key` anywhere in `v` (the JSON shapes may grow; the names are fixed).
pub fn find_key<'a>(v: &'a Value, key: &str, found: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    found.push(x);
                }
                find_key(x, key, found);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| find_key(x, key, found)),
        _ => {}
    }
}

/// Processes (pid, command line) whose command line contains `marker`, other than this test.
pub fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Expect no process mentioning `marker` to survive oomguard (waits up to 2 s for the reaper).
pub fn expect_no_survivors(run: &Run, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for (pid, _) in &left {
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
            run.fail(
                "no child outlives oomguard",
                "no process left",
                &format!("{left:?}"),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
// ---- end of test helper ----

/// Poll `f` every 10 ms until it holds (true) or `limit` passes (false): tests
/// wait with a deadline, never with a fixed sleep.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state letter of /proc/PID/stat (`R`, `S`, `T`, `Z`...), or None when gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..].trim_start().chars().next()
}

/// Whether process `pid` exists and has not exited (a zombie, exited but not yet
/// reaped, is not alive).
pub fn alive(pid: i32) -> bool {
    matches!(proc_state(pid), Some(c) if c != 'Z' && c != 'X')
}

/// Those of `pids` that are [`alive`].
pub fn alive_of(pids: &[i32]) -> Vec<i32> {
    pids.iter().copied().filter(|&p| alive(p)).collect()
}

/// The simulated trainer (`examples/sim_trainer.py`).
pub fn sim() -> String {
    repo().join("examples/sim_trainer.py").display().to_string()
}

/// The README demo's command (faster steps), writing into `out`.
pub fn demo_args(out: &Path) -> Vec<String> {
    let mut v = vec!["python3".to_string(), sim()];
    for a in [
        "--per_device_train_batch_size",
        "16",
        "--gradient_accumulation_steps",
        "2",
        "--max_seq_length",
        "1024",
        "--max_steps",
        "30",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.005",
        "--output_dir",
    ] {
        v.push(a.to_string());
    }
    v.push(out.display().to_string());
    v
}

/// The real-client tier's venv `bin` folder (`OOMGUARD_REAL_PYTHON`'s parent, set by
/// `tests/run.sh`); panics saying how to set it up when it is not.
pub fn venv_bin() -> PathBuf {
    let p = std::env::var_os("OOMGUARD_REAL_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "OOMGUARD_REAL_PYTHON is not set: needs the real-client venv: run bash tests/run.sh"
            )
        });
    // Not canonicalized: a venv's python is a symlink out of the venv.
    let bin = PathBuf::from(p)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    assert!(
        bin.join("python").exists(),
        "OOMGUARD_REAL_PYTHON: no python in {}",
        bin.display()
    );
    bin
}

/// The value after `flag` in an argv (`--x 4` or `--x=4`).
pub fn flag_value(argv: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_string)
        }
    })
}

/// A 1.3B-parameter Llama-shaped model folder (its config.json) in `dir`: the sizing
/// and climb-back tests' model.
pub fn llama_1b3_model(dir: &Path) -> PathBuf {
    let m = dir.join("model");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(
        m.join("config.json"),
        r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5504, "num_attention_heads": 16, "vocab_size": 32000, "hidden_act": "silu"}"#,
    )
    .unwrap();
    m
}

/// The one `name` event of a journal (checked: exactly one).
pub fn only_event(run: &Run, journal: &[Value], name: &str) -> Value {
    let found = events(journal, name);
    run.check(&format!("{name} events"), 1, found.len());
    found[0].clone()
}

/// What a real trainer's report says of its last launch (tests/real/lightning_cli.py).
pub struct LastLaunch<'a> {
    pub world: u64,
    pub micro: u64,
    pub accum: u64,
    pub global_batch: u64,
    pub resumed_from: &'a str,
    pub global_step: u64,
}

/// Checks the last line of the report at `rep` (Lightning's own account of the launches)
/// against `want`.
pub fn check_last_launch(run: &Run, rep: &Path, want: LastLaunch<'_>) {
    let r = report(rep);
    let last = r.last().cloned().unwrap_or_default();
    run.check(
        "final world (Lightning)",
        Some(want.world),
        last["world"].as_u64(),
    );
    run.check(
        "final micro-batch",
        Some(want.micro),
        last["micro"].as_u64(),
    );
    run.check(
        "final accumulation",
        Some(want.accum),
        last["accum"].as_u64(),
    );
    run.check(
        "global batch kept",
        Some(want.global_batch),
        last["global_batch"].as_u64(),
    );
    run.check(
        "resumed from",
        Some(want.resumed_from),
        last["ckpt_path"].as_str(),
    );
    run.check(
        "reached max_steps",
        Some(want.global_step),
        last["global_step"].as_u64(),
    );
}

/// The report lines a test program appended (one JSON object a line; others skipped).
pub fn report(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A Python environment with transformers `version` installed, as oomguard reads one
/// (`lib/python3.12/site-packages/transformers-VERSION.dist-info`): its python.
pub fn fake_venv(dir: &Path, version: &str) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("python3"), "").unwrap();
    std::fs::create_dir_all(
        dir.join("lib/python3.12/site-packages")
            .join(format!("transformers-{version}.dist-info")),
    )
    .unwrap();
    bin.join("python3").display().to_string()
}
