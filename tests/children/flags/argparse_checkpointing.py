"""A plain argparse script with a per-device batch size and gradient checkpointing, but no
accumulation option: argparse refuses `--gradient_accumulation_steps` ("unrecognized
arguments", exit 2). Its whole parser is in this file."""
import argparse

from fake_train import train

parser = argparse.ArgumentParser(description="train")
parser.add_argument("--per_device_train_batch_size", type=int, default=8)
parser.add_argument("--gradient_checkpointing", action="store_true")
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()
train(args.per_device_train_batch_size, 1, args.gradient_checkpointing)
