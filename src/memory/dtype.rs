//! The dtype the weights are held in on the GPU.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    Int8,
    /// bitsandbytes 4-bit (NF4/FP4), with its quantisation constants.
    Int4,
}

impl Dtype {
    /// `bfloat16`, `torch.bfloat16`, `bf16`, `float32`, `fp16`, `half`, ...;
    /// `None` for `auto` and anything else (the checkpoint's own dtype is not read).
    pub fn parse(s: &str) -> Option<Dtype> {
        let s = s.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
        let s = s.strip_prefix("torch.").unwrap_or(&s);
        Some(match s {
            "float32" | "fp32" | "float" | "32" | "32-true" | "full" => Dtype::F32,
            "bfloat16" | "bf16" | "bf16-true" => Dtype::Bf16,
            "float16" | "fp16" | "half" | "16-true" => Dtype::F16,
            "int8" | "8bit" => Dtype::Int8,
            "nf4" | "fp4" | "4bit" | "int4" => Dtype::Int4,
            _ => return None,
        })
    }

    /// Bytes per weight (4-bit: half a byte plus its block constants).
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::F32 => 4.0,
            Dtype::Bf16 | Dtype::F16 => 2.0,
            Dtype::Int8 => 1.0,
            Dtype::Int4 => 0.55,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "fp16",
            Dtype::Int8 => "int8",
            Dtype::Int4 => "4-bit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_spellings() {
        assert_eq!(Dtype::parse("torch.bfloat16"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("'bf16'"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("float32"), Some(Dtype::F32));
        assert_eq!(Dtype::parse("half"), Some(Dtype::F16));
        assert_eq!(Dtype::parse("auto"), None);
    }
}
