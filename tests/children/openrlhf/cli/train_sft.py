"""An OpenRLHF SFT run as oomguard meets it (`openrlhf/cli/train_sft.py`, run by path):
OpenRLHF's argparse options for what oomguard reads and changes, in the dotted spelling
of 2026 (`--train.micro_batch_size`) or the one before (`--micro_train_batch_size`),
with OpenRLHF's defaults and store_true switches. Accumulation is the global batch over
micro-batch x world size, as OpenRLHF's strategy computes it. Every `--ckpt.save_steps`
optimizer steps it saves a DeepSpeed checkpoint (`<ckpt.path>/global_stepN/` then
`latest`); with `--ckpt.load_enable` it loads the one `latest` names and goes on from
its step. At step `--oom_at_step` (the batch of the longest samples), a micro-batch
above 1 without checkpointing dies of an OOM as PyTorch's caching allocator reports
it: the one allocation that failed and the memory in use."""
import argparse
import json
import os
import sys


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

p = argparse.ArgumentParser()
p.add_argument("--train.micro_batch_size", "--micro_train_batch_size", dest="micro", type=int,
               default=8)
p.add_argument("--train.batch_size", "--train_batch_size", dest="batch", type=int, default=128)
p.add_argument("--data.max_len", "--max_len", dest="max_len", type=int, default=2048)
p.add_argument("--model.gradient_checkpointing_enable", "--gradient_checkpointing",
               dest="checkpointing", action="store_true", default=False)
p.add_argument("--ds.zero_stage", "--zero_stage", dest="zero_stage", type=int, default=2)
p.add_argument("--ds.adam_offload", "--adam_offload", dest="adam_offload", action="store_true")
p.add_argument("--ckpt.path", "--ckpt_path", dest="ckpt_path",
               default="./ckpt/checkpoints_sft")
p.add_argument("--ckpt.save_steps", "--save_steps", dest="save_steps", type=int, default=-1)
p.add_argument("--ckpt.load_enable", "--load_checkpoint", dest="load", action="store_true",
               default=False)
p.add_argument("--train.max_steps", dest="max_steps", type=int, default=6)
p.add_argument("--oom_at_step", type=int, default=3)
args = p.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
accum = args.batch // (args.micro * world)
print(f"micro {args.micro}, accumulation {accum}, global batch {args.micro * accum * world}",
      flush=True)

step = 0
if args.load and os.path.exists(args.ckpt_path):
    with open(os.path.join(args.ckpt_path, "latest")) as f:
        tag = f.read().strip()
    with open(os.path.join(args.ckpt_path, tag, "client_state.json")) as f:
        state = json.load(f)
    step = state["global_step"]
    print(f"Loaded the checkpoint: {os.path.join(args.ckpt_path, tag)}, consumed_samples: "
          f"{state['consumed_samples']}", flush=True)

while step < args.max_steps:
    step += 1
    if step == args.oom_at_step and args.micro > 1 and not args.checkpointing:
        # One layer's activations for this micro-batch fail; what is in use grows with it.
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {args.micro / 2:.2f} GiB. GPU 0 has a "
            f"total capacity of 79.19 GiB of which 612.00 MiB is free. Including non-PyTorch "
            f"memory, this process has 78.58 GiB memory in use. Of the allocated memory "
            f"{70 + args.micro:.2f} GiB is allocated by PyTorch, and 1.86 GiB is reserved by "
            f"PyTorch but unallocated.")
    print(f"Train step of epoch 0: global_step {step}, loss {1.0 / step:.4f}", flush=True)
    if args.save_steps > 0 and step % args.save_steps == 0:
        tag = f"global_step{step}"
        d = os.path.join(args.ckpt_path, tag)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "mp_rank_00_model_states.pt"), "wb") as f:
            f.write(b"weights" * 64)
        with open(os.path.join(d, "client_state.json"), "w") as f:
            json.dump({"global_step": step, "consumed_samples": step * args.batch}, f)
        with open(os.path.join(args.ckpt_path, "latest"), "w") as f:
            f.write(tag)
print("training done", flush=True)
sys.exit(0)
