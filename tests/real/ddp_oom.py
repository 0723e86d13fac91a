#!/usr/bin/env python3
"""A real DDP job (torchrun, gloo on CPU) whose rank 1 dies of a real torch.OutOfMemoryError.

    torchrun --nproc_per_node=2 tests/real/ddp_oom.py --per_device_train_batch_size 8 \
        --gradient_accumulation_steps 1 --budget 4 --max_steps 6 --output_dir /tmp/ddp-out

Rank 1 raises `torch.OutOfMemoryError` (the real exception class, with the text a
PyTorch 2.x CUDA OOM carries) from inside its forward pass when the micro-batch is
larger than --budget, while rank 0 waits in the gradient all-reduce; torchrun then
stops rank 0 and prints its ChildFailedError summary, as on a real multi-GPU node.
Rank 0 prints the global batch of every step and writes output_dir/final.json.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def oom_message(tried_bytes, device=0, total_gib=23.65):
    gib = 1024 ** 3
    in_use = total_gib - 1.19
    return (f"CUDA out of memory. Tried to allocate {tried_bytes / gib:.2f} GiB. GPU {device} has a total "
            f"capacity of {total_gib:.2f} GiB of which 1.19 GiB is free. Including non-PyTorch memory, this "
            f"process has {in_use:.2f} GiB memory in use. Of the allocated memory {in_use - 1.35:.2f} GiB is "
            "allocated by PyTorch, and 912.00 MiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
            "avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


class TinyModel(nn.Module):
    def __init__(self, budget, rank):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.budget, self.rank = budget, rank

    def forward(self, x):
        # Rank 1 stands in for the one GPU that runs out first.
        if self.rank == 1 and x.shape[0] > self.budget:
            raise torch.OutOfMemoryError(oom_message(x.shape[0] * 256 * 1024 ** 2, device=self.rank))
        return self.net(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, required=True)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=6)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--budget", type=int, required=True, help="largest micro-batch that 'fits' on rank 1")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
    global_batch = micro * accum * world
    torch.manual_seed(rank)
    model = DDP(TinyModel(args.budget, rank))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    for step in range(1, args.max_steps + 1):
        for micro_step in range(accum):
            x, y = torch.randn(micro, 16), torch.randn(micro, 1)
            loss = nn.functional.mse_loss(model(x), y) / accum
            if micro_step < accum - 1:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()  # the gradient all-reduce happens here
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step}/{args.max_steps} micro={micro} accum={accum} world={world} "
                  f"global_batch={global_batch} loss={loss.item() * accum:.4f}", flush=True)

    if rank == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "final.json"), "w") as f:
            json.dump({"micro": micro, "accum": accum, "world": world, "global_batch": global_batch,
                       "steps": args.max_steps}, f)
        print(f"training finished: global_batch={global_batch}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
