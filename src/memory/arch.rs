//! Architectures from a Hugging Face `config.json`: parameter counts (total and,
//! for a Mixture-of-Experts, active per token), the linear layers LoRA can
//! target, and the activation bytes per layer per token, per family.
//!
//! Only the families listed in [`FAMILIES`] are known. A config of any other
//! `model_type` is an [`Unknown`]: the memory model says so and the policy's
//! ladder decides, never a Llama guess (a GPT-NeoX taken as Llama was 28% off).

use serde::Serialize;

/// The families the model knows, by `model_type`, with how their blocks are built.
const FAMILIES: &[(&str, Block)] = &[
    ("llama", Block::GATED),
    ("mistral", Block::GATED),
    ("qwen2", Block::GATED),
    ("qwen3", Block::GATED),
    ("gemma", Block::GATED),
    ("gemma2", Block::GATED),
    ("gemma3_text", Block::GATED),
    ("phi3", Block::GATED),
    ("mixtral", Block::GATED),
    ("qwen2_moe", Block::GATED),
    ("qwen3_moe", Block::GATED),
    ("gpt_neox", Block::PARALLEL_GELU),
    ("gptj", Block::PARALLEL_GELU),
    ("phi", Block::PARALLEL_GELU),
    ("falcon", Block::PARALLEL_GELU),
    ("gpt2", Block::SERIAL_GELU),
];

/// How a transformer block is built.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Block {
    /// SwiGLU/GeGLU MLP (gate, up, down) instead of two matrices with GELU.
    gated: bool,
    /// Attention and MLP read one shared norm (GPT-NeoX, GPT-J, Falcon, Phi-2).
    parallel: bool,
}

impl Block {
    const GATED: Block = Block {
        gated: true,
        parallel: false,
    };
    const PARALLEL_GELU: Block = Block {
        gated: false,
        parallel: true,
    };
    const SERIAL_GELU: Block = Block {
        gated: false,
        parallel: false,
    };
}

/// The tensors of the MLP's width an activation function saves for the backward
/// pass beyond its input, where transformers composes it of several elementwise
/// operations instead of one kernel: `gelu_new` (GPT-2's, GPT-J's and Phi's
/// default), `gelu_fast`, `gelu_accurate` and `gelu_python` keep their tanh or erf,
/// the half input and the sum they multiply (3); `quick_gelu` its sigmoid (1).
/// `gelu`, `gelu_pytorch_tanh`, `silu` and `relu` are one kernel each (0).
/// Measured on an H200 (a gpt2-medium shape, `--bf16`, 8 × 1024 tokens): the
/// estimate was 23% under the peak without these tensors, 8% over with them
/// (`tests/fixtures/measured/`).
fn composed_activation_tensors(name: Option<&str>) -> f64 {
    match name.map(str::to_ascii_lowercase).as_deref() {
        Some("gelu_new" | "gelu_fast" | "gelu_accurate" | "gelu_python") => 3.0,
        Some("quick_gelu") => 1.0,
        _ => 0.0,
    }
}

/// The family names the model knows, for messages.
pub fn known() -> String {
    FAMILIES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A config.json whose architecture the model does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct Unknown {
    /// The `model_type` (or `architectures[0]`), or "none given".
    pub what: String,
}

/// One linear layer of a block, for LoRA: name, inputs, outputs, copies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Linear {
    pub name: &'static str,
    pub d_in: f64,
    pub d_out: f64,
    /// Per layer (experts: each has its own).
    pub copies: f64,
    /// Part of the MLP (LoRA's `all-linear` / `lora_target_linear` reach it).
    pub mlp: bool,
}

