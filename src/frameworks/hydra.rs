//! Hydra / OmegaConf command lines (verl, lightning-hydra-template, llm-foundry):
//! `key.path=N` overrides, matched by the key's last segment.

use super::Family;
use crate::settings::Knob;

pub static FAMILY: Family = Family {
    name: "hydra",
    override_keys: &[
        (
            Knob::MicroBatch,
            &[
                "per_device_train_batch_size",
                "micro_batch_size",
                "micro_batch_size_per_gpu",
                "ppo_micro_batch_size_per_gpu",
                "train_micro_batch_size_per_gpu",
                "device_train_microbatch_size",
                "local_batch_size",
            ],
        ),
        (
            Knob::GradAccum,
            &["gradient_accumulation_steps", "accumulate_grad_batches"],
        ),
        (
            Knob::SeqLen,
            &[
                "max_seq_length",
                "max_seq_len",
                "max_length",
                "cutoff_len",
                "sequence_len",
                "seq_len",
                "block_size",
            ],
        ),
        (
            Knob::GradCheckpointing,
            &[
                "gradient_checkpointing",
                "enable_activation_checkpointing",
                "activation_checkpointing",
                "enable_gradient_checkpointing",
            ],
        ),
        (
            Knob::DataloaderWorkers,
            &["num_workers", "dataloader_num_workers"],
        ),
        (
            Knob::EvalBatch,
            &[
                "per_device_eval_batch_size",
                "eval_batch_size",
                "val_batch_size",
                "valid_batch_size",
            ],
        ),
    ],
    file_keys: &[(Knob::SeqLen, &["variables.max_seq_len"])],
    ..Family::NONE
};
