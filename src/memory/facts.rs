//! What the run will hold, read from the run's own facts: the command's flags
//! and overrides and the content of the config files it names (recipes,
//! `--fsdp_config`, accelerate's `--config_file`) — keys and their values,
//! never a file's name. A recipe called `qlora-free.yml` says nothing; its
//! `adapter: lora` line does.
//!
//! Read here: the weights' dtype (`--torch_dtype`, `--dtype`, a recipe's
//! `torch_dtype:`/`dtype:`, `model_kwargs`, axolotl's `bf16: full` and
//! `bf16: true`, LLaMA-Factory's `pure_bf16`, torchtune's bf16 default), the
//! optimizer, PEFT (`adapter:`, `finetuning_type:`, `--use_peft`, `lora_r`,
//! target modules, `load_in_4bit`, `quantization_bit`, torchtune's `lora_*`
//! components) and FSDP (see [`super::shard`]).

use std::path::Path;

use super::dtype::Dtype;
use super::optim::Optimizer;
use super::peft::{Peft, Targets, default_targets};
use super::shard::Fsdp;
use crate::command::Command;

/// One key and its value, with where it was read.
#[derive(Debug, Clone)]
pub struct Pair {
    /// Dotted path, lower case (`model_kwargs.torch_dtype`, `fsdp_config.fsdp_offload_params`).
    pub key: String,
    pub value: String,
    /// `--torch_dtype` or `train.yml`.
    pub from: String,
}

impl Pair {
    fn last(&self) -> &str {
        self.key.rsplit('.').next().unwrap_or(&self.key)
    }
    fn said(&self) -> String {
        if self.from.starts_with("--") {
            format!("{} {}", self.from, self.value)
        } else {
            format!("{}: {} in {}", self.key, self.value, self.from)
        }
    }
}

/// The facts read, each with where it was read.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub dtype: Option<(Dtype, String)>,
    pub optimizer: Option<(Optimizer, String)>,
    pub peft: Option<Peft>,
    /// How the frozen base of a PEFT run is held (4-bit, 8-bit), when quantized.
    pub quant: Option<(Dtype, String)>,
    pub fsdp: Option<Fsdp>,
    /// `--torch_dtype auto` (or a recipe's `dtype: auto`), as said: the
    /// checkpoint's own dtype (config.json's), settled by [`settle_dtype`].
    pub dtype_auto: Option<String>,
    /// Who loads the weights: what dtype they take when none is given.
    pub loader: Loader,
    /// Mixed precision said to be off (`--bf16 false` with no `--fp16`,
    /// accelerate's `mixed_precision: no`, Lightning's `precision: 32`), as said:
    /// the activations are held in the weights' dtype, fp32's with fp32 weights.
    /// `None` when nothing says so, or something turns it on.
    pub no_mixed_precision: Option<String>,
}

/// Who calls `from_pretrained`, and so the dtype it loads the weights in when
/// the run names none (see [`settle_dtype`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Loader {
    /// A script calling `from_pretrained` itself (HF Trainer, `run_clm.py`):
    /// transformers 5 loads config.json's dtype (`dtype="auto"` is its
    /// default), transformers 4 loads fp32.
    #[default]
    FromPretrained,
    /// TRL's scripts and `SFTTrainer`: fp32 unless `--dtype` / `model_init_kwargs`.
    Trl,
    /// axolotl: bf16 or fp16 when the recipe says so, else fp32.
    Axolotl,
    /// LLaMA-Factory: the compute dtype (config.json's bf16, else fp16), with
    /// a full fine-tune's trainable parameters upcast to fp32.
    LlamaFactory,
    /// torchtune: bf16 (read as a fact already).
    Torchtune,
}

/// Whether the run's mixed precision is said to be off, from its `bf16`, `fp16`,
/// `mixed_precision` and `precision` keys: every one of them said, and each says off
/// (`--bf16 false`, `mixed_precision: no`, `precision: 32-true`). The first that
/// said so, as said.
fn no_mixed_precision(said: &[&Pair]) -> Option<String> {
    let off = |p: &Pair| {
        let v = p
            .value
            .trim()
            .trim_matches(['"', '\''])
            .to_ascii_lowercase();
        match p.last() {
            "mixed_precision" => v == "no",
            "precision" => matches!(v.as_str(), "32" | "32-true" | "64" | "64-true"),
            _ => matches!(v.as_str(), "false" | "0" | "no" | "off"),
        }
    };
    // A key said twice (`--bf16 true ... --bf16 false`): the last one counts. A
    // DeepSpeed config's `bf16.enabled` and `fp16.enabled` are two keys.
    let name = |p: &Pair| {
        if p.last() == "enabled" {
            p.key.clone()
        } else {
            p.last().to_string()
        }
    };
    let lasts: Vec<&Pair> = said
        .iter()
        .enumerate()
        .filter(|(i, p)| !said[i + 1..].iter().any(|q| name(q) == name(p)))
        .map(|(_, p)| *p)
        .collect();
    (!lasts.is_empty() && lasts.iter().all(|p| off(p))).then(|| lasts[0].said())
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim()
            .trim_matches(['"', '\''])
            .to_ascii_lowercase()
            .as_str(),
        "true" | "1" | "yes" | "on"
    )
}

