"""A real Hydra application (hydra-core from PyPI) whose batch size lives only in
its config. One training step at `data.batch_size` samples of 1024 tokens fits in a
4 GiB budget only at 32 or fewer; above it, it raises a real torch.OutOfMemoryError
naming the one allocation that failed, as the caching allocator does. Hydra itself
parses the override oomguard adds (`++data.batch_size=32`): a `+data.batch_size=32`
would be rejected ("Could not append to config. An item is already at ...").
"""
import sys

import hydra
import torch
from omegaconf import DictConfig

GIB = 1 << 30
BUDGET = 4 * GIB
PER_SAMPLE = 96 << 20  # activations of one 1024-token sample


@hydra.main(version_base=None, config_path="hydra_conf", config_name="config")
def main(cfg: DictConfig) -> None:
    micro = int(cfg.data.batch_size)
    accum = int(cfg.trainer.accumulate_grad_batches)
    print(f"batch_size={micro} accumulate_grad_batches={accum}", flush=True)
    in_use = 2 * GIB  # weights, gradients, optimizer state
    need = micro * PER_SAMPLE
    if in_use + need > BUDGET:
        tried = need // 4  # one layer's activations: the allocation that fails
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a total "
            f"capacity of {BUDGET / GIB:.2f} GiB of which {(BUDGET - in_use) / (1 << 20) / 8:.2f} MiB "
            f"is free. Including non-PyTorch memory, this process has {in_use / GIB:.2f} GiB memory "
            f"in use. Of the allocated memory {in_use / GIB:.2f} GiB is allocated by PyTorch, and "
            f"20.00 MiB is reserved by PyTorch but unallocated."
        )
    for step in range(1, int(cfg.trainer.max_steps) + 1):
        print(f"step {step}: loss {1.0 / step:.3f} (global batch {micro * accum})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
