#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: check oomguard's GPU features against nvidia-smi, and
# that an OOM caused by another tenant makes oomguard wait instead of shrinking.
#
#   examples/gpu_tenant_check.sh
#
# 1. `oomguard gpus --json` while a "tenant" process holds 2 GiB, compared with
#    `nvidia-smi --query-gpu=... --format=csv` and `--query-compute-apps=pid,...`:
#    per-GPU memory used and total, every compute process (PID, memory), and the
#    tenant's user and "not an oomguard run".
# 2. A training job under oomguard warms up; then the tenant grabs 60% of the GPU; the
#    job's next allocation OOMs (a real PyTorch message naming the tenant's PID). oomguard
#    must see a foreign tenant, wait until the tenant leaves (it holds for 25 s), and
#    retry with the SAME micro-batch (8), not a halved one; the run must finish.
# 3. oomguard's summary "peak X of Y GiB on GPU N" against the maximum nvidia-smi showed
#    for the job's PIDs (sampled every 0.5 s).
# 4. The sampler's CPU cost per NVML sample (an ignored unit test, run by name).
#
# Environment:
#   OOMGUARD_REAL_PYTHON  python with torch (CUDA); default: the venv of tests/run.sh
#   OOMGUARD_BIN          the oomguard binary; default: target/release/oomguard (built)
#   GPU                   NVML index of the GPU to use; default: the one with most free memory
#   OOMGUARD_FLAGS        options for the supervised run; default "--wait-timeout 180"
#
# Exit: 0 all checks passed; 1 a check failed (the figures are printed side by side);
# 77 skipped: no nvidia-smi, or torch sees no CUDA device.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helper="$repo/examples/gpu_tenant_check.py"
say() { printf '[gpu_tenant_check] %s\n' "$*" >&2; }

if ! command -v nvidia-smi >/dev/null; then
    say "skipped: nvidia-smi not found (no NVIDIA driver here)"
    exit 77
fi

py="${OOMGUARD_REAL_PYTHON:-}"
if [[ -z "$py" ]]; then
    say "OOMGUARD_REAL_PYTHON not set: using the venv of tests/run.sh (created on first use)"
    py="$(bash "$repo/tests/run.sh" --setup-only)"
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "skipped: $py has no torch with a CUDA device"
    exit 77
fi

bin="${OOMGUARD_BIN:-$repo/target/release/oomguard}"
if [[ -z "${OOMGUARD_BIN:-}" ]]; then
    (cd "$repo" && cargo build --release --quiet)
fi
[[ -x "$bin" ]] || { say "error: $bin is not executable"; exit 1; }
read -r -a run_flags <<<"${OOMGUARD_FLAGS:---wait-timeout 180}"

gpu="${GPU:-}"
if [[ -z "$gpu" ]]; then
    gpu="$(nvidia-smi --query-gpu=index,memory.free --format=csv,noheader,nounits |
        sort -t, -k2 -n -r | head -n1 | cut -d, -f1 | tr -d ' ')"
fi
say "using GPU $gpu (NVML index), python $py, oomguard $bin"

