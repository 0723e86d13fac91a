#!/usr/bin/env python3
"""An allocator-faithful simulated trainer for the sizing benchmark (and tests).

It reads what a Hugging Face Trainer script would (--model_name_or_path's
config.json, --deepspeed's ZeRO stage and offload, the batch, accumulation,
sequence and checkpointing flags), and allocates its memory the way PyTorch
does: weights, gradients and optimizer states tensor by tensor, then each
layer's activations in the forward pass, then the logits. The first allocation
that does not fit raises an OOM whose message, like PyTorch's, names only that
one allocation (not the whole deficit), what is free, and what this process has
in use. Otherwise it trains --max_steps steps and exits 0.

The true activation size differs from oomguard's model by SIM_ACT_FACTOR (the
benchmark draws it per scenario and never tells oomguard). SIM_GPU_GIB is the
GPU's memory, SIM_WORLD the world size (the benchmark's torchrun stand-in sets
it), SIM_RESULT a file where the settings of every attempt are appended as JSON.

SIM_SPIKE_STEPS=K makes the run's batches uneven, as real data is: its first K
steps see typical batches, SIM_TYPICAL (0.6) of --max_seq_length long, and step
K+1 the longest one. A run whose typical batch does not fit dies at step 1 (a
steady overflow); one whose longest batch alone does not fit dies after K good
steps ("step N/M" lines printed), of the longest batch's OOM (a spike).
"""

import argparse
import json
import os
import sys

GIB, MIB = 1024 ** 3, 1024 ** 2
CONTEXT = 500 * MIB


def str2bool(v):
    return str(v).lower() in ("1", "true", "yes", "on")