/// Every key and value of the command: flags (without dashes), overrides.
pub fn command_pairs(cmd: &Command) -> Vec<Pair> {
    let mut out = Vec::new();
    for f in &cmd.flags {
        let key = f
            .name
            .trim_start_matches('-')
            .replace('-', "_")
            .to_ascii_lowercase();
        let mut value = f.value.clone().unwrap_or_else(|| "true".into());
        // Lists after a flag (`--lora_target_modules q_proj v_proj`).
        if matches!(
            key.as_str(),
            "lora_target_modules" | "target_modules" | "lora_target" | "fsdp"
        ) {
            let mut i = f.index + if f.value.is_some() { 2 } else { 1 };
            while let Some(a) = cmd.args.get(i).filter(|a| !a.starts_with('-')) {
                if matches!(f.form, crate::command::FlagForm::Equals) {
                    break;
                }
                value.push(' ');
                value.push_str(a);
                i += 1;
            }
        }
        out.push(Pair {
            key,
            value,
            from: f.name.clone(),
        });
    }
    for o in &cmd.overrides {
        out.push(Pair {
            key: o.key.to_ascii_lowercase(),
            value: o.value.clone(),
            from: format!("{}{}", o.prefix, o.key),
        });
    }
    out
}

/// Every key and value of a config file's text: JSON, TOML or YAML, told by
/// the content. Lists give one pair per item.
pub fn text_pairs(text: &str, from: &str) -> Vec<Pair> {
    let mut out = Vec::new();
    let t = text.trim_start();
    if t.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(t) {
            json_pairs(&v, String::new(), from, &mut out);
        }
        return out;
    }
    let toml_like = text.lines().any(|l| {
        let l = l.trim();
        l.starts_with('[') && l.ends_with(']') && !l.contains(',') && l.len() > 2
    });
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut section = String::new();
    for raw in text.lines() {
        let line = strip_comment(raw);
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let c = line.trim();
        if toml_like {
            if c.starts_with('[') && c.ends_with(']') {
                section = c.trim_matches(['[', ']']).to_ascii_lowercase();
                continue;
            }
            if let Some((k, v)) = c.split_once('=') {
                let k = k.trim().trim_matches('"').to_ascii_lowercase();
                let key = if section.is_empty() {
                    k
                } else {
                    format!("{section}.{k}")
                };
                push_value(&mut out, key, v.trim(), from);
            }
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i > indent) {
            stack.pop();
        }
        let path = |stack: &[(usize, String)]| {
            stack
                .iter()
                .map(|(_, k)| k.as_str())
                .collect::<Vec<_>>()
                .join(".")
        };
        if let Some(item) = c.strip_prefix("- ").or_else(|| (c == "-").then_some("")) {
            // A list item belongs to the last key at this indentation or less.
            while stack.last().is_some_and(|(i, _)| *i > indent) {
                stack.pop();
            }
            let base = path(&stack);
            match item.split_once(": ") {
                Some((k, v)) => push_value(&mut out, join(&base, k), v, from),
                None => push_value(&mut out, base, item, from),
            }
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let (k, v) = match c.split_once(": ") {
            Some((k, v)) => (k, v.trim()),
            None => match c.strip_suffix(':') {
                Some(k) => (k, ""),
                None => continue,
            },
        };
        let k = k.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
        if v.is_empty() || v == "|" || v == ">" {
            stack.push((indent, k));
        } else if v.starts_with('{') {
            // An inline map: `model_kwargs: {torch_dtype: bfloat16}`.
            let base = join(&path(&stack), &k);
            for part in v.trim_matches(['{', '}']).split(',') {
                if let Some((ik, iv)) = part.split_once(':') {
                    push_value(&mut out, join(&base, ik.trim()), iv.trim(), from);
                }
            }
        } else {
            push_value(&mut out, join(&path(&stack), &k), v, from);
        }
    }
    out
}

fn join(base: &str, k: &str) -> String {
    let k = k.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
    if base.is_empty() {
        k
    } else {
        format!("{base}.{k}")
    }
}

fn strip_comment(l: &str) -> &str {
    if l.trim_start().starts_with('#') {
        return "";
    }
    match l.find(" #") {
        Some(i) => &l[..i],
        None => l,
    }
}

/// A scalar, or each item of an inline list `[a, b]`.
fn push_value(out: &mut Vec<Pair>, key: String, v: &str, from: &str) {
    let v = v.trim();
    let items: Vec<&str> = if v.starts_with('[') && v.ends_with(']') {
        v.trim_matches(['[', ']']).split(',').collect()
    } else {
        vec![v]
    };
    for i in items {
        let i = i.trim().trim_matches(['"', '\'']);
        if !i.is_empty() {
            out.push(Pair {
                key: key.clone(),
                value: i.to_string(),
                from: from.to_string(),
            });
        }
    }
}

fn json_pairs(v: &serde_json::Value, path: String, from: &str, out: &mut Vec<Pair>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                json_pairs(v, join(&path, k), from, out);
            }
        }
        serde_json::Value::Array(a) => {
            for v in a {
                json_pairs(v, path.clone(), from, out);
            }
        }
        serde_json::Value::String(s) => push_value(out, path, s, from),
        other => push_value(out, path, &other.to_string(), from),
    }
}

/// The config files a command points at beyond its recipe: `--fsdp_config`,
/// accelerate's `--config_file` (or its default config under `accelerate launch`).
pub fn side_files(cmd: &Command, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out: Vec<String> = ["--fsdp_config", "--config_file", "--deepspeed_config_file"]
        .iter()
        .filter_map(|f| cmd.value(&[f]))
        .filter(|v| !v.trim_start().starts_with('{'))
        .map(str::to_string)
        .collect();
    let accelerate = cmd
        .args
        .iter()
        .take(cmd.args_start().max(1))
        .any(|a| crate::command::base_name(a) == "accelerate");
    if accelerate && cmd.value(&["--config_file"]).is_none() {
        let home =
            env("HF_HOME").or_else(|| env("HOME").map(|h| format!("{h}/.cache/huggingface")));
        if let Some(h) = home {
            out.push(format!("{h}/accelerate/default_config.yaml"));
        }
    }
    out
}

