"""A training script of transformers 5's example shape, without transformers: as the
run_clm.py lineage does, it resumes by itself from `get_last_checkpoint(output_dir)` --
the highest-numbered `checkpoint-N`, whole or not -- unless `--resume_from_checkpoint`
names one; transformers 5 has no flag that turns that search off.
Every `--save_steps` steps it saves a Hugging Face checkpoint (`checkpoint-N/`:
`model.safetensors`, then `trainer_state.json`). With `--save_oom_once MARKER`, the first
save of a run (no MARKER file yet) dies of an OOM after the weights are written, as a save
does when fragmentation leaves no block for the gathered state dict (a retry at the same
settings fits), and as PyTorch reports it: the one allocation that failed and the memory
in use. Loading a checkpoint without `trainer_state.json` fails as the Trainer's resume
does."""
import argparse
import json
import os
import re
import struct
import sys


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

_re_checkpoint = re.compile(r"^checkpoint\-(\d+)$")


def get_last_checkpoint(folder):
    content = os.listdir(folder)
    checkpoints = [p for p in content
                   if _re_checkpoint.search(p) is not None and os.path.isdir(os.path.join(folder, p))]
    if not checkpoints:
        return None
    return os.path.join(folder, max(checkpoints, key=lambda x: int(_re_checkpoint.search(x).groups()[0])))


def _save_checkpoint(output_dir, step, micro, marker):
    ckpt = os.path.join(output_dir, f"checkpoint-{step}")
    os.makedirs(ckpt, exist_ok=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with open(os.path.join(ckpt, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {0.5 * micro:.2f} GiB. GPU 0 has a total "
            f"capacity of 79.19 GiB of which 412.00 MiB is free. Including non-PyTorch memory, "
            f"this process has 78.78 GiB memory in use. Of the allocated memory "
            f"{60 + micro:.2f} GiB is allocated by PyTorch, and 2.10 GiB is reserved by PyTorch "
            f"but unallocated.")
    with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "log_history": []}, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--save_steps", type=int, default=2)
    p.add_argument("--max_steps", type=int, default=5)
    p.add_argument("--save_oom_once", default=None)
    args = p.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    checkpoint = args.resume_from_checkpoint or get_last_checkpoint(args.output_dir)
    step = 0
    if checkpoint is not None:
        state = os.path.join(checkpoint, "trainer_state.json")
        if not os.path.isfile(state):
            raise ValueError(f"Can't find a valid checkpoint at {checkpoint}")
        with open(state) as f:
            step = json.load(f)["global_step"]
        print(f"Continuing training from checkpoint {checkpoint}, global step {step}", flush=True)
    micro = args.per_device_train_batch_size
    print(f"micro {micro}, accumulation {args.gradient_accumulation_steps}", flush=True)
    while step < args.max_steps:
        step += 1
        print(f"{{'loss': {1.0 / step:.4f}, 'step': {step}}}", flush=True)
        if step % args.save_steps == 0:
            print(f"Saving model checkpoint to {args.output_dir}/checkpoint-{step}", flush=True)
            _save_checkpoint(args.output_dir, step, micro, args.save_oom_once)
    print("training done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
