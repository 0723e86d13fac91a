"""A script that builds its own Trainer arguments from a plain argparse parser, as
unsloth-cli.py does: a per-device batch size, accumulation and an output folder, but no
--resume_from_checkpoint (argparse refuses it, "unrecognized arguments", exit 2). Each
launch writes a complete Hugging Face checkpoint (checkpoint-10: safetensors weights and
trainer_state.json) before its first step, as a run that got that far would have."""
import argparse
import json
import os
import struct

from fake_train import train

parser = argparse.ArgumentParser(description="train")
parser.add_argument("--per_device_train_batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--output_dir", default="outputs")
args = parser.parse_args()

ckpt = os.path.join(args.output_dir, "checkpoint-10")
os.makedirs(ckpt, exist_ok=True)
header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
with open(os.path.join(ckpt, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)
with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
    json.dump({"global_step": 10, "log_history": []}, f)
train(args.per_device_train_batch_size, args.gradient_accumulation_steps)
