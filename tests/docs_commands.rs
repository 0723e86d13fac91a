//! Every `oomguard` command line the README and the user guide show (README.md and
//! docs/**/*.md: indented and fenced code blocks, `\` continuations joined, a YAML
//! `command:` list read as one command) is run here through the real binary, as
//! written, by bash, in a fresh folder laid out so that it can run on a machine with
//! no GPU: fake GPUs (`OOMGUARD_FAKE_GPUS`), an empty `train.py`, a Llama-2-7B-shaped
//! `m7b/config.json`, a saved log (`crash.log`), the README's demo run (run first, so
//! `status` and `runs` have a finished run to read), and stand-ins for the tools that
//! need a real system around them (`journalctl`, `dmesg`, `man`).
//!
//! A training command (it would train for hours) is planned instead: `oomguard plan
//! --json` in front of the same words, which must exit 0 and find the knobs where
//! the doc's command sets them. A command that needs what this machine does not have
//! (a Slurm cluster, Kubernetes) is in [`ELSEWHERE`] with the test that runs its shape,
//! and its oomguard part is still planned here. Lines of a code block that show
//! output, or the reference's synopsis, are in [`NOT_COMMANDS`].
//!
//! A command line in the docs that none of these covers fails the test, and so does an
//! entry that no longer matches a line of the docs.

mod common;
use common::OOMGUARD;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One command line a doc shows.
#[derive(Debug, Clone)]
struct DocCommand {
    file: String,
    line: usize,
    text: String,
}

/// README.md and every Markdown file under docs/, relative to the repository.
fn doc_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut v = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut v);
    let mut v: Vec<String> = v
        .iter()
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

/// Whether a shell line runs `oomguard`: the word `oomguard` at a command's place (first,
/// after `VAR=VALUE` words, after `&&`, `||`, `|`, `;`, `exec`, `nohup`, `setsid`, or a
/// quote that starts a `bash -c` script). Comments are left out.
fn runs_oomguard(line: &str) -> bool {
    let words: Vec<&str> = line
        .split_whitespace()
        .take_while(|w| !w.starts_with('#'))
        .collect();
    words.iter().enumerate().any(|(i, w)| {
        if w.trim_start_matches(['\'', '"']) != "oomguard" {
            return false;
        }
        if w.starts_with(['\'', '"']) || i == 0 {
            return true;
        }
        let prev = words[i - 1].trim_start_matches(['\'', '"']);
        matches!(prev, "&&" | "||" | "|" | "exec" | "nohup" | "setsid" | "-")
            || prev.ends_with(';')
            || words[..i].iter().all(|w| w.contains('='))
    })
}

/// The command lines of a Markdown text: fenced blocks and indented (4 spaces) lines,
/// `\` continuations joined; in a fenced block, a YAML list item `- oomguard` and the
/// items after it at the same indent are one command (quotes dropped).
fn commands_of(file: &str, text: &str) -> Vec<DocCommand> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut fence = false;
    let mut cur = String::new();
    let mut start = 0;
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if l.trim_start().starts_with("```") {
            fence = !fence;
            cur.clear();
            continue;
        }
        let code = if fence {
            l
        } else if let Some(c) = l.strip_prefix("    ") {
            c
        } else {
            cur.clear();
            continue;
        };
        if fence && code.trim() == "- oomguard" {
            let indent = &code[..code.find('-').unwrap()];
            let mut words = vec!["oomguard".to_string()];
            let line = i;
            while let Some(item) = lines
                .get(i)
                .and_then(|n| n.strip_prefix(indent))
                .and_then(|n| n.strip_prefix("- "))
            {
                words.push(item.trim().trim_matches('"').to_string());
                i += 1;
            }
            out.push(DocCommand {
                file: file.to_string(),
                line,
                text: words.join(" "),
            });
            continue;
        }
        let code = code.trim();
        if cur.is_empty() {
            start = i;
        } else {
            cur.push(' ');
        }
        let cont = code.ends_with('\\');
        cur.push_str(code.trim_end_matches('\\').trim());
        if !cont {
            if runs_oomguard(&cur) {
                out.push(DocCommand {
                    file: file.to_string(),
                    line: start,
                    text: cur.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
            cur.clear();
        }
    }
    out
}

fn doc_commands() -> Vec<DocCommand> {
    doc_files()
        .iter()
        .flat_map(|f| commands_of(f, &fs::read_to_string(root().join(f)).unwrap()))
        .collect()
}

/// What is done with a command, matched by its file and the start of its text.
enum How {
    /// Run as written; exit 0, and its output (stdout and stderr) holds each string.
    Run(&'static [&'static str]),
    /// The same, from the repository's root (it reads the project's own files).
    RunInRepo(&'static [&'static str]),
    /// Run as written: exit 0, and its output holds, as it is, the fenced block that
    /// follows the command in the doc (the output the doc shows).
    RunShowsNextBlock,
    /// `oomguard plan --json` in front of the command's words (it would train): exit 0,
    /// each `(knob, binding)` found, the world size (unless 0), and each `(variable,
    /// value)` in the environment it adds.
    Plan(Knobs, u64, Knobs),
}

