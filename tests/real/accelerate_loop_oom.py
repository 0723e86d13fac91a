#!/usr/bin/env python3
"""A training loop written on a real `accelerate.Accelerator`, the way diffusers'
training examples and transformers' `*_no_trainer.py` examples are: its own argparse
parser (`--train_batch_size`, whose help says it is per device), accumulation through
`accelerator.accumulate`, checkpoints with `accelerator.save_state` into
`output_dir/checkpoint-N` (diffusers) or `output_dir/step_N` (`--checkpoint_prefix step_`,
the no_trainer examples), resumed with `--resume_from_checkpoint PATH|latest` as they do
(the step from the folder's name, the batches already seen skipped).

While the micro-batch exceeds --budget, the optimizer step --oom_at_step dies of a real
torch.OutOfMemoryError whose message names the one allocation that failed, as PyTorch's
does. Each launch appends what it ran with and where it resumed to --report; the last
writes output_dir/final.json.
"""
import argparse
import json
import logging
import os

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger

logger = get_logger(__name__)


def parse_args():
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    parser.add_argument(
        "--train_batch_size", type=int, default=16, help="Batch size (per device) for the training dataloader."
    )
    parser.add_argument(
        "--gradient_accumulation_steps",
        type=int,
        default=1,
        help="Number of updates steps to accumulate before performing a backward/update pass.",
    )
    parser.add_argument(
        "--gradient_checkpointing",
        action="store_true",
        help="Whether or not to use gradient checkpointing to save memory at the expense of slower backward pass.",
    )
    parser.add_argument("--max_train_steps", type=int, default=6)
    parser.add_argument("--checkpointing_steps", type=int, default=2)
    parser.add_argument("--checkpoint_prefix", default="checkpoint-", help="checkpoint- or step_")
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--budget", type=int, required=True, help="the largest micro-batch that fits")
    parser.add_argument("--oom_at_step", type=int, default=3)
    parser.add_argument("--report", required=True)
    return parser.parse_args()


def oom_message(samples):
    gib = 1024 ** 3
    tried = samples * 96 * 1024 ** 2
    return (f"CUDA out of memory. Tried to allocate {tried / gib:.2f} GiB. GPU 0 has a total capacity of "
            f"23.65 GiB of which {0.31:.2f} GiB is free. Including non-PyTorch memory, this process has "
            f"23.33 GiB memory in use. Of the allocated memory 22.71 GiB is allocated by PyTorch, and "
            f"402.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
            f"large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def main():
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=args.train_batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    global_step, resumed = 0, None
    if args.resume_from_checkpoint:
        if args.resume_from_checkpoint != "latest":
            path = os.path.basename(args.resume_from_checkpoint)
        else:
            dirs = [d for d in os.listdir(args.output_dir) if d.startswith(args.checkpoint_prefix)]
            dirs.sort(key=lambda d: int(d[len(args.checkpoint_prefix):]))
            path = dirs[-1] if dirs else None
        if path is not None:
            accelerator.print(f"Resuming from checkpoint {path}")
            accelerator.load_state(os.path.join(args.output_dir, path))
            global_step = resumed = int(path[len(args.checkpoint_prefix):])
    with open(args.report, "a") as f:
        f.write(json.dumps({"micro": args.train_batch_size, "accum": args.gradient_accumulation_steps,
                            "resumed": resumed}) + "\n")

    # The batches the resumed steps have seen, at this launch's micro-batch and accumulation.
    skip = global_step * args.gradient_accumulation_steps
    seen = 0
    for x, y in accelerator.skip_first_batches(loader, skip) if skip else loader:
        with accelerator.accumulate(model):
            if global_step + 1 >= args.oom_at_step and args.train_batch_size > args.budget:
                raise torch.OutOfMemoryError(oom_message(args.train_batch_size))
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += x.shape[0]
        if accelerator.sync_gradients:
            global_step += 1
            accelerator.print(f"step {global_step}: loss {loss.item():.4f}")
            if global_step % args.checkpointing_steps == 0:
                save_path = os.path.join(args.output_dir, f"{args.checkpoint_prefix}{global_step}")
                accelerator.save_state(save_path)
                logger.info(f"Saved state to {save_path}")
            if global_step >= args.max_train_steps:
                break
    # A validation pass, as the examples run one (`model.eval()` is no builtin eval: the
    # parser above is still read whole).
    model.eval()
    with torch.no_grad():
        val = torch.nn.functional.mse_loss(model(data.tensors[0][:64]), data.tensors[1][:64]).item()
    accelerator.print(f"validation loss {val:.4f}")
    with open(os.path.join(args.output_dir, "final.json"), "w") as f:
        json.dump({"micro": args.train_batch_size, "accum": args.gradient_accumulation_steps,
                   "global_step": global_step, "samples_per_step": args.train_batch_size
                   * args.gradient_accumulation_steps}, f)
    accelerator.print("training finished")


if __name__ == "__main__":
    main()
