#!/usr/bin/env python3
"""Prints `ready (pid: N)`, then every signal it receives; exits 143 on SIGTERM.

Like dumb-init's tests/lib/print_signals.py. Used to check what oomguard forwards.
"""
import os
import signal
import sys
import time

CATCH = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD)]


def handler(signum, _frame):
    print(f"received {signal.Signals(signum).name} ({signum})", flush=True)
    if signum == signal.SIGTERM:
        sys.exit(143)


for s in CATCH:
    try:
        signal.signal(s, handler)
    except (OSError, RuntimeError, ValueError):
        pass

print(f"ready (pid: {os.getpid()})", flush=True)
while True:
    time.sleep(3600)
