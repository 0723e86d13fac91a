//! The command-line contract, driven through the real binary: usage errors,
//! `plan`, the environment the child gets, byte-exact pass-through, and user
//! signals (no relaunch after Ctrl-C).

mod common;
use common::OOMGUARD;

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run oomguard; on a failed expectation the caller prints `describe`.
struct Run {
    args: Vec<OsString>,
    cwd: PathBuf,
    out: Output,
}

impl Run {
    fn new<I, S>(cwd: &Path, args: I, envs: &[(&str, &str)]) -> Run
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut cmd = Command::new(OOMGUARD);
        cmd.args(&args).current_dir(cwd).stdin(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run oomguard");
        Run {
            args,
            cwd: cwd.to_path_buf(),
            out,
        }
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn code(&self) -> Option<i32> {
        self.out.status.code()
    }
    fn describe(&self, expected: &str) -> String {
        format!(
            "\ncommand: {OOMGUARD} {:?}\ncwd: {}\nexpected: {expected}\nfound: status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args,
            self.cwd.display(),
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            Some(code),
            "{}",
            self.describe(&format!("exit {code}"))
        );
        self
    }
    fn expect_stderr(&self, needle: &str) -> &Self {
        assert!(
            self.stderr().contains(needle),
            "{}",
            self.describe(&format!("stderr containing {needle:?}"))
        );
        self
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn malformed_policy_names_file_line_and_key() {
    let t = tmp();
    let p = t.path().join("mine.toml");
    std::fs::write(
        &p,
        "max_attempts = 4\n[[step]]\nkind = \"halve_micro_batch\"\n[[step]]\nkind = \"shorten_seq\"\nfactor = 2.0\n",
    )
    .unwrap();
    let r = Run::new(t.path(), ["--policy", p.to_str().unwrap(), "true"], &[]);
    r.expect_code(2).expect_stderr(&format!(
        "{}:6: step[1].factor: must be between 0 and 1",
        p.display()
    ));
}

#[test]
fn unknown_policy_name_lists_the_shipped_ones() {
    let t = tmp();
    Run::new(t.path(), ["--policy", "agressive", "true"], &[])
        .expect_code(2)
        .expect_stderr(
            "neither a shipped policy (default, keep-results, keep-micro-batch, smaller-batch) nor a file",
        );
}

#[test]
fn unknown_knob_and_missing_flag_are_usage_errors() {
    let t = tmp();
    Run::new(
        t.path(),
        ["--knob", "microbatch=--bs", "python3", "x.py"],
        &[],
    )
    .expect_code(2)
    .expect_stderr("unknown knob 'microbatch': expected one of micro_batch");
    Run::new(
        t.path(),
        [
            "--knob",
            "micro_batch=--bs",
            "python3",
            "x.py",
            "--batch",
            "4",
        ],
        &[],
    )
    .expect_code(2)
    .expect_stderr("the command has no --bs flag");
}

#[test]
fn missing_command_and_unexecutable_command() {
    let t = tmp();
    Run::new(t.path(), ["--max-attempts", "2"], &[]).expect_code(2);
    let r = Run::new(
        t.path(),
        [
            "--run-dir",
            "run",
            "no-such-trainer-xyz",
            "--per_device_train_batch_size",
            "8",
        ],
        &[("PATH", "/usr/bin:/bin")],
    );
    r.expect_code(127)
        .expect_stderr("no-such-trainer-xyz")
        .expect_stderr("/usr/bin");
    let script = t.path().join("train.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap(); // not executable
    Run::new(t.path(), ["--run-dir", "run", "./train.sh"], &[]).expect_code(126);
}

#[test]
fn plan_json_has_the_documented_shape_and_runs_nothing() {
    let t = tmp();
    let marker = t.path().join("ran");
    let r = Run::new(
        t.path(),
        [
            "plan",
            "--json",
            "torchrun",
            "--nproc_per_node=4",
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps=4",
            "--max_seq_length",
            "2048",
            "--output_dir",
            marker.to_str().unwrap(),
        ],
        &[],
    );
    r.expect_code(0);
    assert!(!marker.exists(), "plan ran something");
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).expect("plan --json is JSON");
    assert_eq!(v["knobs"]["micro_batch"]["value"], 8, "{}", r.stdout());
    assert_eq!(
        v["knobs"]["micro_batch"]["binding"],
        "flag --per_device_train_batch_size"
    );
    assert_eq!(v["knobs"]["grad_accum"]["value"], 4);
    assert_eq!(v["knobs"]["seq_len"]["value"], 2048);
    assert_eq!(v["world_size"], 4);
    assert_eq!(v["global_batch"], 128);
    assert!(v["env"].is_object());
    assert!(v["resume"].is_object());
    let ladder = v["ladder"].as_array().unwrap();
    assert_eq!(ladder[0]["step"], "as_given");
    assert_eq!(ladder[1]["step"], "halve_micro_batch");
    assert_eq!(ladder[1]["settings"]["micro_batch"], 4);
    assert_eq!(ladder[1]["settings"]["grad_accum"], 8);
    let argv: Vec<&str> = ladder[1]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        argv.windows(2)
            .any(|w| w == ["--per_device_train_batch_size", "4"])
    );
    assert!(argv.contains(&"--gradient_accumulation_steps=8"));
    // Every rung keeps the global batch.
    for rung in ladder {
        assert_eq!(rung["global_batch"], 128, "{rung}");
    }
}

#[test]
fn plan_says_how_to_bind_an_ambiguous_batch_flag() {
    let t = tmp();
    let r = Run::new(
        t.path(),
        [
            "plan",
            "python",
            "train.py",
            "--batch_size=12",
            "--compile=False",
        ],
        &[],
    );
    r.expect_code(0);
    assert!(
        r.stdout().contains("--knob micro_batch=--batch_size"),
        "{}",
        r.describe("a note on --batch_size")
    );
    assert!(
        r.stdout()
            .contains("halve_micro_batch: micro_batch is not bound")
    );
}

#[test]
fn environment_defaults_merge_and_never_override() {
    let t = tmp();
    let script = "import os;print('|'.join(os.environ.get(k,'<unset>') for k in ['PYTORCH_CUDA_ALLOC_CONF','TOKENIZERS_PARALLELISM','PYTHONUNBUFFERED','PYTORCH_ALLOC_CONF']))";
    let r = Run::new(
        t.path(),
        ["--run-dir", "run", "python3", "-c", script],
        &[
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),
            ("TOKENIZERS_PARALLELISM", "true"),
        ],
    );
    r.expect_code(0);
    assert_eq!(
        r.stdout().trim(),
        "max_split_size_mb:128,expandable_segments:True|true|1|<unset>",
        "{}",
        r.describe("merged environment")
    );
    let r = Run::new(
        t.path(),
        ["--run-dir", "run2", "--no-env", "python3", "-c", script],
        &[("PYTHONUNBUFFERED", "")],
    );
    assert!(
        r.stdout().starts_with("<unset>|<unset>|"),
        "{}",
        r.describe("--no-env adds nothing")
    );
}

#[test]
fn output_passes_through_byte_exact() {
    let t = tmp();
    // Non-UTF-8, carriage-return progress, ANSI colour, NUL, and no final newline.
    let payload: Vec<u8> =
        b"\x1b[32mgreen\x1b[0m\n10%\r50%\r100%\n\xff\xfe\x00bytes\xc3(\nlast line no newline"
            .to_vec();
    let p = t.path().join("payload.bin");
    std::fs::write(&p, &payload).unwrap();
    let r = Run::new(
        t.path(),
        ["--run-dir", "run", "-q", "cat", p.to_str().unwrap()],
        &[],
    );
    r.expect_code(0);
    assert_eq!(r.out.stdout, payload, "{}", r.describe("stdout == payload"));
    // The saved copy is the same bytes.
    let saved = std::fs::read(t.path().join("run/attempt-1/output.log")).unwrap();
    assert_eq!(saved, payload);
}

#[test]
fn argv_reaches_the_child_byte_exact_without_a_shell() {
    let t = tmp();
    let weird: Vec<OsString> = vec![
        "a; touch pwned".into(),
        "$(touch pwned2)".into(),
        "it's \"quoted\"".into(),
        "new\nline".into(),
        OsString::from_vec(vec![0xff, b'x', 0xfe]),
        "".into(),
    ];
    let mut args: Vec<OsString> = vec![
        "--run-dir".into(),
        "run".into(),
        "-q".into(),
        "python3".into(),
        "-c".into(),
        "import sys,os;sys.stdout.buffer.write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))"
            .into(),
    ];
    args.extend(weird.iter().cloned());
    let r = Run::new(t.path(), args, &[]);
    r.expect_code(0);
    let expected: Vec<u8> = weird
        .iter()
        .map(|a| a.clone().into_vec())
        .collect::<Vec<_>>()
        .join(&0u8);
    assert_eq!(r.out.stdout, expected, "{}", r.describe("argv echoed back"));
    assert!(!t.path().join("pwned").exists() && !t.path().join("pwned2").exists());
}

#[test]
fn non_oom_failure_keeps_the_childs_code_and_does_not_relaunch() {
    let t = tmp();
    let r = Run::new(
        t.path(),
        [
            "--run-dir",
            "run",
            "python3",
            "-c",
            "import sys; print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr); sys.exit(3)",
            "--per_device_train_batch_size",
            "8",
        ],
        &[],
    );
    r.expect_code(3)
        .expect_stderr("not an out-of-memory error")
        .expect_stderr("after 1 attempt;");
    let journal = std::fs::read_to_string(t.path().join("run/journal.jsonl")).unwrap();
    assert_eq!(journal.matches("\"attempt_start\"").count(), 1);
    assert!(journal.contains("\"outcome\":\"other_failure\""));
}

#[test]
fn exhausted_policy_has_its_own_exit_code() {
    let t = tmp();
    let oom = "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free.', file=sys.stderr); sys.exit(1)";
    let r = Run::new(
        t.path(),
        [
            "--run-dir",
            "run",
            "python3",
            "-c",
            oom,
            "--per_device_train_batch_size",
            "2",
            "--gradient_accumulation_steps",
            "1",
            "--gradient_checkpointing",
        ],
        &[],
    );
    // 2 → 1, checkpointing already on, no sequence flag: two attempts, then out of steps.
    r.expect_code(75)
        .expect_stderr("has no step left")
        .expect_stderr("after 2 attempts");
    let journal = std::fs::read_to_string(t.path().join("run/journal.jsonl")).unwrap();
    assert!(journal.contains("\"step\":\"halve_micro_batch\""));
    assert!(journal.contains("\"tried_to_allocate_bytes\":20971520"));
}

fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn ctrl_c_is_forwarded_and_never_relaunched() {
    let t = tmp();
    let sim = root().join("examples/sim_trainer.py");
    let mut child = Command::new(OOMGUARD)
        .args(["--run-dir", "run", "python3"])
        .arg(&sim)
        .args([
            "--per_device_train_batch_size",
            "1",
            "--output_dir",
            "out",
            "--max_steps",
            "100000",
            "--step_seconds",
            "0.05",
            "--print_signals",
        ])
        .current_dir(t.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    wait_for(
        || {
            while let Ok(b) = rx.try_recv() {
                seen.extend(b);
            }
            String::from_utf8_lossy(&seen).contains("step 2/")
        },
        "the trainer to start",
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    while let Ok(b) = rx.recv_timeout(Duration::from_secs(2)) {
        seen.extend(b);
    }
    let out = String::from_utf8_lossy(&seen);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("SIGINT"),
        "the trainer did not see SIGINT:\n{out}"
    );
    let journal = std::fs::read_to_string(t.path().join("run/journal.jsonl")).unwrap();
    assert_eq!(journal.matches("\"attempt_start\"").count(), 1, "{journal}");
    assert!(journal.contains("\"outcome\":\"interrupted\""), "{journal}");
}

#[test]
fn a_module_the_script_imports_is_edited_in_place_only_when_asked_and_restored() {
    let t = tmp();
    std::fs::create_dir_all(t.path().join("config")).unwrap();
    let original = "# model settings\nMAX_SEQ_LENGTH = 1536  # tokens\nLR = 3e-4\n";
    std::fs::write(t.path().join("config/__init__.py"), "").unwrap();
    std::fs::write(t.path().join("config/config.py"), original).unwrap();
    std::fs::write(
        t.path().join("train.py"),
        "import sys\nfrom config import config\nprint('seq', config.MAX_SEQ_LENGTH, flush=True)\nif config.MAX_SEQ_LENGTH > 1000:\n    print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free.', file=sys.stderr)\n    sys.exit(1)\n",
    )
    .unwrap();
    let knob = ["--knob", "seq_len=config/config.py:MAX_SEQ_LENGTH"];

    // Not asked: plan says why it cannot, and how to allow it.
    let r = Run::new(
        t.path(),
        ["plan"]
            .into_iter()
            .chain(knob)
            .chain(["python3", "train.py"]),
        &[],
    );
    r.expect_code(0);
    assert!(
        r.stdout().contains("is not named on the command line")
            && r.stdout().contains("--edit-in-place"),
        "{}",
        r.describe("a note offering --edit-in-place")
    );

    // Asked: edited in place, run recovers, the original is back afterwards.
    let r = Run::new(
        t.path(),
        ["--run-dir", "run", "--edit-in-place"]
            .into_iter()
            .chain(knob)
            .chain(["python3", "train.py"]),
        &[],
    );
    r.expect_code(0)
        .expect_stderr("restored")
        .expect_stderr("(edited in place)");
    assert!(
        r.stdout().contains("seq 1536")
            && r.stdout().contains("seq 1152")
            && r.stdout().contains("seq 832"),
        "{}",
        r.describe("the script saw 1536, 1152, 832")
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("config/config.py")).unwrap(),
        original,
        "the module is restored byte for byte"
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("run/originals/0-config.py")).unwrap(),
        original,
        "the original is kept in the run folder"
    );
    assert!(!t.path().join("run/restore.json").exists());

