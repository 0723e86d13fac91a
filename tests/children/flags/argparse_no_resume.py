"""A script that builds its own Trainer arguments from a plain argparse parser, as
unsloth-cli.py does: a per-device batch size, accumulation and an output folder, but no
--resume_from_checkpoint (argparse refuses it, "unrecognized arguments", exit 2). Each
launch writes a complete Hugging Face checkpoint (checkpoint-10: safetensors weights and
trainer_state.json) before its first step, as a run that got that far would have."""
import argparse

from fake_train import train, write_checkpoint

parser = argparse.ArgumentParser(description="train")
parser.add_argument("--per_device_train_batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--output_dir", default="outputs")
args = parser.parse_args()

write_checkpoint(args.output_dir)
train(args.per_device_train_batch_size, args.gradient_accumulation_steps)
