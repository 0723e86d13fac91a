//! Sharding that is not a knob of the command: FSDP (Hugging Face `--fsdp`,
//! accelerate FSDP configs, torchtune's distributed recipes, torchtitan's data
//! parallel shard degree, Lightning's `strategy: fsdp`), with its offload.
//! ZeRO's stage and offloads are knobs (`zero_stage`, `offload_*`).

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fsdp {
    /// The ZeRO stage it matches: 3 for full_shard/hybrid, 2 for shard_grad_op.
    pub stage: u64,
    /// Shards over at most this many ranks (hybrid: one node's GPUs);
    /// `None`: the whole world.
    pub degree: Option<u64>,
    /// Parameters (and with them gradients and the optimizer step) on the CPU.
    pub offload: bool,
    /// How the command says it (`--fsdp full_shard auto_wrap`).
    pub source: String,
}

impl Fsdp {
    /// From a Hugging Face `--fsdp` value or an accelerate
    /// `fsdp_sharding_strategy` (`FULL_SHARD`, `1`, `SHARD_GRAD_OP`, `2`,
    /// `HYBRID_SHARD`, `4`, `NO_SHARD`, `3`). `None`: no sharding.
    pub fn from_strategy(s: &str, source: String) -> Option<Fsdp> {
        let l = s.to_ascii_lowercase();
        let words: Vec<&str> = l
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        let has = |w: &str| words.contains(&w);
        let (stage, degree) = if has("hybrid_shard_zero2") || has("5") {
            (2, Some(8))
        } else if has("shard_grad_op") || has("2") {
            (2, None)
        } else if has("hybrid_shard") || has("4") {
            (3, Some(8))
        } else if has("full_shard") || has("1") || has("true") {
            (3, None)
        } else {
            return None;
        };
        Some(Fsdp {
            stage,
            degree,
            offload: has("offload"),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsdp_spellings() {
        let f = Fsdp::from_strategy("full_shard auto_wrap", "x".into()).unwrap();
        assert_eq!((f.stage, f.offload), (3, false));
        let f = Fsdp::from_strategy("full_shard offload auto_wrap", "x".into()).unwrap();
        assert!(f.offload);
        assert_eq!(
            Fsdp::from_strategy("SHARD_GRAD_OP", "x".into())
                .unwrap()
                .stage,
            2
        );
        assert_eq!(Fsdp::from_strategy("1", "x".into()).unwrap().stage, 3);
        assert_eq!(
            Fsdp::from_strategy("HYBRID_SHARD", "x".into())
                .unwrap()
                .degree,
            Some(8)
        );
        assert!(Fsdp::from_strategy("NO_SHARD", "x".into()).is_none());
        assert!(Fsdp::from_strategy("", "x".into()).is_none());
    }
}
