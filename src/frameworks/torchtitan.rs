//! torchtitan: `torchrun ... train.py --job.config_file llama3_8b.toml`, or its
//! `run_train.sh` reading `CONFIG_FILE`. Its own checkpoint folder
//! (`checkpoint.folder`) is resumed by torchtitan itself when enabled.

use super::Family;
use crate::settings::Knob;

pub static FAMILY: Family = Family {
    name: "torchtitan",
    file_keys: &[
        (Knob::MicroBatch, &["training.local_batch_size"]),
        (Knob::SeqLen, &["training.seq_len"]),
    ],
    config_flags: &["--job.config_file"],
    config_env: &["CONFIG_FILE"],
    ..Family::NONE
};
