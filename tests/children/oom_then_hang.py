#!/usr/bin/env python3
"""Prints a PyTorch 2.x CUDA OOM line (like a rank whose peers then wait in NCCL), then
sleeps for ever without printing."""
import os
import sys
import time

print(f"ready (pid: {os.getpid()})", flush=True)
sys.stderr.write(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. "
    "Including non-PyTorch memory, this process has 78.08 GiB memory in use. "
    "Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.32 GiB is reserved "
    "by PyTorch but unallocated.\n"
)
sys.stderr.flush()
while True:
    time.sleep(3600)
