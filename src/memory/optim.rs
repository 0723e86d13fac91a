//! Optimizers and the bytes of state they keep per trainable parameter.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Adam/AdamW (torch, fused, apex, 32-bit paged): m and v.
    AdamW,
    /// bitsandbytes/torchao 8-bit Adam (also paged): 1-byte m and v.
    Adam8bit,
    /// Adafactor: factored second moments, no first moment by default.
    Adafactor,
    /// SGD with momentum: one state.
    Sgd,
    /// Lion: one state (momentum).
    Lion,
    /// 8-bit Lion: one 1-byte state.
    Lion8bit,
}

impl Optimizer {
    /// From the names trainers use: HF `--optim` values (`adamw_torch_fused`,
    /// `adamw_bnb_8bit`, `paged_adamw_8bit`, `adafactor`, `sgd`, `lion_32bit`),
    /// class names (`torch.optim.AdamW`, `bitsandbytes.optim.PagedAdamW8bit`,
    /// `torchao.optim.AdamW8bit`), torchtitan's `name = "AdamW"`.
    pub fn parse(s: &str) -> Option<Optimizer> {
        let s = s.to_ascii_lowercase().replace(['-', '.'], "_");
        let has = |w: &str| s.contains(w);
        Some(if has("lion") {
            if has("8bit") {
                Optimizer::Lion8bit
            } else {
                Optimizer::Lion
            }
        } else if has("adafactor") {
            Optimizer::Adafactor
        } else if has("adam") && (has("8bit") || has("_8b")) {
            Optimizer::Adam8bit
        } else if has("adam") {
            Optimizer::AdamW
        } else if has("sgd") || has("rmsprop") || has("adagrad") {
            Optimizer::Sgd
        } else {
            return None;
        })
    }

    /// Bytes of optimizer state per trainable parameter whose states are kept
    /// at `state_bytes` per value (4 for fp32, 2 when the weights are bf16).
    pub fn state_bytes(self, state_bytes: f64) -> f64 {
        match self {
            Optimizer::AdamW => 2.0 * state_bytes,
            Optimizer::Adam8bit => 2.0,
            // Row and column factors: a few bytes per row of each matrix.
            Optimizer::Adafactor => 0.02 * state_bytes,
            Optimizer::Sgd | Optimizer::Lion => state_bytes,
            Optimizer::Lion8bit => 1.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Optimizer::AdamW => "AdamW",
            Optimizer::Adam8bit => "8-bit Adam",
            Optimizer::Adafactor => "Adafactor",
            Optimizer::Sgd => "SGD",
            Optimizer::Lion => "Lion",
            Optimizer::Lion8bit => "8-bit Lion",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_spellings() {
        for (s, o) in [
            ("adamw_torch_fused", Optimizer::AdamW),
            ("paged_adamw_32bit", Optimizer::AdamW),
            ("adamw_bnb_8bit", Optimizer::Adam8bit),
            ("paged_adamw_8bit", Optimizer::Adam8bit),
            ("bitsandbytes.optim.PagedAdamW8bit", Optimizer::Adam8bit),
            ("torchao.optim.AdamW8bit", Optimizer::Adam8bit),
            ("adafactor", Optimizer::Adafactor),
            ("sgd", Optimizer::Sgd),
            ("lion_32bit", Optimizer::Lion),
            ("paged_lion_8bit", Optimizer::Lion8bit),
            ("torch.optim.AdamW", Optimizer::AdamW),
        ] {
            assert_eq!(Optimizer::parse(s), Some(o), "{s}");
        }
        assert_eq!(Optimizer::parse("shampoo_x"), None);
    }
}
