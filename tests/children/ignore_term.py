#!/usr/bin/env python3
"""Ignores SIGTERM and forks a grandchild that ignores it too; both sleep.

Writes the grandchild's pid to the file named by argv[1] (if given) and prints
`ready (pid: N, grandchild: M)`. Only SIGKILL ends them.
"""
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    while True:
        time.sleep(3600)
if len(sys.argv) > 1:
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{pid}\n")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print(f"ready (pid: {os.getpid()}, grandchild: {pid})", flush=True)
while True:
    time.sleep(3600)
