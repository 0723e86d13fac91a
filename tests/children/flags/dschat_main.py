#!/usr/bin/env python3
"""The shape of DeepSpeed-Chat's training scripts (step1_supervised_finetuning/main.py and its
siblings): a literal argparse parser handed to deepspeed.add_config_arguments, which adds only
DeepSpeed's own options, and the output folder made with mkdir(parents=True). The micro-batch,
the sequence length, checkpointing, the ZeRO stage and `--offload` (the optimizer's, and at
stage 3 the parameters', in the ZeRO config it builds) are options with defaults the command
may leave out.
Read by `oomguard plan`, never run."""
import argparse
from pathlib import Path

import deepspeed


def parse_args():
    parser = argparse.ArgumentParser(description="Finetune a transformers model on a causal language modeling task")
    parser.add_argument("--model_name_or_path", type=str, required=True)
    parser.add_argument("--per_device_train_batch_size", type=int, default=16,
                        help="Batch size (per device) for the training dataloader.")
    parser.add_argument("--max_seq_len", type=int, default=512, help="The maximum sequence length.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--zero_stage", type=int, default=0)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--offload", action="store_true", help="Enable ZeRO Offload techniques.")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":
    main()