/// What the memory model needs of an architecture.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arch {
    /// The config's `model_type`.
    pub family: String,
    pub params: f64,
    /// Parameters a token passes through (a Mixture-of-Experts' top-k experts).
    pub active_params: f64,
    pub hidden: f64,
    pub layers: f64,
    /// The MLP width a token passes through (top-k experts, shared expert).
    pub intermediate: f64,
    pub vocab: f64,
    /// Activation bytes per layer per token, Korthikanti et al.'s 16-bit count
    /// with flash attention (before the precision factor).
    pub act_per_layer_token: f64,
    /// The linear layers of one block (LoRA targets).
    #[serde(skip)]
    pub linears: Vec<Linear>,
}

impl Arch {
    /// From a Hugging Face `config.json`'s text (`None`: not JSON, or no sizes).
    pub fn from_config_json(text: &str) -> Option<Result<Arch, Unknown>> {
        let root: serde_json::Value = serde_json::from_str(text).ok()?;
        // Multimodal configs keep the language model's in `text_config`.
        let v = root
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(&root);
        let ty = v
            .get("model_type")
            .and_then(|t| t.as_str())
            .or_else(|| root.get("model_type").and_then(|t| t.as_str()));
        let num = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| v.get(*k).and_then(|x| x.as_f64()))
                .filter(|x| *x > 0.0)
        };
        let flag = |k: &str| v.get(k).and_then(|x| x.as_bool());
        let hidden = num(&["hidden_size", "n_embd", "d_model", "dim"])?;
        let layers = num(&["num_hidden_layers", "n_layer", "num_layers", "n_layers"])?;
        let Some((family, block)) = ty.and_then(|t| FAMILIES.iter().find(|(n, _)| *n == t)) else {
            let what = ty
                .map(str::to_string)
                .or_else(|| {
                    root.get("architectures")
                        .and_then(|a| a.get(0))
                        .and_then(|a| a.as_str())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "none given".into());
            return Some(Err(Unknown { what }));
        };
        let family = family.to_string();
        let vocab = num(&["vocab_size", "padded_vocab_size"]).unwrap_or(32000.0);
        let heads = num(&["num_attention_heads", "n_head"]).unwrap_or((hidden / 128.0).max(1.0));
        let head_dim = num(&["head_dim"]).unwrap_or(hidden / heads);
        let kv_heads = match family.as_str() {
            "falcon" => {
                if flag("new_decoder_architecture") == Some(true) {
                    num(&["num_kv_heads"]).unwrap_or(heads)
                } else if flag("multi_query").unwrap_or(true) {
                    1.0
                } else {
                    heads
                }
            }
            _ => num(&["num_key_value_heads", "num_kv_heads"]).unwrap_or(heads),
        };
        let q = heads * head_dim;
        let kv = kv_heads * head_dim;
        let dense_i = match family.as_str() {
            "gpt2" | "gptj" => num(&["n_inner"]).unwrap_or(4.0 * hidden),
            "falcon" => num(&["ffn_hidden_size"]).unwrap_or(4.0 * hidden),
            _ => num(&["intermediate_size"]).unwrap_or(4.0 * hidden),
        };
        // Mixture-of-Experts: Mixtral's num_local_experts, Qwen-MoE's num_experts.
        let experts = num(&["num_local_experts", "num_experts"]).filter(|e| *e > 1.0);
        let top_k = num(&["num_experts_per_tok"]).unwrap_or(2.0);
        let expert_i = num(&["moe_intermediate_size"]).unwrap_or(dense_i);
        let shared_i = num(&["shared_expert_intermediate_size"]).unwrap_or(0.0);
        let mats = if block.gated { 3.0 } else { 2.0 };
        let mut linears = vec![
            lin("q_proj", hidden, q, 1.0, false),
            lin("k_proj", hidden, kv, 1.0, false),
            lin("v_proj", hidden, kv, 1.0, false),
            lin("o_proj", q, hidden, 1.0, false),
        ];
        let mlp_lins = |i: f64, copies: f64, out: &mut Vec<Linear>| {
            if block.gated {
                out.push(lin("gate_proj", hidden, i, copies, true));
            }
            out.push(lin("up_proj", hidden, i, copies, true));
            out.push(lin("down_proj", i, hidden, copies, true));
        };
        let (mlp_total, mlp_active, act_i) = match experts {
            Some(e) => {
                mlp_lins(expert_i, e, &mut linears);
                if shared_i > 0.0 {
                    mlp_lins(shared_i, 1.0, &mut linears);
                }
                let router = hidden * e;
                (
                    mats * hidden * (expert_i * e + shared_i) + router,
                    mats * hidden * (expert_i * top_k + shared_i) + router,
                    expert_i * top_k + shared_i,
                )
            }
            None => {
                mlp_lins(dense_i, 1.0, &mut linears);
                let m = mats * hidden * dense_i;
                (m, m, dense_i)
            }
        };
        let attn = 2.0 * hidden * q + 2.0 * hidden * kv;
        // Norms and biases: a few vectors of h per layer.
        let small = 4.0 * hidden + q + 2.0 * kv;
        let tied_default = matches!(family.as_str(), "gemma" | "gemma2" | "gemma3_text" | "gpt2")
            || family == "falcon";
        let tied = flag("tie_word_embeddings").unwrap_or(tied_default);
        let mut embed = vocab * hidden * if tied { 1.0 } else { 2.0 };
        if family == "gpt2" {
            embed += num(&["n_positions"]).unwrap_or(1024.0) * hidden;
        }
        let params = layers * (attn + mlp_total + small) + embed;
        let active_params = layers * (attn + mlp_active + small) + embed;
        // Korthikanti et al.'s 16-bit count per layer per token with flash
        // attention (no s² term): norms and the residual 6h, q/k/v 2(q + 2kv), the
        // attention output and its projection 4q — 16h for Llama's full heads.
        // The MLP: a gated one keeps gate, up and their product (4.5·I, fitted on
        // an H100), a GELU one its input and output (3·I). A parallel block
        // reads one norm for both halves.
        let attn_act = 6.0 * hidden + 2.0 * (q + 2.0 * kv) + 4.0 * q;
        let act_fn = ["hidden_act", "activation_function", "hidden_activation"]
            .iter()
            .find_map(|k| v.get(*k).and_then(|x| x.as_str()));
        let composed = composed_activation_tensors(act_fn.or(match family.as_str() {
            "gpt2" | "gptj" | "phi" => Some("gelu_new"),
            _ => None,
        }));
        let mlp_act = (if block.gated { 4.5 } else { 3.0 } + 2.0 * composed) * act_i;
        let shared_norm = if block.parallel { 2.0 * hidden } else { 0.0 };
        Some(Ok(Arch {
            family,
            params,
            active_params,
            hidden,
            layers,
            intermediate: act_i,
            vocab,
            act_per_layer_token: attn_act + mlp_act - shared_norm,
            linears,
        }))
    }

    /// A Llama-shaped architecture of `params` parameters (`--knob params=N`:
    /// the user gave a size, not a shape).
    pub fn llama_of(params: f64) -> Arch {
        let hidden = ((params * 128.0 / 12.0).cbrt() / 128.0).round().max(1.0) * 128.0;
        let layers = (params / (12.0 * hidden * hidden)).round().max(1.0);
        let intermediate = 8.0 / 3.0 * hidden;
        let mut linears: Vec<Linear> = ["q_proj", "k_proj", "v_proj", "o_proj"]
            .iter()
            .map(|n| lin(n, hidden, hidden, 1.0, false))
            .collect();
        linears.push(lin("gate_proj", hidden, intermediate, 1.0, true));
        linears.push(lin("up_proj", hidden, intermediate, 1.0, true));
        linears.push(lin("down_proj", intermediate, hidden, 1.0, true));
        Arch {
            family: "llama".into(),
            params,
            active_params: params,
            hidden,
            layers,
            intermediate,
            vocab: 32000.0,
            act_per_layer_token: 16.0 * hidden + 4.5 * intermediate,
            linears,
        }
    }

    /// LoRA's trainable parameters at rank `r` on the modules `targets` picks.
    pub fn lora_params(&self, r: f64, targets: &super::peft::Targets) -> f64 {
        self.layers
            * self
                .linears
                .iter()
                .filter(|l| targets.picks(l))
                .map(|l| r * (l.d_in + l.d_out) * l.copies)
                .sum::<f64>()
    }
}

