#!/bin/sh
# Leaves checkpoint folders the way a crashing trainer does, then dies of a CUDA OOM.
#
#   make_checkpoints.sh --output_dir DIR [--incomplete N] [--unreadable] [any other flags]
#
# --incomplete N: checkpoint-1 … checkpoint-N, empty (killed before anything was saved).
# --unreadable:   checkpoint-(N+100), complete-looking but mode 000 (another user's).
# Other flags (--per_device_train_batch_size …) are accepted and ignored, so oomguard
# finds its knobs and its Hugging Face layout in the command.
out="" n=0 unreadable=""
while [ $# -gt 0 ]; do
    case "$1" in
        --output_dir) out=$2; shift ;;
        --incomplete) n=$2; shift ;;
        --unreadable) unreadable=1 ;;
    esac
    shift
done
mkdir -p "$out"
if [ "$n" -gt 0 ]; then
    (cd "$out" && seq -f 'checkpoint-%.0f' 1 "$n" | xargs mkdir -p)
fi
if [ -n "$unreadable" ]; then
    d="$out/checkpoint-$((n + 100))"
    if [ ! -d "$d" ]; then
        mkdir -p "$d"
        printf '{"global_step": %d}\n' $((n + 100)) > "$d/trainer_state.json"
        printf 'weights' > "$d/model.safetensors"
        chmod 000 "$d"
    fi
fi
echo "Traceback (most recent call last):" >&2
echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.32 GiB is reserved by PyTorch but unallocated." >&2
exit 1
