#!/usr/bin/env python3
"""A script run by a real `accelerate launch --config_file X.yaml` (DeepSpeed plugin,
CPU): its gradient accumulation comes from the accelerate config
(`deepspeed_config.gradient_accumulation_steps`, passed by accelerate as
ACCELERATE_GRADIENT_ACCUMULATION_STEPS), its micro-batch from a flag. It dies of a
real torch.OutOfMemoryError while the micro-batch exceeds --budget, and appends
the settings of each launch to --report.
"""
import argparse
import json

import torch
from accelerate.utils import DeepSpeedPlugin


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--report", required=True)
    args = p.parse_args()
    plugin = DeepSpeedPlugin()  # reads what accelerate launch exported from the config
    micro, accum = args.per_device_train_batch_size, plugin.gradient_accumulation_steps
    print(f"micro={micro} accum={accum} zero_stage={plugin.zero_stage} global_batch={micro * accum}",
          flush=True)
    with open(args.report, "a") as f:
        f.write(json.dumps({"micro": micro, "accum": accum, "zero_stage": plugin.zero_stage}) + "\n")
    if micro > args.budget:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.65 GiB of "
            "which 1.19 GiB is free. Including non-PyTorch memory, this process has 22.45 GiB memory in use. "
            "Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB is reserved by "
            "PyTorch but unallocated.")
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
