#!/usr/bin/env python3
"""A healthy run that merely mentions an OOM: it logs a config line containing the words
"CUDA out of memory" (and a warning of a caught one), is quiet for argv[1] seconds (a save,
an eval), then prints `finished` and exits 0."""
import sys
import time

quiet = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
print("config: {'on_error': 'retry', 'oom_message': 'CUDA out of memory'}", flush=True)
sys.stderr.write("WARNING: caught CUDA out of memory, retrying with batch size 16\n")
sys.stderr.flush()
print("step 1 loss 0.91", flush=True)
time.sleep(quiet)
print("finished", flush=True)
