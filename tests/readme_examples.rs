//! Every example command in the "Where knobs live" table (docs/knobs.md), run as a newcomer
//! runs it: the files it names are laid out in a fresh folder (shaped like the real
//! ones), a complete checkpoint is written where that trainer writes it, and
//! `oomguard plan --json` must show the ladder and resume line the table promises:
//! the checkpoint found where the trainer keeps them, and ignored, since it was
//! there before the run (a relaunch resumes only from checkpoints the run writes).
//!
//! The commands are read from docs/knobs.md itself (the README links there), so a changed example is tested as
//! written, and an example without an entry here (or an entry without an example)
//! fails the test.

mod common;
use common::OOMGUARD;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value as J;

/// What one table example must show.
struct Expect {
    /// Files to write (relative path, content).
    files: &'static [(&'static str, &'static str)],
    /// A complete checkpoint to write (see `checkpoint`), or none.
    checkpoint: Option<Ckpt>,
    /// The step of the ladder's second rung (what the first OOM does).
    first_step: &'static str,
    /// The resume layout's name starts with this (None: no checkpoint layout).
    layout: Option<&'static str>,
    /// Words of how a relaunch is told to resume (plan's `resume.how`: its flag,
    /// its value, `flag=value`). The plan's rungs resume from nothing: the
    /// checkpoint written here was there before the run.
    resume_how: &'static [&'static str],
    /// Arguments the second rung's argv must contain (checks the change lands where the trainer reads it).
    rung2_has: &'static [&'static str],
}

