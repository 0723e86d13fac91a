#!/usr/bin/env python3
"""For the nohup test: reports how SIGHUP, SIGINT and SIGQUIT are disposed, writes
`argv[1]/ready` holding its parent's pid (oomguard's), then waits for `argv[1]/go`
and exits 0. A SIGHUP at its default would end it with 129 before `go` appears."""
import os
import signal
import sys
import time

folder = sys.argv[1]


def disposition(sig):
    h = signal.getsignal(sig)
    return "ignored" if h == signal.SIG_IGN else "default" if h == signal.SIG_DFL else "handled"


print(
    "dispositions: "
    + " ".join(f"{s.name}={disposition(s)}" for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)),
    flush=True,
)
with open(os.path.join(folder, "ready.tmp"), "w") as f:
    f.write(str(os.getppid()))
os.rename(os.path.join(folder, "ready.tmp"), os.path.join(folder, "ready"))
for _ in range(1200):
    if os.path.exists(os.path.join(folder, "go")):
        print("training finished after the hangup", flush=True)
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
