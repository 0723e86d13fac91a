#!/usr/bin/env python3
"""Starts a tree: this process, N children, each with one grandchild; all sleep.

argv[1]: file to write every pid of the tree to (one a line, written atomically once all
are started). argv[2] (optional) may contain "setsid", to put each child in a new session
as torchrun does with its workers (start_new_session=True), and "exit", to exit right after
writing the file, leaving the rest of the tree behind (e.g. "setsid-exit").
"""
import os
import sys
import time

out = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else ""
r, w = os.pipe()
pids = [os.getpid()]
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if "setsid" in mode:
            os.setsid()
        gpid = os.fork()
        if gpid == 0:
            os.write(w, f"{os.getpid()}\n".encode())
            while True:
                time.sleep(3600)
        os.write(w, f"{os.getpid()}\n".encode())
        while True:
            time.sleep(3600)
    pids.append(pid)
os.close(w)
got = []
buf = b""
while len(got) < 4:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    buf += chunk
    got = buf.split()
with open(out + ".tmp", "w") as f:
    for p in pids + [int(x) for x in got if int(x) not in pids]:
        f.write(f"{p}\n")
os.rename(out + ".tmp", out)
print("tree ready", flush=True)
if "exit" in mode:
    sys.exit(0)
while True:
    time.sleep(3600)
