#!/usr/bin/env python3
"""Dies of an uncaught CUDA OOM, as Python prints it: a traceback ending in the exception line.

argv[1]: `torch` raises a class printed as `torch.OutOfMemoryError` (torch >= 2.1),
`runtime` a `RuntimeError: CUDA out of memory` (older torch).
argv[2]: `exit` to exit 1 (as an uncaught exception does), `hang` to print the traceback
and then sleep for ever without output (a rank whose peers wait in NCCL).
argv[3] (optional): a flag file; when it exists, print `finished` and exit 0 instead; the
first run creates it. Flags after it are ignored (they carry the knobs).
A line longer than 64 KiB precedes the traceback when OOMGUARD_TEST_LONG_LINE is set."""
import os
import sys
import time
import traceback


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

kind, mode = sys.argv[1], sys.argv[2]
flag = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("-") else None
if flag and os.path.exists(flag):
    print("finished", flush=True)
    sys.exit(0)
if flag:
    open(flag, "w").close()
print(f"ready (pid: {os.getpid()})", flush=True)
print("step 1 loss 0.91", flush=True)
message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
           "has 78.08 GiB memory in use.")
if os.environ.get("OOMGUARD_TEST_LONG_LINE"):
    # One 100 KB line (a logged tensor, a progress dump) ending in the OOM message.
    sys.stderr.write("x" * 100_000 + " torch.OutOfMemoryError: " + message + "\n")
    sys.stderr.flush()
    sys.exit(1)
error = OutOfMemoryError(message) if kind == "torch" else RuntimeError(message)
if mode == "hang":
    try:
        raise error
    except RuntimeError:
        traceback.print_exc()
        sys.stderr.flush()
    while True:
        time.sleep(3600)
raise error