/// Read the facts from the command and the texts of its config files
/// (`(shown name, text)`).
pub fn read(cmd: &Command, files: &[(String, String)]) -> Facts {
    let mut pairs = command_pairs(cmd);
    // A JSON given inline to --fsdp_config.
    if let Some(v) = cmd
        .value(&["--fsdp_config"])
        .filter(|v| v.trim_start().starts_with('{'))
    {
        pairs.extend(text_pairs(v, "--fsdp_config"));
    }
    for (name, text) in files {
        pairs.extend(text_pairs(text, name));
    }
    from_pairs(cmd, &pairs)
}

/// Read a config file the command names; unreadable files give no pairs.
pub fn read_file(path: &str) -> Option<(String, String)> {
    let text = crate::untrusted::read_config(Path::new(path)).ok()?;
    let shown = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string());
    Some((shown, text))
}

fn from_pairs(cmd: &Command, pairs: &[Pair]) -> Facts {
    let mut f = Facts::default();
    let last = |keys: &[&str]| pairs.iter().rev().find(|p| keys.contains(&p.last()));
    let all = |keys: &[&str]| {
        pairs
            .iter()
            .filter(|p| keys.contains(&p.last()))
            .collect::<Vec<_>>()
    };
    let words = cmd.args.join(" ").to_ascii_lowercase();
    // torchtune trains in bf16 without fp32 master weights unless told otherwise.
    let torchtune = cmd
        .args
        .iter()
        .take(cmd.args_start().max(1) + 1)
        .any(|a| crate::command::base_name(a) == "tune");

    let program = cmd.args.first().map(|a| crate::command::base_name(a));
    f.loader = if torchtune {
        Loader::Torchtune
    } else if program == Some("llamafactory-cli")
        || (last(&["finetuning_type", "stage"]).is_some_and(|p| !p.from.starts_with("--"))
            && pairs.iter().any(|p| p.key == "template"))
    {
        Loader::LlamaFactory
    } else if cmd
        .args
        .iter()
        .take(cmd.args_start().max(1))
        .any(|a| crate::command::base_name(a) == "axolotl" || a.starts_with("axolotl."))
        || pairs
            .iter()
            .any(|p| p.key == "base_model" && !p.from.starts_with("--"))
    {
        Loader::Axolotl
    } else if cmd
        .args
        .iter()
        .take(cmd.args_start().max(1))
        .any(|a| crate::command::base_name(a) == "trl" || a.starts_with("trl."))
    {
        Loader::Trl
    } else {
        Loader::FromPretrained
    };

    // A DeepSpeed config's `bf16: {enabled: ...}` is a switch too.
    let precision: Vec<&Pair> = pairs
        .iter()
        .filter(|p| {
            ["bf16", "fp16", "mixed_precision", "precision"].contains(&p.last())
                || p.key.ends_with("bf16.enabled")
                || p.key.ends_with("fp16.enabled")
        })
        .collect();
    f.no_mixed_precision = no_mixed_precision(&precision);
    // A Hugging Face Trainer (or an accelerate script of the same arguments) that names
    // none of them trains in fp32: TrainingArguments' bf16 and fp16 default to false,
    // accelerate's mixed_precision to "no" (TRL's configs default to bf16). Measured on
    // an H200: a 0.17B Llama shape with fp32 weights peaked 16% above its autocast
    // estimate.
    if precision.is_empty()
        && f.loader == Loader::FromPretrained
        && !crate::frameworks::hf::trl(cmd)
        && last(&["per_device_train_batch_size"]).is_some()
    {
        f.no_mixed_precision =
            Some("neither --bf16 nor --fp16 said: fp32, the Trainer's default".into());
    }

    // The weights' dtype.
    if let Some(p) = last(&["torch_dtype", "dtype", "model_dtype"]) {
        match Dtype::parse(&p.value) {
            Some(d) => f.dtype = Some((d, p.said())),
            None if p.value.trim().trim_matches(['"', '\'']) == "auto" => {
                f.dtype_auto = Some(p.said())
            }
            None => {}
        }
    }
    if f.dtype.is_none() && f.dtype_auto.is_none() {
        if let Some(p) = last(&["bf16"]).filter(|p| p.value.eq_ignore_ascii_case("full")) {
            f.dtype = Some((Dtype::Bf16, p.said()));
        } else if let Some(p) = last(&["pure_bf16"]).filter(|p| truthy(&p.value)) {
            f.dtype = Some((Dtype::Bf16, p.said()));
        } else if let Some(p) = last(&["bf16"]).filter(|p| {
            // axolotl loads the weights in bf16 when `bf16: true` (or auto).
            !p.from.starts_with("--")
                && (truthy(&p.value) || p.value == "auto")
                && pairs
                    .iter()
                    .any(|q| q.from == p.from && q.key == "base_model")
        }) {
            f.dtype = Some((Dtype::Bf16, p.said()));
        } else if let Some(p) = last(&["fp16"]).filter(|p| {
            // axolotl loads the weights in fp16 when `fp16: true`.
            !p.from.starts_with("--") && truthy(&p.value) && f.loader == Loader::Axolotl
        }) {
            f.dtype = Some((Dtype::F16, p.said()));
        } else if torchtune {
            f.dtype = Some((Dtype::Bf16, "torchtune's default dtype: bf16".into()));
        }
    }

    // The optimizer.
    if let Some((o, p)) = pairs.iter().rev().find_map(|p| {
        let k = p.last();
        let is_opt = matches!(
            k,
            "optim" | "optimizer" | "optimizer_type" | "optimizer_name"
        ) || (k == "_component_" && p.key.contains("optimizer"))
            || (k == "name" && p.key.contains("optimizer"));
        is_opt.then(|| Optimizer::parse(&p.value).map(|o| (o, p)))?
    }) {
        f.optimizer = Some((o, p.said()));
    }

    // PEFT.
    let lora_word = |v: &str| {
        let v = v.to_ascii_lowercase();
        v.contains("lora") || v.contains("dora")
    };
    let peft_said = last(&["adapter", "finetuning_type", "peft_type", "peft_method"])
        .filter(|p| lora_word(&p.value))
        .map(Pair::said)
        .or_else(|| {
            last(&["use_peft", "use_lora", "lora"])
                .filter(|p| truthy(&p.value))
                .map(Pair::said)
        })
        .or_else(|| {
            // torchtune's model components: lora_llama3_2_1b, qlora_llama3_8b.
            pairs
                .iter()
                .find(|p| {
                    p.last() == "_component_" && p.key.starts_with("model") && lora_word(&p.value)
                })
                .map(Pair::said)
        });
    let qlora = last(&["adapter"]).is_some_and(|p| p.value.eq_ignore_ascii_case("qlora"))
        || pairs.iter().any(|p| {
            p.last() == "_component_" && p.key.starts_with("model") && p.value.contains("qlora")
        });
    if let Some(source) = peft_said {
        let rank = last(&["lora_r", "lora_rank", "r", "rank"])
            .and_then(|p| p.value.parse::<f64>().ok())
            .filter(|r| *r > 0.0)
            .unwrap_or(8.0);
        let mut names: Vec<String> = Vec::new();
        let mut all_linear = last(&["lora_target_linear"]).is_some_and(|p| truthy(&p.value));
        for p in all(&[
            "lora_target_modules",
            "target_modules",
            "lora_target",
            "lora_attn_modules",
        ]) {
            for n in p.value.split([' ', ',']).filter(|n| !n.is_empty()) {
                let n = n.trim_matches(['"', '\'', '[', ']']).to_ascii_lowercase();
                if matches!(n.as_str(), "all" | "all-linear" | "all_linear") {
                    all_linear = true;
                } else if !n.is_empty() {
                    names.push(n);
                }
            }
        }
        if last(&["apply_lora_to_mlp"]).is_some_and(|p| truthy(&p.value)) {
            names.extend(["w1", "w2", "w3"].map(String::from));
        }
        let targets = if all_linear {
            Targets::AllLinear
        } else if names.is_empty() {
            default_targets()
        } else {
            Targets::Named(names)
        };
        f.peft = Some(Peft {
            rank,
            targets,
            source,
        });
    }
    if f.peft.is_some() {
        if let Some(p) = last(&["load_in_4bit"]).filter(|p| truthy(&p.value)) {
            f.quant = Some((Dtype::Int4, p.said()));
        } else if let Some(p) = last(&["quantization_bit"]).filter(|p| p.value.trim() == "4") {
            f.quant = Some((Dtype::Int4, p.said()));
        } else if qlora {
            f.quant = Some((Dtype::Int4, "QLoRA".into()));
        } else if let Some(p) = last(&["load_in_8bit"]).filter(|p| truthy(&p.value)) {
            f.quant = Some((Dtype::Int8, p.said()));
        } else if let Some(p) = last(&["quantization_bit"]).filter(|p| p.value.trim() == "8") {
            f.quant = Some((Dtype::Int8, p.said()));
        }
    }

    // FSDP.
    let fsdp_offload = last(&[
        "fsdp_offload_params",
        "offload_params",
        "fsdp_cpu_offload",
        "cpu_offload",
    ])
    .is_some_and(|p| truthy(&p.value));
    let hf = pairs
        .iter()
        .filter(|p| p.key == "fsdp")
        .map(|p| p.value.clone())
        .collect::<Vec<_>>();
    let mut fsdp = if !hf.is_empty() {
        let joined = hf.join(" ");
        Fsdp::from_strategy(&joined, format!("fsdp: {joined}"))
    } else {
        None
    };
    if fsdp.is_none() {
        let accel = last(&["distributed_type"])
            .is_some_and(|p| p.value.eq_ignore_ascii_case("fsdp"))
            || last(&["use_fsdp"]).is_some_and(|p| truthy(&p.value));
        if accel {
            let strategy = last(&["fsdp_sharding_strategy", "sharding_strategy"]);
            let reshard = last(&["fsdp_reshard_after_forward", "reshard_after_forward"]);
            fsdp = match (strategy, reshard) {
                (Some(p), _) => Fsdp::from_strategy(&p.value, p.said()),
                (None, Some(p)) if !truthy(&p.value) => {
                    Fsdp::from_strategy("SHARD_GRAD_OP", p.said())
                }
                _ => Fsdp::from_strategy("FULL_SHARD", "accelerate FSDP".into()),
            };
        }
    }
    if fsdp.is_none()
        && let Some(p) =
            last(&["strategy"]).filter(|p| p.value.to_ascii_lowercase().contains("fsdp"))
    {
        fsdp = Fsdp::from_strategy("full_shard", p.said());
    }
    if fsdp.is_none() {
        // torchtitan: FSDP over the data-parallel shard degree (-1: every rank).
        let degree = last(&["data_parallel_shard_degree"]);
        let titan = words.contains("torchtitan");
        match degree {
            Some(p) => {
                if let Ok(d) = p.value.parse::<i64>()
                    && (d == -1 || d > 1)
                {
                    fsdp = Fsdp::from_strategy("full_shard", p.said());
                    if let Some(f) = fsdp.as_mut() {
                        f.degree = (d > 1).then_some(d as u64);
                    }
                }
            }
            None if titan => {
                fsdp = Fsdp::from_strategy(
                    "full_shard",
                    "torchtitan's default data_parallel_shard_degree -1".into(),
                );
            }
            None => {}
        }
    }
    if fsdp.is_none() && torchtune && words.contains("_distributed") {
        fsdp = Fsdp::from_strategy("full_shard", "torchtune's distributed recipe (FSDP)".into());
    }
    if let Some(f2) = fsdp.as_mut() {
        f2.offload |= fsdp_offload;
    }
    f.fsdp = fsdp;
    f
}

