#!/usr/bin/env python3
"""Sizing benchmark: the blind ladder against the decision from evidence.

    python3 benches/sizing.py --bin target/release/oomguard [--scenarios 40] [--seed 12] [--spikes 20]

A scenario generator draws runs that OOM as given and have a fix that keeps the
results (random Llama-shaped models of 0.35-7B parameters, GPUs of 24/40/80 GiB,
world sizes 1-8, DeepSpeed or not, a hidden activation factor 0.8-1.5 that
oomguard's model does not know). Each is run through the real oomguard binary
twice, around benches/sizing_trainer.py (an allocator-faithful simulated trainer
whose OOM names only the one allocation that failed): with
benches/blind-ladder.toml (the old default) and with the shipped default. A
stand-in `torchrun` on PATH gives oomguard the world size. Reported per policy:
runs finished, relaunches (median, max), the fraction of the best fitting
throughput kept (mean, worst; throughput model: memory.rs's `throughput`), and
runs whose sequence was shortened although a results-preserving fix existed.

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


def fits(cfg, s, gpu_gib, factor, seq_share=1.0):
    args = types.SimpleNamespace(
        per_device_train_batch_size=s["micro_batch"],
        max_seq_length=s["seq_len"],
        gradient_checkpointing=s["grad_checkpointing"],
    )
    ds = None
    if s["zero_stage"] is not None:
        ds = {"zero_optimization": {
            "stage": s["zero_stage"],
            "offload_optimizer": {"device": s["offload_optimizer"]},
            "offload_param": {"device": s["offload_param"]},
        }}
    os.environ["SIM_ACT_FACTOR"] = str(factor)
    total = sum(max(2 * sim.MIB, -(-b // (2 * sim.MIB)) * 2 * sim.MIB)
                for _, b in sim.allocations(args, cfg, ds, s["world"],
                                            max(1, int(s["seq_len"] * seq_share))))
    return sim.CONTEXT + total <= gpu_gib * GIB


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


def model_config(rng, target):
    hidden = rng.choice([1024, 1536, 2048, 2560, 3072, 4096])
    inter = int(hidden * 8 / 3 / 256 + 1) * 256
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = max(4, round((target - 2 * 32000 * hidden) / per_layer))
    return {"hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": inter,
            "num_attention_heads": hidden // 128, "vocab_size": 32000, "hidden_act": "silu"}


def scenarios(rng, n, spikes=0):
    out = []
    while len(out) < n:
        cfg = model_config(rng, rng.uniform(0.35e9, 7e9))
        world = rng.choice([1, 2, 4, 8])
        gpu = rng.choice([24, 40, 80])
        ds = rng.random() < 0.5
        s0 = {"micro_batch": rng.choice([4, 8, 16, 32]), "grad_accum": rng.choice([1, 2, 4]),
              "seq_len": rng.choice([1024, 2048, 4096]), "grad_checkpointing": False,
              "zero_stage": rng.choice([0, 1, 2]) if ds else None,
              "offload_optimizer": "none" if ds else None,
              "offload_param": "none" if ds else None, "world": world}
        factor = rng.uniform(0.8, 1.5)
        if fits(cfg, s0, gpu, factor):
            continue
        # A spike: the typical batch fits as given, only the longest does not.
        if spikes and not fits(cfg, s0, gpu, factor, TYPICAL):
            continue
        good = [s for s in preserving(s0) if fits(cfg, s, gpu, factor)]
        if not good:
            continue
        best = max(throughput(s) for s in good)
        out.append({"cfg": cfg, "s0": s0, "gpu": gpu, "factor": factor, "best": best})
    return out


def run_one(binary, sc, policy, work, spikes=0):
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
           "--max_seq_length", str(s0["seq_len"])]
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
               SIM_SPIKE_STEPS=str(spikes))
    p = subprocess.run([binary, "--policy", policy, "--max-attempts", "8", "--hang-timeout", "5",
                        "--run-dir", os.path.join(d, "run"), "--"] + cmd,
                       cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = [json.loads(l) for l in open(result)] if os.path.exists(result) else []
    last = dict(lines[-1]["settings"], world=s0["world"]) if lines else None
    ok = p.returncode == 0 and lines and not lines[-1]["oom"]
    return {
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
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    scs = scenarios(rng, a.scenarios, a.spikes)
    policies = [("blind ladder (old default)", os.path.join(HERE, "blind-ladder.toml")),
                ("decide from evidence (default)", "default")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, pol in policies:
            rs = [run_one(os.path.abspath(a.bin), sc, pol, work, a.spikes) for sc in scs]
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
