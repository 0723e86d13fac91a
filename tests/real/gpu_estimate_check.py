#!/usr/bin/env python3
"""`oomguard estimate` against the peak memory a real Hugging Face Trainer run measures.

For sessions with a GPU (nothing here runs in CI). For each case it writes a
Llama-shaped config.json, asks `oomguard estimate --json` what the command needs per
GPU, then runs that command for real (tests/real/gpu_hf_trainer.py, bf16, sdpa
attention, no memory cap, a few steps) and reads what PyTorch measured:

- peak device memory = torch.cuda.max_memory_reserved() + the process's non-PyTorch
  memory (the CUDA context), against the estimate's total;
- the model states (memory allocated at rest after training, which holds the weights
  and the optimizer's states, plus the gradients' size), against the estimate's
  weights + gradients + optimizer.

    python3 tests/real/gpu_estimate_check.py --bin target/release/oomguard --out /tmp/est

Prints one table row per case with the error in % (estimate − measured) / measured and
writes results.json and results.md to --out. Exit 0 when every case ran; 1 when one did
not; 77 when torch sees no CUDA device. The error is reported, not asserted: it is a
measurement of the model, not a pass/fail test.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

GIB = 1024 ** 3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(REPO, "tests", "real", "gpu_hf_trainer.py")

MODELS = {
    # name: (hidden, layers, intermediate, heads, vocab[, config.json's other keys])
    "llama-0.17b": (1024, 8, 2816, 16, 32000),
    "llama-0.95b": (2048, 16, 5632, 16, 32000),
    "deep-0.3b": (1024, 16, 2816, 16, 32000),
    "vocab128k-0.4b": (1024, 8, 2816, 16, 128000),
    "widemlp-0.3b": (1024, 8, 8192, 16, 32000),
    "wide-1.1b": (4096, 4, 11008, 32, 32000),
    "vocab128k-1.3b": (2048, 16, 5632, 16, 128000),
    # held out from any fitting of the activation term
    "gpt-shaped-0.4b": (1536, 12, 4096, 12, 50304),
    "llama-1.7b": (2560, 20, 6912, 20, 32000),
    # other families (held out: the model's blocks by model_type, never measured before)
    "qwen2-0.5b": (896, 24, 4864, 14, 151936,
                   {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                    "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "mistral-gqa-1b": (2048, 16, 5632, 16, 32000,
                       {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                        "num_key_value_heads": 4}),
    "gpt2-medium": (1024, 24, 4096, 16, 50257,
                    {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}),
}

# (model, micro-batch, sequence, gradient checkpointing[, more flags]); held-out cases
# first, so that a run cut short by its time budget keeps the ones never measured.
BF16 = ["--torch_dtype", "bfloat16"]
LORA = ["--use_peft", "true", "--lora_r", "16", "--lora_target_modules",
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = [
    ("qwen2-0.5b", 8, 1024, False),
    ("qwen2-0.5b", 8, 1024, False, BF16),
    ("mistral-gqa-1b", 8, 2048, False),
    ("mistral-gqa-1b", 8, 2048, True, BF16),
    ("gpt2-medium", 8, 1024, False),
    ("llama-0.95b", 8, 1024, False, BF16),
    ("llama-0.95b", 8, 2048, False, BF16 + LORA),
    ("llama-0.95b", 8, 2048, True, LORA),
    ("llama-0.17b", 8, 1024, False, ["--bf16", "false"]),
    ("deep-0.3b", 8, 1024, False),
    ("vocab128k-0.4b", 8, 1024, False),
    ("widemlp-0.3b", 8, 1024, False),
    ("wide-1.1b", 4, 2048, False),
    ("vocab128k-1.3b", 4, 1024, False),
    ("gpt-shaped-0.4b", 8, 1024, False),
    ("gpt-shaped-0.4b", 8, 1024, True),
    ("llama-1.7b", 2, 4096, False),
    ("llama-1.7b", 4, 2048, True),
    # in-sample: the four rows without checkpointing fitted the activation factor
    ("llama-0.17b", 8, 1024, False),
    ("llama-0.17b", 16, 2048, False),
    ("llama-0.17b", 16, 2048, True),
    ("llama-0.95b", 4, 2048, False),
    ("llama-0.95b", 8, 2048, True),
    ("llama-0.95b", 16, 1024, False),
]


def write_config(folder, name):
    hidden, layers, inter, heads, vocab, *more = MODELS[name]
    more = more[0] if more else {}
    path = os.path.join(folder, name)
    os.makedirs(path, exist_ok=True)
    if more.get("model_type") == "gpt2":
        config = {"n_embd": hidden, "n_layer": layers, "n_inner": inter, "n_head": heads,
                  "vocab_size": vocab, "n_positions": 4096, "activation_function": "gelu_new"}
    else:
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": inter,
                  "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
                  "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": False,
                  "rms_norm_eps": 1e-5}
    config.update(more)
    config["torch_dtype"] = "float32"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def measured(out, key):
    m = re.search(rf"^{re.escape(key)}: ([0-9.]+) GiB", out, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the oomguard binary")
    ap.add_argument("--out", required=True, help="folder for results.json and results.md")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--budget_s", type=float, default=0, help="start no case after this many seconds (0: none)")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device", file=sys.stderr)
        return 77
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_estimate_check.")
    rows, failed, began = [], False, time.monotonic()
    for name, micro, seq, gc, *more in CASES:
        more = more[0] if more else []
        if args.budget_s and time.monotonic() - began > args.budget_s:
            print(f"time budget spent: case {name} mb{micro} s{seq} and later not run", file=sys.stderr)
            break
        model = write_config(work, name)
        cmd = [args.python, TRAINER, "--model_name_or_path", model,
               "--per_device_train_batch_size", str(micro), "--gradient_accumulation_steps", "1",
               "--max_seq_length", str(seq), "--bf16", "true",
               "--gradient_checkpointing", "true" if gc else "false",
               "--max_steps", str(args.steps), "--save_strategy", "no",
               "--output_dir", os.path.join(work, "out"), "--gpu_mem_gib", "0", *more]
        est = subprocess.run([args.bin, "estimate", "--json", "--gpu-memory", f"{gpu_gib:.2f}", *cmd],
                             capture_output=True, text=True)
        if est.returncode != 0:
            print(f"estimate failed for {name}: {est.stderr}", file=sys.stderr)
            failed = True
            continue
        e = json.loads(est.stdout)["given"]["estimate"]
        est_total = sum(e.values()) / GIB
        est_rest = (e["weights"] + e["gradients"] + e["optimizer"]) / GIB
        run = subprocess.run(cmd, capture_output=True, text=True)
        out = run.stdout + run.stderr
        peak = measured(out, "peak device memory")
        rest = measured(out, "model states (weights, gradients, optimizer)")
        allocated = measured(out, "max memory allocated")
        reserved = measured(out, "max memory reserved")
        context = measured(out, "non-PyTorch memory (context)")
        if run.returncode != 0 or peak is None:
            print(f"run failed for {name} mb{micro} s{seq} gc={gc}:\n{out[-3000:]}", file=sys.stderr)
            failed = True
            continue
        row = {
            "model": name, "micro_batch": micro, "seq": seq, "grad_checkpointing": gc,
            "flags": " ".join(more).replace(" ".join(LORA[4:]), "all-linear"),
            "estimate_gib": round(est_total, 2), "measured_peak_gib": peak,
            "error_pct": round(100 * (est_total - peak) / peak, 1),
            "estimate_states_gib": round(est_rest, 2), "measured_at_rest_gib": rest,
            "states_error_pct": round(100 * (est_rest - rest) / rest, 1) if rest else None,
            "estimate_parts_gib": {k: round(v / GIB, 2) for k, v in e.items()},
            "max_allocated_gib": allocated, "max_reserved_gib": reserved, "context_gib": context,
            "shape": dict(zip(["hidden", "layers", "intermediate", "heads", "vocab"], MODELS[name])),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    head = ("| model | flags | micro-batch | sequence | checkpointing | estimate GiB | measured peak GiB "
            "| error | model states est. GiB | measured GiB | error |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['model']} | {r['flags']} | {r['micro_batch']} | {r['seq']} | {'yes' if r['grad_checkpointing'] else 'no'} "
             f"| {r['estimate_gib']:.2f} | {r['measured_peak_gib']:.2f} | {r['error_pct']:+.1f}% "
             f"| {r['estimate_states_gib']:.2f} | {r['measured_at_rest_gib']} | "
             f"{'' if r['states_error_pct'] is None else format(r['states_error_pct'], '+.1f') + '%'} |"
             for r in rows]
    table = head + "\n".join(lines) + "\n"
    print(f"GPU: {torch.cuda.get_device_name(0)}, {gpu_gib:.1f} GiB; torch {torch.__version__}")
    print(table)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "gpu_gib": gpu_gib,
                   "torch": torch.__version__, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