fn lin(name: &'static str, d_in: f64, d_out: f64, copies: f64, mlp: bool) -> Linear {
    Linear {
        name,
        d_in,
        d_out,
        copies,
        mlp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(cfg: &str) -> Arch {
        Arch::from_config_json(cfg).unwrap().unwrap()
    }

    /// Published parameter counts, from the families' own config.json files.
    #[test]
    fn published_models_have_their_parameter_counts() {
        let cases: &[(&str, f64, f64)] = &[
            // Llama-2-7B
            (
                r#"{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"intermediate_size":11008,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32000}"#,
                6.74,
                6.74,
            ),
            // Llama-3.2-1B: GQA and tied embeddings.
            (
                r#"{"model_type":"llama","hidden_size":2048,"num_hidden_layers":16,"intermediate_size":8192,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"tie_word_embeddings":true}"#,
                1.24,
                1.24,
            ),
            // Mistral-7B
            (
                r#"{"model_type":"mistral","hidden_size":4096,"num_hidden_layers":32,"intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000}"#,
                7.24,
                7.24,
            ),
            // Qwen2-0.5B: tied
            (
                r#"{"model_type":"qwen2","hidden_size":896,"num_hidden_layers":24,"intermediate_size":4864,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true}"#,
                0.49,
                0.49,
            ),
            // Pythia-1.4B (GPT-NeoX)
            (
                r#"{"model_type":"gpt_neox","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":8192,"num_attention_heads":16,"vocab_size":50304,"rotary_pct":0.25,"use_parallel_residual":true}"#,
                1.41,
                1.41,
            ),
            // GPT-2 (124M)
            (
                r#"{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":12,"vocab_size":50257,"n_positions":1024}"#,
                0.124,
                0.124,
            ),
            // GPT-J-6B
            (
                r#"{"model_type":"gptj","n_embd":4096,"n_layer":28,"n_head":16,"vocab_size":50400,"rotary_dim":64}"#,
                6.05,
                6.05,
            ),
            // Falcon-7B: multi-query
            (
                r#"{"model_type":"falcon","hidden_size":4544,"num_hidden_layers":32,"num_attention_heads":71,"vocab_size":65024,"multi_query":true,"parallel_attn":true}"#,
                6.92,
                6.92,
            ),
            // Gemma-2B: head_dim 256, one KV head, 256k vocabulary, tied
            (
                r#"{"model_type":"gemma","hidden_size":2048,"num_hidden_layers":18,"intermediate_size":16384,"num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,"vocab_size":256000}"#,
                2.51,
                2.51,
            ),
            // Phi-2
            (
                r#"{"model_type":"phi","hidden_size":2560,"num_hidden_layers":32,"intermediate_size":10240,"num_attention_heads":32,"vocab_size":51200,"partial_rotary_factor":0.4}"#,
                2.78,
                2.78,
            ),
            // Mixtral-8x7B: 46.7B total, 12.9B active
            (
                r#"{"model_type":"mixtral","hidden_size":4096,"num_hidden_layers":32,"intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000,"num_local_experts":8,"num_experts_per_tok":2}"#,
                46.7,
                12.9,
            ),
            // Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B active
            (
                r#"{"model_type":"qwen2_moe","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":5632,"moe_intermediate_size":1408,"shared_expert_intermediate_size":5632,"num_attention_heads":16,"num_key_value_heads":16,"vocab_size":151936,"num_experts":60,"num_experts_per_tok":4}"#,
                14.3,
                2.7,
            ),
        ];
        for (cfg, total, active) in cases {
            let a = arch(cfg);
            let rel = |got: f64, want: f64| (got / 1e9 - want).abs() / want;
            assert!(
                rel(a.params, *total) < 0.03,
                "{}: {} vs {total}",
                a.family,
                a.params
            );
            assert!(
                rel(a.active_params, *active) < 0.05,
                "{}: active {} vs {active}",
                a.family,
                a.active_params
            );
        }
    }

    /// transformers' `gelu_new` (GPT-2's default) is several elementwise
    /// operations, each saving a tensor of the MLP's width; `gelu_pytorch_tanh`
    /// is one kernel.
    #[test]
    fn a_composed_activation_keeps_three_more_tensors_of_the_mlps_width() {
        let gpt2 = |act: &str| {
            let extra = if act.is_empty() {
                String::new()
            } else {
                format!(r#","activation_function":"{act}""#)
            };
            Arch::from_config_json(&format!(
                r#"{{"model_type":"gpt2","n_embd":1024,"n_layer":24,"n_head":16,"vocab_size":50257{extra}}}"#
            ))
            .unwrap()
            .unwrap()
            .act_per_layer_token
        };
        let fused = gpt2("gelu_pytorch_tanh");
        assert_eq!(gpt2("gelu_new") - fused, 2.0 * 3.0 * 4096.0);
        assert_eq!(gpt2(""), gpt2("gelu_new"), "GPT-2's default is gelu_new");
        assert_eq!(gpt2("quick_gelu") - fused, 2.0 * 4096.0);
        let llama = |act: &str| {
            Arch::from_config_json(&format!(
                r#"{{"model_type":"llama","hidden_size":1024,"num_hidden_layers":8,"intermediate_size":2816,"num_attention_heads":16,"hidden_act":"{act}"}}"#
            ))
            .unwrap()
            .unwrap()
            .act_per_layer_token
        };
        assert_eq!(llama("silu"), llama("gelu"));
    }

    #[test]
    fn an_unknown_architecture_is_said_as_such_not_taken_for_llama() {
        let u = Arch::from_config_json(
            r#"{"model_type":"mamba","hidden_size":768,"num_hidden_layers":24}"#,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!(u.what, "mamba");
        let u = Arch::from_config_json(
            r#"{"architectures":["RwkvForCausalLM"],"hidden_size":768,"num_hidden_layers":24}"#,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!(u.what, "RwkvForCausalLM");
        assert!(Arch::from_config_json("not json").is_none());
    }

    /// A GELU MLP keeps less per token than a gated one of the same width, a
    /// parallel block one norm less, and GQA smaller keys and values.
    #[test]
    fn activations_follow_the_block() {
        let llama = arch(
            r#"{"model_type":"llama","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":8192,"num_attention_heads":16}"#,
        );
        let neox = arch(
            r#"{"model_type":"gpt_neox","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":8192,"num_attention_heads":16}"#,
        );
        let gqa = arch(
            r#"{"model_type":"llama","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":8192,"num_attention_heads":16,"num_key_value_heads":2}"#,
        );
        assert_eq!(llama.act_per_layer_token, 16.0 * 2048.0 + 4.5 * 8192.0);
        assert!(neox.act_per_layer_token < llama.act_per_layer_token);
        assert!(gqa.act_per_layer_token < llama.act_per_layer_token);
        // A Mixture-of-Experts token passes through its top-k experts only.
        let moe = arch(
            r#"{"model_type":"mixtral","hidden_size":2048,"num_hidden_layers":24,"intermediate_size":8192,"num_attention_heads":16,"num_local_experts":8,"num_experts_per_tok":2}"#,
        );
        assert_eq!(moe.intermediate, 2.0 * 8192.0);
        assert!(moe.params > 3.0 * moe.active_params);
    }
}
