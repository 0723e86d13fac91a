#!/usr/bin/env python3
"""An allocator-faithful simulated trainer for the sizing benchmark (and tests).

It reads what a Hugging Face Trainer script would (--model_name_or_path's
config.json, --deepspeed's ZeRO stage and offload, --fsdp, --torch_dtype,
--optim, PEFT flags, the batch, accumulation, sequence and checkpointing
flags), and allocates its memory the way PyTorch does: weights, gradients and
optimizer states tensor by tensor, then each layer's activations in the
forward pass, then the logits. The first allocation that does not fit raises
an OOM whose message, like PyTorch's, names only that one allocation (not the
whole deficit), what is free, and what this process has in use. Otherwise it
trains --max_steps steps and exits 0.

Its costs are its own, not oomguard's formulas: parameters are counted layer
by layer with biases and norms; activations are listed tensor by tensor per
family (fp32 norms and residual stream under autocast over fp32 weights,
rotary copies, parallel blocks sharing one norm, GELU or gated MLPs, routed
experts' gather/scatter copies, Gemma's extra norms and soft-capped logits);
FSDP keeps the gathered units it prefetches; 4-bit bases keep their
quantisation constants. Two hidden factors, drawn per scenario and never told
to oomguard, scale what the formulas give: SIM_ACT_FACTOR the activations
(kernels, allocator), SIM_STATE_FACTOR the model states (buffers,
fragmentation). SIM_GPU_GIB is the GPU's memory, SIM_WORLD the world size (the
benchmark's torchrun stand-in sets it), SIM_RESULT a file where the settings of
every attempt are appended as JSON.

SIM_SPIKE_STEPS=K makes the run's batches uneven, as real data is: its first K
steps see typical batches, SIM_TYPICAL (0.6) of --max_seq_length long, and step
K+1 the longest one. A run whose typical batch does not fit dies at step 1 (a
steady overflow); one whose longest batch alone does not fit dies after K good
steps ("step N/M" lines printed), of the longest batch's OOM (a spike).

SIM_HOLD_S=S keeps a run that trained for S seconds after its last step (its
memory held, as while saving), so that a sampler of the GPUs sees it.
"""

import argparse
import json
import os
import sys

GIB, MIB = 1024 ** 3, 1024 ** 2
CONTEXT = 500 * MIB

GATED = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
         "mixtral", "qwen2_moe", "qwen3_moe"}
PARALLEL = {"gpt_neox", "gptj", "phi", "falcon"}
BIASED = {"gpt2", "gpt_neox", "phi", "gptj", "qwen2", "qwen2_moe"}


def str2bool(v):
    return str(v).lower() in ("1", "true", "yes", "on")


