//! Knob discovery on real training commands.
//!
//! `fixture_corpus_knobs_found_as_labelled` runs `oomguard plan --json` on the
//! 61 real command lines in `tests/fixtures/corpus/commands/` (copied from public
//! repositories; each with its config files laid out where the command names them)
//! and compares every knob with the case's `labels.json`. A mismatch fails the test
//! unless it is listed in `EXCEPTIONS` with the reason oomguard is not meant to find
//! it; the figure "N of M labelled knob locations found as labelled" is printed. It
//! also checks that a rung's changed copy differs only on the changed keys, and that
//! `plan` leaves the case's files byte-identical. It fails if the corpus folder is
//! missing.
//!
//! The other tests need only `tests/fixtures/configs/` and always run.

mod common;
use common::OOMGUARD;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value as J;

const KNOBS: [&str; 7] = [
    "micro_batch",
    "grad_accum",
    "seq_len",
    "grad_checkpointing",
    "zero_stage",
    "offload_optimizer",
    "offload_param",
];

/// The corpus of real commands; panics when it is missing (it is part of the repository).
fn corpus_commands() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus/commands");
    assert!(
        dir.is_dir(),
        "{} is missing: it is part of the repository (restore it with git checkout)",
        dir.display()
    );
    dir
}

fn own_configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs")
}

// ---------------------------------------------------------------------------
// A small shell-words splitter for command.txt
// ---------------------------------------------------------------------------

/// One command taken from a shell snippet: leading `VAR=value` assignments
/// (given to the child as environment) and the words after them.
#[derive(Debug, Default, PartialEq)]
struct ShellCommand {
    env: Vec<(String, String)>,
    argv: Vec<String>,
}

fn is_assignment(w: &str) -> Option<(String, String)> {
    let (name, value) = w.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return None;
    }
    Some((name.to_string(), value.to_string()))
}

/// Split the first command of a shell snippet into words, the way a shell
/// would before expansion: `\`-newline continuations are joined, single and
/// double quotes and backslash escapes are honoured, `$VAR`, `${VAR}` and
/// `$(...)` and `<placeholder>` stay literal text, a `#` comment is dropped, and the command ends
/// at `|`, `&`, `;`, `>`, a heredoc `<<` or a `(` (an array or subshell).
/// Lines holding only assignments (shell variables) are skipped. Returns
/// `None` when no command word is found.
fn split_command(text: &str) -> Option<ShellCommand> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut words: Vec<String> = Vec::new();
    let mut word: Option<String> = None;

    // Ends the current word; at a command end, decides whether to stop.
    fn finish(word: &mut Option<String>, words: &mut Vec<String>) {
        if let Some(w) = word.take() {
            words.push(w);
        }
    }
    fn has_command(words: &[String]) -> bool {
        words.iter().any(|w| is_assignment(w).is_none())
    }

    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' => {
                match chars.get(i + 1) {
                    Some('\n') => {} // continuation
                    Some('\r') if chars.get(i + 2) == Some(&'\n') => i += 1,
                    Some(&n) => word.get_or_insert_with(String::new).push(n),
                    None => {}
                }
                i += 2;
                continue;
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        match chars.get(i + 1) {
                            Some('\n') => {
                                i += 2;
                                continue;
                            }
                            Some(&n @ ('\\' | '"' | '$' | '`')) => {
                                w.push(n);
                                i += 2;
                                continue;
                            }
                            _ => {}
                        }
                    }
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                // `$(...)` stays one literal token (nested parentheses counted).
                let w = word.get_or_insert_with(String::new);
                let mut depth = 0;
                while i < chars.len() {
                    w.push(chars[i]);
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            ' ' | '\t' | '\r' => finish(&mut word, &mut words),
            '\n' => {
                finish(&mut word, &mut words);
                if has_command(&words) {
                    break;
                }
                words.clear(); // shell variables only: not the command
            }
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '|' | '&' | ';' | '>' | '(' => {
                finish(&mut word, &mut words);
                break;
            }
            '<' if chars.get(i + 1) == Some(&'<') => {
                finish(&mut word, &mut words);
                break;
            }
            '<' => {
                // A documentation placeholder `<your_port>` stays literal text.
                let w = word.get_or_insert_with(String::new);
                while i < chars.len() && chars[i] != '\n' {
                    w.push(chars[i]);
                    if chars[i] == '>' {
                        break;
                    }
                    i += 1;
                }
            }
            _ => word.get_or_insert_with(String::new).push(c),
        }
        i += 1;
    }
    finish(&mut word, &mut words);
    let mut cmd = ShellCommand::default();
    let mut it = words.into_iter().peekable();
    while let Some(w) = it.peek() {
        match is_assignment(w) {
            Some(kv) => {
                cmd.env.push(kv);
                it.next();
            }
            None => break,
        }
    }
    cmd.argv = it.collect();
    (!cmd.argv.is_empty()).then_some(cmd)
}

