#!/usr/bin/env python3
"""Sizing benchmark: the blind ladder against the decision from evidence, and --fit.

    python3 benches/sizing.py --bin target/release/oomguard [--scenarios 40] [--seed 12] [--spikes 20]

A scenario generator draws runs that OOM as given and have a fix that keeps the
results: model families (Llama with MHA or GQA, Mistral, Qwen2, Gemma,
GPT-NeoX, GPT-2, GPT-J, Falcon, Phi, Mixtral, Qwen-MoE) of 0.35-7B parameters,
GPUs of 24/40/80 GiB, world sizes 1-8, DeepSpeed ZeRO, FSDP full_shard or plain
DDP, bf16 weights (`--torch_dtype bfloat16`, or config.json's bf16 with
`--torch_dtype auto`), 8-bit Adam, LoRA and QLoRA. Each is run through the real
oomguard binary around benches/sizing_trainer.py (an allocator-faithful
simulated trainer with its own cost accounting and two hidden factors, on the
activations and on the model states, that oomguard is never told; its OOM
names only the one allocation that failed): with benches/blind-ladder.toml (the
old default), with the shipped default, and with the default and --fit (given
the simulated GPU's size as --gpu-memory, as NVML would). A stand-in `torchrun`
on PATH gives oomguard the world size. Reported per policy: runs finished,
relaunches (median, max), the fraction of the best fitting throughput kept
(mean, worst; throughput model: memory's `throughput`), and runs whose sequence
was shortened although a results-preserving fix existed. --llama-only draws the
suite before issue 21 (Llama-shaped, fp32 weights, AdamW).

With --spikes K the runs OOM as spikes instead: their typical batch (0.6 of the
sequence) fits as given, the longest one does not, and the simulated trainer
dies of it after K good steps ("step N/M" lines), as a run with uneven batches
does; oomguard learns the step reached from those lines.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sizing_trainer as sim  # noqa: E402

GIB = 1024 ** 3


def throughput(s):
    """memory.rs's `throughput`, in Python."""
    tokens = s["micro_batch"] * s["seq_len"]
    t = tokens / (tokens + 1024.0)
    if s["grad_checkpointing"]:
        t *= 0.75
    if s["world"] > 1:
        t *= {0: 1.0, 1: 1.0, 2: 0.97}.get(s["zero_stage"] or 0, 0.85)
    if s["offload_optimizer"] not in (None, "none"):
        t *= 0.6
    if s["offload_param"] not in (None, "none"):
        t *= 0.6
    return t


TYPICAL = 0.6  # the simulated trainer's SIM_TYPICAL default


def sim_args(sc, s):
    """The simulated trainer's arguments for settings s of scenario sc."""
    f = sc.get("flags", {})
    return types.SimpleNamespace(
        per_device_train_batch_size=s["micro_batch"],
        max_seq_length=s["seq_len"],
        gradient_checkpointing=s["grad_checkpointing"],
        fsdp=f.get("fsdp", ""),
        torch_dtype=f.get("torch_dtype"),
        optim=f.get("optim", "adamw_torch"),
        use_peft=bool(f.get("lora_r")),
        lora_r=f.get("lora_r", 8),
        lora_target_modules=f.get("lora_target_modules"),
        load_in_4bit=f.get("load_in_4bit", False),
    )


