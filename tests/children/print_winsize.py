#!/usr/bin/env python3
"""Prints `ready isatty=B size=COLSxROWS` (and creates the file argv[1], if given), then, on
the first SIGWINCH (or after 10 s), the new size as `winch size=COLSxROWS`, and exits."""
import os
import signal
import sys
import time

got = []
signal.signal(signal.SIGWINCH, lambda *_: got.append(os.get_terminal_size()))
s = os.get_terminal_size()
print(f"ready isatty={sys.stdout.isatty()} size={s.columns}x{s.lines}", flush=True)
if len(sys.argv) > 1:
    open(sys.argv[1], "w").close()
deadline = time.time() + 10
while not got and time.time() < deadline:
    time.sleep(0.02)
if got:
    print(f"winch size={got[0].columns}x{got[0].lines}", flush=True)
else:
    print("no winch", flush=True)
