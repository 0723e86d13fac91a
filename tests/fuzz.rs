//! Bad input, fuzzed through the real binary with proptest: `diagnose` on arbitrary bytes,
//! the flag rewriter (`plan --json` with random flags) and the policy parser on random TOML
//! never panic and always answer with a documented exit code.
//!
//! Why the binary and not the functions: the crate is binary-only (no `src/lib.rs`), so an
//! integration test cannot call `detect::Scanner` or `policy::Policy::parse` directly. One
//! spawn costs a few milliseconds, which keeps 256 cases a property at a few seconds. A
//! longer run: `OOMGUARD_FUZZ_CASES=20000 cargo test --release --test fuzz`.

mod common;
use common::OOMGUARD;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("OOMGUARD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Shrinking spawns the binary too; keep a failing case's report quick.
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn run(args: &[&str], stdin: &[u8], cwd: &std::path::Path) -> Output {
    let mut child = Command::new(OOMGUARD)
        .args(args)
        .current_dir(cwd)
        .env("OOMGUARD_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn oomguard");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data); // a closed pipe is the binary's business
    });
    let out = child.wait_with_output().expect("wait oomguard");
    writer.join().unwrap();
    out
}

fn no_panic(out: &Output) -> Result<(), TestCaseError> {
    let err = String::from_utf8_lossy(&out.stderr);
    prop_assert!(
        !err.contains("panicked") && out.status.code().is_some(),
        "panic or death by signal: {:?}\n{err}",
        out.status
    );
    Ok(())
}

/// Bytes that look like logs: fragments of real OOM, NCCL and traceback lines, prefixes,
/// ANSI escapes, \r progress, numbers, and raw bytes, glued at random.
/// Flags the rewriter knows (and a few it must leave alone).
const KNOWN_FLAGS: &[&str] = &[
    "--per_device_train_batch_size",
    "--gradient_accumulation_steps",
    "--max_seq_length",
    "--gradient_checkpointing",
    "--global_batch_size",
    "--batch_size",
    "--micro_batch_size",
    "--output_dir",
    "--resume_from_checkpoint",
    "--deepspeed",
    "--nproc_per_node",
    "--block_size",
    "--max_length",
    "trainer.batch_size",
    "+model.seq_len",
    "--",
];