def params_of(cfg):
    h = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    inter = cfg.get("intermediate_size", 4 * h)
    vocab = cfg.get("vocab_size", 32000)
    heads = cfg.get("num_attention_heads", max(1, h // 128))
    kv = cfg.get("num_key_value_heads", heads)
    gated = inter < 4 * h * 0.99 or cfg.get("hidden_act") == "silu"
    attn = 2 * h * h + 2 * h * kv * (h / heads)
    mlp = (3 if gated else 2) * h * inter
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * (attn + mlp) + embed, h, layers, inter, vocab


def fmt(n):
    if n < GIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


def allocations(a, cfg, ds, world, seq=None):
    """The tensors this rank allocates, in order: (what, bytes), for batches of
    `seq` tokens (default: --max_seq_length)."""
    p, h, layers, inter, vocab = params_of(cfg)
    zero = ds.get("zero_optimization", {}) if ds else {}
    stage = int(zero.get("stage", 0)) if ds else 0
    off_opt = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    off_par = (zero.get("offload_param") or {}).get("device", "none") not in ("none", None)
    n = world
    per_layer = p / layers
    out = []
    for i in range(layers):
        w = 2 * per_layer / (n if stage >= 3 else 1)
        if not off_par:
            out.append((f"layer {i} weights", w))
    if off_par:
        out.append(("gathered weights", 4 * per_layer))
    for i in range(layers):
        out.append((f"layer {i} gradients", 2 * per_layer / (n if stage >= 2 else 1)))
    if not off_opt:
        for i in range(layers):
            out.append((f"layer {i} optimizer states", 12 * per_layer / (n if stage >= 1 else 1)))
    factor = float(os.environ.get("SIM_ACT_FACTOR", "1.0"))
    tokens = a.per_device_train_batch_size * (seq or a.max_seq_length)
    # The per-layer and logits figures measured for a Hugging Face Trainer with --bf16 on
    # an H100 (docs/internals/memory-model.md, "Measured on a GPU"); SIM_ACT_FACTOR is what a run deviates by.
    act = 1.9 * (16 * h + 4.5 * inter) * tokens * factor
    if a.gradient_checkpointing:
        for i in range(layers):
            out.append((f"layer {i} checkpoint", 2 * h * tokens * factor))
        out.append(("recomputed layer", act))
    else:
        for i in range(layers):
            out.append((f"layer {i} activations", act))
    out.append(("logits", 14 * vocab * tokens))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model_name_or_path", required=True)
    ap.add_argument("--per_device_train_batch_size", type=int, default=8)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=1)
    ap.add_argument("--max_seq_length", type=int, default=2048)
    ap.add_argument("--gradient_checkpointing", type=str2bool, nargs="?", const=True, default=False)
    ap.add_argument("--deepspeed", default=None)
    ap.add_argument("--output_dir", default=None)
    ap.add_argument("--resume_from_checkpoint", default=None)
    ap.add_argument("--max_steps", type=int, default=3)
    a = ap.parse_args()
    with open(os.path.join(a.model_name_or_path, "config.json")) as f:
        cfg = json.load(f)
    ds = None
    if a.deepspeed:
        with open(a.deepspeed) as f:
            ds = json.load(f)
    world = int(os.environ.get("SIM_WORLD", "1"))
    total = float(os.environ.get("SIM_GPU_GIB", "24")) * GIB
    zero = (ds or {}).get("zero_optimization", {})
    settings = {
        "micro_batch": a.per_device_train_batch_size,
        "grad_accum": a.gradient_accumulation_steps,
        "seq_len": a.max_seq_length,
        "grad_checkpointing": a.gradient_checkpointing,
        "zero_stage": int(zero.get("stage", 0)) if ds else None,
        "offload_optimizer": (zero.get("offload_optimizer") or {}).get("device") if ds else None,
        "offload_param": (zero.get("offload_param") or {}).get("device") if ds else None,
    }
    if os.environ.get("SIM_HOST_OOM_ON_CPU_OFFLOAD") and "cpu" in (
        settings["offload_optimizer"], settings["offload_param"]
    ):
        # The host has no room for the offloaded states.
        if os.environ.get("SIM_RESULT"):
            with open(os.environ["SIM_RESULT"], "a") as f:
                f.write(json.dumps({"settings": settings, "oom": "host"}) + "\n")
        print("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
              "26843545600 bytes. Error code 12 (Cannot allocate memory)", file=sys.stderr)
        sys.exit(1)
    def first_failure(seq=None):
        """The first allocation that does not fit, and what is in use then."""
        in_use = 0.0
        for what, size in allocations(a, cfg, ds, world, seq):
            # The caching allocator rounds to 2 MiB blocks.
            size = max(2 * MIB, -(-size // (2 * MIB)) * (2 * MIB))
            if CONTEXT + in_use + size > total:
                return (what, size), in_use
            in_use += size
        return None, in_use

    spike_steps = int(os.environ.get("SIM_SPIKE_STEPS", "0"))
    good = 0
    if spike_steps:
        typical = max(1, int(a.max_seq_length * float(os.environ.get("SIM_TYPICAL", "0.6"))))
        failed, in_use = first_failure(typical)
        if not failed:
            for step in range(1, spike_steps + 1):
                print(f"step {step}/{a.max_steps} loss 1.0", flush=True)
            good = spike_steps
            failed, in_use = first_failure()
    else:
        failed, in_use = first_failure()
    if os.environ.get("SIM_RESULT"):
        with open(os.environ["SIM_RESULT"], "a") as f:
            f.write(json.dumps({"settings": settings, "oom": failed is not None,
                                "good_steps": good}) + "\n")
    if failed:
        what, size = failed
        free = max(0.0, total - CONTEXT - in_use)
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "train.py", line 1, in <module>', file=sys.stderr)
        print(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {fmt(size)}. "
            f"GPU 0 has a total capacity of {fmt(total)} of which {fmt(free)} is free. "
            f"Including non-PyTorch memory, this process has {fmt(in_use + CONTEXT)} memory in use. "
            f"Of the allocated memory {fmt(in_use)} is allocated by PyTorch, and 0 bytes is reserved "
            f"by PyTorch but unallocated. ({what})",
            file=sys.stderr,
        )
        sys.exit(1)
    for step in range(good + 1, max(a.max_steps, good + 1) + 1):
        print(f"step {step}/{a.max_steps} loss 1.0", flush=True)


if __name__ == "__main__":
    main()
