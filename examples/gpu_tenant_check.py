#!/usr/bin/env python3
"""Helpers for examples/gpu_tenant_check.sh (needs a real NVIDIA GPU and torch).

  hold --gib G --seconds S --ready FILE     "another tenant": holds G GiB on cuda:0 for S s
  train --gib_per_sample X --ready FILE ... a training job that OOMs when a tenant arrives
  free-mib                                  free MiB on cuda:0 (torch.cuda.mem_get_info)
  compare-gpus GPUS_JSON SMI_GPUS SMI_APPS  `oomguard gpus --json` vs nvidia-smi
  compare-peak OUTPUT SMI_LOG TRAIN_PIDS    oomguard's peak line vs nvidia-smi's maximum

Memory from torch is allocated with torch.empty on cuda:0 (CUDA_VISIBLE_DEVICES picks
the GPU). The comparisons exit 1 with the figures side by side when they disagree.
"""

import argparse
import csv
import getpass
import json
import os
import re
import sys
import time

MIB = 1 << 20
GIB = 1 << 30


def hold(a):
    import torch

    x = torch.empty(int(a.gib * GIB), dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    print(f"tenant: pid {os.getpid()} holds {a.gib:.1f} GiB for {a.seconds:.0f} s", flush=True)
    with open(a.ready, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(a.seconds)
    print("tenant: leaving", flush=True)


def train(a, rest):
    """A Hugging Face-style command line, so oomguard finds the micro-batch knob.

    Warm up (CUDA context plus 0.5 GiB), say so through --started, wait (bounded) for the
    tenant's --ready file, then allocate micro_batch x gib_per_sample at once, as a forward
    pass would: a real PyTorch OOM when the tenant holds the rest.
    """
    import torch

    attempt = os.environ.get("OOMGUARD_ATTEMPT", "?")
    bs = a.per_device_train_batch_size
    print(f"train: pid {os.getpid()} attempt {attempt} micro_batch={bs} "
          f"grad_accum={a.gradient_accumulation_steps}", flush=True)
    warm = torch.empty(GIB // 2, dtype=torch.uint8, device="cuda:0")
    warm.fill_(1)
    with open(a.started, "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.time() + 120
    while not os.path.exists(a.ready) and time.time() < deadline:
        time.sleep(0.2)
    need = int(bs * a.gib_per_sample * GIB)
    acts = torch.empty(need, dtype=torch.uint8, device="cuda:0")  # OOMs with the tenant there
    acts.fill_(1)
    torch.cuda.synchronize()
    # Hold the peak a few seconds so samplers at 1 Hz see it.
    time.sleep(a.hold_seconds)
    print(f"train: done micro_batch={bs} peak_gib={torch.cuda.max_memory_reserved() / GIB:.2f}",
          flush=True)
    os.makedirs(a.output_dir, exist_ok=True)


def free_mib(_a):
    import torch

    free, _total = torch.cuda.mem_get_info(0)
    print(free // MIB)


def read_csv(path):
    with open(path) as f:
        return [[c.strip() for c in row] for row in csv.reader(f) if row]


def mib(field):
    # nvidia-smi with nounits prints MiB as integers; "[N/A]" when unknown.
    try:
        return int(float(field))
    except ValueError:
        return None


def compare_gpus(a):
    """GPUS_JSON: `oomguard gpus --json`. SMI_GPUS: --query-gpu=index,uuid,memory.used,
    memory.total --format=csv,noheader,nounits. SMI_APPS: --query-compute-apps=pid,
    gpu_uuid,used_memory --format=csv,noheader,nounits."""
    ours = json.load(open(a.gpus_json))
    smi = {r[1]: r for r in read_csv(a.smi_gpus)}
    apps = read_csv(a.smi_apps)
    bad = 0
    me = getpass.getuser()
    for g in ours["gpus"]:
        row = smi.get(g["uuid"])
        if row is None:
            print(f"MISMATCH: oomguard shows {g['uuid']} which nvidia-smi does not list")
            bad += 1
            continue
        used_smi, total_smi = mib(row[2]), mib(row[3])
        used_ours = g["used_bytes"] // MIB
        tol = max(256, total_smi // 50)  # snapshots a moment apart; reserved memory accounting
        ok = abs(used_ours - used_smi) <= tol
        print(f"{'ok' if ok else 'MISMATCH'}: GPU {g['index']} used oomguard {used_ours} MiB, "
              f"nvidia-smi {used_smi} MiB (tolerance {tol} MiB)")
        bad += not ok
        if g["total_bytes"] // MIB != total_smi:
            print(f"MISMATCH: GPU {g['index']} total oomguard {g['total_bytes'] // MIB} MiB, "
                  f"nvidia-smi {total_smi} MiB")
            bad += 1
        procs = {p["pid"]: p for p in g["processes"]}
        smi_here = [r for r in apps if r[1] == g["uuid"]]
        if not smi_here:
            print(f"note: nvidia-smi lists no compute process on GPU {g['index']} "
                  "(inside a container without the host PID namespace it shows none)")
        for r in smi_here:
            pid, used = int(r[0]), mib(r[2])
            p = procs.get(pid)
            if p is None:
                print(f"MISMATCH: nvidia-smi shows pid {pid} ({used} MiB) on GPU {g['index']}; "
                      "oomguard does not")
                bad += 1
                continue
            ok = used is None or abs(p["used_bytes"] // MIB - used) <= 64
            print(f"{'ok' if ok else 'MISMATCH'}: pid {pid} user {p['user']} oomguard "
                  f"{p['used_bytes'] // MIB} MiB, nvidia-smi {used} MiB")
            bad += not ok
    if a.tenant_pid:
        hits = [p for g in ours["gpus"] for p in g["processes"] if p["pid"] == a.tenant_pid]
        if not hits:
            print(f"MISMATCH: the tenant pid {a.tenant_pid} is not in `oomguard gpus`")
            bad += 1
        else:
            p = hits[0]
            ok = p["user"] == me and p["oomguard_attempt"] is None
            print(f"{'ok' if ok else 'MISMATCH'}: tenant pid {a.tenant_pid}: user {p['user']} "
                  f"(expected {me}), oomguard_attempt {p['oomguard_attempt']} (expected null)")
            bad += not ok
    sys.exit(1 if bad else 0)


def compare_peak(a):
    """OOMGUARD_OUTPUT (stdout and stderr) holds the summary "peak 71.2 of 79.6 GiB on GPU 2: ...". SMI_LOG:
    blocks of "pid,used_memory" lines, each after a "---" line, sampled every 0.5 s while the run went; TRAIN_PIDS: the run's."""
    text = open(a.oomguard_output, errors="replace").read()
    m = re.findall(r"peak ([0-9.]+) of ([0-9.]+) GiB on GPU (\d+)", text)
    if not m:
        print("MISMATCH: no 'peak X of Y GiB on GPU N' line in oomguard's output")
        sys.exit(1)
    ours = float(m[-1][0])
    pids = {int(p) for p in open(a.train_pids).read().split()}
    best = 0
    # One sample per "---" block: the run's memory is the sum over its PIDs at one instant.
    for block in open(a.smi_log).read().split("---"):
        total = 0
        for r in csv.reader(block.splitlines()):
            r = [c.strip() for c in r]
            if len(r) >= 2 and r[0].isdigit() and int(r[0]) in pids and mib(r[1]) is not None:
                total += mib(r[1])
        best = max(best, total)
    smi = best / 1024
    # oomguard samples at 1 Hz and nvidia-smi at 2 Hz over a peak held for several seconds.
    ok = abs(ours - smi) <= max(0.5, smi * 0.05)
    print(f"{'ok' if ok else 'MISMATCH'}: run peak oomguard {ours:.1f} GiB, "
          f"nvidia-smi max {smi:.1f} GiB over pids {sorted(pids)}")
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold")
    h.add_argument("--gib", type=float, required=True)
    h.add_argument("--seconds", type=float, required=True)
    h.add_argument("--ready", required=True)
    t = sub.add_parser("train")
    t.add_argument("--per_device_train_batch_size", type=int, required=True)
    t.add_argument("--gradient_accumulation_steps", type=int, default=1)
    t.add_argument("--gib_per_sample", type=float, required=True)
    t.add_argument("--output_dir", required=True)
    t.add_argument("--started", required=True)
    t.add_argument("--ready", required=True)
    t.add_argument("--hold_seconds", type=float, default=6.0)
    sub.add_parser("free-mib")
    c = sub.add_parser("compare-gpus")
    c.add_argument("gpus_json")
    c.add_argument("smi_gpus")
    c.add_argument("smi_apps")
    c.add_argument("--tenant-pid", type=int)
    k = sub.add_parser("compare-peak")
    k.add_argument("oomguard_output")
    k.add_argument("smi_log")
    k.add_argument("train_pids")
    a, rest = p.parse_known_args()
    if a.cmd == "hold":
        hold(a)
    elif a.cmd == "train":
        train(a, rest)
    elif a.cmd == "free-mib":
        free_mib(a)
    elif a.cmd == "compare-gpus":
        compare_gpus(a)
    else:
        compare_peak(a)


if __name__ == "__main__":
    main()