work="$(mktemp -d "${TMPDIR:-/tmp}/gpu_tenant_check.XXXXXX")"
say "work folder: $work"
bg_pids=()
cleanup() {
    local p
    for p in "${bg_pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${bg_pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT

# wait_file FILE SECS: until FILE exists and is not empty.
wait_file() {
    local deadline=$((SECONDS + $2))
    until [[ -s "$1" ]]; do
        if ((SECONDS >= deadline)); then
            say "error: $1 did not appear within $2 s"
            return 1
        fi
        sleep 0.2
    done
}

absent() { ! grep -q -- "$1" "$2"; }

failed=0
check() { # check NAME COMMAND...: run, report, remember a failure
    if "${@:2}"; then say "PASS: $1"; else say "FAIL: $1"; failed=1; fi
}

# ---- 1. `oomguard gpus` against nvidia-smi ----
say "phase 1: oomguard gpus vs nvidia-smi, with a tenant holding 2 GiB"
CUDA_VISIBLE_DEVICES="$gpu" CUDA_DEVICE_ORDER=PCI_BUS_ID \
    "$py" "$helper" hold --gib 2 --seconds 600 --ready "$work/hold1.ready" &
hold1=$!
bg_pids+=("$hold1")
wait_file "$work/hold1.ready" 120
sleep 1 # NVML's per-process figures settle
(unset CUDA_VISIBLE_DEVICES; "$bin" gpus --json >"$work/gpus.json")
(unset CUDA_VISIBLE_DEVICES; "$bin" gpus) || true
nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits \
    >"$work/smi_gpus.csv"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits \
    >"$work/smi_apps.csv"
nvidia-smi --query-gpu=memory.used --format=csv
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
check "oomguard gpus matches nvidia-smi" \
    "$py" "$helper" compare-gpus "$work/gpus.json" "$work/smi_gpus.csv" "$work/smi_apps.csv" \
    --tenant-pid "$hold1"
kill "$hold1" 2>/dev/null || true
wait "$hold1" 2>/dev/null || true

# ---- 2. an OOM caused by another tenant: wait, do not shrink ----
say "phase 2: a tenant arrives during training"
export CUDA_VISIBLE_DEVICES="$gpu" CUDA_DEVICE_ORDER=PCI_BUS_ID
sleep 2 # the phase-1 tenant's memory is released
free_mib="$("$py" "$helper" free-mib)"
# The job at micro-batch 8 needs 60% of what is free; the tenant takes 60%: together they
# do not fit, while micro-batch 4 (30%) would fit beside the tenant — so a run that shrinks
# instead of waiting is caught by its micro-batch.
per_sample="$(awk -v f="$free_mib" 'BEGIN { printf "%.3f", f * 0.60 / 8 / 1024 }')"
tenant_gib="$(awk -v f="$free_mib" 'BEGIN { printf "%.3f", f * 0.60 / 1024 }')"
say "free ${free_mib} MiB: ${per_sample} GiB per sample at micro-batch 8, tenant ${tenant_gib} GiB"

(
    while true; do
        echo "---"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits || true
        sleep 0.5
    done
) >"$work/smi_peak.csv" 2>/dev/null &
bg_pids+=("$!")

"$bin" "${run_flags[@]}" --run-dir "$work/run" -- \
    "$py" "$helper" train --per_device_train_batch_size 8 --gradient_accumulation_steps 1 \
    --gib_per_sample "$per_sample" --output_dir "$work/out" \
    --started "$work/train.pids" --ready "$work/tenant.ready" \
    >"$work/oomguard.out" 2>"$work/oomguard.err" &
guard=$!
bg_pids+=("$guard")
wait_file "$work/train.pids" 180

"$py" "$helper" hold --gib "$tenant_gib" --seconds 25 --ready "$work/tenant.ready" \
    >"$work/tenant.out" 2>&1 &
tenant=$!
bg_pids+=("$tenant")
say "tenant pid $tenant"

deadline=$((SECONDS + 540))
while kill -0 "$guard" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
if kill -0 "$guard" 2>/dev/null; then
    say "FAIL: oomguard still running after 540 s"
    kill "$guard" 2>/dev/null || true
fi
rc=0
wait "$guard" || rc=$?
say "oomguard exited $rc; its output:"
cat "$work/oomguard.out" "$work/oomguard.err" >&2

check "oomguard finished the run (exit 0)" test "$rc" -eq 0
check "the job's first attempt OOMed" grep -q "CUDA out of memory" "$work/oomguard.err" "$work/oomguard.out"
check "the retry kept micro-batch 8 (waited, did not shrink)" \
    grep -q "train: done micro_batch=8" "$work/oomguard.out"
check "no attempt ran with a halved micro-batch" \
    absent "micro_batch=4" "$work/oomguard.out"
check "oomguard named the tenant (pid $tenant) in its output or journal" \
    grep -rqw -- "$tenant" "$work/oomguard.err" "$work/run"

# ---- 3. peak figures against nvidia-smi ----
cat "$work/oomguard.out" "$work/oomguard.err" >"$work/oomguard.all"
check "oomguard's peak matches nvidia-smi's maximum for the job's PIDs" \
    "$py" "$helper" compare-peak "$work/oomguard.all" "$work/smi_peak.csv" "$work/train.pids"

# ---- 4. sampling cost with NVML ----
if command -v cargo >/dev/null; then
    say "phase 4: CPU cost of one NVML sample"
    (cd "$repo" && cargo test --release --quiet --bin oomguard gpu::tests::measure_sampling_cost \
        -- --ignored --nocapture 2>&1 | grep -E "µs" >&2) || say "(measurement did not run)"
fi

if ((failed)); then
    say "some checks FAILED; files in $work"
    exit 1
fi
say "all checks passed; files in $work"