class Shape:
    """A config.json's shape, read as the family's modelling code does."""

    def __init__(self, cfg):
        ty = cfg.get("model_type", "llama")
        self.ty = ty
        g = lambda *ks, d=None: next((cfg[k] for k in ks if cfg.get(k)), d)  # noqa: E731
        h = g("hidden_size", "n_embd")
        self.h = h
        self.layers = g("num_hidden_layers", "n_layer")
        heads = g("num_attention_heads", "n_head", d=max(1, h // 128))
        self.head_dim = g("head_dim", d=h // heads)
        if ty == "falcon":
            kv = cfg.get("num_kv_heads", heads) if cfg.get("new_decoder_architecture") else (
                1 if cfg.get("multi_query", True) else heads)
        else:
            kv = g("num_key_value_heads", "num_kv_heads", d=heads)
        self.q = heads * self.head_dim
        self.kv = kv * self.head_dim
        if ty in ("gpt2", "gptj"):
            inter = cfg.get("n_inner") or 4 * h
        elif ty == "falcon":
            inter = cfg.get("ffn_hidden_size") or 4 * h
        else:
            inter = cfg.get("intermediate_size") or 4 * h
        self.gated = ty in GATED
        self.parallel = ty in PARALLEL
        self.experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 1
        self.top_k = cfg.get("num_experts_per_tok", 2) if self.experts > 1 else 1
        self.expert_i = cfg.get("moe_intermediate_size") or inter
        self.shared_i = cfg.get("shared_expert_intermediate_size", 0)
        self.inter = inter if self.experts == 1 else self.expert_i
        self.vocab = cfg.get("vocab_size", 32000)
        tied_default = ty in ("gemma", "gemma2", "gemma3_text", "gpt2", "falcon")
        self.tied = cfg.get("tie_word_embeddings", tied_default)
        self.rotary = {"gpt_neox": cfg.get("rotary_pct", 0.25), "phi": cfg.get("partial_rotary_factor", 0.5),
                       "gptj": (cfg.get("rotary_dim") or 64) / max(1, self.head_dim), "gpt2": 0.0}.get(ty, 1.0)
        self.positions = cfg.get("n_positions", 1024) if ty == "gpt2" else 0
        self.bias = ty in BIASED

    def linears(self):
        """(name, d_in, d_out, copies) of one block."""
        h, out = self.h, []
        out += [("q_proj", h, self.q, 1), ("k_proj", h, self.kv, 1), ("v_proj", h, self.kv, 1),
                ("o_proj", self.q, h, 1)]
        mats = [("gate_proj", 1), ("up_proj", 1), ("down_proj", 1)] if self.gated else [("up_proj", 1), ("down_proj", 1)]
        for name, _ in mats:
            i = self.inter
            d = (i, h) if name == "down_proj" else (h, i)
            out.append((name, d[0], d[1], self.experts))
            if self.shared_i:
                ds = (self.shared_i, h) if name == "down_proj" else (h, self.shared_i)
                out.append(("shared_" + name, ds[0], ds[1], 1))
        return out

    def layer_params(self):
        p = sum(i * o * c + (o * c if self.bias else 0) for _, i, o, c in self.linears())
        norms = (1 if self.parallel else 2) * self.h * (2 if self.bias else 1)
        router = self.h * self.experts if self.experts > 1 else 0
        return p + norms + router

    def params(self):
        embed = self.vocab * self.h * (1 if self.tied else 2) + self.positions * self.h
        return self.layers * self.layer_params() + embed + self.h


def act_tensors(sh, tokens, fp32_stream):
    """The tensors one layer keeps for the backward pass, in bytes, this
    simulator's own count. Under autocast over fp32 weights the residual stream
    and the norms are fp32 (4 bytes); matrix products give bf16 (2 bytes)."""
    r = 4 if fp32_stream else 2
    h, q, kv, t = sh.h, sh.q, sh.kv, tokens
    out = []
    norms = 1 if sh.parallel else 2
    if sh.ty.startswith("gemma2") or sh.ty.startswith("gemma3"):
        norms += 2  # pre- and post-norms around each half
    for i in range(norms):
        out.append((f"norm {i}", (r + 2) * h * t))
    out.append(("q k v", 2 * (q + 2 * kv) * t))
    out.append(("rotary q k", 2 * (q + kv) * sh.rotary * t))
    out.append(("attention out", 2 * q * t + 4 * t * (q // max(1, sh.head_dim))))
    out.append(("attention residual", r * h * t))
    i = sh.expert_i * sh.top_k + sh.shared_i if sh.experts > 1 else sh.inter
    if sh.experts > 1:
        out.append(("router", 4 * sh.experts * t))
        out.append(("routed copies", 2 * 2 * h * sh.top_k * t))
    if sh.gated:
        out += [("gate", 2 * i * t), ("up", 2 * i * t), ("act(gate)*up", 2 * i * t)]
        if fp32_stream:
            out.append(("act in fp32", 2 * i * t))
    else:
        out += [("fc1 out", 2 * i * t), ("gelu out", 2 * i * t)]
        if fp32_stream:
            out.append(("gelu upcast", 2 * i * t))
    out.append(("mlp residual", r * h * t))
    return out


def allocations(a, cfg, ds, world, seq=None):
    """The tensors this rank allocates, in order: (what, bytes), for batches of
    `seq` tokens (default: --max_seq_length)."""
    sh = Shape(cfg)
    zero = ds.get("zero_optimization", {}) if ds else {}
    stage = int(zero.get("stage", 0)) if ds else 0
    off_opt = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    off_par = (zero.get("offload_param") or {}).get("device", "none") not in ("none", None)
    fsdp = (getattr(a, "fsdp", "") or "").lower()
    if "full_shard" in fsdp or "hybrid_shard" in fsdp:
        stage = 3
    elif "shard_grad_op" in fsdp:
        stage = 2
    if "offload" in fsdp:
        off_opt = off_par = True
    n = world
    dtype = (getattr(a, "torch_dtype", None) or "float32").replace("torch.", "")
    if dtype == "auto":
        # from_pretrained(dtype="auto"): config.json's own dtype.
        dtype = (cfg.get("dtype") or cfg.get("torch_dtype") or "float32").replace("torch.", "")
    wb = {"bfloat16": 2, "float16": 2, "bf16": 2}.get(dtype, 4)
    optim = (getattr(a, "optim", None) or "adamw_torch").lower()
    lora = getattr(a, "use_peft", False)
    state_f = float(os.environ.get("SIM_STATE_FACTOR", "1.0"))
    per_layer = sh.layer_params()
    total = sh.params()
    if lora:
        r = getattr(a, "lora_r", 8)
        targets = getattr(a, "lora_target_modules", None) or ["q_proj", "v_proj"]
        train_layer = sum(r * (i + o) * c for name, i, o, c in sh.linears()
                          if "all-linear" in targets or name.replace("shared_", "") in targets)
        base = 0.53 if getattr(a, "load_in_4bit", False) else wb
        # Adapters in fp32 with fp32 Adam states: 4 + 4 + 8.
        wbytes, gbytes, obytes = 4, 4, (2.0 if "8bit" in optim else 8)
        frozen_layer = per_layer * base
    else:
        train_layer = per_layer
        frozen_layer = 0
        if ds:
            wbytes, gbytes = 2, 2
            obytes = 4 + (2.0 if "8bit" in optim else 8)
        else:
            wbytes, gbytes = wb, wb
            obytes = 2.02 if "8bit" in optim else 2 * wb
    out = []
    for i in range(sh.layers):
        w = (wbytes * train_layer + frozen_layer) / (n if stage >= 3 else 1)
        if not off_par:
            out.append((f"layer {i} weights", w * state_f))
    embed = total - sh.layers * per_layer
    out.append(("embeddings", (wb if lora else wbytes) * embed / (n if stage >= 3 else 1)))
    if off_par or (stage >= 3 and fsdp):
        # FSDP/ZeRO-3 gather one unit and prefetch the next, in 16 bits.
        out.append(("gathered units", 2 * 2 * per_layer))
    for i in range(sh.layers):
        if not (off_par and fsdp):
            out.append((f"layer {i} gradients", gbytes * train_layer / (n if stage >= 2 else 1) * state_f))
    if not lora:
        out.append(("embedding gradients", gbytes * embed / (n if stage >= 2 else 1)))
    if not off_opt:
        for i in range(sh.layers):
            out.append((f"layer {i} optimizer states", obytes * train_layer / (n if stage >= 1 else 1) * state_f))
        if not lora:
            out.append(("embedding optimizer states", obytes * embed / (n if stage >= 1 else 1)))
    factor = float(os.environ.get("SIM_ACT_FACTOR", "1.0"))
    tokens = a.per_device_train_batch_size * (seq or a.max_seq_length)
    fp32_stream = (wb == 4 and not lora) or (lora and wb == 4 and not getattr(a, "load_in_4bit", False))
    layer = sum(b for _, b in act_tensors(sh, tokens, fp32_stream)) * factor
    if a.gradient_checkpointing:
        r = 4 if fp32_stream else 2
        for i in range(sh.layers):
            out.append((f"layer {i} checkpoint", r * sh.h * tokens * factor))
        out.append(("recomputed layer", layer))
    else:
        for i in range(sh.layers):
            out.append((f"layer {i} activations", layer))
    soft = 4 if sh.ty.startswith("gemma2") else 0
    out.append(("logits", (14 + soft) * sh.vocab * tokens))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model_name_or_path", required=True)
    ap.add_argument("--per_device_train_batch_size", type=int, default=8)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=1)
    ap.add_argument("--max_seq_length", type=int, default=2048)
    ap.add_argument("--gradient_checkpointing", type=str2bool, nargs="?", const=True, default=False)
    ap.add_argument("--deepspeed", default=None)
    ap.add_argument("--fsdp", default="")
    ap.add_argument("--torch_dtype", default=None)
    ap.add_argument("--bf16", type=str2bool, nargs="?", const=True, default=False)
    ap.add_argument("--optim", default="adamw_torch")
    ap.add_argument("--use_peft", action="store_true")
    ap.add_argument("--lora_r", type=int, default=8)
    ap.add_argument("--lora_target_modules", nargs="+", default=None)
    ap.add_argument("--load_in_4bit", action="store_true")
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
        "fsdp": a.fsdp or None,
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
    hold = float(os.environ.get("SIM_HOLD_S", "0"))
    if hold > 0:
        import time
        time.sleep(hold)


def fmt(n):
    if n < GIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


if __name__ == "__main__":
    main()