type Knobs = &'static [(&'static str, &'static str)];

const HF_KNOBS: Knobs = &[
    ("micro_batch", "flag --per_device_train_batch_size"),
    ("grad_accum", "flag --gradient_accumulation_steps"),
];

/// Commands run here: (file, the command's start, how).
const RUN: &[(&str, &str, How)] = &[
    (
        "README.md",
        "demo=$(mktemp -d) && oomguard python3 examples/sim_trainer.py",
        How::Run(&[
            "oomguard: finished after 3 attempts",
            "micro_batch  16      4",
            "oomguard: to rerun at the settings that fit: python3 examples/sim_trainer.py --per_device_train_batch_size 4 --gradient_accumulation_steps 8",
        ]),
    ),
    (
        "README.md",
        "oomguard torchrun --nproc_per_node=4 train.py",
        How::Plan(
            &[
                ("micro_batch", "flag --per_device_train_batch_size"),
                ("grad_accum", "flag --gradient_accumulation_steps"),
                ("seq_len", "flag --max_seq_length"),
            ],
            4,
            &[],
        ),
    ),
    (
        "README.md",
        "oomguard plan torchrun --nproc_per_node 4 train.py",
        How::Run(&[
            "oomguard plan: nothing is run",
            "micro_batch         8       flag --per_device_train_batch_size",
            "grad_accum          4       flag --gradient_accumulation_steps",
        ]),
    ),
    (
        "docs/diagnose.md",
        "oomguard diagnose crash.log",
        How::Run(&["cuda_oom"]),
    ),
    (
        "docs/diagnose.md",
        "journalctl -u train | oomguard diagnose --json",
        How::Run(&["\"kind\":\"cuda_oom\""]),
    ),
    (
        "docs/diagnose.md",
        "dmesg > dmesg.txt; oomguard diagnose --kernel-log dmesg.txt crash.log",
        How::Run(&["cuda_oom"]),
    ),
    (
        "docs/install.md",
        "mkdir -p ~/.local/share/bash-completion/completions && oomguard completions bash",
        How::Run(&[]),
    ),
    (
        "docs/install.md",
        "mkdir -p ~/.zfunc && oomguard completions zsh",
        How::Run(&[]),
    ),
    (
        "docs/install.md",
        "mkdir -p ~/.config/fish/completions && oomguard completions fish",
        How::Run(&[]),
    ),
    (
        "docs/install.md",
        "mkdir -p ~/.local/share/man/man1 && oomguard man",
        How::Run(&["man: oomguard(1)"]),
    ),
    (
        "docs/internals/detection.md",
        "oomguard diagnose --score tests/fixtures/corpus/logs tests/fixtures/logs",
        How::RunInRepo(&["GPU OOM", "host OOM", "precision"]),
    ),
    (
        "docs/shared-servers.md",
        "oomguard gpus",
        How::Run(&["Fake H100", "alice"]),
    ),
    (
        "docs/shared-servers.md",
        "oomguard --gpus auto:2 --wait-for-memory auto torchrun --nproc_per_node gpu train.py ...",
        // GPU 0 is alice's: the two free ones are picked, and torchrun's `gpu` is 2.
        How::Plan(&[], 2, &[("CUDA_VISIBLE_DEVICES", "1,2")]),
    ),
    (
        "docs/sizing.md",
        "oomguard estimate --gpu-memory 80 torchrun --nproc_per_node 4 train.py --model_name_or_path m7b",
        How::RunShowsNextBlock,
    ),
    (
        "docs/watching.md",
        "oomguard status #",
        How::Run(&["oomguard run .oomguard/runs/", "finished"]),
    ),
    (
        "docs/watching.md",
        "oomguard status -f",
        How::Run(&["oomguard run .oomguard/runs/", "finished"]),
    ),
    (
        "docs/watching.md",
        "oomguard status --json RUN_DIR",
        How::Run(&["\"state\""]),
    ),
    (
        "docs/watching.md",
        "oomguard runs",
        How::Run(&["finished  3 attempts"]),
    ),
];