#[derive(Clone, Copy)]
enum Ckpt {
    /// `DIR/checkpoint-5` as the Hugging Face Trainer writes it.
    Hf(&'static str),
    /// torchtune: `DIR/epoch_0` + `DIR/recipe_state/recipe_state.pt`.
    Torchtune(&'static str),
    /// Lightning: `DIR/version_0/checkpoints/last.ckpt`.
    Lightning(&'static str),
    /// nanoGPT: `DIR/ckpt.pt`.
    NanoGpt(&'static str),
    /// LitGPT: `DIR/step-00000100/lit_model.pth`.
    LitGpt(&'static str),
    /// Megatron: `DIR/iter_0000100/mp_rank_00/model_optim_rng.pt` and
    /// `DIR/latest_checkpointed_iteration.txt`.
    Megatron(&'static str),
    /// fairseq: `DIR/checkpoint_1_100.pt` and its copy `DIR/checkpoint_last.pt`.
    Fairseq(&'static str),
    /// A DeepSpeed engine's: `DIR/global_step100/mp_rank_00_model_states.pt` and `DIR/latest`.
    DeepSpeed(&'static str),
}

/// A `torch.save` zip: local header, then the end-of-central-directory record.
fn zip_bytes() -> Vec<u8> {
    let mut v = b"PK\x03\x04 some tensor bytes ".to_vec();
    v.extend_from_slice(b"PK\x05\x06");
    v.extend_from_slice(&[0u8; 18]);
    v
}

/// A safetensors file: header length, JSON header, one tensor's bytes.
fn safetensors() -> Vec<u8> {
    let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(&[0u8; 8]);
    v
}

/// Writes the checkpoint; returns its path relative to the folder.
fn checkpoint(root: &Path, c: Ckpt) -> String {
    match c {
        Ckpt::Hf(dir) => {
            let d = root.join(dir).join("checkpoint-5");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("trainer_state.json"), r#"{"global_step": 5}"#).unwrap();
            fs::write(d.join("model.safetensors"), safetensors()).unwrap();
            format!("{dir}/checkpoint-5")
        }
        Ckpt::Torchtune(dir) => {
            let d = root.join(dir).join("epoch_0");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("adapter_model.safetensors"), b"weights").unwrap();
            let rs = root.join(dir).join("recipe_state");
            fs::create_dir_all(&rs).unwrap();
            fs::write(rs.join("recipe_state.pt"), zip_bytes()).unwrap();
            format!("{dir}/epoch_0")
        }
        Ckpt::Lightning(dir) => {
            let d = root.join(dir).join("version_0/checkpoints");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("last.ckpt"), zip_bytes()).unwrap();
            format!("{dir}/version_0/checkpoints/last.ckpt")
        }
        Ckpt::NanoGpt(dir) => {
            fs::create_dir_all(root.join(dir)).unwrap();
            fs::write(root.join(dir).join("ckpt.pt"), zip_bytes()).unwrap();
            format!("{dir}/ckpt.pt")
        }
        Ckpt::LitGpt(dir) => {
            let d = root.join(dir).join("step-00000100");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("lit_model.pth"), zip_bytes()).unwrap();
            format!("{dir}/step-00000100")
        }
        Ckpt::Megatron(dir) => {
            let d = root.join(dir).join("iter_0000100/mp_rank_00");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model_optim_rng.pt"), zip_bytes()).unwrap();
            fs::write(
                root.join(dir).join("latest_checkpointed_iteration.txt"),
                "100",
            )
            .unwrap();
            format!("{dir}/iter_0000100")
        }
        Ckpt::Fairseq(dir) => {
            let d = root.join(dir);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("checkpoint_1_100.pt"), zip_bytes()).unwrap();
            fs::write(d.join("checkpoint_last.pt"), zip_bytes()).unwrap();
            format!("{dir}/checkpoint_last.pt")
        }
        Ckpt::DeepSpeed(dir) => {
            let d = root.join(dir).join("global_step100");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("mp_rank_00_model_states.pt"), zip_bytes()).unwrap();
            fs::write(root.join(dir).join("latest"), "global_step100").unwrap();
            format!("{dir}/global_step100")
        }
    }
}

const ZERO3_ACCELERATE: &str = "compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  deepspeed_multinode_launcher: standard
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
";

/// torchtune's packaged `recipes/configs/llama3_2/1B_lora_single_device.yaml`, abridged
/// (its output_dir made relative so the test writes inside its own folder).
const TORCHTUNE_1B_LORA: &str =
    "# Config for single device LoRA finetuning in lora_finetune_single_device.py
output_dir: tt-out # /tmp may be deleted by your system. Change it to your preference.

model:
  _component_: torchtune.models.llama3_2.lora_llama3_2_1b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  lora_rank: 64
  lora_alpha: 128

tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Llama-3.2-1B-Instruct/original/tokenizer.model
  max_seq_len: null

checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  output_dir: ${output_dir}
  model_type: LLAMA3_2

# Fine-tuning arguments
batch_size: 4
epochs: 1
max_steps_per_epoch: null
gradient_accumulation_steps: 8  # Use to increase effective batch size
compile: False  # torch.compile the model + loss, True increases speed + decreases memory

# Training env
device: cuda

# Memory management
enable_activation_checkpointing: False  # True reduces memory
enable_activation_offloading: False  # True reduces memory
";

fn expectations() -> BTreeMap<&'static str, Expect> {
    let mut m = BTreeMap::new();
    m.insert(
        "Hugging Face `Trainer`, TRL, plain argparse",
        Expect {
            files: &[],
            checkpoint: Some(Ckpt::Hf("out")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &[],
            rung2_has: &["--gradient_accumulation_steps", "8"],
        },
    );
    m.insert(
        "DeepSpeed JSON",
        Expect {
            files: &[(
                "ds.json",
                r#"{
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "zero_optimization": {"stage": 2, "overlap_comm": true}
}
"#,
            )],
            checkpoint: Some(Ckpt::Hf("out")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &[],
            rung2_has: &["--per_device_train_batch_size", "4"],
        },
    );
    m.insert(
        "accelerate",
        Expect {
            files: &[("zero3.yaml", ZERO3_ACCELERATE)],
            checkpoint: Some(Ckpt::Hf("out")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &[],
            rung2_has: &["--per_device_train_batch_size", "4"],
        },
    );
    m.insert(
        "alignment-handbook / TRL recipes",
        Expect {
            files: &[
                ("zero3.yaml", ZERO3_ACCELERATE),
                (
                    "recipe.yaml",
                    "# Model arguments
model_name_or_path: mistralai/Mistral-7B-v0.1
torch_dtype: bfloat16
# SFT trainer config
bf16: true
gradient_accumulation_steps: 2
gradient_checkpointing: true
learning_rate: 2.0e-05
max_length: 2048
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-full
per_device_train_batch_size: 16
save_strategy: \"steps\"
save_steps: 100
",
                ),
            ],
            checkpoint: Some(Ckpt::Hf("data/zephyr-7b-sft-full")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &[],
            rung2_has: &[],
        },
    );
    m.insert(
        "axolotl",
        Expect {
            files: &[(
                "config.yml",
                "base_model: NousResearch/Llama-3.2-1B
load_in_8bit: true
adapter: lora
sequence_len: 4096
sample_packing: true
output_dir: ./outputs/lora-out
gradient_accumulation_steps: 2
micro_batch_size: 2
num_epochs: 1
gradient_checkpointing: true
",
            )],
            checkpoint: Some(Ckpt::Hf("outputs/lora-out")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &["--resume-from-checkpoint"],
            rung2_has: &[],
        },
    );
    m.insert(
        "LLaMA-Factory",
        Expect {
            files: &[(
                "sft.yaml",
                "### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
### method
stage: sft
do_train: true
finetuning_type: lora
### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
### output
output_dir: saves/llama3-8b/lora/sft
save_steps: 500
### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
",
            )],
            checkpoint: Some(Ckpt::Hf("saves/llama3-8b/lora/sft")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &[],
            rung2_has: &[],
        },
    );
    m.insert(
        "fairseq",
        Expect {
            files: &[],
            // fairseq loads checkpoint_last.pt from --save-dir (default checkpoints)
            // by itself: nothing is added.
            checkpoint: Some(Ckpt::Fairseq("checkpoints")),
            first_step: "halve_micro_batch",
            layout: Some("fairseq"),
            resume_how: &[],
            rung2_has: &["--max-tokens", "2048", "--update-freq", "32"],
        },
    );
    m.insert(
        "torchtune",
        Expect {
            files: &[],
            checkpoint: Some(Ckpt::Torchtune("tt-out")),
            first_step: "halve_micro_batch",
            layout: Some("torchtune"),
            resume_how: &[],
            rung2_has: &["batch_size=2", "gradient_accumulation_steps=16"],
        },
    );
    m.insert(
        "Hydra (verl, lightning-hydra-template)",
        Expect {
            files: &[],
            checkpoint: None,
            first_step: "halve_micro_batch",
            layout: None,
            resume_how: &[],
            rung2_has: &[
                "data.micro_batch_size_per_gpu=2",
                "trainer.accumulate_grad_batches=4",
            ],
        },
    );
    m.insert(
        "Lightning CLI",
        Expect {
            files: &[],
            checkpoint: Some(Ckpt::Lightning("lightning_logs")),
            first_step: "halve_micro_batch",
            layout: Some("lightning"),
            resume_how: &[],
            rung2_has: &[
                "--data.batch_size",
                "4",
                "--trainer.accumulate_grad_batches",
            ],
        },
    );
    m.insert(
        "nanoGPT",
        Expect {
            files: &[(
                "config/train_gpt2.py",
                "# config for training GPT-2 (124M) down to very nice loss of ~2.85 on 1 node of 8X A100 40GB
# launch as the following (e.g. in a screen session) and wait ~5 days:
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

wandb_log = True
wandb_project = 'owt'
wandb_run_name='gpt2-124M'

# these make the total batch size be ~0.5M
# 12 batch size * 1024 block size * 5 gradaccum * 8 GPUs = 491,520
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# this makes total number of tokens be 300B
max_iters = 600000
lr_decay_iters = 600000
",
            )],
            checkpoint: Some(Ckpt::NanoGpt("out")),
            first_step: "halve_micro_batch",
            layout: Some("nanogpt"),
            resume_how: &["--init_from=resume"],
            rung2_has: &["--batch_size=6"],
        },
    );
    m.insert(
        "torchtitan",
        Expect {
            files: &[(
                "llama3_8b.toml",
                "[job]
dump_folder = \"./outputs\"
description = \"Llama 3 8B training\"

[model]
name = \"llama3\"
flavor = \"8B\"

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 1000

[activation_checkpoint]
mode = \"selective\"
",
            )],
            // Results first, and still the sequence: the micro-batch is already 1,
            // and torchtitan binds no accumulation, checkpointing or ZeRO knob, so
            // nothing results-preserving is left.
            checkpoint: None,
            first_step: "shorten_seq",
            layout: None,
            resume_how: &[],
            rung2_has: &[],
        },
    );
    m.insert(
        "Oumi",
        Expect {
            files: &[(
                "train.yaml",
                include_str!("fixtures/configs/oumi_llama3_2_1b_full_train.yaml"),
            )],
            checkpoint: Some(Ckpt::Hf("output/llama1b.fft")),
            first_step: "halve_micro_batch",
            layout: Some("hugging-face"),
            resume_how: &["--training.resume_from_checkpoint"],
            rung2_has: &["--training.per_device_train_batch_size", "4"],
        },
    );
    m.insert(
        "OpenRLHF",
        Expect {
            files: &[],
            checkpoint: Some(Ckpt::DeepSpeed("ckpt/sft")),
            first_step: "halve_micro_batch",
            layout: Some("deepspeed"),
            // A bare switch: OpenRLHF loads the checkpoint `latest` names by itself.
            resume_how: &["--ckpt.load_enable"],
            rung2_has: &["--train.micro_batch_size", "2", "--train.batch_size", "256"],
        },
    );
    m.insert(
        "LitGPT",
        Expect {
            files: &[(
                "pretrain.yaml",
                include_str!("fixtures/configs/litgpt_llama2_7b_lora.yaml"),
            )],
            checkpoint: Some(Ckpt::LitGpt("out/pretrain")),
            first_step: "halve_micro_batch",
            layout: Some("litgpt"),
            // The global batch flag is kept as written; no accumulation key appears.
            resume_how: &["--resume", "auto"],
            rung2_has: &[
                "--train.micro_batch_size",
                "2",
                "--train.global_batch_size",
                "64",
            ],
        },
    );
    m.insert(
        "any YAML / JSON / TOML / Python file the command names",
        Expect {
            files: &[(
                "config.yaml",
                "training:\n  micro_batch_size: 8\n  grad_accum: 2\n  lr: 3.0e-4\n",
            )],
            checkpoint: None,
            first_step: "halve_micro_batch",
            layout: None,
            resume_how: &[],
            rung2_has: &[],
        },
    );
    m.insert(
        "Megatron-LM",
        Expect {
            files: &[(
                "pretrain_gpt.py",
                "from megatron.training import pretrain\n",
            )],
            checkpoint: Some(Ckpt::Megatron("ckpt")),
            first_step: "halve_micro_batch",
            layout: Some("megatron"),
            resume_how: &[],
            rung2_has: &["--micro-batch-size", "2", "--global-batch-size", "256"],
        },
    );
    m.insert(
        "environment",
        Expect {
            files: &[],
            checkpoint: None,
            first_step: "halve_micro_batch",
            layout: None,
            resume_how: &[],
            rung2_has: &[],
        },
    );
    m
}

/// The knob table's file: the README links to it, and the family pages show its commands.
const KNOBS_MD: &str = "docs/knobs.md";

/// (family, command) for each row of the "Where knobs live" table (`docs/knobs.md`).
fn readme_examples() -> Vec<(String, String)> {
    let text =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(KNOBS_MD)).expect(KNOBS_MD);
    let at = text
        .find("# Where knobs live")
        .expect("docs/knobs.md has a 'Where knobs live' heading");
    let section = &text[at..];
    let mut out = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        if cells.len() < 3 {
            continue;
        }
        let family = cells[0].trim_start_matches("| ").trim().to_string();
        let Some(cmd) = cells[1].split('`').nth(1) else {
            continue;
        };
        if cmd.contains("oomguard ") {
            out.push((family, cmd.to_string()));
        }
    }
    out
}

/// The commands a guide page shows: its indented (4 spaces) code lines that run
/// `oomguard` (after `VAR=VALUE` words), with `\` continuations joined.
fn page_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let Some(code) = line.strip_prefix("    ") else {
            continue;
        };
        let code = code.trim();
        let cont = code.ends_with('\\');
        let part = code.trim_end_matches('\\').trim();
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(part);
        if !cont {
            let words: Vec<&str> = cur.split_whitespace().collect();
            let runs = words
                .iter()
                .position(|w| *w == "oomguard")
                .is_some_and(|at| words[..at].iter().all(|w| w.contains('=')));
            if runs {
                out.push(words.join(" "));
            }
            cur.clear();
        }
    }
    out
}

/// Every command a family page of the user guide (`docs/frameworks/*.md`) shows is a
/// row of the knob table, so `every_readme_knob_example_plans_its_ladder_and_resume`
/// plans it with its files and checkpoint; and every row has a page that shows it.
#[test]
fn every_family_page_command_is_a_planned_knob_table_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table: Vec<String> = readme_examples()
        .into_iter()
        .map(|(_, c)| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let mut shown = Vec::new();
    let mut failures = Vec::new();
    let mut pages: Vec<PathBuf> = fs::read_dir(root.join("docs/frameworks"))
        .expect("docs/frameworks")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "only {} family pages", pages.len());
    for page in &pages {
        let text = fs::read_to_string(page).unwrap();
        let cmds = page_commands(&text);
        if cmds.is_empty() && !page.ends_with("README.md") {
            failures.push(format!("{} shows no oomguard command", page.display()));
        }
        for c in cmds {
            if !table.contains(&c) {
                failures.push(format!(
                    "{} shows `{c}`, which is not a row of {KNOBS_MD}'s table (so no test plans it)",
                    page.display()
                ));
            }
            shown.push(c);
        }
    }
    for c in &table {
        if !shown.contains(c) {
            failures.push(format!("no family page shows the table's `{c}`"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A torchtune installed the way pip installs it: `bin/tune` names its Python, and
/// the packaged configs sit in `lib/python3.X/site-packages/recipes/configs`.
fn fake_torchtune_install(root: &Path) -> PathBuf {
    let venv = root.join("venv");
    let bin = venv.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let tune = bin.join("tune");
    fs::write(
        &tune,
        format!(
            "#!{}/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom torchtune._cli.tune import main\nif __name__ == '__main__':\n    sys.exit(main())\n",
            bin.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&tune, fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = venv.join("lib/python3.11/site-packages/recipes/configs/llama3_2");
    fs::create_dir_all(&cfg).unwrap();
    fs::write(cfg.join("1B_lora_single_device.yaml"), TORCHTUNE_1B_LORA).unwrap();
    bin
}

fn strings(v: &J) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_readme_knob_example_plans_its_ladder_and_resume() {
    let examples = readme_examples();
    let mut want = expectations();
    assert!(
        examples.len() >= 15,
        "found only {} examples in docs/knobs.md's table",
        examples.len()
    );
    let mut failures = Vec::new();
    for (family, line) in &examples {
        let Some(exp) = want.remove(family.as_str()) else {
            failures.push(format!(
                "docs/knobs.md example for {family:?} has no expectation in tests/readme_examples.rs"
            ));
            continue;
        };
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        for (rel, text) in exp.files {
            let p = dir.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, text).unwrap();
        }
        let ckpt = exp.checkpoint.map(|c| checkpoint(dir, c));
        let tune_bin = fake_torchtune_install(dir);
        // `VAR=VALUE oomguard ARGS...`
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "oomguard").unwrap();
        let mut cmd = Command::new(OOMGUARD);
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .env("HOME", dir)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    tune_bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .arg("plan")
            .arg("--json")
            .args(&words[at + 1..]);
        for w in &words[..at] {
            let (k, v) = w.split_once('=').unwrap();
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ctx = format!("{family}: `{line}`\nstdout:\n{stdout}\nstderr:\n{stderr}");
        if !out.status.success() {
            failures.push(format!("exit {:?}\n{ctx}", out.status.code()));
            continue;
        }
        let v: J = match serde_json::from_str(&stdout) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("plan --json is not JSON ({e})\n{ctx}"));
                continue;
            }
        };
        let ladder = v["ladder"].as_array().cloned().unwrap_or_default();
        if ladder.len() < 2 {
            failures.push(format!("a one-rung ladder\n{ctx}"));
            continue;
        }
        if ladder[1]["step"] != exp.first_step {
            failures.push(format!(
                "first step {} instead of {}\n{ctx}",
                ladder[1]["step"], exp.first_step
            ));
        }
        // The global batch never changes along the micro-batch rungs.
        let g0 = &ladder[0]["global_batch"];
        for r in ladder.iter().filter(|r| r["step"] == "halve_micro_batch") {
            if r["global_batch"] != *g0 || g0.is_null() {
                failures.push(format!(
                    "global batch {} → {} at {}\n{ctx}",
                    g0, r["global_batch"], r["settings"]
                ));
            }
        }
        let argv = strings(&ladder[1]["argv"]);
        for a in exp.rung2_has {
            if !argv.iter().any(|x| x == a) {
                failures.push(format!("rung 2's argv lacks {a:?}: {argv:?}\n{ctx}"));
            }
        }
        match (exp.layout, ckpt) {
            (None, _) => {
                if !v["resume"].is_null() {
                    failures.push(format!("a resume layout where none was expected\n{ctx}"));
                }
            }
            (Some(layout), Some(rel)) => {
                let got = v["resume"]["layout"].as_str().unwrap_or("");
                if !got.starts_with(layout) {
                    failures.push(format!("layout {got:?}, expected {layout}…\n{ctx}"));
                }
                // Found where the trainer writes it, and ignored: it was there
                // before the run, and a relaunch continues this run.
                if !ignored_names(&v, &rel) {
                    failures.push(format!("{rel} not listed in resume.ignored\n{ctx}"));
                }
                if !v["resume"]["checkpoint"].is_null() {
                    failures.push(format!(
                        "resumes from {}, which was there before the run\n{ctx}",
                        v["resume"]["checkpoint"]
                    ));
                }
                if argv.iter().any(|a| a.contains(&rel)) {
                    failures.push(format!(
                        "rung 2 resumes from {rel}, which was there before the run: {argv:?}\n{ctx}"
                    ));
                }
                let how = &v["resume"]["how"];
                if how.is_null() {
                    failures.push(format!("no resume spelling (resume.how)\n{ctx}"));
                }
                let words = how_words(how);
                for w in exp.resume_how {
                    if !words.iter().any(|x| x == w) {
                        failures.push(format!("resume.how lacks {w:?}: {how}\n{ctx}"));
                    }
                }
            }
            (Some(_), None) => unreachable!("a layout is checked with a checkpoint"),
        }
    }
    for family in want.keys() {
        failures.push(format!(
            "an expectation for {family:?} but no such example in docs/knobs.md's table"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The words of plan's `resume.how`: its flag or key, its value, and
/// `flag=value`.
fn how_words(how: &J) -> Vec<String> {
    let mut w = Vec::new();
    let name = how["flag"].as_str().or(how["key"].as_str());
    if let Some(n) = name {
        w.push(n.to_string());
        if let Some(v) = how["value"].as_str() {
            w.push(v.to_string());
            w.push(format!("{n}={v}"));
        }
    }
    w
}

/// `resume.ignored` in a plan names a path ending with `rel`.
fn ignored_names(v: &J, rel: &str) -> bool {
    v["resume"]["ignored"].as_array().is_some_and(|a| {
        a.iter()
            .any(|s| s["path"].as_str().is_some_and(|p| p.ends_with(rel)))
    })
}

/// The headline command finds the Hugging Face checkpoints under every launcher
/// (a launcher option before `train.py` once made it look like nanoGPT), and a
/// relaunch is told with `--resume_from_checkpoint`; one that was there before
/// the run is ignored.
#[test]
fn headline_command_finds_hf_checkpoints_under_every_launcher() {
    for launcher in [
        "python3",
        "torchrun --nproc_per_node=4",
        "torchrun --nproc_per_node 4",
        "python -m torch.distributed.run --nproc_per_node 4",
        "accelerate launch --num_processes 4",
        "deepspeed --num_gpus 2",
    ] {
        let t = tempfile::tempdir().unwrap();
        let rel = checkpoint(t.path(), Ckpt::Hf("out"));
        let line = format!(
            "{launcher} train.py --per_device_train_batch_size 8 --gradient_accumulation_steps 4 --output_dir out"
        );
        let out = Command::new(OOMGUARD)
            .current_dir(t.path())
            .args(["plan", "--json"])
            .args(line.split_whitespace())
            .output()
            .unwrap();
        let v: J = serde_json::from_slice(&out.stdout).unwrap_or(J::Null);
        assert!(
            v["resume"]["layout"]
                .as_str()
                .unwrap_or("")
                .starts_with("hugging-face")
                && ignored_names(&v, &rel)
                && v["resume"]["checkpoint"].is_null()
                && v["resume"]["how"]["flag"] == "--resume_from_checkpoint",
            "{line}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let argv = strings(&v["ladder"][1]["argv"]);
        assert!(!argv.iter().any(|a| a.contains(&rel)), "{line}: {argv:?}");
    }
}

/// Real nanoGPT under torchrun: the config module's own `out_dir` is where it resumes.
#[test]
fn nanogpt_under_torchrun_reads_out_dir_from_its_config_module() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir_all(t.path().join("config")).unwrap();
    fs::write(
        t.path().join("config/train_shakespeare_char.py"),
        "out_dir = 'out-shakespeare-char'\neval_interval = 250\ngradient_accumulation_steps = 1\nbatch_size = 64\nblock_size = 256 # context of up to 256 previous characters\n",
    )
    .unwrap();
    let rel = checkpoint(t.path(), Ckpt::NanoGpt("out-shakespeare-char"));
    let out = Command::new(OOMGUARD)
        .current_dir(t.path())
        .args([
            "plan",
            "--json",
            "torchrun",
            "--standalone",
            "--nproc_per_node=2",
            "train.py",
            "config/train_shakespeare_char.py",
        ])
        .output()
        .unwrap();
    let v: J = serde_json::from_slice(&out.stdout).unwrap();
    assert!(ignored_names(&v, &rel), "{v}");
}

/// The Lightning CLI example with `--knob` after the command hands it to the
/// script; in front of it, a batch size only in a config file is given its value.
#[test]
fn lightning_flag_absent_from_the_command_is_added_from_its_given_value() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(OOMGUARD)
        .current_dir(t.path())
        .args([
            "plan",
            "--json",
            "--knob",
            "micro_batch=--data.batch_size=8",
            "python",
            "cli.py",
            "fit",
            "--config",
            "config.yaml",
            "--trainer.accumulate_grad_batches",
            "2",
        ])
        .output()
        .unwrap();
    // config.yaml does not exist: --config naming a missing YAML is an error that says so.
    assert_eq!(out.status.code(), Some(2));
    fs::write(t.path().join("config.yaml"), "trainer:\n  max_epochs: 3\n").unwrap();
    let out = Command::new(OOMGUARD)
        .current_dir(t.path())
        .args([
            "plan",
            "--json",
            "--knob",
            "micro_batch=--data.batch_size=8",
            "python",
            "cli.py",
            "fit",
            "--config",
            "config.yaml",
            "--trainer.accumulate_grad_batches",
            "2",
        ])
        .output()
        .unwrap();
    let v: J = serde_json::from_slice(&out.stdout).unwrap_or(J::Null);
    assert_eq!(v["knobs"]["micro_batch"]["value"], 8, "{v}");
    let argv = strings(&v["ladder"][1]["argv"]);
    assert!(
        argv.windows(2).any(|w| w == ["--data.batch_size", "4"]) && argv.contains(&"4".to_string()),
        "{argv:?}"
    );
}

/// LitGPT derives accumulation from its global batch: halving the micro-batch
/// keeps `train.global_batch_size` and writes no accumulation key anywhere.
#[test]
fn litgpt_halving_keeps_the_global_batch_and_writes_no_accumulation_key() {
    let t = tempfile::tempdir().unwrap();
    fs::write(
        t.path().join("lora.yaml"),
        include_str!("fixtures/configs/litgpt_llama2_7b_lora.yaml"),
    )
    .unwrap();
    let out = Command::new(OOMGUARD)
        .current_dir(t.path())
        .args([
            "plan",
            "--json",
            "litgpt",
            "finetune_lora",
            "checkpoints/meta-llama/Llama-2-7b-hf",
            "--config",
            "lora.yaml",
            "--devices",
            "2",
        ])
        .output()
        .unwrap();
    let v: J = serde_json::from_slice(&out.stdout).unwrap_or(J::Null);
    assert_eq!(v["world_size"], 2, "{v}");
    // global_batch_size 8 in the file: accumulation 8 / (2 × 2) = 2.
    assert_eq!(v["knobs"]["grad_accum"]["value"], 2, "{v}");
    let rung = &v["ladder"][1];
    assert_eq!(rung["settings"]["micro_batch"], 1, "{rung}");
    assert_eq!(rung["settings"]["grad_accum"], 4, "{rung}");
    assert_eq!(rung["global_batch"], 8, "{rung}");
    let diff = rung["files"][0]["diff"].as_str().unwrap_or("");
    assert!(diff.contains("+  micro_batch_size: 1"), "{diff}");
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .collect();
    assert_eq!(
        changed.len(),
        1,
        "only the micro-batch line changes: {diff}"
    );
    assert!(!strings(&rung["argv"]).iter().any(|a| a.contains("accum")));
}

/// One setting with different values in a recipe YAML and its DeepSpeed JSON is a
/// warning in `plan` and on every run (not only with -v).
#[test]
fn one_setting_with_two_values_is_a_warning_on_every_run() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    fs::write(
        d.join("recipe.yaml"),
        "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\ndeepspeed: ds.json\noutput_dir: out\n",
    )
    .unwrap();
    fs::write(
        d.join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}"#,
    )
    .unwrap();
    fs::write(d.join("sft.py"), "print('trained')\n").unwrap();
    let plan = Command::new(OOMGUARD)
        .current_dir(d)
        .args([
            "plan",
            "--json",
            "python3",
            "sft.py",
            "--config",
            "recipe.yaml",
        ])
        .output()
        .unwrap();
    let v: J = serde_json::from_slice(&plan.stdout).unwrap_or(J::Null);
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("micro_batch has two values") && warnings.contains("ds.json"),
        "{v}"
    );
    let run = Command::new(OOMGUARD)
        .current_dir(d)
        .args([
            "--run-dir",
            "run",
            "python3",
            "sft.py",
            "--config",
            "recipe.yaml",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains("oomguard: warning: micro_batch has two values"),
        "{err}"
    );
}
