"""A plain argparse script whose options come from a helper module (train_args.py): no
accumulation option, which argparse refuses ("unrecognized arguments", exit 2)."""
import argparse

from fake_train import train
from train_args import add_args

parser = argparse.ArgumentParser(description="train")
add_args(parser)
args = parser.parse_args()
train(args.per_device_train_batch_size, 1, args.gradient_checkpointing)
