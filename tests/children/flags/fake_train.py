"""The training the flag programs run: one step at `micro` samples needs more than the
4 GiB budget above 4 samples, unless gradient checkpointing is on (activations are
recomputed, a quarter of them stored). Above it, it raises an OOM as PyTorch's caching
allocator does: `torch.OutOfMemoryError` naming the one allocation that failed and the
memory in use (a stand-in class, so that no torch import is needed). Each step prints
`step N: loss ... (micro M, accumulation A, checkpointing C)`."""
import json
import os
import struct
import sys


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

GIB = 1 << 30
BUDGET = 4 * GIB
IN_USE = 2 * GIB  # weights, gradients, optimizer state
PER_SAMPLE = 512 << 20  # activations of one sample


def train(micro, accum=1, checkpointing=False, steps=2):
    micro, accum = int(micro), int(accum)
    print(f"training: micro {micro}, accumulation {accum}, checkpointing {checkpointing}",
          flush=True)
    need = micro * PER_SAMPLE // (4 if checkpointing else 1)
    if IN_USE + need > BUDGET:
        tried = need // 4  # one layer's activations: the allocation that fails
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a total "
            f"capacity of {BUDGET / GIB:.2f} GiB of which 1.00 GiB is free. Including non-PyTorch "
            f"memory, this process has {(BUDGET - GIB) / GIB:.2f} GiB memory in use. Of the "
            f"allocated memory {IN_USE / GIB:.2f} GiB is allocated by PyTorch, and 20.00 MiB is "
            f"reserved by PyTorch but unallocated.")
    for step in range(1, steps + 1):
        print(f"step {step}: loss {1.0 / step:.3f} (global batch {micro * accum})", flush=True)
    sys.stdout.flush()


def write_checkpoint(output_dir, step=10):
    """A complete Hugging Face checkpoint, output_dir/checkpoint-STEP (safetensors weights
    and trainer_state.json), as a run that got that far would have written."""
    ckpt = os.path.join(output_dir, f"checkpoint-{step}")
    os.makedirs(ckpt, exist_ok=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with open(os.path.join(ckpt, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "log_history": []}, f)
