#!/usr/bin/env python3
"""An accelerate FSDP trainer (no torch needed) whose checkpoint save runs out of GPU memory
while FSDP gathers a full state dict on one rank (`fsdp_state_dict_type: FULL_STATE_DICT` in
the accelerate config); with SHARDED_STATE_DICT each rank saves its shard and the run finishes.

    python tests/children/phase_fsdp_oom.py --accelerate_config cfg.yaml --output_dir out

Prints `state_dict_type=X` first, then a real Python traceback through FSDP's state-dict
frames and PyTorch's message, exit 1; or `training finished`.
"""
import argparse
import os


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


def _full_pre_state_dict_hook(kind):
    if kind == "FULL_STATE_DICT":
        raise OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 13.48 GiB. GPU 0 has a total capacity of 79.32 GiB "
            "of which 7.06 GiB is free. Including non-PyTorch memory, this process has 72.25 GiB memory in "
            "use. Of the allocated memory 69.91 GiB is allocated by PyTorch, and 1.57 GiB is reserved by "
            "PyTorch but unallocated.")
    return {}


def _pre_state_dict_hook(kind):
    return _full_pre_state_dict_hook(kind)


def save_fsdp_model(out, step, kind):
    os.makedirs(os.path.join(out, f"checkpoint-{step}"), exist_ok=True)
    _pre_state_dict_hook(kind)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accelerate_config")
    p.add_argument("--output_dir")
    a = p.parse_args()
    kind = None
    for line in open(a.accelerate_config):
        if line.strip().startswith("fsdp_state_dict_type:"):
            kind = line.split(":", 1)[1].strip()
    print(f"state_dict_type={kind}", flush=True)
    for step in range(1, 5):
        print(f"{{'loss': {2.0 / step:.3f}, 'step': {step}}}", flush=True)
        if step % 2 == 0:
            save_fsdp_model(a.output_dir, step, kind)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
