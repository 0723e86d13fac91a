#!/usr/bin/env python3
"""Runs out of memory inside a memory cgroup, so that the kernel's OOM killer kills it.

argv[1]: the cgroup's process list (`cgroup.procs`); argv[2]: "self" or "worker".

- self: moves itself into the cgroup, says "allocating (pid: N)", loads for a second (as
  a worker reads its data first), then allocates and touches memory in 4 MiB steps
  until the kernel kills it (it never gets to say more).
- worker: starts a worker doing "self" and waits for it; when the worker was killed it
  exits 1 without a word, as a launcher that does not report its workers would.
"""
import os
import subprocess
import sys
import time

procs, mode = sys.argv[1], sys.argv[2]
if mode == "self":
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
    print(f"allocating (pid: {os.getpid()})", flush=True)
    time.sleep(1)
    held = []
    for _ in range(4096):  # 16 GiB at most: far past any test's limit
        held.append(bytearray(4 << 20))
    print("the limit was never reached", flush=True)
    sys.exit(3)
worker = subprocess.Popen([sys.executable, __file__, procs, "self"])
sys.exit(0 if worker.wait() == 0 else 1)