/// Commands this machine cannot run as written: (file, the command's start, the test
/// that runs their shape, why; the environment the command would have, and the knobs
/// and world size `oomguard plan` must find in its oomguard part).
#[allow(clippy::type_complexity)]
const ELSEWHERE: &[(&str, &str, &str, &str, Knobs, Knobs, u64)] = &[
    (
        "docs/clusters.md",
        "oomguard srun torchrun --nnodes 2 --nproc_per_node 4",
        "tests/slurm.rs::slurm_one_rank_ooms_and_both_relaunch_on_the_same_settings",
        "a line of a Slurm batch script: needs a Slurm cluster (srun)",
        &[
            ("SLURM_JOB_ID", "17"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NTASKS_PER_NODE", "1"),
        ],
        HF_KNOBS,
        8,
    ),
    (
        "docs/clusters.md",
        "srun bash -c 'exec oomguard torchrun --nnodes 2 --node_rank $SLURM_NODEID",
        "tests/slurm.rs::slurm_one_oomguard_per_node_around_torchrun",
        "a line of a Slurm batch script: needs a Slurm cluster (srun), one oomguard per node",
        &[
            ("SLURM_JOB_ID", "17"),
            ("SLURM_NODEID", "0"),
            ("MASTER", "node0"),
        ],
        HF_KNOBS,
        8,
    ),
    (
        "docs/clusters.md",
        "oomguard --grace 30 torchrun train.py",
        "tests/kubernetes.rs::a_restarted_pod_starts_at_the_settings_the_job_decided",
        "a PyTorchJob manifest's container command: needs Kubernetes and its training operator",
        &[
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", "0"),
            ("PET_NPROC_PER_NODE", "4"),
            ("OOMGUARD_JOB_NAME", "llama-ft"),
        ],
        HF_KNOBS,
        8,
    ),
];

/// Lines of code blocks that name `oomguard` at a command's place but are not commands:
/// (file, the line's start, what it is).
const NOT_COMMANDS: &[(&str, &str, &str)] = &[
    (
        "docs/reference.md",
        "oomguard ",
        "the synopsis (placeholders in brackets); docs.rs::every_cli_option_and_subcommand_is_in_the_reference checks it against --help, and each subcommand runs above",
    ),
    (
        "docs/watching.md",
        "oomguard run .oomguard/runs/20261121-073155",
        "the first line of `oomguard status`'s output",
    ),
    (
        "docs/watching.md",
        "state running: attempt 2 of at most 8",
        "a line of `oomguard status`'s output",
    ),
];

/// The knob table's rows (docs/knobs.md): the family pages show them, and
/// tests/readme_examples.rs::every_readme_knob_example_plans_its_ladder_and_resume plans
/// each with its files and a checkpoint.
fn knob_table_rows() -> Vec<String> {
    let text = fs::read_to_string(root().join("docs/knobs.md")).unwrap();
    let at = text.find("# Where knobs live").expect("knob table heading");
    text[at..]
        .lines()
        .filter(|l| l.starts_with("| "))
        .filter_map(|l| l.split(" | ").nth(1)?.split('`').nth(1).map(str::to_string))
        .filter(|c| c.contains("oomguard "))
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The folder a command runs in, and the environment it runs with.
struct Place {
    dir: tempfile::TempDir,
}

const LLAMA2_7B: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
 "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
 "max_position_embeddings": 4096, "hidden_act": "silu", "torch_dtype": "float16"}"#;

const FAKE_GPUS: &str = r#"{ "snapshots": [ { "at_s": 0, "gpus": [
  { "index": 0, "name": "Fake H100 80GB HBM3", "total_gib": 80, "util_percent": 97,
    "processes": [ { "pid": 4242, "used_gib": 70.5, "user": "alice" } ] },
  { "index": 1, "name": "Fake H100 80GB HBM3", "total_gib": 80, "used_gib": 0.5 },
  { "index": 2, "name": "Fake H100 80GB HBM3", "total_gib": 80, "used_gib": 0.5 },
  { "index": 3, "name": "Fake H100 80GB HBM3", "total_gib": 80, "used_gib": 0.5 } ] } ] }"#;

/// The kernel's record of an OOM kill of another process (so the log's GPU OOM stands).
const DMESG: &str =
    "[ 812.2] Out of memory: Killed process 4444 (Xorg) total-vm:1kB, anon-rss:1kB\n";

