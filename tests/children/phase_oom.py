#!/usr/bin/env python3
"""A DeepSpeed-style trainer (no torch needed) whose checkpoint save runs out of GPU memory
while ZeRO-3 gathers the full 16-bit weights on one rank, as `save_16bit_model` does when the
config sets `zero_optimization.stage3_gather_16bit_weights_on_model_save: true`; with it false,
each rank saves its own shard and the run finishes.

    python tests/children/phase_oom.py --deepspeed ds.json --output_dir out

Prints `gather=BOOL micro=N` first, then a real Python traceback through the save's frames
and PyTorch's message, exit 1; or `training finished`.
"""
import argparse
import json
import os
import sys


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


def _zero3_consolidated_16bit_state_dict(gather):
    if gather:
        raise OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 12.50 GiB. GPU 0 has a total capacity of 79.32 GiB "
            "of which 9.81 GiB is free. Including non-PyTorch memory, this process has 69.50 GiB memory in "
            "use. Of the allocated memory 66.02 GiB is allocated by PyTorch, and 2.11 GiB is reserved by "
            "PyTorch but unallocated.")
    return {}


def save_16bit_model(gather):
    return _zero3_consolidated_16bit_state_dict(gather)


def _save_checkpoint(out, step, gather):
    os.makedirs(os.path.join(out, f"checkpoint-{step}"), exist_ok=True)
    save_16bit_model(gather)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deepspeed")
    p.add_argument("--output_dir")
    a = p.parse_args()
    cfg = json.load(open(a.deepspeed))
    zero = cfg.get("zero_optimization", {})
    gather = bool(zero.get("stage3_gather_16bit_weights_on_model_save", False))
    print(f"gather={gather} micro={cfg.get('train_micro_batch_size_per_gpu')}", flush=True)
    for step in range(1, 5):
        print(f"{{'loss': {2.0 / step:.3f}, 'step': {step}}}", flush=True)
        if step % 2 == 0:
            _save_checkpoint(a.output_dir, step, gather)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
