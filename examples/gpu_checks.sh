#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: real CUDA out-of-memory errors carried through by
# oomguard, and its memory estimate against the peak PyTorch measures.
#
#   examples/gpu_checks.sh [RESULTS_DIR]
#
# 1. Ladder tier: tests/real/gpu_hf_trainer.py (a small GPT-2 with no config.json, so no
#    memory model) capped at 4 GiB with torch.cuda.set_per_process_memory_fraction,
#    micro-batch 32: the real CUDA OOM at step 7 is carried through by halving the
#    micro-batch (global batch 32 kept) and resuming from checkpoint-5, to step 20.
# 2. Memory-model tier: the same trainer with a Llama-shaped config.json (0.17B, bf16,
#    sdpa) capped at 8 GiB, micro-batch 32 × 1024 tokens: oomguard reads the OOM's
#    numbers (the cap shows as "X allowed;"), calibrates, picks the fix and finishes.
# 3. tests/real/gpu_estimate_check.py: `oomguard estimate` against the measured peak
#    (GPU_CHECKS_ESTIMATE_BUDGET_S: start no case after that many seconds; default 240).
# 4. transformers 4.x's example start (tests/real/hf_example_oom.py --on_gpu: the script
#    stops on a non-empty --output_dir itself): the tier-1 OOM is carried through with
#    --overwrite_output_dir and --resume_from_checkpoint checkpoint-5, never the script's
#    "already exists and is not empty".
# 5. A script that calls trainer.train() bare (tests/real/hf_bare_train_oom.py --on_gpu):
#    the OOM is carried through by a relaunch from step 0 at the halved micro-batch.
#
# Environment: OOMGUARD_BIN (default target/release/oomguard, built), PYTHON (default
# python3, with torch on CUDA and transformers). Exit 0 when every check passed, 1 when
# one failed, 77 when torch sees no CUDA device.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="${1:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks.XXXXXX")}"
mkdir -p "$results"
py="${PYTHON:-python3}"
say() { printf '[gpu_checks] %s\n' "$*" >&2; }

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "skipped: $py has no torch with a CUDA device"
    exit 77
fi
bin="${OOMGUARD_BIN:-$repo/target/release/oomguard}"
if [[ -z "${OOMGUARD_BIN:-}" ]]; then
    (cd "$repo" && cargo build --release --quiet) || exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks_work.XXXXXX")"
trainer="$repo/tests/real/gpu_hf_trainer.py"
failed=0
check() { if "${@:2}"; then say "PASS: $1"; else say "FAIL: $1"; failed=1; fi; }
step_of() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["global_step"])' "$1" 2>/dev/null; }

# ---- 4. an example script's own start (it looks in --output_dir itself) ----
say "4: real CUDA OOM, transformers 4.x example start (listdir)"
"$bin" --run-dir "$work/run4" -- "$py" "$repo/tests/real/hf_example_oom.py" --on_gpu --example_start listdir \
    --per_device_train_batch_size 32 --gradient_accumulation_steps 1 --max_seq_length 512 \
    --output_dir "$work/out4" --max_steps 20 --save_steps 5 --short_until_step 7 \
    >"$results/tier4.out" 2>"$results/tier4.err"
rc=$?
check "tier 4: oomguard exit 0 (was $rc)" test "$rc" -eq 0
check "tier 4: a real CUDA OOM was met" grep -q "CUDA out of memory" "$results/tier4.err" "$results/tier4.out"
check "tier 4: the script never stopped on its non-empty folder" \
    bash -c '! grep -q "already exists and is not empty" "$0" "$1"' "$results/tier4.err" "$results/tier4.out"
check "tier 4: relaunched with --overwrite_output_dir" grep -q -- "--overwrite_output_dir" "$work/run4/journal.jsonl"
check "tier 4: resumed from checkpoint-5" grep -q "resuming from $work/out4/checkpoint-5" "$results/tier4.out"
check "tier 4: global batch 32 kept" grep -q "global_batch=32" "$results/tier4.out"
check "tier 4: trained to step 20" test "$(step_of "$work/out4/checkpoint-20/trainer_state.json")" = 20
cp -r "$work/run4" "$results/run4" 2>/dev/null || true

