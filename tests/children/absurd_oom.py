#!/usr/bin/env python3
"""Dies of an absurd allocation request, as a CUDA extension built for another GPU makes
one: a traceback ending in `torch.OutOfMemoryError` for 131062.02 GiB on a 44.53 GiB GPU.

argv[1]: `exit` to exit 1 (as an uncaught exception does), `hang` to print the traceback
and then sleep for ever without output; `thrust` to die as gaussian-splatting#961 did at
scene setup (simple-knn built for another GPU): thrust's `MemoryError: std::bad_alloc:
cudaErrorMemoryAllocation: out of memory`, no size printed, exit 1; `thrust-after-steps`
to print three training steps first and die so only at `--per_device_train_batch_size 8`
(finishing at any other). Other flags are ignored (they carry the knobs).
"""
import sys
import time
import traceback

if sys.argv[1] in ("thrust", "thrust-after-steps"):
    if sys.argv[1] == "thrust-after-steps":
        # As jac99/MinkLoc3Dv2#3: the same words after training had run (real memory
        # pressure); only at micro-batch 8: the relaunch at a smaller one finishes.
        batch = sys.argv[sys.argv.index("--per_device_train_batch_size") + 1]
        for step in range(1, 4):
            print(f"step {step} loss 0.9", flush=True)
        if batch != "8":
            print(f"done at micro-batch {batch}", flush=True)
            sys.exit(0)
    sys.stderr.write(
        "Traceback (most recent call last):\n"
        '  File "train.py", line 35, in training\n'
        "    scene = Scene(dataset, gaussians)\n"
        '  File "scene/gaussian_model.py", line 134, in create_from_pcd\n'
        "    dist2 = torch.clamp_min(distCUDA2(torch.from_numpy(np.asarray(pcd.points))"
        ".float().cuda()), 0.0000001)\n"
        "MemoryError: std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n"
    )
    sys.exit(1)


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

print("step 1 loss 0.91", flush=True)
error = OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 131062.02 GiB. GPU 0 has a total capacity of "
    "44.53 GiB of which 40.12 GiB is free. Of the allocated memory 1.20 GiB is allocated "
    "by PyTorch, and 0.10 GiB is reserved by PyTorch but unallocated."
)
if sys.argv[1] == "hang":
    try:
        raise error
    except RuntimeError:
        traceback.print_exc()
        sys.stderr.flush()
    while True:
        time.sleep(3600)
raise error
