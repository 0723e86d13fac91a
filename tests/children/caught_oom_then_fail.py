#!/usr/bin/env python3
"""Catches its own OOM and goes on, then fails of something else.

Prints a traceback-less "caught ... OutOfMemoryError ... retrying" line (as Composer,
Lightning's batch-size finder and HF's auto_find_batch_size do when they catch an OOM and
go on), a few training-progress lines, then a ValueError traceback, and exits 3."""
import sys

sys.stderr.write(
    "caught torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free; "
    "retrying with batch size 4\n"
)
sys.stderr.flush()
for step in range(1, 4):
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
sys.stderr.write(
    "Traceback (most recent call last):\n"
    '  File "train.py", line 12, in <module>\n'
    "    check(labels)\n"
    "ValueError: label 7 is out of range\n"
)
sys.stderr.flush()
sys.exit(3)
