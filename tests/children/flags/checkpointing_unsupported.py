"""A plain argparse script whose model cannot take gradient checkpointing: given
--gradient_checkpointing it fails at start-up, before any step, as transformers does
("ValueError: GPT2Model does not support gradient checkpointing."). At micro-batch 1
and --max_seq_length above 512 it trains steps 1 and 2, then dies at step 3 of an OOM
worded as PyTorch's (one allocation, the memory in use); with --oom_at_first_step it dies
in its first step instead, printing no step, its traceback running through
training_step; with --oom_before_training, before it (no step, no training frame)."""
import argparse
import sys


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

parser = argparse.ArgumentParser(description="train")
parser.add_argument("--per_device_train_batch_size", type=int, default=1)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--max_seq_length", type=int, default=1024)
parser.add_argument("--gradient_checkpointing", action="store_true")
parser.add_argument("--output_dir", default="out")
parser.add_argument("--oom_at_first_step", action="store_true")
parser.add_argument("--oom_before_training", action="store_true")
args = parser.parse_args()
print(f"training: micro {args.per_device_train_batch_size}, seq {args.max_seq_length}, "
      f"checkpointing {args.gradient_checkpointing}", flush=True)
if args.gradient_checkpointing:
    raise ValueError("GPT2Model does not support gradient checkpointing.")


def oom():
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
        "23.65 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
        "has 22.58 GiB memory in use. Of the allocated memory 21.90 GiB is allocated by "
        "PyTorch, and 180.00 MiB is reserved by PyTorch but unallocated.")


def training_step(step):
    first = 1 if args.oom_at_first_step else 3
    if step == first and args.per_device_train_batch_size * args.max_seq_length > 512:
        raise oom()
    print(f"step {step}: loss {1.0 / step:.3f}", flush=True)


if args.oom_before_training and args.per_device_train_batch_size * args.max_seq_length > 512:
    raise oom()


for step in range(1, 5):
    training_step(step)
sys.exit(0)