def fits(sc, s, seq_share=1.0):
    ds = None
    if s["zero_stage"] is not None:
        ds = {"zero_optimization": {
            "stage": s["zero_stage"],
            "offload_optimizer": {"device": s["offload_optimizer"]},
            "offload_param": {"device": s["offload_param"]},
        }}
    os.environ["SIM_ACT_FACTOR"] = str(sc["factor"])
    os.environ["SIM_STATE_FACTOR"] = str(sc.get("state_factor", 1.0))
    total = sum(max(2 * sim.MIB, -(-b // (2 * sim.MIB)) * 2 * sim.MIB)
                for _, b in sim.allocations(sim_args(sc, s), sc["cfg"], ds, s["world"],
                                            max(1, int(s["seq_len"] * seq_share))))
    return sim.CONTEXT + total <= sc["gpu"] * GIB


def preserving(s0):
    """Every results-preserving setting reachable from s0 (sequence as given)."""
    product = s0["micro_batch"] * s0["grad_accum"]
    micros = [m for m in range(1, s0["micro_batch"] + 1) if product % m == 0]
    stages = [None] if s0["zero_stage"] is None else [st for st in range(s0["zero_stage"], 4)]
    for m in micros:
        for gc in (s0["grad_checkpointing"], True):
            for st in stages:
                for oo in ("none", "cpu") if st is not None else (None,):
                    for op in ("none", "cpu") if st is not None else (None,):
                        if oo == "cpu" and st == 0:
                            continue
                        if op == "cpu" and st != 3:
                            continue
                        yield dict(s0, micro_batch=m, grad_accum=product // m,
                                   grad_checkpointing=gc, zero_stage=st,
                                   offload_optimizer=oo, offload_param=op)


# The families of the suite: (model_type, gated MLP, head size, vocabulary, extra config).
FAMILIES = [
    ("llama", True, 128, 32000, {}),
    ("llama", True, 128, 128256, {"gqa": 4, "tie_word_embeddings": True}),
    ("mistral", True, 128, 32000, {"gqa": 4}),
    ("qwen2", True, 128, 151936, {"gqa": 7}),
    ("gemma", True, 256, 256000, {"gqa": 8, "head_dim": 256}),
    ("gpt_neox", False, 128, 50304, {"rotary_pct": 0.25, "use_parallel_residual": True}),
    ("gpt2", False, 64, 50257, {}),
    ("gptj", False, 256, 50400, {"rotary_dim": 64}),
    ("falcon", False, 64, 65024, {"multi_query": True}),
    ("phi", False, 80, 51200, {"partial_rotary_factor": 0.4}),
    ("mixtral", True, 128, 32000, {"gqa": 4, "num_local_experts": 8, "num_experts_per_tok": 2}),
    ("qwen2_moe", True, 128, 151936, {"num_experts": 16, "num_experts_per_tok": 4}),
]


def model_config(rng, target, fam=None):
    ty, gated, hd, vocab, extra = fam or FAMILIES[0]
    hidden = rng.choice([1024, 1536, 2048, 2560, 3072, 4096])
    heads = max(1, hidden // hd)
    kv = max(1, heads // extra["gqa"]) if "gqa" in extra else heads
    head_dim = extra.get("head_dim", hidden // heads)
    inter = int(hidden * 8 / 3 / 256 + 1) * 256 if gated else 4 * hidden
    experts = extra.get("num_local_experts") or extra.get("num_experts") or 1
    if ty == "qwen2_moe":
        inter = hidden
    mats = 3 if gated else 2
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + mats * hidden * inter * experts
    layers = max(4, round((target - 2 * vocab * hidden) / per_layer))
    cfg = {"model_type": ty, "num_hidden_layers": layers, "num_attention_heads": heads,
           "vocab_size": vocab}
    if ty in ("gpt2", "gptj"):
        cfg.update({"n_embd": hidden, "n_layer": layers, "n_head": heads})
        del cfg["num_hidden_layers"], cfg["num_attention_heads"]
    else:
        cfg["hidden_size"] = hidden
        if ty != "falcon":
            cfg["intermediate_size"] = inter
    if "gqa" in extra:
        cfg["num_key_value_heads"] = kv
    if ty == "qwen2_moe":
        cfg.update({"moe_intermediate_size": inter, "shared_expert_intermediate_size": 2 * inter})
    if gated:
        cfg["hidden_act"] = "silu"
    cfg.update({k: v for k, v in extra.items() if k != "gqa"})
    return cfg


def draw_flags(rng, world, ds, families):
    """The run's own facts: dtype, optimizer, PEFT, FSDP."""
    f = {}
    if rng.random() < 0.3:
        f["torch_dtype"] = "bfloat16"
    if rng.random() < 0.25:
        f["optim"] = "adamw_bnb_8bit"
    if families and not ds and rng.random() < 0.25:
        f["lora_r"] = rng.choice([8, 16, 64])
        f["lora_target_modules"] = rng.choice([["q_proj", "v_proj"], ["all-linear"]])
        if rng.random() < 0.5:
            f["load_in_4bit"] = True
            f["torch_dtype"] = "bfloat16"
    if families and world > 1 and not ds and not f.get("lora_r") and rng.random() < 0.5:
        f["fsdp"] = "full_shard auto_wrap"
    return f


def scenarios(rng, n, spikes=0, families=True):
    out = []
    while len(out) < n:
        fam = rng.choice(FAMILIES) if families else FAMILIES[0]
        cfg = model_config(rng, rng.uniform(0.35e9, 7e9), fam)
        world = rng.choice([1, 2, 4, 8])
        gpu = rng.choice([24, 40, 80])
        ds = rng.random() < (0.35 if families else 0.5)
        s0 = {"micro_batch": rng.choice([4, 8, 16, 32]), "grad_accum": rng.choice([1, 2, 4]),
              "seq_len": rng.choice([1024, 2048, 4096]), "grad_checkpointing": False,
              "zero_stage": rng.choice([0, 1, 2]) if ds else None,
              "offload_optimizer": "none" if ds else None,
              "offload_param": "none" if ds else None, "world": world}
        sc = {"cfg": cfg, "s0": s0, "gpu": gpu, "factor": rng.uniform(0.8, 1.3),
              "state_factor": rng.uniform(1.0, 1.1) if families else 1.0,
              "flags": draw_flags(rng, world, ds, families)}
        if sc["flags"].get("torch_dtype") == "bfloat16" and rng.random() < 0.5:
            # The checkpoint's own dtype: config.json says bf16, the command `--torch_dtype auto`.
            sc["flags"]["torch_dtype"] = "auto"
            cfg["torch_dtype"] = "bfloat16"
        if not families:
            sc["factor"] = rng.uniform(0.8, 1.5)
        if fits(sc, s0):
            continue
        # A spike: the typical batch fits as given, only the longest does not.
        if spikes and not fits(sc, s0, TYPICAL):
            continue
        good = [s for s in preserving(s0) if fits(sc, s)]
        if not good:
            continue
        sc["best"] = max(throughput(s) for s in good)
        out.append(sc)
    return out


def run_one(binary, sc, policy, work, spikes=0, extra=()):
    d = tempfile.mkdtemp(dir=work)
    os.makedirs(os.path.join(d, "model"))
    with open(os.path.join(d, "model", "config.json"), "w") as f:
        json.dump(sc["cfg"], f)
    os.makedirs(os.path.join(d, "bin"))
    tr = os.path.join(d, "bin", "torchrun")
    with open(tr, "w") as f:
        f.write('#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in --*) shift;; *) break;; esac; done\n'
                'exec python3 "$@"\n')
    os.chmod(tr, 0o755)
    s0 = sc["s0"]
    cmd = ["torchrun", f"--nproc_per_node={s0['world']}", os.path.join(HERE, "sizing_trainer.py"),
           "--model_name_or_path", "model",
           "--per_device_train_batch_size", str(s0["micro_batch"]),
           "--gradient_accumulation_steps", str(s0["grad_accum"]),
           "--max_seq_length", str(s0["seq_len"]), "--bf16"]
    f = sc.get("flags", {})
    for k in ("torch_dtype", "optim", "fsdp"):
        if f.get(k):
            cmd += [f"--{k}", f[k]]
    if f.get("lora_r"):
        cmd += ["--use_peft", "--lora_r", str(f["lora_r"]), "--lora_target_modules"] + f["lora_target_modules"]
    if f.get("load_in_4bit"):
        cmd += ["--load_in_4bit"]
    if s0["zero_stage"] is not None:
        with open(os.path.join(d, "ds.json"), "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                       "zero_optimization": {"stage": s0["zero_stage"],
                                             "offload_optimizer": {"device": "none"},
                                             "offload_param": {"device": "none"}}}, f)
        cmd += ["--deepspeed", "ds.json"]
    result = os.path.join(d, "result.jsonl")
    env = dict(os.environ, PATH=os.path.join(d, "bin") + ":" + os.environ["PATH"],
               SIM_WORLD=str(s0["world"]), SIM_GPU_GIB=str(sc["gpu"]),
               SIM_ACT_FACTOR=str(sc["factor"]), SIM_RESULT=result,
               SIM_STATE_FACTOR=str(sc.get("state_factor", 1.0)),
               SIM_SPIKE_STEPS=str(spikes))
    if "--fit" in extra:
        extra = (*extra, "--gpu-memory", str(sc["gpu"]))
    p = subprocess.run([binary, "--policy", policy, *extra, "--max-attempts", "8", "--hang-timeout", "5",
                        "--run-dir", os.path.join(d, "run"), "--"] + cmd,
                       cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = [json.loads(l) for l in open(result)] if os.path.exists(result) else []
    last = dict(lines[-1]["settings"], world=s0["world"]) if lines else None
    ok = p.returncode == 0 and lines and not lines[-1]["oom"]
    return {
        "final": last,
        "finished": bool(ok),
        "relaunches": max(0, len(lines) - 1),
        "kept": throughput(last) / sc["best"] if ok else 0.0,
        "shortened": bool(last and last["seq_len"] < s0["seq_len"]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--scenarios", type=int, default=40)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--spikes", type=int, default=0, metavar="K",
                    help="runs that OOM of their longest batch after K good steps (default: at step 1)")
    ap.add_argument("--llama-only", action="store_true",
                    help="the suite before issue 21: Llama-shaped models, fp32 weights, AdamW, no PEFT or FSDP")
    ap.add_argument("--runs", action="store_true", help="one line per run on stderr")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    scs = scenarios(rng, a.scenarios, a.spikes, families=not a.llama_only)
    policies = [("blind ladder (old default)", os.path.join(HERE, "blind-ladder.toml"), ()),
                ("decide from evidence (default)", "default", ()),
                ("decide from evidence, --fit", "default", ("--fit",))]
    # --fit needs the GPU's size before the first OOM: NVML gives it on a GPU
    # machine; here the simulated GPU's size is given as --gpu-memory.
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, pol, extra in policies:
            rs = [run_one(os.path.abspath(a.bin), sc, pol, work, a.spikes, extra) for sc in scs]
            if a.runs:
                for sc, r in zip(scs, rs):
                    print(f"{name[:24]:24} {sc['cfg']['model_type']:10} gpu {sc['gpu']} world {sc['s0']['world']} "
                          f"flags {sc['flags']} act {sc['factor']:.2f} states {sc['state_factor']:.2f}: {r}",
                          file=sys.stderr)
            rel = [r["relaunches"] for r in rs]
            kept = [r["kept"] for r in rs]
            rows.append((name, sum(r["finished"] for r in rs), len(rs), statistics.median(rel), max(rel),
                         statistics.mean(kept), min(kept), sum(r["shortened"] for r in rs)))
    if a.json:
        keys = ["policy", "finished", "runs", "relaunches_median", "relaunches_max",
                "kept_mean", "kept_worst", "shortened_needlessly"]
        print(json.dumps({"seed": a.seed, "spikes": a.spikes, "rows": [dict(zip(keys, r)) for r in rows]}))
        return
    how = f"after {a.spikes} good steps, of its longest batch" if a.spikes else "at its first step"
    print(f"{len(scs)} scenarios (seed {a.seed}): each OOMs as given ({how}) and has a results-preserving fix")
    print("| policy | finished | relaunches median | max | throughput kept mean | worst | sequence shortened needlessly |")
    print("|---|---|---|---|---|---|---|")
    for name, fin, n, med, mx, mean, worst, short in rows:
        print(f"| {name} | {fin}/{n} | {med:g} | {mx} | {mean:.3f} | {worst:.3f} | {short} |")


if __name__ == "__main__":
    main()
