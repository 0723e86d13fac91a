#!/usr/bin/env python3
"""Workers under a real `torchrun --max-restarts N` that fail the way a night's run does.

    torchrun --standalone --nproc_per_node=2 --max-restarts 2 tests/real/torchrun_restarts.py \
        --per_device_train_batch_size 8 --gradient_accumulation_steps 1 --budget 4 \
        --launches /tmp/launches.txt [--flaky_first_launch]

Each worker appends one line to --launches when it starts (`rank=R micro=M accum=A`), so a
test counts how often torchrun and oomguard launched the settings. With
--flaky_first_launch, every rank's first launch dies of a RuntimeError that is not an OOM
(a transient failure: torchrun restarts the worker group, as --max-restarts asks). A rank
whose micro-batch is above --budget then dies: rank 1 of a real torch.OutOfMemoryError
(the text a PyTorch 2.x CUDA OOM carries), the others wait as ranks blocked in a
collective do until torchrun stops them. A micro-batch within the budget trains
--max_steps steps and prints the global batch.
"""
import argparse
import os
import sys
import time

import torch


def oom_message(tried_bytes, device):
    gib = 1024 ** 3
    return (f"CUDA out of memory. Tried to allocate {tried_bytes / gib:.2f} GiB. GPU {device} has a total "
            "capacity of 23.65 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has "
            "22.45 GiB memory in use. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB "
            "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, required=True)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--max_steps", type=int, default=3)
    p.add_argument("--launches", required=True)
    p.add_argument("--flaky_first_launch", action="store_true")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
    with open(args.launches, "a+") as f:
        f.seek(0)
        before = sum(1 for line in f if line.startswith(f"rank={rank} "))
        f.write(f"rank={rank} micro={micro} accum={accum}\n")
    print(f"rank {rank}: launch {before + 1} micro={micro} accum={accum}", flush=True)
    if args.flaky_first_launch and before == 0:
        time.sleep(0.5)
        raise RuntimeError(f"rank {rank}: transient failure of the first launch (not an OOM)")
    model = torch.nn.Linear(16, 1)
    if micro > args.budget:
        if rank == 1:
            time.sleep(0.5)
            raise torch.OutOfMemoryError(oom_message(micro * 256 * 1024 ** 2, device=rank))
        time.sleep(120)  # blocked in a collective with the rank that died
        sys.exit(1)
    for step in range(1, args.max_steps + 1):
        for _ in range(accum):
            model(torch.randn(micro, 16)).sum().backward()
        if rank == 0:
            print(f"step {step}/{args.max_steps} micro={micro} accum={accum} "
                  f"global_batch={micro * accum * world}", flush=True)
    if rank == 0:
        print(f"training finished: global_batch={micro * accum * world}", flush=True)


if __name__ == "__main__":
    main()
