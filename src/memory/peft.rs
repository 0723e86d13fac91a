//! Parameter-efficient fine-tuning: which linear layers LoRA adapts, at which
//! rank, and how the frozen base is held.

use serde::Serialize;

use super::arch::Linear;

/// The modules LoRA adapts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Targets {
    /// Every linear layer of a block (`all-linear`, `lora_target: all`,
    /// `lora_target_linear: true`).
    AllLinear,
    /// By name (`q_proj`, `v_proj`, torchtune's `output_proj`, ...); a name
    /// matches the layer it ends like (`q` matches `q_proj`).
    Named(Vec<String>),
}

impl Targets {
    pub fn picks(&self, l: &Linear) -> bool {
        match self {
            Targets::AllLinear => true,
            Targets::Named(names) => names.iter().any(|n| name_matches(n, l)),
        }
    }
}

/// torchtune's and GPT-NeoX's names for the same layers.
fn name_matches(n: &str, l: &Linear) -> bool {
    let n = n.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
    let alias: &[&str] = match l.name {
        "q_proj" => &[
            "q_proj",
            "q",
            "query",
            "wq",
            "query_key_value",
            "qkv_proj",
            "c_attn",
        ],
        "k_proj" => &[
            "k_proj",
            "k",
            "key",
            "wk",
            "query_key_value",
            "qkv_proj",
            "c_attn",
        ],
        "v_proj" => &[
            "v_proj",
            "v",
            "value",
            "wv",
            "query_key_value",
            "qkv_proj",
            "c_attn",
        ],
        "o_proj" => &["o_proj", "output_proj", "dense", "out_proj", "wo", "c_proj"],
        "gate_proj" => &["gate_proj", "w1", "gate_up_proj"],
        "up_proj" => &[
            "up_proj",
            "w3",
            "dense_h_to_4h",
            "fc1",
            "fc_in",
            "c_fc",
            "gate_up_proj",
        ],
        "down_proj" => &[
            "down_proj",
            "w2",
            "dense_4h_to_h",
            "fc2",
            "fc_out",
            "mlp.c_proj",
        ],
        _ => &[],
    };
    alias.contains(&n.as_str())
}

/// A LoRA (or QLoRA) fine-tune.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peft {
    pub rank: f64,
    pub targets: Targets,
    /// Where it was read (`adapter: qlora in train.yml`).
    pub source: String,
}

/// PEFT's default targets for a Llama-shaped model when none are given.
pub fn default_targets() -> Targets {
    Targets::Named(vec!["q_proj".into(), "v_proj".into()])
}