/// A command assembled in a variable by a heredoc and word-split onto a launcher line
/// (`read -r -d '' CMD <<EOF ... EOF`, then `deepspeed --module $CMD`): the first line
/// after the heredoc that uses the variable, with the heredoc's text in its place, as
/// the shell would run it. `None` when the snippet has no such heredoc.
fn expand_heredoc_variable(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (start, name, delim) = lines.iter().enumerate().find_map(|(i, l)| {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.first() != Some(&"read") {
            return None;
        }
        let at = words.iter().position(|w| w.starts_with("<<"))?;
        let delim = words[at]
            .trim_start_matches("<<")
            .trim_start_matches('-')
            .trim_matches(['\'', '"']);
        let delim = if delim.is_empty() {
            words.get(at + 1)?.trim_matches(['\'', '"'])
        } else {
            delim
        };
        Some((i, *words.get(at.checked_sub(1)?)?, delim))
    })?;
    let end = start + 1 + lines[start + 1..].iter().position(|l| l.trim() == delim)?;
    let body = lines[start + 1..end].join("\n");
    let uses = [format!("${{{name}}}"), format!("${name}")];
    let line = lines[end + 1..].iter().find(|l| {
        !l.trim_start().starts_with('#') && uses.iter().any(|u| l.contains(u.as_str()))
    })?;
    let mut line = line.trim().to_string();
    for u in &uses {
        line = line.replace(u.as_str(), &body);
    }
    Some(line)
}

#[test]
fn a_heredoc_in_a_variable_is_expanded_where_the_variable_is_used() {
    let text = "read -r -d '' cmds <<EOF\nm.train \\\n   --a 1 \\\n   --b\nEOF\n# --c\nif x; then\n    deepspeed --module $cmds\nfi\n";
    let line = expand_heredoc_variable(text).unwrap();
    assert_eq!(
        split_command(&line).unwrap().argv,
        vec!["deepspeed", "--module", "m.train", "--a", "1", "--b"]
    );
    assert_eq!(expand_heredoc_variable("torchrun t.py --a 1"), None);
}

#[test]
fn splitter_handles_continuations_quotes_env_and_operators() {
    let c = split_command(
        "    A=1 B=\"x y\" \\\n  torchrun --n=2 \\\n    train.py --s 'a b' \"c\\\"d\" $OUT ${X}/f.json $@ # comment\n",
    )
    .unwrap();
    assert_eq!(
        c.env,
        vec![("A".into(), "1".into()), ("B".into(), "x y".into())]
    );
    assert_eq!(
        c.argv,
        vec![
            "torchrun",
            "--n=2",
            "train.py",
            "--s",
            "a b",
            "c\"d",
            "$OUT",
            "${X}/f.json",
            "$@"
        ]
    );
    let c = split_command("deepspeed main.py --x 1 \\\n   &> $OUTPUT/log").unwrap();
    assert_eq!(c.argv, vec!["deepspeed", "main.py", "--x", "1"]);
    let c = split_command("torchrun --p=<your_port> t.py --o <dir> > log").unwrap();
    assert_eq!(
        c.argv,
        vec!["torchrun", "--p=<your_port>", "t.py", "--o", "<dir>"]
    );
    let c = split_command("a b | c; d && e").unwrap();
    assert_eq!(c.argv, vec!["a", "b"]);
    let c = split_command("read -r x <<EOF\nfoo --bar\nEOF").unwrap();
    assert_eq!(c.argv, vec!["read", "-r", "x"]);
    let c = split_command("n=2\n\nCUDA=0,1 \\\nswift sft --g $(expr 16 / $n) --z 2").unwrap();
    assert_eq!(c.env, vec![("CUDA".into(), "0,1".into())]);
    assert_eq!(
        c.argv,
        vec!["swift", "sft", "--g", "$(expr 16 / $n)", "--z", "2"]
    );
    assert_eq!(split_command("run_cmd=\"deepspeed x.py\""), None);
    let c = split_command("trl sft --a zero2  # or path/to.yaml").unwrap();
    assert_eq!(c.argv, vec!["trl", "sft", "--a", "zero2"]);
}

// ---------------------------------------------------------------------------
// Running plan
// ---------------------------------------------------------------------------

struct Plan {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    json: Option<J>,
}

fn run_plan(
    cwd: &Path,
    home: &Path,
    extra: &[&str],
    argv: &[String],
    env: &[(String, String)],
) -> Plan {
    let mut cmd = Command::new(OOMGUARD);
    cmd.arg("plan").arg("--json").args(extra).arg("--");
    cmd.args(argv).current_dir(cwd).stdin(Stdio::null());
    cmd.env("HOME", home);
    for v in [
        "HF_HOME",
        "XDG_CACHE_HOME",
        "ACCELERATE_CONFIG_FILE",
        "CUDA_VISIBLE_DEVICES",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NPROC_PER_NODE",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run oomguard");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Plan {
        code: out.status.code(),
        json: serde_json::from_str(&stdout).ok(),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    fs::read(&p).unwrap_or_default(),
                );
            }
        }
    }
    out
}

fn primary(binding: &str) -> &str {
    binding.split(" (also ").next().unwrap_or(binding)
}

/// The keys named by a binding description and its mirrors (`role path: key`).
fn binding_keys(binding: &str) -> Vec<String> {
    let mut parts = vec![primary(binding).to_string()];
    if let Some((_, rest)) = binding.split_once(" (also ") {
        let rest = rest.strip_suffix(')').unwrap_or(rest);
        parts.extend(rest.split(", ").map(String::from));
    }
    parts
        .iter()
        .filter_map(|p| p.rsplit_once(": ").map(|(_, k)| k.to_string()))
        .collect()
}