/// config.json's dtype (`torch_dtype`, or `dtype` in newer transformers):
/// what `from_pretrained(dtype="auto")` loads. `None` when it names none.
pub fn config_dtype(config_text: &str) -> Option<Dtype> {
    let root: serde_json::Value = serde_json::from_str(config_text).ok()?;
    let v = root
        .get("text_config")
        .filter(|t| t.get("torch_dtype").is_some() || t.get("dtype").is_some())
        .unwrap_or(&root);
    ["dtype", "torch_dtype"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|d| d.as_str()).and_then(Dtype::parse))
}

/// The dtype the weights are loaded in when the run names none, or names
/// `auto`: config.json's (`config`, read at `config_src`) where the loader
/// takes it, else the loader's own default. `transformers` is the major
/// version installed where the command runs (`None`: not found). Always
/// leaves `f.dtype` set, with where it came from, once a config is known.
pub fn settle_dtype(
    f: &mut Facts,
    config: Option<Dtype>,
    config_src: &str,
    transformers: Option<u32>,
) {
    if f.dtype.is_some() {
        return;
    }
    let cfg_said = |d: Dtype| format!("config.json's dtype {} ({config_src})", d.name());
    if let Some(said) = &f.dtype_auto {
        f.dtype = Some(match config {
            Some(d) => (d, format!("{said}: {}", cfg_said(d))),
            None => (
                Dtype::F32,
                format!("{said}: config.json names no dtype, fp32 assumed"),
            ),
        });
        return;
    }
    f.dtype = Some(match f.loader {
        Loader::Trl => (
            Dtype::F32,
            "TRL loads fp32 unless --dtype or model_init_kwargs says otherwise".into(),
        ),
        Loader::Axolotl => (
            Dtype::F32,
            "axolotl loads fp32 without bf16:/fp16: in the recipe".into(),
        ),
        Loader::LlamaFactory => {
            if f.peft.is_some() {
                // The compute dtype: bf16 where config.json says bf16, else fp16
                // (on a GPU with bf16, bf16 only where the checkpoint is).
                let d = if config == Some(Dtype::Bf16) {
                    Dtype::Bf16
                } else {
                    Dtype::F16
                };
                (
                    d,
                    format!(
                        "LLaMA-Factory's compute dtype, from config.json's {} ({config_src})",
                        config.map_or("none", Dtype::name)
                    ),
                )
            } else {
                (
                    Dtype::F32,
                    "LLaMA-Factory upcasts a full fine-tune's trainable parameters to fp32 (pure_bf16: true keeps bf16)".into(),
                )
            }
        }
        Loader::Torchtune => (Dtype::Bf16, "torchtune's default dtype: bf16".into()),
        Loader::FromPretrained => match (transformers, config) {
            (_, None) | (_, Some(Dtype::F32)) => (
                Dtype::F32,
                format!(
                    "from_pretrained's default: config.json names {} ({config_src})",
                    config.map_or("no dtype", |_| "fp32")
                ),
            ),
            (Some(v), Some(d)) if v >= 5 => (
                d,
                format!(
                    "transformers {v}'s from_pretrained loads config.json's dtype ({config_src})"
                ),
            ),
            (Some(v), Some(d)) => (
                Dtype::F32,
                format!(
                    "transformers {v}'s from_pretrained default, not config.json's {} (--torch_dtype auto takes it)",
                    d.name()
                ),
            ),
            (None, Some(d)) => (
                Dtype::F32,
                format!(
                    "from_pretrained's default before transformers 5, assumed: no transformers found where the command runs; transformers 5 loads config.json's {}",
                    d.name()
                ),
            ),
        },
    });
}