    // `oomguard restore` after a hard kill (simulated: a record left behind, with the
    // content hashes of the original and of what the run wrote).
    let edited = "MAX_SEQ_LENGTH = 864  # tokens\n";
    std::fs::write(t.path().join("config/config.py"), edited).unwrap();
    let sha = |b: &str| -> String {
        <sha2::Sha256 as sha2::Digest>::digest(b.as_bytes())
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    let manifest = serde_json::json!({
        "oomguard_restore": 2,
        "files": [{
            "original": t.path().join("config/config.py"),
            "backup": t.path().join("run/originals/0-config.py"),
            "original_sha256": sha(original),
            "written_sha256": [sha(edited)],
        }],
    });
    std::fs::write(t.path().join("run/restore.json"), manifest.to_string()).unwrap();
    let r = Run::new(t.path(), ["restore", "run"], &[]);
    r.expect_code(0);
    assert_eq!(
        std::fs::read_to_string(t.path().join("config/config.py")).unwrap(),
        original
    );
}

/// `python3 -c oom --per_device_train_batch_size micro` under oomguard with two
/// attempts (the second at the halved micro-batch), and its journal's text.
fn halved_once(t: &tempfile::TempDir, oom: &str, micro: &str) -> (Run, String) {
    let r = Run::new(
        t.path(),
        [
            "--run-dir",
            "run",
            "--max-attempts",
            "2",
            "python3",
            "-c",
            oom,
            "--per_device_train_batch_size",
            micro,
        ],
        &[],
    );
    let journal = std::fs::read_to_string(t.path().join("run/journal.jsonl")).unwrap();
    (r, journal)
}

/// A real CUDA OOM at a halved micro-batch often fails on a block of the same
/// size, with less memory in use (seen on an H200 under a 4 GiB cap: 256 MiB at
/// micro-batch 32 and at 16, 3.77 then 3.70 GiB allocated): no warning then.
#[test]
fn the_same_allocation_with_less_in_use_after_halving_is_not_flagged() {
    let t = tmp();
    let oom = "import sys\nb = int(sys.argv[sys.argv.index('--per_device_train_batch_size') + 1])\nprint(f'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free. Of the allocated memory {20 + b / 100:.2f} GiB is allocated by PyTorch, and 60.78 MiB is reserved by PyTorch but unallocated.', file=sys.stderr)\nsys.exit(1)";
    let (r, journal) = halved_once(&t, oom, "32");
    r.expect_code(75).expect_stderr("micro-batch 32 → 16");
    assert!(
        !r.stderr().contains("ignoring the new value"),
        "{}",
        r.describe("no warning that the trainer ignores the new value")
    );
    assert!(!journal.contains("\"event\":\"suspect\""), "{journal}");
}

#[test]
fn the_same_allocation_after_halving_is_flagged_as_a_trainer_ignoring_the_new_value() {
    // A "trainer" that ignores its micro-batch flag: the same OOM every time.
    let t = tmp();
    let oom = "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.19 GiB is free.', file=sys.stderr); sys.exit(1)";
    let (r, journal) = halved_once(&t, oom, "8");
    r.expect_code(75)
        .expect_stderr("the trainer may be ignoring the new value");
    assert!(journal.contains("\"event\":\"suspect\""), "{journal}");
}

#[test]
fn help_lists_every_exit_code() {
    let t = tmp();
    let r = Run::new(t.path(), ["--help"], &[]);
    r.expect_code(0);
    let help = r.stdout();
    for code in [
        "0 success",
        "130/143",
        "75",
        "74",
        "2 usage error",
        "69",
        "126/127",
    ] {
        assert!(
            help.contains(code),
            "{}",
            r.describe(&format!("--help mentioning exit code {code}"))
        );
    }
    assert!(
        help.contains("69 `oomguard gpus`"),
        "{}",
        r.describe("69 explained as oomguard gpus' code")
    );
}

#[test]
fn restore_without_a_run_folder_is_a_usage_error() {
    let t = tmp();
    let missing = t.path().join("no-such-run");
    let file = t.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    for path in [&missing, &file] {
        let r = Run::new(
            t.path(),
            [std::ffi::OsStr::new("restore"), path.as_os_str()],
            &[],
        );
        r.expect_code(2)
            .expect_stderr(&format!(
                "oomguard: error: no run folder at {}",
                path.display()
            ))
            .expect_stderr("runs live under .oomguard/runs/");
        assert!(r.stdout().is_empty(), "{}", r.describe("nothing on stdout"));
    }
}

#[test]
fn restore_with_nothing_to_restore_succeeds() {
    let t = tmp();
    std::fs::create_dir(t.path().join("run")).unwrap();
    let r = Run::new(t.path(), ["restore", "run"], &[]);
    r.expect_code(0);
    assert!(
        r.stdout()
            .contains("nothing to restore: run has no restore.json"),
        "{}",
        r.describe("the nothing-to-restore message")
    );
}

/// Results first, as a user sees it in `plan`: on one GPU with a DeepSpeed
/// config the default ladder halves, checkpoints, offloads (raising the ZeRO
/// stage it needs, never raising it alone) and only then shortens the sequence.
#[test]
fn plan_on_one_gpu_offloads_before_it_shortens_the_sequence() {
    let t = tmp();
    std::fs::write(
        t.path().join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"}}}"#,
    )
    .unwrap();
    let r = Run::new(
        t.path(),
        [
            "plan",
            "--json",
            "python",
            "train.py",
            "--deepspeed",
            "ds.json",
            "--per_device_train_batch_size",
            "2",
            "--gradient_accumulation_steps",
            "4",
            "--max_seq_length",
            "2048",
            "--output_dir",
            "out",
        ],
        &[],
    );
    r.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).expect("plan --json is JSON");
    let steps: Vec<String> = v["ladder"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["step"].as_str().unwrap().to_string())
        .collect();
    let first_short = steps.iter().position(|s| s == "shorten_seq");
    let expected = [
        "as_given",
        "halve_micro_batch",
        "enable_grad_checkpointing",
        "offload_optimizer",
        "offload_param",
    ];
    assert_eq!(
        steps[..expected.len()],
        expected,
        "{}",
        r.describe("results-preserving steps first")
    );
    assert!(
        !steps.contains(&"raise_zero_stage".to_string()),
        "{steps:?}"
    );
    if let Some(i) = first_short {
        assert!(i >= expected.len(), "{steps:?}");
    }
}