fn log_bytes() -> impl Strategy<Value = Vec<u8>> {
    let frag = prop_oneof![
        Just(b"torch.OutOfMemoryError: CUDA out of memory. ".to_vec()),
        Just(b"Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. ".to_vec()),
        Just(b"RuntimeError: CUDA error: out of memory\n".to_vec()),
        Just(b"[rank3]: ".to_vec()),
        Just(b"DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes".to_vec()),
        Just(b"NCCL watchdog timeout; connection closed by peer\n".to_vec()),
        Just(b"HIP out of memory. MPS backend out of memory ".to_vec()),
        Just(b"\x1b[31m".to_vec()),
        Just(b"\r 50%|#####     | 5/10 [".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"Traceback (most recent call last):\n".to_vec()),
        "[0-9.]{0,30} ?(GiB|MiB|KiB|B|bytes)".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
    ];
    prop::collection::vec(frag, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn diagnose_never_panics_on_arbitrary_bytes(
        raw in prop::collection::vec(any::<u8>(), 0..4096),
        logish in log_bytes(),
        json in any::<bool>(),
    ) {
        let dir = std::env::temp_dir();
        for input in [&raw, &logish] {
            let args: &[&str] = if json { &["diagnose", "--json"] } else { &["diagnose"] };
            let out = run(args, input, &dir);
            no_panic(&out)?;
            prop_assert_eq!(out.status.code(), Some(0), "input {:?}", String::from_utf8_lossy(input));
            if json {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                    .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
                let kind = v["kind"].as_str().unwrap_or("");
                prop_assert!(
                    ["cuda_oom", "host_oom", "absurd_request", "other_failure", "no_failure"].contains(&kind),
                    "kind {kind:?}"
                );
            }
        }
    }

    #[test]
    fn plan_with_random_flags_exits_0_or_2_with_a_message(
        flags in prop::collection::vec(
            (
                prop_oneof![
                    prop::sample::select(KNOWN_FLAGS).prop_map(str::to_string),
                    "-{1,2}[a-z_]{1,12}",
                ],
                prop_oneof![
                    Just(None),
                    "-?[0-9]{1,22}".prop_map(Some),
                    "[0-9]{0,3}\\.[0-9]{0,3}(e[+-]?[0-9]{1,3})?".prop_map(Some),
                    Just(Some(String::new())),
                    "(true|false|True|no|auto|gpu|nan|inf)".prop_map(Some),
                    "\\PC{0,12}".prop_map(Some),
                ],
                any::<bool>(),
            ),
            0..8,
        ),
        knob in prop::option::of("(micro_batch|grad_accum|seq_len|bogus)=(--[a-z_]{1,8}|env:[A-Z]{1,5}|)"),
    ) {
        let mut args: Vec<String> = vec!["plan".into(), "--json".into()];
        if let Some(k) = knob {
            args.push("--knob".into());
            args.push(k);
        }
        args.extend(["python".into(), "t.py".into()]);
        for (flag, value, equals) in flags {
            match (value, equals) {
                (Some(v), true) => args.push(format!("{flag}={v}")),
                (Some(v), false) => { args.push(flag.to_string()); args.push(v); }
                (None, _) => args.push(flag.to_string()),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&argv, b"", dir.path());
        no_panic(&out)?;
        let code = out.status.code();
        let err = String::from_utf8_lossy(&out.stderr);
        prop_assert!(code == Some(0) || code == Some(2), "exit {code:?} for {args:?}\n{err}");
        if code == Some(2) {
            prop_assert!(err.contains("error"), "exit 2 without a message for {args:?}");
        } else {
            prop_assert!(
                serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok(),
                "plan --json printed no JSON for {args:?}"
            );
        }
    }

    #[test]
    fn policy_parser_on_random_toml_exits_0_or_2_with_file_line_key(
        lines in prop::collection::vec(
            prop_oneof![
                Just("[[step]]".to_string()),
                Just("[env]".to_string()),
                Just("[resume]".to_string()),
                Just("[step]".to_string()),
                Just("kind = \"halve_micro_batch\"".to_string()),
                Just("kind = \"shorten_seq\"".to_string()),
                Just("kind = \"raise_zero_stage\"".to_string()),
                Just("kind = \"explode\"".to_string()),
                (
                    "(max_attempts|keep_global_batch|description|min|factor|max|multiple_of|kind|pattern|dir|flag|command|exec|[A-Z_]{1,8})",
                    prop_oneof![
                        "-?[0-9]{1,21}",
                        "-?[0-9]{1,3}\\.[0-9]{1,3}",
                        Just("true".to_string()),
                        "\"\\PC{0,10}\"",
                        Just("[1, 2]".to_string()),
                        Just("{ a = 1 }".to_string()),
                        "\\PC{0,6}",
                    ],
                ).prop_map(|(k, v)| format!("{k} = {v}")),
                "\\PC{0,20}",
            ],
            0..14,
        ),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        let text = lines.join("\n");
        std::fs::write(&file, &text).unwrap();
        let f = file.to_str().unwrap();
        let out = run(&["plan", "--policy", f, "python", "t.py", "--per_device_train_batch_size", "8"], b"", dir.path());
        no_panic(&out)?;
        let code = out.status.code();
        let err = String::from_utf8_lossy(&out.stderr);
        prop_assert!(code == Some(0) || code == Some(2), "exit {code:?} for policy:\n{text}\n{err}");
        if code == Some(2) {
            // "<file>:<line>: <key>: <message>"
            let rest = err.split_once(&format!("{f}:")).map(|(_, r)| r);
            let line_ok = rest.is_some_and(|r| {
                let digits: String = r.chars().take_while(char::is_ascii_digit).collect();
                !digits.is_empty() && r[digits.len()..].starts_with(": ")
            });
            prop_assert!(line_ok, "exit 2 without file:line:key for policy:\n{text}\n{err}");
        }
    }
}
