"""Raises a real torch.OutOfMemoryError inside a third-party training program that
nobody here wrote (nanoGPT's train.py in tests/real/third_party/nanogpt, TRL's sft.py
from the installed trl, LLaMA-Factory's `llamafactory-cli train`), without editing its files.

Python imports `sitecustomize` from PYTHONPATH at start-up; this one waits for the
program to import its `model` module and wraps `GPT.forward`: in training mode, once
the program's own `iter_num` (a global of train.py, run as __main__) reaches
OOMGUARD_TEST_OOM_AT_ITER, and while `batch_size * block_size` (train.py's globals,
as its configurator set them from the command line) is above OOMGUARD_TEST_BUDGET,
the forward raises the error PyTorch's caching allocator raises, with its message:
the one allocation that failed and the memory in use. Everything else — the loop,
the checkpoint, the resume, the output — is the program's own.

For a Hugging Face Trainer program (TRL's recipes, LLaMA-Factory), OOMGUARD_TEST_OOM_AT_STEP wraps
`transformers.Trainer.training_step` instead: once the Trainer's global_step reaches it,
while `per_device_train_batch_size * max_length` (the program's own parsed arguments)
is above OOMGUARD_TEST_BUDGET, the training step raises the same error. Where the
arguments hold no max_length (LLaMA-Factory keeps its `cutoff_len` in its data
arguments), the micro-batch alone is held to the budget.
"""
import importlib.abc
import importlib.machinery
import os
import sys

OOM_AT = os.environ.get("OOMGUARD_TEST_OOM_AT_ITER")
OOM_AT_STEP = os.environ.get("OOMGUARD_TEST_OOM_AT_STEP")
BUDGET = int(os.environ.get("OOMGUARD_TEST_BUDGET", "0"))


def oom_message(tokens):
    gib = 1024 ** 3
    tried = tokens * 8 * 1024 ** 2
    return (f"CUDA out of memory. Tried to allocate {tried / gib:.2f} GiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 22.45 GiB "
            "memory in use. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def patch(module):
    import torch
    gpt = getattr(module, "GPT", None)
    if gpt is None:
        return
    forward = gpt.forward

    def guarded(self, *args, **kwargs):
        main = sys.modules.get("__main__")
        it = getattr(main, "iter_num", 0)
        tokens = getattr(main, "batch_size", 0) * getattr(main, "block_size", 0)
        if self.training and OOM_AT is not None and it >= int(OOM_AT) and tokens > BUDGET:
            raise torch.OutOfMemoryError(oom_message(tokens))
        return forward(self, *args, **kwargs)

    gpt.forward = guarded


def patch_trainer(module):
    import torch
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return
    step = trainer.training_step

    def guarded(self, *args, **kwargs):
        tokens = self.args.per_device_train_batch_size * (getattr(self.args, "max_length", None) or 1)
        if self.state.global_step >= int(OOM_AT_STEP) and tokens > BUDGET:
            raise torch.OutOfMemoryError(oom_message(tokens))
        return step(self, *args, **kwargs)

    trainer.training_step = guarded


class _Finder(importlib.abc.MetaPathFinder):
    """Patches module `name` with `patch` once it is imported."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if OOM_AT is not None:
    sys.meta_path.insert(0, _Finder("model", patch))
if OOM_AT_STEP is not None:
    sys.meta_path.insert(0, _Finder("transformers.trainer", patch_trainer))
