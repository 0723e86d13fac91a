#!/usr/bin/env python3
"""A real DDP job (torchrun, gloo on CPU) whose rank 1 dies of a real torch.OutOfMemoryError.

    torchrun --nproc_per_node=2 tests/real/ddp_oom.py --per_device_train_batch_size 8 \
        --gradient_accumulation_steps 1 --budget 4 --max_steps 6 --output_dir /tmp/ddp-out

Rank 1 (--oom_rank; or, with --oom_env NAME, the rank whose environment has NAME=1:
torchrun's c10d rendezvous numbers the nodes by arrival, so a test picks the node that
runs out by its environment) raises `torch.OutOfMemoryError` (the real exception class, with the
text a PyTorch 2.x CUDA OOM carries) from inside its forward pass when the micro-batch is
larger than --budget (from step --oom_at_step on), while rank 0 waits in the gradient
all-reduce; torchrun then stops rank 0 and prints its ChildFailedError summary, as on a
real multi-GPU node. Rank 0 prints the global batch of every step.

With --save_steps N, rank 0 saves a Hugging Face-shaped `checkpoint-N/` (weights, then
`trainer_state.json` last) every N steps, and --resume_from_checkpoint resumes from one.
Each rank writes output_dir/final.json (rank 0) or final-rankR.json at the end: its
settings and, per launch, the step it started from and the checkpoint it resumed from.

Hangs, as NCCL jobs hang: --hang_after_oom makes the OOM rank print its traceback and
then never exit (a rank stuck in NCCL's teardown); --peer_hangs makes the other ranks,
once their collective fails because the OOM rank is gone, wait for ever without a word
(NCCL without async error handling). The process group's timeout is --pg_timeout
seconds (600 by default): a supervisor that waited for it would take ten minutes.
"""
import argparse
import datetime
import json
import os
import sys
import time
import traceback

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
    def __init__(self, args, rank):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.args, self.rank, self.step = args, rank, 0
        self.ooms = (os.environ.get(args.oom_env) == "1") if args.oom_env else rank == args.oom_rank

    def forward(self, x):
        # One rank stands in for the one GPU that runs out first.
        a = self.args
        if self.ooms and x.shape[0] > a.budget and self.step >= a.oom_at_step:
            raise torch.OutOfMemoryError(oom_message(x.shape[0] * 256 * 1024 ** 2, device=self.rank))
        return self.net(x)


def hang():
    while True:
        time.sleep(3600)


def save(args, step, model, segments):
    ckpt = os.path.join(args.output_dir, f"checkpoint-{step}")
    os.makedirs(ckpt, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(ckpt, "pytorch_model.bin"))
    state = {"global_step": step, "segments": segments}
    tmp = os.path.join(ckpt, ".trainer_state.json.part")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(ckpt, "trainer_state.json"))
    print(f"Saving model checkpoint to {ckpt}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, required=True)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=6)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--budget", type=int, required=True, help="largest micro-batch that 'fits' on the OOM rank")
    p.add_argument("--oom_rank", type=int, default=1)
    p.add_argument("--oom_env", default=None, help="the rank whose environment has this variable =1 OOMs")
    p.add_argument("--oom_at_step", type=int, default=1)
    p.add_argument("--save_steps", type=int, default=0)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--hang_after_oom", action="store_true")
    p.add_argument("--peer_hangs", action="store_true")
    p.add_argument("--pg_timeout", type=float, default=600.0)
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
    global_batch = micro * accum * world
    torch.manual_seed(rank)
    inner = TinyModel(args, rank)
    start, segments = 0, []
    if args.resume_from_checkpoint:
        inner.load_state_dict(torch.load(os.path.join(args.resume_from_checkpoint, "pytorch_model.bin")))
        with open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")) as f:
            state = json.load(f)
        start, segments = state["global_step"], state["segments"]
        print(f"rank {rank}: resuming from {os.path.basename(args.resume_from_checkpoint)} at step {start}",
              flush=True)
    segments.append({"start_step": start, "micro": micro, "accum": accum,
                     "resumed_from": args.resume_from_checkpoint})
    model = DDP(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    for step in range(start + 1, args.max_steps + 1):
        inner.step = step
        try:
            for micro_step in range(accum):
                x, y = torch.randn(micro, 16), torch.randn(micro, 1)
                loss = nn.functional.mse_loss(model(x), y) / accum
                if micro_step < accum - 1:
                    with model.no_sync():
                        loss.backward()
                else:
                    loss.backward()  # the gradient all-reduce happens here
        except torch.OutOfMemoryError:
            if not args.hang_after_oom:
                raise
            traceback.print_exc()
            sys.stderr.flush()
            hang()
        except RuntimeError:
            if not args.peer_hangs:
                raise
            hang()  # NCCL: blocked in the collective, silent
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step}/{args.max_steps} micro={micro} accum={accum} world={world} "
                  f"global_batch={global_batch} loss={loss.item() * accum:.4f}", flush=True)
            if args.save_steps and step % args.save_steps == 0:
                save(args, step, inner, segments)
        if args.save_steps and step % args.save_steps == 0:
            dist.barrier()  # the checkpoint is whole before any rank goes on

    os.makedirs(args.output_dir, exist_ok=True)
    name = "final.json" if rank == 0 else f"final-rank{rank}.json"
    with open(os.path.join(args.output_dir, name), "w") as f:
        json.dump({"micro": micro, "accum": accum, "world": world, "global_batch": global_batch,
                   "steps": args.max_steps, "attempts": segments}, f)
    if rank == 0:
        print(f"training finished: global_batch={global_batch}", flush=True)
    dist.destroy_process_group()
    # PyTorch's teardown at interpreter exit can abort a finished rank ("terminate
    # called without an active exception", SIGABRT: a c10d background thread destroyed
    # while joinable; seen under load with gloo). Training is over and every file is
    # written: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
