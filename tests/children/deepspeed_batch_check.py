#!/usr/bin/env python3
"""Checks its DeepSpeed JSON the way DeepSpeed does, then dies of an OOM once.

argv: FLAG_FILE --deepspeed CONFIG.json. The world size comes from WORLD_SIZE (as a
launcher sets it; oomguard cannot know it). train_batch_size must equal
train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size, or it fails
like DeepSpeed (exit 1, an AssertionError). The first run (no FLAG_FILE yet) then raises
a CUDA OOM; the next one prints `micro=M accum=A train_batch_size=T` and exits 0."""
import json
import os
import sys

flag = sys.argv[1]
config = sys.argv[sys.argv.index("--deepspeed") + 1]
with open(config) as f:
    ds = json.load(f)
world = int(os.environ.get("WORLD_SIZE", "1"))
micro = ds["train_micro_batch_size_per_gpu"]
accum = ds["gradient_accumulation_steps"]
total = ds["train_batch_size"]
if total != micro * accum * world:
    sys.stderr.write(
        "AssertionError: Check batch related parameters. train_batch_size is not equal to "
        f"micro_batch_per_gpu * gradient_acc_step * world_size {total} != {micro} * {accum} * {world}\n"
    )
    sys.exit(1)
if not os.path.exists(flag):
    open(flag, "w").close()
    sys.stderr.write(
        "Traceback (most recent call last):\n"
        '  File "train.py", line 40, in <module>\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.06 GiB is free.\n"
    )
    sys.exit(1)
print(f"micro={micro} accum={accum} train_batch_size={total}", flush=True)