# ---- 5. trainer.train() called bare: no resume, a relaunch from step 0 ----
say "5: real CUDA OOM, a script that calls trainer.train() bare"
"$bin" --run-dir "$work/run5" -- "$py" "$repo/tests/real/hf_bare_train_oom.py" --on_gpu \
    --per_device_train_batch_size 32 --gradient_accumulation_steps 1 --max_seq_length 512 \
    --output_dir "$work/out5" --max_steps 12 --save_steps 5 --short_until_step 7 \
    >"$results/tier5.out" 2>"$results/tier5.err"
rc=$?
check "tier 5: oomguard exit 0 (was $rc)" test "$rc" -eq 0
check "tier 5: a real CUDA OOM was met" grep -q "CUDA out of memory" "$results/tier5.err" "$results/tier5.out"
check "tier 5: no resume was passed" bash -c '! grep -q "resuming from" "$0"' "$results/tier5.out"
check "tier 5: trained to step 12 at global batch 32" grep -q "training finished: global_step=12 global_batch=32" "$results/tier5.out"
say "tier 5: attempts: $(grep '^micro=' "$results/tier5.out" | cut -d' ' -f1-2 | paste -sd'|')"

# ---- 1. ladder tier ----
say "1: real CUDA OOM, no model config (the ladder)"
"$bin" --run-dir "$work/run1" -- "$py" "$trainer" --per_device_train_batch_size 32 \
    --gradient_accumulation_steps 1 --max_seq_length 512 --output_dir "$work/out1" \
    --max_steps 20 --save_steps 5 --short_until_step 7 >"$results/tier1.out" 2>"$results/tier1.err"
rc=$?
check "tier 1: oomguard exit 0 (was $rc)" test "$rc" -eq 0
check "tier 1: a real CUDA OOM was met" grep -q "CUDA out of memory" "$results/tier1.err" "$results/tier1.out"
check "tier 1: relaunched with --resume_from_checkpoint" grep -q "resuming from $work/out1/checkpoint-" "$results/tier1.out"
check "tier 1: global batch 32 kept" grep -q "global_batch=32" "$results/tier1.out"
check "tier 1: trained to step 20" test "$(step_of "$work/out1/checkpoint-20/trainer_state.json")" = 20

# ---- 2. memory-model tier ----
say "2: real CUDA OOM with a model config (the memory model decides)"
# The same 0.17B Llama-shaped config.json the estimate check writes.
model="$("$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import gpu_estimate_check as g
print(g.write_config(sys.argv[2], "llama-0.17b"))' "$repo/tests/real" "$work")"
args2=(--model_name_or_path "$model" --bf16 true --per_device_train_batch_size 32
    --gradient_accumulation_steps 1 --max_seq_length 1024 --gpu_mem_gib 8
    --output_dir "$work/out2" --max_steps 12 --save_steps 4 --short_until_step 5)
"$bin" estimate --gpu-memory 8 -- "$py" "$trainer" "${args2[@]}" >"$results/tier2.estimate" 2>&1
"$bin" --run-dir "$work/run2" -- "$py" "$trainer" "${args2[@]}" >"$results/tier2.out" 2>"$results/tier2.err"
rc=$?
check "tier 2: oomguard exit 0 (was $rc)" test "$rc" -eq 0
check "tier 2: a real CUDA OOM was met" grep -q "CUDA out of memory" "$results/tier2.err" "$results/tier2.out"
check "tier 2: global batch 32 kept" grep -q "global_batch=32" "$results/tier2.out"
check "tier 2: trained to step 12" test "$(step_of "$work/out2/checkpoint-12/trainer_state.json")" = 12
attempts="$(grep -c '^micro=' "$results/tier2.out")"
say "tier 2: $attempts attempts: $(grep '^micro=' "$results/tier2.out" | cut -d' ' -f1-2,5-6 | paste -sd'|')"
check "tier 2: at most 2 relaunches (3 attempts; was $attempts)" test "$attempts" -le 3
cp -r "$work/run2" "$results/run2" 2>/dev/null || true

# ---- 3. estimate against the measured peak ----
say "3: oomguard estimate against the measured peak"
"$py" "$repo/tests/real/gpu_estimate_check.py" --bin "$bin" --out "$results" --python "$py" \
    --budget_s "${GPU_CHECKS_ESTIMATE_BUDGET_S:-240}" \
    >"$results/estimate.out" 2>&1
rc=$?
cat "$results/estimate.out" >&2
check "estimate check ran every case (exit $rc)" test "$rc" -eq 0

if ((failed)); then say "some checks FAILED; results in $results, work in $work"; exit 1; fi
say "all checks passed; results in $results"