/// The major version of transformers installed where the command runs: the
/// environment of its program (`python`, `torchrun`, `accelerate`, ... found
/// on PATH), its `lib/python*/site-packages/transformers-X.Y.Z.dist-info`.
pub fn transformers_major(cmd: &Command, env: &dyn Fn(&str) -> Option<String>) -> Option<u32> {
    let prog = cmd.args.first()?;
    let path = if prog.contains('/') {
        std::path::PathBuf::from(prog)
    } else {
        let p = env("PATH")?;
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())?
    };
    // bin/python → the environment's prefix (a venv's python is a link: its
    // own folder's parent, not the link's target's).
    let prefix = path.parent()?.parent()?;
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut dirs: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            let Ok(sp) = std::fs::read_dir(d.join("site-packages")) else {
                continue;
            };
            for e in sp.flatten() {
                let n = e.file_name();
                let n = n.to_string_lossy();
                if let Some(v) = n
                    .strip_prefix("transformers-")
                    .and_then(|r| r.strip_suffix(".dist-info"))
                {
                    return v.split('.').next()?.parse().ok();
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn cmd(a: &[&str]) -> Command {
        Command::parse(&a.iter().map(OsString::from).collect::<Vec<_>>())
    }

    fn facts(a: &[&str], files: &[(&str, &str)]) -> Facts {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        read(&cmd(a), &files)
    }

    #[test]
    fn mixed_precision_is_off_only_where_every_switch_said_says_so() {
        let off = |args: &[&str], files: &[(&str, &str)]| facts(args, files).no_mixed_precision;
        assert_eq!(
            off(&["python", "train.py", "--bf16", "false"], &[]).as_deref(),
            Some("--bf16 false")
        );
        assert!(
            off(
                &["python", "train.py", "--bf16", "true", "--bf16", "false"],
                &[]
            )
            .is_some()
        );
        assert!(
            off(
                &["python", "train.py", "--bf16", "false", "--fp16", "true"],
                &[]
            )
            .is_none()
        );
        assert!(off(&["python", "train.py", "--bf16"], &[]).is_none());
        assert!(
            off(&["python", "train.py"], &[]).is_none(),
            "nothing said: unknown"
        );
        // A Trainer's arguments with no precision at all: the Trainer's default, fp32.
        let trainer = ["python", "run_clm.py", "--per_device_train_batch_size", "8"];
        assert_eq!(
            off(&trainer, &[]).as_deref(),
            Some("neither --bf16 nor --fp16 said: fp32, the Trainer's default")
        );
        assert!(off(&[&trainer[..], &["--bf16"]].concat(), &[]).is_none());
        let ds = [&trainer[..], &["--deepspeed", "ds.json"]].concat();
        assert!(
            off(&ds, &[("ds.json", r#"{"bf16": {"enabled": true}}"#)]).is_none(),
            "a DeepSpeed config's bf16 turns it on"
        );
        assert!(
            off(
                &ds,
                &[(
                    "ds.json",
                    r#"{"bf16": {"enabled": false}, "fp16": {"enabled": false}}"#
                )]
            )
            .is_some(),
            "both of DeepSpeed's switches off"
        );
        assert!(
            off(
                &["python", "run_clm.py", "args.yaml"],
                &[("args.yaml", "per_device_train_batch_size: 8\nbf16: true\n")]
            )
            .is_none()
        );
        assert!(
            off(
                &[
                    "accelerate",
                    "launch",
                    "t.py",
                    "--per_device_train_batch_size",
                    "8"
                ],
                &[("default_config.yaml", "mixed_precision: bf16\n")]
            )
            .is_none(),
            "accelerate's config turns it on"
        );
        assert!(
            off(&["trl", "sft", "--per_device_train_batch_size", "8"], &[]).is_none(),
            "TRL's configs default to bf16"
        );
        let dir = tempfile::tempdir().unwrap();
        let sft = dir.path().join("sft.py");
        std::fs::write(&sft, "from trl import SFTConfig, SFTTrainer\n").unwrap();
        let sft = sft.to_str().unwrap();
        assert!(
            off(&["python", sft, "--per_device_train_batch_size", "8"], &[]).is_none(),
            "a script of TRL's configs: bf16 by default"
        );
        assert!(
            off(
                &["accelerate", "launch", "--mixed_precision", "no", "t.py"],
                &[]
            )
            .is_some()
        );
        assert!(
            off(
                &["accelerate", "launch", "--mixed_precision", "bf16", "t.py"],
                &[]
            )
            .is_none()
        );
        assert!(
            off(
                &["python", "t.py", "c.yaml"],
                &[("c.yaml", "trainer:\n  precision: 32-true\n")]
            )
            .is_some()
        );
        assert!(
            off(
                &["python", "t.py", "c.yaml"],
                &[("c.yaml", "trainer:\n  precision: bf16-mixed\n")]
            )
            .is_none()
        );
    }

    #[test]
    fn the_dtype_is_read_from_flags_and_recipes() {
        let f = facts(
            &["python", "train.py", "--torch_dtype", "bfloat16", "--bf16"],
            &[],
        );
        assert_eq!(f.dtype.unwrap().0, Dtype::Bf16);
        let f = facts(&["python", "train.py", "--bf16"], &[]);
        assert!(
            f.dtype.is_none(),
            "--bf16 alone is autocast over fp32 weights"
        );
        let f = facts(
            &["python", "sft.py", "c.yaml"],
            &[("c.yaml", "model_init_kwargs:\n  torch_dtype: bfloat16\n")],
        );
        assert_eq!(f.dtype.unwrap().0, Dtype::Bf16);
        let f = facts(
            &["python", "sft.py", "c.yaml"],
            &[("c.yaml", "model_kwargs: {torch_dtype: float16}\n")],
        );
        assert_eq!(f.dtype.unwrap().0, Dtype::F16);
        let f = facts(
            &["axolotl", "train", "a.yml"],
            &[("a.yml", "base_model: x\nbf16: full\n")],
        );
        assert_eq!(f.dtype.unwrap().0, Dtype::Bf16);
        let f = facts(
            &[
                "tune",
                "run",
                "full_finetune_single_device",
                "--config",
                "c.yaml",
            ],
            &[],
        );
        assert_eq!(f.dtype.unwrap().0, Dtype::Bf16);
    }

    #[test]
    fn the_optimizer_is_read_from_flags_and_recipes() {
        let f = facts(&["python", "train.py", "--optim", "paged_adamw_8bit"], &[]);
        assert_eq!(f.optimizer.unwrap().0, Optimizer::Adam8bit);
        let f = facts(
            &["tune", "run", "x", "--config", "c.yaml"],
            &[(
                "c.yaml",
                "optimizer:\n  _component_: torch.optim.SGD\n  lr: 1e-3\n",
            )],
        );
        assert_eq!(f.optimizer.unwrap().0, Optimizer::Sgd);
        let f = facts(
            &["torchrun", "-m", "torchtitan.train"],
            &[("t.toml", "[optimizer]\nname = \"AdamW\"\nlr = 8e-4\n")],
        );
        assert_eq!(f.optimizer.unwrap().0, Optimizer::AdamW);
        let f = facts(
            &["axolotl", "train", "a.yml"],
            &[("a.yml", "optimizer: adamw_bnb_8bit\n")],
        );
        assert_eq!(f.optimizer.unwrap().0, Optimizer::Adam8bit);
    }

    /// The same axolotl recipe under any file name: LoRA from its content.
    #[test]
    fn peft_is_read_from_content_never_from_file_names() {
        let recipe = "base_model: m\nadapter: lora\nlora_r: 16\nlora_target_modules:\n  - q_proj\n  - v_proj\n  - k_proj\n";
        for name in ["my.yml", "qlora-free.yml", "full.yml"] {
            let f = facts(&["axolotl", "train", name], &[(name, recipe)]);
            let p = f.peft.expect(name);
            assert_eq!(p.rank, 16.0);
            assert_eq!(
                p.targets,
                Targets::Named(vec!["q_proj".into(), "v_proj".into(), "k_proj".into()])
            );
            assert!(f.quant.is_none(), "{name}");
        }
        // A full fine-tune in a file called lora.yml is a full fine-tune.
        let f = facts(
            &["axolotl", "train", "lora.yml"],
            &[("lora.yml", "base_model: m\nmicro_batch_size: 2\n")],
        );
        assert!(f.peft.is_none());
        let f = facts(
            &["python", "train_lora.py", "--output_dir", "lora-out"],
            &[],
        );
        assert!(f.peft.is_none(), "words in paths are not facts");
        // QLoRA by adapter, and by load_in_4bit.
        let f = facts(
            &["axolotl", "train", "x.yml"],
            &[("x.yml", "adapter: qlora\nlora_target_linear: true\n")],
        );
        assert_eq!(f.quant.unwrap().0, Dtype::Int4);
        assert_eq!(f.peft.unwrap().targets, Targets::AllLinear);
        let f = facts(
            &[
                "python",
                "sft.py",
                "--use_peft",
                "--lora_r",
                "32",
                "--lora_target_modules",
                "q_proj",
                "v_proj",
                "--load_in_4bit",
            ],
            &[],
        );
        let p = f.peft.unwrap();
        assert_eq!(p.rank, 32.0);
        assert_eq!(
            p.targets,
            Targets::Named(vec!["q_proj".into(), "v_proj".into()])
        );
        assert_eq!(f.quant.unwrap().0, Dtype::Int4);
        // LLaMA-Factory.
        let f = facts(
            &["llamafactory-cli", "train", "c.yaml"],
            &[(
                "c.yaml",
                "finetuning_type: lora\nlora_rank: 8\nlora_target: all\nquantization_bit: 4\n",
            )],
        );
        assert_eq!(f.peft.unwrap().targets, Targets::AllLinear);
        assert_eq!(f.quant.unwrap().0, Dtype::Int4);
        // torchtune's LoRA components.
        let f = facts(
            &[
                "tune",
                "run",
                "lora_finetune_single_device",
                "--config",
                "c.yaml",
            ],
            &[(
                "c.yaml",
                "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n  apply_lora_to_mlp: True\n  lora_rank: 64\n",
            )],
        );
        let p = f.peft.unwrap();
        assert_eq!(p.rank, 64.0);
        assert!(
            matches!(p.targets, Targets::Named(ref n) if n.len() == 6),
            "{:?}",
            p.targets
        );
    }

    #[test]
    fn fsdp_is_read_from_hf_accelerate_torchtune_and_torchtitan() {
        let f = facts(
            &[
                "torchrun",
                "--nproc_per_node=8",
                "train.py",
                "--fsdp",
                "full_shard auto_wrap",
            ],
            &[],
        );
        assert_eq!(f.fsdp.unwrap().stage, 3);
        let f = facts(
            &[
                "torchrun",
                "train.py",
                "--fsdp",
                "full_shard",
                "offload",
                "auto_wrap",
            ],
            &[],
        );
        assert!(f.fsdp.unwrap().offload);
        let f = facts(&["torchrun", "train.py", "--fsdp", "shard_grad_op"], &[]);
        assert_eq!(f.fsdp.unwrap().stage, 2);
        let acc = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: true\nnum_processes: 8\n";
        let f = facts(
            &[
                "accelerate",
                "launch",
                "--config_file",
                "fsdp.yaml",
                "train.py",
            ],
            &[("fsdp.yaml", acc)],
        );
        let fs = f.fsdp.unwrap();
        assert_eq!((fs.stage, fs.offload), (3, true));
        let f = facts(
            &[
                "accelerate",
                "launch",
                "--use_fsdp",
                "--fsdp_sharding_strategy",
                "SHARD_GRAD_OP",
                "train.py",
            ],
            &[],
        );
        assert_eq!(f.fsdp.unwrap().stage, 2);
        let f = facts(
            &[
                "tune",
                "run",
                "--nproc_per_node",
                "4",
                "full_finetune_distributed",
                "--config",
                "c.yaml",
            ],
            &[("c.yaml", "fsdp_cpu_offload: True\n")],
        );
        assert!(f.fsdp.unwrap().offload);
        let f = facts(
            &[
                "torchrun",
                "-m",
                "torchtitan.train",
                "--job.config_file",
                "t.toml",
            ],
            &[("t.toml", "[parallelism]\ndata_parallel_shard_degree = 4\n")],
        );
        assert_eq!(f.fsdp.unwrap().degree, Some(4));
        let f = facts(&["torchrun", "train.py", "--deepspeed", "ds.json"], &[]);
        assert!(f.fsdp.is_none());
        let f = facts(
            &["python", "train.py", "--fsdp_config", "fsdp.json"],
            &[("fsdp.json", "{\"fsdp_offload_params\": true}")],
        );
        assert!(
            f.fsdp.is_none(),
            "an fsdp_config without --fsdp shards nothing"
        );
    }
    /// The dtype the weights load in when the run names none or says `auto`:
    /// config.json's where the loader takes it, the loader's default elsewhere,
    /// always said with where it came from.
    #[test]
    fn the_dtype_without_a_flag_follows_the_loader_and_config_json() {
        let cfg = r#"{"model_type": "llama", "torch_dtype": "bfloat16"}"#;
        assert_eq!(config_dtype(cfg), Some(Dtype::Bf16));
        assert_eq!(config_dtype(r#"{"dtype": "float16"}"#), Some(Dtype::F16));
        assert_eq!(config_dtype(r#"{"hidden_size": 8}"#), None);
        let settle = |a: &[&str], files: &[(&str, &str)], c, v| {
            let mut f = facts(a, files);
            settle_dtype(&mut f, c, "m/config.json", v);
            let (d, said) = f.dtype.unwrap();
            (d, said)
        };
        let bf = Some(Dtype::Bf16);
        let hf = [
            "torchrun",
            "train.py",
            "--model_name_or_path",
            "m",
            "--bf16",
        ];
        // --torch_dtype auto: config.json's, whatever the version.
        let auto = ["python", "run_clm.py", "--torch_dtype", "auto"];
        let (d, said) = settle(&auto, &[], bf, Some(4));
        assert_eq!(d, Dtype::Bf16);
        assert!(
            said.contains("--torch_dtype auto") && said.contains("config.json"),
            "{said}"
        );
        assert_eq!(settle(&auto, &[], None, Some(5)).0, Dtype::F32);
        // No flag: transformers 5 loads config.json's dtype, 4 fp32, unknown: fp32, said.
        assert_eq!(settle(&hf, &[], bf, Some(5)).0, Dtype::Bf16);
        assert_eq!(settle(&hf, &[], bf, Some(4)).0, Dtype::F32);
        let (d, said) = settle(&hf, &[], bf, None);
        assert_eq!(d, Dtype::F32);
        assert!(said.contains("no transformers found"), "{said}");
        assert_eq!(settle(&hf, &[], None, Some(5)).0, Dtype::F32);
        // A flag wins over config.json.
        let flag = ["python", "t.py", "--torch_dtype", "float32"];
        assert_eq!(settle(&flag, &[], bf, Some(5)).0, Dtype::F32);
        // TRL: fp32 unless --dtype, whatever config.json says.
        assert_eq!(
            settle(
                &["trl", "sft", "--model_name_or_path", "m"],
                &[],
                bf,
                Some(5)
            )
            .0,
            Dtype::F32
        );
        assert_eq!(
            settle(&["trl", "sft", "--dtype", "auto"], &[], bf, Some(5)).0,
            Dtype::Bf16
        );
        // axolotl: its recipe's bf16/fp16, else fp32.
        let ax = ("a.yml", "base_model: m\nadapter: lora\n");
        assert_eq!(
            settle(&["axolotl", "train", "a.yml"], &[ax], bf, Some(5)).0,
            Dtype::F32
        );
        let ax16 = ("a.yml", "base_model: m\nfp16: true\n");
        assert_eq!(
            settle(&["axolotl", "train", "a.yml"], &[ax16], bf, Some(5)).0,
            Dtype::F16
        );
        // LLaMA-Factory: LoRA's base in the compute dtype, a full fine-tune fp32.
        let lf = (
            "c.yaml",
            "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\ntemplate: llama3\n",
        );
        assert_eq!(
            settle(&["llamafactory-cli", "train", "c.yaml"], &[lf], bf, Some(5)).0,
            Dtype::Bf16
        );
        let lf_full = (
            "c.yaml",
            "model_name_or_path: m\nstage: sft\nfinetuning_type: full\ntemplate: llama3\n",
        );
        assert_eq!(
            settle(
                &["llamafactory-cli", "train", "c.yaml"],
                &[lf_full],
                bf,
                Some(5)
            )
            .0,
            Dtype::F32
        );
    }

    /// The installed transformers' major version, from the program's environment.
    #[test]
    fn the_transformers_version_is_read_from_the_programs_environment() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("torchrun"), "#!/bin/sh\n").unwrap();
        let sp = d.path().join("lib/python3.12/site-packages");
        std::fs::create_dir_all(sp.join("transformers-5.23.0.dist-info")).unwrap();
        let path = bin.display().to_string();
        let env = move |k: &str| (k == "PATH").then(|| path.clone());
        let c = cmd(&["torchrun", "train.py"]);
        assert_eq!(transformers_major(&c, &env), Some(5));
        let c = cmd(&["nothere-xyz", "train.py"]);
        assert_eq!(transformers_major(&c, &env), None);
    }
}
