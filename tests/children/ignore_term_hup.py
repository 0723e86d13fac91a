#!/usr/bin/env python3
"""Ignores SIGTERM and SIGHUP (prints each) and forks a grandchild that ignores them too.

Prints `ready child=PID grandchild=PID`. Only SIGKILL ends them: what a training script
stuck in a collective, or one that traps SIGTERM to save and never finishes, looks like."""
import os
import signal
import time


def noted(signum, _frame):
    os.write(1, f"{os.getpid()} ignored {signal.Signals(signum).name}\n".encode())


for s in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, noted)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"x")
    while True:
        time.sleep(3600)
os.read(r, 1)
print(f"ready child={os.getpid()} grandchild={pid}", flush=True)
while True:
    time.sleep(3600)