fn write_exe(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

impl Place {
    fn new() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["bin", "tmp", "examples", "m7b"] {
            fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(OOMGUARD, d.join("bin/oomguard")).unwrap();
        fs::copy(
            root().join("examples/sim_trainer.py"),
            d.join("examples/sim_trainer.py"),
        )
        .unwrap();
        fs::write(d.join("train.py"), "").unwrap();
        fs::write(d.join("m7b/config.json"), LLAMA2_7B).unwrap();
        fs::write(
            d.join("ds.json"),
            r#"{"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}}"#,
        )
        .unwrap();
        fs::write(d.join("gpus.json"), FAKE_GPUS).unwrap();
        fs::copy(
            root().join("tests/fixtures/logs/own-gpu_wrapped_new.log"),
            d.join("crash.log"),
        )
        .unwrap();
        // Stand-ins for the system's tools: journalctl gives the saved log, dmesg a
        // kernel record, man checks that the page is where man looks and is roff.
        write_exe(
            &d.join("bin/journalctl"),
            "#!/bin/sh\ncat \"$HOME/crash.log\"\n",
        );
        write_exe(
            &d.join("bin/dmesg"),
            &format!("#!/bin/sh\nprintf '%s' '{DMESG}'\n"),
        );
        write_exe(
            &d.join("bin/man"),
            "#!/bin/sh\nhead -c 4 \"$HOME/.local/share/man/man1/$1.1\" | grep -q '^\\.' && echo \"man: $1(1)\"\n",
        );
        Place { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `bash -c LINE` in `cwd` with this place's environment and `env`.
    fn bash(&self, cwd: &Path, line: &str, env: &[(&str, &str)]) -> (bool, String, String) {
        let d = self.path();
        let path = format!(
            "{}:{}",
            d.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(line)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", path)
            .env("HOME", d)
            .env("TMPDIR", d.join("tmp"))
            .env("LANG", "C.UTF-8")
            .env("OOMGUARD_FAKE_GPUS", d.join("gpus.json"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `oomguard plan --json` in front of the words after the line's `oomguard`: exit 0,
    /// the knobs found, and the world size when `world` is not 0.
    fn plan(
        &self,
        c: &DocCommand,
        env: Knobs,
        knobs: Knobs,
        world: u64,
        adds: Knobs,
    ) -> Result<(), String> {
        let at = c.text.find("oomguard ").unwrap();
        let line = format!(
            "oomguard plan --json {}",
            c.text[at + "oomguard ".len()..].trim_end_matches('\'')
        );
        let (ok, stdout, stderr) = self.bash(self.path(), &line, env);
        let why = format!("`{line}` ({}:{}):\n{stdout}\n{stderr}", c.file, c.line);
        if !ok {
            return Err(format!("failed: {why}"));
        }
        let v: Value = serde_json::from_str(&stdout).map_err(|e| format!("{e}: {why}"))?;
        for (knob, binding) in knobs {
            if v["knobs"][knob]["binding"] != *binding {
                return Err(format!("{knob} is not `{binding}`: {why}"));
            }
        }
        if world != 0 && v["world_size"] != world {
            return Err(format!("world size is not {world}: {why}"));
        }
        for (var, value) in adds {
            if v["env"][var] != *value {
                return Err(format!("the environment has no {var}={value}: {why}"));
            }
        }
        Ok(())
    }

    /// The newest run folder under .oomguard/runs here.
    fn newest_run(&self) -> Option<String> {
        let mut runs: Vec<String> = fs::read_dir(self.path().join(".oomguard/runs"))
            .ok()?
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        runs.sort();
        runs.pop().map(|r| format!(".oomguard/runs/{r}"))
    }
}

/// The fenced block after a command's line in its doc, without its fences.
fn next_fenced_block(c: &DocCommand) -> String {
    let text = fs::read_to_string(root().join(&c.file)).unwrap();
    let mut block = text
        .lines()
        .skip(c.line)
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    block.push('\n');
    block
}

fn run_one(place: &Place, c: &DocCommand, how: &How) -> Result<(), String> {
    let block: String;
    let shown: [&str; 1];
    let (cwd, expect): (&Path, &[&str]) = match how {
        How::Plan(knobs, world, adds) => return place.plan(c, &[], knobs, *world, adds),
        How::Run(e) => (place.path(), *e),
        How::RunInRepo(e) => (root(), *e),
        How::RunShowsNextBlock => {
            block = next_fenced_block(c);
            shown = [block.as_str()];
            (place.path(), &shown[..])
        }
    };
    let mut line = c.text.clone();
    if line.contains(" RUN_DIR") {
        let run = place
            .newest_run()
            .ok_or("no run folder for RUN_DIR: the README's demo did not run")?;
        line = line.replace(" RUN_DIR", &format!(" {run}"));
    }
    let (ok, stdout, stderr) = place.bash(cwd, &line, &[]);
    let why = format!("`{line}` ({}:{}):\n{stdout}\n{stderr}", c.file, c.line);
    if !ok {
        return Err(format!("failed: {why}"));
    }
    let all = format!("{stdout}{stderr}");
    for e in expect {
        if !all.contains(e) {
            return Err(format!("no `{e}` in the output of {why}"));
        }
    }
    Ok(())
}

#[test]
fn every_command_in_the_readme_and_the_guide_runs() {
    let commands = doc_commands();
    assert!(
        commands.len() >= 30,
        "only {} commands found in the docs",
        commands.len()
    );
    let table = knob_table_rows();
    let place = Place::new();
    let mut failures = Vec::new();
    let mut used = vec![false; RUN.len() + ELSEWHERE.len() + NOT_COMMANDS.len()];
    let (mut ran, mut planned, mut elsewhere, mut rows) = (0, 0, 0, 0);
    // The README's demo first: `status` and `runs` read the run it leaves.
    let mut order: Vec<&DocCommand> = commands.iter().collect();
    order.sort_by_key(|c| !c.text.contains("examples/sim_trainer.py"));
    for c in order {
        let is = |file: &str, start: &str| c.file == file && c.text.starts_with(start);
        if let Some(i) = RUN.iter().position(|(f, s, _)| is(f, s)) {
            used[i] = true;
            match &RUN[i].2 {
                How::Plan(..) => planned += 1,
                _ => ran += 1,
            }
            if let Err(e) = run_one(&place, c, &RUN[i].2) {
                failures.push(e);
            }
        } else if let Some(i) = ELSEWHERE.iter().position(|e| is(e.0, e.1)) {
            used[RUN.len() + i] = true;
            elsewhere += 1;
            let (_, _, _, _, env, knobs, world) = ELSEWHERE[i];
            if let Err(e) = place.plan(c, env, knobs, world, &[]) {
                failures.push(e);
            }
        } else if let Some(i) = NOT_COMMANDS.iter().position(|(f, s, _)| is(f, s)) {
            used[RUN.len() + ELSEWHERE.len() + i] = true;
        } else if c.file.starts_with("docs/frameworks/") && table.contains(&c.text) {
            // Planned with its files and a checkpoint by tests/readme_examples.rs.
            rows += 1;
        } else {
            failures.push(format!(
                "{}:{}: `{}` is neither run by tests/docs_commands.rs nor listed there",
                c.file, c.line, c.text
            ));
        }
    }
    let entries = RUN
        .iter()
        .map(|(f, s, _)| (*f, *s))
        .chain(ELSEWHERE.iter().map(|e| (e.0, e.1)))
        .chain(NOT_COMMANDS.iter().map(|(f, s, _)| (*f, *s)));
    for ((f, s), u) in entries.zip(&used) {
        if !u {
            failures.push(format!("no command in {f} starts with `{s}` any more"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!(
        "{ran} commands run, {planned} planned, {elsewhere} run elsewhere (planned here), \
         {rows} knob-table rows planned by tests/readme_examples.rs"
    );
}

/// The extraction itself: continuations joined, output and comments not taken for
/// commands, a YAML command list read as one command.
#[test]
fn commands_are_read_from_code_blocks_as_a_shell_would() {
    let text = "Run:\n\n    oomguard plan torchrun \\\n        train.py --x 1\n    oomguard: finished\n    a=1 oomguard gpus  # oomguard run\n\nnot code: oomguard gpus\n\n```yaml\n    command:\n      - oomguard\n      - --grace\n      - \"30\"\n      - python\n    env:\n```\n\n    srun bash -c 'exec oomguard python t.py'\n    echo hi # oomguard x\n";
    let got: Vec<String> = commands_of("x.md", text)
        .into_iter()
        .map(|c| c.text)
        .collect();
    assert_eq!(
        got,
        [
            "oomguard plan torchrun train.py --x 1",
            "a=1 oomguard gpus # oomguard run",
            "oomguard --grace 30 python",
            "srun bash -c 'exec oomguard python t.py'",
        ]
    );
}
