"""argparse_no_resume.py with its options added by a helper module (train_args.py), so
its source does not show that --resume_from_checkpoint is missing: argparse refuses the
flag at run time ("unrecognized arguments", exit 2). Each launch writes a complete Hugging
Face checkpoint (checkpoint-10) before its first step."""
import argparse

from fake_train import train, write_checkpoint
from train_args import add_batch_args

parser = argparse.ArgumentParser(description="train")
add_batch_args(parser)
args = parser.parse_args()
write_checkpoint(args.output_dir)
train(args.per_device_train_batch_size, args.gradient_accumulation_steps)