/// Check one rung's diffs: every `-`/`+` line mentions a segment of a changed
/// key or a changed file's name (a reference to a changed child copy), or is
/// punctuation only, or differs from its partner only by a trailing comma.
fn check_rung_diff(case: &str, knobs: &J, base: &J, rung: &J) -> Vec<String> {
    let mut problems = Vec::new();
    let settings = &rung["settings"];
    let mut segments: Vec<String> = Vec::new();
    for k in KNOBS {
        if settings.get(k).is_some()
            && settings[k] != base[k]
            && let Some(b) = knobs[k]["binding"].as_str()
        {
            for key in binding_keys(b) {
                segments.extend(key.split('.').filter(|s| s.len() > 2).map(String::from));
            }
        }
    }
    segments.push("train_batch_size".into()); // DeepSpeed keeps micro × accum × world
    let files = rung["files"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = files
        .iter()
        .flat_map(|f| [f["original"].as_str(), f["copy"].as_str()])
        .flatten()
        .filter_map(|p| {
            Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .collect();
    for f in &files {
        let diff = f["diff"].as_str().unwrap_or("");
        let mut minus: Vec<&str> = Vec::new();
        let mut plus: Vec<&str> = Vec::new();
        for l in diff.lines() {
            if l.starts_with("---") || l.starts_with("+++") {
                continue;
            }
            if let Some(r) = l.strip_prefix('-') {
                minus.push(r);
            } else if let Some(r) = l.strip_prefix('+') {
                plus.push(r);
            }
        }
        let bare = |s: &str| s.trim_end().trim_end_matches(',').to_string();
        let mut rest: Vec<String> = Vec::new();
        for m in &minus {
            if let Some(pos) = plus.iter().position(|p| bare(p) == bare(m)) {
                plus.remove(pos);
            } else {
                rest.push(format!("-{m}"));
            }
        }
        rest.extend(plus.iter().map(|p| format!("+{p}")));
        for l in rest {
            let body = &l[1..];
            let punct = body
                .chars()
                .all(|c| c.is_whitespace() || "{}[],".contains(c));
            let named = segments.iter().any(|s| body.contains(s.as_str()))
                || names.iter().any(|n| body.contains(n.as_str()));
            if !punct && !named {
                problems.push(format!(
                    "{case}: rung {} diff of {} touches a line of no changed key: {l:?} (changed keys: {segments:?})",
                    rung["step"],
                    f["original"]
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------

/// Labelled knobs oomguard is not meant to find as labelled, with the reason.
/// Case number, knob ("*" for every knob of the case), reason.
const EXCEPTIONS: &[(&str, &str, &str)] = &[
    (
        "01",
        "grad_accum",
        "`gradient_accumulation_steps = 5 * 8` is a Python expression; oomguard edits literals, it does not evaluate code",
    ),
    (
        "03",
        "micro_batch",
        "llm.c's single-letter flags (-b) of a custom binary are not guessed; bind with --knob",
    ),
    (
        "03",
        "grad_accum",
        "llm.c -d is the total batch in tokens (derived); single-letter flags are not guessed",
    ),
    (
        "03",
        "seq_len",
        "llm.c's single-letter flags (-t) are not guessed; bind with --knob",
    ),
    (
        "03",
        "grad_checkpointing",
        "llm.c -r is a recompute level 0|1|2, not a bool; not guessed",
    ),
    (
        "03",
        "zero_stage",
        "llm.c -z (unsure in labels) is not guessed",
    ),
    (
        "07",
        "zero_stage",
        "`trl sft --accelerate_config zero2` names a preset shipped inside TRL, not a file on the command line",
    ),
    (
        "07",
        "offload_optimizer",
        "the preset's YAML (zero2.yaml) is not named by the command",
    ),
    (
        "07",
        "offload_param",
        "the preset's YAML (zero2.yaml) is not named by the command",
    ),
    ("13", "micro_batch", "hard-coded in the training script"),
    ("13", "seq_len", "hard-coded in the training script"),
    (
        "14",
        "grad_accum",
        "the accelerate config names its DeepSpeed JSON by an absolute path (/home/ubuntu/...) the fixture cannot place",
    ),
    (
        "14",
        "zero_stage",
        "DeepSpeed JSON named by an absolute path the fixture cannot place",
    ),
    (
        "14",
        "offload_optimizer",
        "DeepSpeed JSON named by an absolute path the fixture cannot place",
    ),
    (
        "14",
        "offload_param",
        "DeepSpeed JSON named by an absolute path the fixture cannot place",
    ),
    (
        "20",
        "seq_len",
        "split prompt/completion lengths (two keys); seq_len is one value",
    ),
    (
        "24",
        "*",
        "config.yml is not part of the fixture (labels: not provided); plan stops with exit 2 naming it",
    ),
    (
        "29",
        "grad_accum",
        "torchtune built-in recipe `--config llama2/7B_lora_single_device` is not a file the command names",
    ),
    (
        "29",
        "seq_len",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "30",
        "micro_batch",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "30",
        "grad_accum",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "30",
        "grad_checkpointing",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "31",
        "grad_accum",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "31",
        "seq_len",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "31",
        "grad_checkpointing",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "31",
        "offload_param",
        "FSDP offload (fsdp_cpu_offload) in a built-in recipe config",
    ),
    (
        "32",
        "micro_batch",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "32",
        "grad_accum",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "32",
        "seq_len",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "32",
        "grad_checkpointing",
        "torchtune built-in recipe config is not a file the command names",
    ),
    (
        "33",
        "zero_stage",
        "value behind a shell variable ($ZERO_STAGE)",
    ),
    (
        "34",
        "seq_len",
        "split prompt/answer lengths (two flags); seq_len is one value",
    ),
    (
        "34",
        "zero_stage",
        "actor/critic stages behind shell variables ($ACTOR_ZERO_STAGE)",
    ),
    (
        "34",
        "offload_param",
        "--offload_reference_model offloads the frozen reference model only",
    ),
    (
        "36",
        "micro_batch",
        "value behind a shell variable ($MICRO_BATCH_SIZE)",
    ),
    (
        "36",
        "grad_accum",
        "derived from --global-batch-size $GLOBAL_BATCH_SIZE (shell variable)",
    ),
    (
        "36",
        "seq_len",
        "value behind a shell variable ($SEQ_LENGTH)",
    ),
    (
        "36",
        "grad_checkpointing",
        "shell variable activation_checkpoint in the script",
    ),
    (
        "36",
        "zero_stage",
        "--zero-stage inside $ds_args (shell variable)",
    ),
    (
        "37",
        "*",
        "the command is a string assigned to run_cmd from shell variables and a sed template; no command line to plan",
    ),
    (
        "47",
        "micro_batch",
        "value behind a shell variable ($BATCH_SIZE_PER_GPU)",
    ),
    (
        "47",
        "grad_accum",
        "value behind a shell variable ($GRADIENT_ACC_STEPS)",
    ),
    (
        "49",
        "grad_accum",
        "derived from global_train_batch_size; llm-foundry computes accumulation",
    ),
    (
        "49",
        "zero_stage",
        "FSDP sharding_strategy labelled as zero_stage",
    ),
    (
        "50",
        "grad_accum",
        "derived, in verl's packaged Hydra config the command does not name",
    ),
    (
        "50",
        "seq_len",
        "verl's packaged Hydra config sft_trainer.yaml is not named by the command",
    ),
    (
        "50",
        "grad_checkpointing",
        "verl's packaged Hydra config is not named by the command",
    ),
    (
        "50",
        "offload_optimizer",
        "FSDP offload in verl's packaged Hydra config",
    ),
    (
        "50",
        "offload_param",
        "FSDP offload in verl's packaged Hydra config",
    ),
    ("51", "grad_accum", "derived from ppo_mini_batch_size"),
    (
        "51",
        "seq_len",
        "split prompt/response lengths (two overrides); seq_len is one value",
    ),
    (
        "51",
        "offload_optimizer",
        "FSDP bool optimizer_offload; the offload knobs are DeepSpeed devices",
    ),
    (
        "51",
        "offload_param",
        "FSDP bool param_offload; the offload knobs are DeepSpeed devices",
    ),
    (
        "52",
        "micro_batch",
        "bare data.batch_size is the global batch in lightning-hydra-template (divided by world size); not guessed",
    ),
    (
        "53",
        "micro_batch",
        "Hydra config group file configs/data/mnist.yaml is not named by the command",
    ),
    (
        "54",
        "micro_batch",
        "list value [2,2] behind an ambiguous --data.batch_size",
    ),
    (
        "54",
        "seq_len",
        "domain analogue data.audio_time_len (list of strings)",
    ),
    (
        "55",
        "*",
        "the saved config logs/NBSS/version_x/config.yaml is not in the fixture; plan stops with exit 2 naming it",
    ),
    (
        "56",
        "*",
        "the command is built in a bash array args=(...) with env defaults; no command line to plan",
    ),
    (
        "57",
        "grad_accum",
        "derived: litgpt computes accumulation from train.global_batch_size",
    ),
    (
        "60",
        "grad_accum",
        "value is a command substitution $(expr 16 / $nproc_per_node)",
    ),
    (
        "60",
        "zero_stage",
        "`--deepspeed zero2` names a preset shipped inside ms-swift",
    ),
    ("60", "offload_optimizer", "preset name `--deepspeed zero2`"),
    ("60", "offload_param", "preset name `--deepspeed zero2`"),
    (
        "61",
        "grad_checkpointing",
        "activation_checkpoint.mode is none|selective|full, not a bool",
    ),
    (
        "61",
        "zero_stage",
        "FSDP data_parallel_shard_degree labelled as zero_stage",
    ),
];

fn exception(case: &str, knob: &str) -> Option<&'static str> {
    EXCEPTIONS
        .iter()
        .find(|(c, k, _)| case.starts_with(c) && (*k == knob || *k == "*"))
        .map(|(_, _, r)| *r)
}

/// Config files of a case, relative to its folder.
fn case_files(dir: &Path) -> Vec<PathBuf> {
    snapshot(dir)
        .into_keys()
        .filter(|p| {
            let n = p.to_string_lossy();
            n != "labels.json" && n != "command.txt"
        })
        .collect()
}

/// Path-like words in a text (split on whitespace, quotes, `#`, `,`, `=`, `:`
/// followed by a space, brackets).
fn path_words(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "\"'#,=[]()".contains(c))
        .map(|w| w.trim_end_matches(':').to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Where to put each config file: every relative path the command, its
/// environment or another config file names it by; else its own relative
/// path (the accelerate default config goes to `$HOME`).
fn placements(dir: &Path, cmd: &ShellCommand, files: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
    let mut refs: Vec<String> = Vec::new();
    for a in &cmd.argv {
        refs.extend(path_words(a));
    }
    for (_, v) in &cmd.env {
        refs.extend(path_words(v));
    }
    for f in files {
        if let Ok(t) = fs::read_to_string(dir.join(f)) {
            refs.extend(path_words(&t));
        }
    }
    let accelerate = cmd.argv.first().map(String::as_str) == Some("accelerate");
    let mut out = Vec::new();
    for f in files {
        let rel = f.to_string_lossy().into_owned();
        let mut dests: Vec<PathBuf> = refs
            .iter()
            .filter(|r| *r == &rel || r.ends_with(&format!("/{rel}")))
            .filter(|r| {
                let p = Path::new(r.as_str());
                p.is_relative()
                    && !p
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
            })
            .map(PathBuf::from)
            .collect();
        dests.sort();
        dests.dedup();
        if dests.is_empty() {
            if accelerate && rel == "default_config.yaml" {
                dests.push(PathBuf::from(
                    "$HOME/.cache/huggingface/accelerate/default_config.yaml",
                ));
            } else {
                dests.push(f.clone());
            }
        }
        for d in dests {
            out.push((f.clone(), d));
        }
    }
    out
}

fn norm(v: &J) -> J {
    match v {
        J::String(s) => {
            let t = s.trim();
            if t.eq_ignore_ascii_case("true") {
                J::Bool(true)
            } else if t.eq_ignore_ascii_case("false") {
                J::Bool(false)
            } else if let Ok(n) = t.parse::<i64>() {
                J::from(n)
            } else {
                J::String(t.to_ascii_lowercase())
            }
        }
        J::Number(n) => n.as_i64().map(J::from).unwrap_or(v.clone()),
        _ => v.clone(),
    }
}

fn as_list(v: &J) -> Vec<J> {
    match v {
        J::Array(a) => a.clone(),
        J::Null => vec![],
        x => vec![x.clone()],
    }
}

const ROLES: &[&str] = &[
    "deepspeed json ",
    "accelerate config ",
    "python config ",
    "config ",
    "file ",
];

/// Is a config binding's key absent from the placed file (so oomguard would add it)?
fn key_absent_in_file(tmp: &Path, home: &Path, path: &str, key: &str) -> bool {
    let p = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        tmp.join(path)
    };
    let p = if p.exists() { p } else { home.join(path) };
    let Ok(text) = fs::read_to_string(&p) else {
        return false;
    };
    if let Ok(json) = serde_json::from_str::<J>(&text) {
        let mut cur = &json;
        for seg in key.split('.') {
            match cur.get(seg) {
                Some(n) => cur = n,
                None => return true,
            }
        }
        return false;
    }
    let leaf = key.rsplit('.').next().unwrap_or(key);
    !text.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with(&format!("{leaf}:")) || l.starts_with(&format!("{leaf} ="))
    })
}

/// Does the found knob describe the labelled place? Returns `Err(why)` if not.
fn compare(label: &J, found: Option<&J>, tmp: &Path, home: &Path) -> Result<(), String> {
    let where_ = label["where"].as_str().unwrap_or("?");
    let keys: Vec<String> = as_list(&label["key"])
        .iter()
        .filter_map(|k| k.as_str().map(String::from))
        .collect();
    let values = as_list(&label["value"]);
    let derived = label["derived"].as_bool() == Some(true) || where_ == "derived";
    let binding = found.and_then(|f| f["binding"].as_str()).unwrap_or("");
    let fval = found.map(|f| norm(&f["value"])).unwrap_or(J::Null);
    let prim = primary(binding);

    if where_ == "absent" {
        return match found {
            None => Ok(()),
            Some(_) if prim.starts_with("absent; would add") => Ok(()),
            Some(_) => {
                // A config key oomguard would add to a file the command names.
                if let Some((head, key)) = prim.rsplit_once(": ")
                    && let Some(role) = ROLES.iter().find(|r| head.starts_with(*r))
                    && key_absent_in_file(tmp, home, &head[role.len()..], key)
                {
                    return Ok(());
                }
                Err(format!("expected absent, found {binding} = {fval}"))
            }
        };
    }
    let Some(_) = found else {
        return Err("not found".into());
    };
    if derived {
        let ok = prim.starts_with("derived:") && keys.iter().any(|k| prim.contains(k.as_str()));
        return if ok {
            Ok(())
        } else {
            Err(format!("found {binding} = {fval}"))
        };
    }
    // Which labelled key the binding names (labels may list several).
    let idx = keys.iter().position(|k| match where_ {
        "cli-flag" => prim == format!("flag {k}"),
        "override" => {
            prim.strip_prefix("override ")
                .and_then(|r| r.strip_suffix('='))
                .map(|r| r.trim_start_matches('+'))
                == Some(k.trim_start_matches('+'))
        }
        "env" => prim == format!("env {k}") || prim.starts_with(&format!("env {k} ")),
        "json" | "yaml" | "toml" | "python-config" => {
            let Some((head, fkey)) = prim.rsplit_once(": ") else {
                return false;
            };
            let Some(role) = ROLES.iter().find(|r| head.starts_with(*r)) else {
                return false;
            };
            let role_ok = match where_ {
                "json" => matches!(*role, "deepspeed json " | "file "),
                "python-config" => matches!(*role, "python config " | "file "),
                _ => true,
            };
            let fpath = &head[role.len()..];
            let lfile = label["file"].as_str().unwrap_or("");
            let name = |p: &str| {
                Path::new(p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            };
            role_ok
                && fkey == k
                && (fpath.ends_with(lfile) || (name(fpath).is_some() && name(fpath) == name(lfile)))
        }
        _ => false,
    });
    let Some(idx) = idx else {
        return Err(format!("found {binding} = {fval}"));
    };
    let want = values
        .get(idx)
        .or(values.first())
        .map(norm)
        .unwrap_or(J::Null);
    // FSDP's CPU offload is labelled as the bool or as `--fsdp`'s words;
    // oomguard shows it as the device it offloads to.
    let want = match &want {
        J::String(s) if s.contains("shard") => {
            J::Bool(s.split_whitespace().any(|w| w == "offload"))
        }
        w => w.clone(),
    };
    let fval = match (&want, &fval) {
        (J::Bool(_), J::String(s)) if s == "cpu" || s == "none" => J::Bool(s == "cpu"),
        _ => fval,
    };
    if want != fval {
        return Err(format!("value: expected {want}, found {fval} at {binding}"));
    }
    Ok(())
}

fn expected_text(label: &J) -> String {
    let mut s = label["where"].as_str().unwrap_or("?").to_string();
    if !label["file"].is_null() {
        s.push_str(&format!(" {}", label["file"].as_str().unwrap_or("")));
    }
    if !label["key"].is_null() {
        s.push_str(&format!(" {}", label["key"]));
    }
    if !label["value"].is_null() {
        s.push_str(&format!(" = {}", label["value"]));
    }
    if label["derived"].as_bool() == Some(true) {
        s.push_str(" (derived)");
    }
    s
}

#[test]
fn fixture_corpus_knobs_found_as_labelled() {
    let root = corpus_commands();
    let mut cases: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("labels.json").is_file())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 61,
        "expected the 61 cases in {}, found {}",
        root.display(),
        cases.len()
    );

    let mut failures: Vec<String> = Vec::new();
    let mut table: Vec<String> = Vec::new();
    let mut details: Vec<String> = Vec::new();
    let mut per_knob: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let (mut n_ok, mut n_all) = (0usize, 0usize);
    let (mut n_ok_present, mut n_present) = (0usize, 0usize);
    let mut used_exceptions: Vec<(String, String)> = Vec::new();
    let mut rungs_with_files = 0usize;

    for dir in &cases {
        let case = dir.file_name().unwrap().to_string_lossy().into_owned();
        let num = &case[..2];
        let labels: J =
            serde_json::from_str(&fs::read_to_string(dir.join("labels.json")).unwrap()).unwrap();
        let text = fs::read_to_string(dir.join("command.txt")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let cmd = split_command(&expand_heredoc_variable(&text).unwrap_or(text));
        let files = case_files(dir);

        let mut plan: Option<J> = None;
        let mut why_none = String::new();
        match &cmd {
            None => why_none = "no command in command.txt".into(),
            Some(cmd) => {
                for (src, dest) in placements(dir, cmd, &files) {
                    let d = match dest.strip_prefix("$HOME") {
                        Ok(rest) => home.path().join(rest),
                        Err(_) => tmp.path().join(&dest),
                    };
                    fs::create_dir_all(d.parent().unwrap()).unwrap();
                    fs::copy(dir.join(&src), &d).unwrap();
                }
                let before = (snapshot(tmp.path()), snapshot(home.path()));
                let p = run_plan(tmp.path(), home.path(), &[], &cmd.argv, &cmd.env);
                let after = (snapshot(tmp.path()), snapshot(home.path()));
                if before != after {
                    failures.push(format!(
                        "{case}: plan changed files in the working or home directory"
                    ));
                }
                if p.code != Some(0) {
                    // The message must name what it is about: a file or flag of the command.
                    let names: Vec<String> = files
                        .iter()
                        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                        .chain(cmd.argv.iter().skip(1).flat_map(|a| path_words(a)))
                        .filter(|n| n.len() > 2)
                        .collect();
                    eprintln!(
                        "{case}: plan exited {:?}; stderr:\n{}",
                        p.code,
                        p.stderr.trim_end()
                    );
                    if !names.iter().any(|n| p.stderr.contains(n.as_str())) {
                        failures.push(format!(
                            "{case}: plan exited {:?} without naming a file or flag of the command: {}",
                            p.code,
                            p.stderr.trim_end()
                        ));
                    }
                    why_none = format!("plan exited {:?}: {}", p.code, p.stderr.trim_end());
                } else if p.json.is_none() {
                    failures.push(format!("{case}: plan --json printed no JSON: {}", p.stdout));
                    why_none = "no JSON".into();
                } else {
                    plan = p.json;
                }
            }
        }

        // Rungs that change files touch only the changed keys.
        if let Some(plan) = &plan {
            let ladder = plan["ladder"].as_array().cloned().unwrap_or_default();
            if let Some(base) = ladder.first() {
                for rung in ladder.iter().skip(1) {
                    if rung["files"].as_array().is_some_and(|f| !f.is_empty()) {
                        rungs_with_files += 1;
                    }
                    failures.extend(check_rung_diff(
                        &case,
                        &plan["knobs"],
                        &base["settings"],
                        rung,
                    ));
                }
            }
        }

        let mut row = format!("{case:<55}");
        for knob in KNOBS {
            let Some(label) = labels["knobs"].get(knob) else {
                row.push_str(&format!(" {:>5}", "-"));
                continue;
            };
            n_all += 1;
            let absent = label["where"] == "absent";
            if !absent {
                n_present += 1;
            }
            let e = per_knob.entry(knob).or_default();
            e.1 += 1;
            let result = match &plan {
                None => Err(why_none.clone()),
                Some(p) => compare(label, p["knobs"].get(knob), tmp.path(), home.path()),
            };
            let cell = match result {
                Ok(()) => {
                    n_ok += 1;
                    if !absent {
                        n_ok_present += 1;
                    }
                    e.0 += 1;
                    if EXCEPTIONS.iter().any(|(c, k, _)| *c == num && *k == knob) {
                        let line = format!(
                            "stale exception {num} {knob}: now found as labelled; take it out of EXCEPTIONS so that losing it fails"
                        );
                        details.push(format!("  {line}"));
                        failures.push(line);
                    }
                    "ok"
                }
                Err(found) => {
                    let line = format!("{case} {knob}: expected {}; {found}", expected_text(label));
                    match exception(num, knob) {
                        Some(reason) => {
                            used_exceptions.push((num.to_string(), knob.to_string()));
                            details.push(format!("  (b) {line}\n        intended: {reason}"));
                            "exc"
                        }
                        None => {
                            details.push(format!("  (a) {line}"));
                            failures.push(line);
                            "MISS"
                        }
                    }
                }
            };
            row.push_str(&format!(" {cell:>5}"));
        }
        table.push(row);
    }

    let mut out = String::new();
    out.push_str(&format!("{:<55}", "case"));
    for k in KNOBS {
        out.push_str(&format!(" {:>5}", &k[..5.min(k.len())]));
    }
    out.push('\n');
    for r in &table {
        out.push_str(r);
        out.push('\n');
    }
    out.push_str("\nper knob (found as labelled / labelled):\n");
    for k in KNOBS {
        let (a, b) = per_knob.get(k).copied().unwrap_or_default();
        out.push_str(&format!("  {k:<20} {a:>3} / {b}\n"));
    }
    out.push_str("\nmismatches ((a) fails the test, (b) is in EXCEPTIONS):\n");
    for d in &details {
        out.push_str(d);
        out.push('\n');
    }
    out.push_str(&format!(
        "\n{n_ok} of {n_all} labelled knob locations found as labelled ({n_ok_present} of {n_present} not labelled absent)\n"
    ));
    out.push_str(&format!(
        "{rungs_with_files} rungs changed a config file (diffs checked: only changed keys); {} exceptions applied\n",
        used_exceptions.len()
    ));
    eprintln!("{out}");
    assert!(
        failures.is_empty(),
        "{} problem(s) not in EXCEPTIONS:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Always-run tests on the project's own config files
// ---------------------------------------------------------------------------

fn plan_in(dir: &Path, extra: &[&str], argv: &[&str]) -> J {
    let home = tempfile::tempdir().unwrap();
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let p = run_plan(dir, home.path(), extra, &argv, &[]);
    assert_eq!(
        p.code,
        Some(0),
        "oomguard plan --json {argv:?} in {}: stderr:\n{}",
        dir.display(),
        p.stderr
    );
    p.json
        .unwrap_or_else(|| panic!("plan --json printed no JSON:\n{}", p.stdout))
}

fn rung<'a>(plan: &'a J, step: &str) -> &'a J {
    plan["ladder"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["step"] == step))
        .unwrap_or_else(|| panic!("no {step} rung in the ladder: {:#}", plan["ladder"]))
}

fn argv_of(r: &J) -> Vec<String> {
    r["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn after<'a>(argv: &'a [String], flag: &str) -> &'a str {
    let i = argv
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} not in {argv:?}"));
    &argv[i + 1]
}

/// The `-`/`+` lines of a rung's diffs, headers left out.
fn changed_lines(r: &J) -> (Vec<String>, Vec<String>) {
    let (mut minus, mut plus) = (Vec::new(), Vec::new());
    for f in r["files"].as_array().unwrap() {
        for l in f["diff"].as_str().unwrap().lines() {
            if l.starts_with("---") || l.starts_with("+++") {
                continue;
            }
            if let Some(x) = l.strip_prefix('-') {
                minus.push(x.trim().to_string());
            } else if let Some(x) = l.strip_prefix('+') {
                plus.push(x.trim().to_string());
            }
        }
    }
    (minus, plus)
}

#[test]
fn deepspeed_json_mirror_follows_the_flag_and_train_batch_size_stays_exact() {
    let tmp = tempfile::tempdir().unwrap();
    // ds_zero3_plain.json (micro 8, accum 2) plus a numeric train_batch_size = 8 × 2 × 2 GPUs.
    let text = fs::read_to_string(own_configs().join("ds_zero3_plain.json")).unwrap();
    let text = text.replacen('{', "{\n  \"train_batch_size\": 32,", 1);
    fs::write(tmp.path().join("ds.json"), &text).unwrap();
    let before = snapshot(tmp.path());
    let plan = plan_in(
        tmp.path(),
        &[],
        &[
            "torchrun",
            "--nproc_per_node=2",
            "train.py",
            "--deepspeed",
            "ds.json",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "2",
            "--output_dir",
            "out",
        ],
    );
    assert_eq!(before, snapshot(tmp.path()), "plan wrote or changed files");
    let micro = &plan["knobs"]["micro_batch"];
    assert_eq!(micro["value"], 8);
    assert_eq!(
        micro["binding"],
        "flag --per_device_train_batch_size (also deepspeed json ds.json: train_micro_batch_size_per_gpu)"
    );
    assert!(
        plan["knobs"]["grad_accum"]["binding"]
            .as_str()
            .unwrap()
            .contains("deepspeed json ds.json: gradient_accumulation_steps"),
        "{:#}",
        plan["knobs"]
    );
    assert_eq!(plan["knobs"]["zero_stage"]["value"], 3);
    assert_eq!(plan["world_size"], 2);
    assert_eq!(plan["global_batch"], 32);

    let r = rung(&plan, "halve_micro_batch");
    assert_eq!(r["settings"]["micro_batch"], 4);
    assert_eq!(r["settings"]["grad_accum"], 4);
    assert_eq!(r["global_batch"], 32);
    let argv = argv_of(r);
    assert_eq!(after(&argv, "--per_device_train_batch_size"), "4");
    assert_eq!(after(&argv, "--gradient_accumulation_steps"), "4");
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{files:#?}");
    let copy = files[0]["copy"].as_str().unwrap();
    assert!(
        after(&argv, "--deepspeed").ends_with(copy),
        "{argv:?} vs {copy}"
    );
    let (minus, plus) = changed_lines(r);
    assert_eq!(
        minus,
        vec![
            "\"train_micro_batch_size_per_gpu\": 8,",
            "\"gradient_accumulation_steps\": 2,"
        ]
    );
    assert_eq!(
        plus,
        vec![
            "\"train_micro_batch_size_per_gpu\": 4,",
            "\"gradient_accumulation_steps\": 4,"
        ]
    );
    // train_batch_size stays 32 = 4 × 4 × 2 on every rung: never rewritten.
    for r in plan["ladder"].as_array().unwrap() {
        assert_eq!(r["global_batch"], 32);
        let (m, p) = changed_lines(r);
        assert!(
            !m.iter()
                .chain(&p)
                .any(|l| l.contains("\"train_batch_size\"")),
            "{}: {m:?} {p:?}",
            r["step"]
        );
    }
}

#[test]
fn accelerate_deepspeed_yaml_zero_stage_is_raised_in_a_copy() {
    let tmp = tempfile::tempdir().unwrap();
    // accelerate_zero3.yaml at stage 2, so raise_zero_stage has a step to take.
    let text = fs::read_to_string(own_configs().join("accelerate_zero3.yaml")).unwrap();
    assert!(text.contains("distributed_type: DEEPSPEED"));
    let text = text.replace("zero_stage: 3", "zero_stage: 2");
    fs::write(tmp.path().join("acc.yaml"), &text).unwrap();
    let before = snapshot(tmp.path());
    let plan = plan_in(
        tmp.path(),
        &["--policy", "keep-micro-batch"],
        &[
            "accelerate",
            "launch",
            "--config_file",
            "acc.yaml",
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--output_dir",
            "out",
        ],
    );
    assert_eq!(before, snapshot(tmp.path()), "plan wrote or changed files");
    assert_eq!(
        plan["knobs"]["zero_stage"]["binding"],
        "accelerate config acc.yaml: deepspeed_config.zero_stage"
    );
    assert_eq!(plan["knobs"]["zero_stage"]["value"], 2);
    assert_eq!(
        plan["world_size"], 4,
        "num_processes: 4 in the accelerate config"
    );
    let r = rung(&plan, "raise_zero_stage");
    assert_eq!(r["settings"]["zero_stage"], 3);
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{files:#?}");
    assert_eq!(files[0]["original"], "acc.yaml");
    let copy = files[0]["copy"].as_str().unwrap();
    assert!(copy.ends_with("acc.yaml") && copy != "acc.yaml", "{copy}");
    let argv = argv_of(r);
    assert!(after(&argv, "--config_file").ends_with(copy), "{argv:?}");
    assert_eq!(
        argv[4..],
        [
            "train.py",
            "--per_device_train_batch_size",
            "8",
            "--output_dir",
            "out"
        ]
    );
    let (minus, plus) = changed_lines(r);
    assert_eq!(
        (minus, plus),
        (
            vec!["zero_stage: 2".to_string()],
            vec!["zero_stage: 3".to_string()]
        )
    );
}

#[test]
fn axolotl_yaml_positional_is_followed() {
    let tmp = tempfile::tempdir().unwrap();
    fs::copy(
        own_configs().join("axolotl_lora.yml"),
        tmp.path().join("x.yml"),
    )
    .unwrap();
    let before = snapshot(tmp.path());
    let plan = plan_in(tmp.path(), &[], &["axolotl", "train", "x.yml"]);
    assert_eq!(before, snapshot(tmp.path()), "plan wrote or changed files");
    let k = &plan["knobs"];
    assert_eq!(
        k["micro_batch"]["binding"],
        "config x.yml: micro_batch_size"
    );
    assert_eq!(k["micro_batch"]["value"], 2);
    assert_eq!(
        k["grad_accum"]["binding"],
        "config x.yml: gradient_accumulation_steps"
    );
    assert_eq!(k["grad_accum"]["value"], 2);
    assert_eq!(k["seq_len"]["binding"], "config x.yml: sequence_len");
    assert_eq!(k["seq_len"]["value"], 2048);
    let r = rung(&plan, "halve_micro_batch");
    let argv = argv_of(r);
    let copy = r["files"][0]["copy"].as_str().unwrap();
    assert_eq!(argv[..2], ["axolotl", "train"]);
    assert!(
        argv[2].ends_with(copy) && copy.ends_with("x.yml"),
        "{argv:?}"
    );
    let (minus, plus) = changed_lines(r);
    assert_eq!(
        minus,
        vec![
            "gradient_accumulation_steps: 2",
            "micro_batch_size: 2  # per GPU"
        ]
    );
    assert_eq!(
        plus,
        vec![
            "gradient_accumulation_steps: 4",
            "micro_batch_size: 1  # per GPU"
        ]
    );
}

#[test]
fn hydra_overrides_are_rewritten_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = plan_in(
        tmp.path(),
        &[],
        &[
            "python",
            "train.py",
            "data.micro_batch_size_per_gpu=8",
            "trainer.accumulate_grad_batches=2",
        ],
    );
    let k = &plan["knobs"];
    assert_eq!(
        k["micro_batch"]["binding"],
        "override data.micro_batch_size_per_gpu="
    );
    assert_eq!(k["micro_batch"]["value"], 8);
    assert_eq!(
        k["grad_accum"]["binding"],
        "override trainer.accumulate_grad_batches="
    );
    assert_eq!(k["grad_accum"]["value"], 2);
    let r = rung(&plan, "halve_micro_batch");
    assert_eq!(
        argv_of(r),
        [
            "python",
            "train.py",
            "data.micro_batch_size_per_gpu=4",
            "trainer.accumulate_grad_batches=4"
        ]
    );
    assert_eq!(r["files"].as_array().map(Vec::len), Some(0));
    assert!(
        fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "plan wrote files"
    );
}
