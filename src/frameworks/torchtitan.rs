//! torchtitan: `torchrun ... train.py --job.config_file llama3_8b.toml`, or its
//! `run_train.sh` reading `CONFIG_FILE`, and the trainers built on it (flame's
//! `train.sh --job.config_file fla.toml`). Its own checkpoint folder
//! (`checkpoint.folder`) is resumed by torchtitan itself when enabled.
//!
//! Every key of its TOML is also a `--section.key V` flag, which wins over the file
//! (`--training.seq_len 65536` beside a file that says 2048): the flag is the knob then.
//! The per-rank batch is `training.local_batch_size` (`training.batch_size` before
//! torchtitan renamed it); accumulation follows from `training.global_batch_size`, or
//! is flame's own `training.gradient_accumulation_steps`.

use super::Family;
use crate::command::Command;
use crate::settings::Knob;

fn recognise(cmd: &Command) -> bool {
    cmd.has_flag(&["--job.config_file", "--job.config-file"])
}

pub static FAMILY: Family = Family {
    name: "torchtitan",
    recognise,
    file_keys: &[
        (Knob::MicroBatch, &["training.local_batch_size"]),
        (Knob::SeqLen, &["training.seq_len"]),
    ],
    own_file_keys: &[
        (Knob::MicroBatch, &["training.batch_size"]),
        (Knob::GradAccum, &["training.gradient_accumulation_steps"]),
    ],
    config_flags: &["--job.config_file"],
    config_env: &["CONFIG_FILE"],
    global_batch_keys: &["training.global_batch_size"],
    dotted_flags: true,
    ..Family::NONE
};
