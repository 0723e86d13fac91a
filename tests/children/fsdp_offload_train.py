"""A Hugging Face Trainer script under FSDP whose model states do not fit one GPU
unless FSDP offloads them to the CPU. It parses the real `TrainingArguments`
(`HfArgumentParser`), so the `--fsdp` words oomguard writes are the ones transformers
accepts, and reads the offload where FSDP would take it from: `args.fsdp_config
["cpu_offload"]` for `--fsdp "full_shard auto_wrap offload"`, or, under `accelerate
launch` with an FSDP config, the FSDP_OFFLOAD_PARAMS that accelerate sets from its
`fsdp_offload_params`.

Memory per GPU: 3.9 GiB of weights, gradients and optimizer state (0.4 GiB offloaded)
plus 512 MiB of activations per sample (a quarter with gradient checkpointing), on a
4 GiB GPU. Above it, it raises an OOM as PyTorch's caching allocator does, naming the
one allocation that failed (a stand-in class, so that no torch import is needed)."""
import os
import sys

from transformers import HfArgumentParser, TrainingArguments


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"

GIB = 1 << 30
BUDGET = 4 * GIB
STATES = int(3.9 * GIB)
STATES_OFFLOADED = int(0.4 * GIB)
PER_SAMPLE = 512 << 20

(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
if os.environ.get("ACCELERATE_USE_FSDP") == "true":
    offload = os.environ.get("FSDP_OFFLOAD_PARAMS") == "true"
    how = f"accelerate FSDP_OFFLOAD_PARAMS={os.environ.get('FSDP_OFFLOAD_PARAMS')}"
else:
    offload = bool(args.fsdp) and bool(args.fsdp_config.get("cpu_offload"))
    how = f"TrainingArguments fsdp={args.fsdp!r} cpu_offload={offload}"
micro = args.per_device_train_batch_size
checkpointing = args.gradient_checkpointing
print(f"training: micro {micro}, accumulation {args.gradient_accumulation_steps}, "
      f"checkpointing {checkpointing}, offload {offload} ({how})", flush=True)
states = STATES_OFFLOADED if offload else STATES
need = micro * PER_SAMPLE // (4 if checkpointing else 1)
if states + need > BUDGET:
    tried = max(need // 4, 64 << 20)
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a total "
        f"capacity of {BUDGET / GIB:.2f} GiB of which {max(BUDGET - states, 0) / GIB / 8:.2f} GiB "
        f"is free. Including non-PyTorch memory, this process has {states / GIB:.2f} GiB memory "
        f"in use. Of the allocated memory {states / GIB:.2f} GiB is allocated by PyTorch, and "
        f"20.00 MiB is reserved by PyTorch but unallocated.")
for step in range(1, 3):
    print(f"step {step}: loss {1.0 / step:.3f}", flush=True)
sys.stdout.flush()
