#!/usr/bin/env python3
"""A real transformers.Trainer run (CPU, tiny GPT-2, no downloads) that dies of a real
torch.OutOfMemoryError while per_device_train_batch_size x max_seq_length > --budget.

    python tests/real/hf_trainer_oom.py --per_device_train_batch_size 8 --max_seq_length 64 \
        --budget 256 --output_dir /tmp/hf-out --max_steps 6 --save_steps 2 [--oom_at_step 3]

The OOM is raised from a forward pre-hook on the model, so it surfaces through the
Trainer's own training_step like a real one. With --host_workers K and more than K
--dataloader_num_workers, a real DataLoader worker process raises the C++ allocator's
host OOM instead when it fetches the first batch of step --oom_at_step, and the
DataLoader re-raises it in the Trainer ("Caught RuntimeError in DataLoader worker
process N"). Checkpoints are the Trainer's own
(checkpoint-N/ with trainer_state.json); --resume_from_checkpoint resumes for real.
Each launch appends one line to --oomguard_report (if given): the settings it ran
with, the checkpoint it resumed from and the global_step it reached.
"""
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer,
                          TrainerCallback, TrainingArguments)

N_POSITIONS = 512  # fixed, so that a checkpoint loads whatever the sequence length


@dataclass
class ScriptArguments:
    max_seq_length: int = field(default=64)
    budget: int = field(default=256, metadata={"help": "largest micro_batch x seq_len that 'fits'"})
    oom_at_step: int = field(default=1, metadata={"help": "a run that does not fit dies at this step"})
    oom_while_saving_at: int = field(default=0, metadata={
        "help": "a run that does not fit dies half-way through saving checkpoint-N (weights written, "
                "optimizer and trainer_state.json not)"})
    host_workers: Optional[int] = field(default=None, metadata={
        "help": "the most DataLoader workers the host's memory holds (default: any number)"})
    oomguard_report: Optional[str] = field(default=None)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab, host_oom_at_batch=None, micro=1):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)
        self.host_oom_at_batch, self.micro, self.calls = host_oom_at_batch, micro, 0

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is not None and self.host_oom_at_batch is not None:
            # Worker w fetches batches w, w + W, w + 2W, ... (this copy of the dataset
            # is the worker's own, and so is its count).
            batch = info.id + (self.calls // self.micro) * info.num_workers
            self.calls += 1
            if batch >= self.host_oom_at_batch:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                   f"{info.num_workers * 2 ** 31} bytes. Error code 12 (Cannot allocate memory)")
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def oom_message(tokens):
    gib = 1024 ** 3
    tried = tokens * 8 * 1024 ** 2
    return (f"CUDA out of memory. Tried to allocate {tried / gib:.2f} GiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 22.45 GiB "
            "memory in use. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


class StepCounter(TrainerCallback):
    """Knows which optimizer step is running, so the OOM can wait for --oom_at_step."""
    step = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1


def main(extra=(), start=None, train=None):
    """The run. `extra`: more argument dataclasses (parsed after these two); `start`: called
    with (training_args, *extra's instances) before training, it returns the checkpoint to
    resume from (default: --resume_from_checkpoint); `train`: called with the Trainer to
    train instead of trainer.train(resume_from_checkpoint=...), it returns the checkpoint
    it resumed from."""
    parser = HfArgumentParser((ScriptArguments, TrainingArguments, *extra))
    # Defaults for this test; anything on the command line comes later and wins.
    defaults = ["--use_cpu", "--report_to", "none", "--logging_steps", "1", "--save_strategy", "steps",
                "--dataloader_num_workers", "0", "--seed", "0"]
    script_args, training_args, *more = parser.parse_args_into_dataclasses(args=defaults + sys.argv[1:])
    seq, micro = script_args.max_seq_length, training_args.per_device_train_batch_size
    accum, world = training_args.gradient_accumulation_steps, training_args.world_size
    print(f"micro={micro} accum={accum} world={world} seq={seq} "
          f"gradient_checkpointing={training_args.gradient_checkpointing} global_batch={micro * accum * world}",
          flush=True)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=N_POSITIONS,
                                       bos_token_id=0, eos_token_id=0))
    counter = StepCounter()

    def fake_oom(module, inputs, kwargs):
        ids = kwargs.get("input_ids", inputs[0] if inputs else None)
        b, s = ids.shape
        if module.training and b * s > script_args.budget and counter.step >= script_args.oom_at_step:
            raise torch.OutOfMemoryError(oom_message(b * s))

    model.register_forward_pre_hook(fake_oom, with_kwargs=True)
    workers = training_args.dataloader_num_workers
    host_oom_at_batch = None
    if script_args.host_workers is not None and workers > script_args.host_workers:
        # Step k trains on batches (k-1)*accum ... k*accum-1, and accelerate's
        # DataLoader fetches one batch ahead: batch k*accum is fetched in step k.
        host_oom_at_batch = script_args.oom_at_step * accum
    print(f"dataloader workers: {workers}", flush=True)
    trainer = Trainer(model=model, args=training_args, callbacks=[counter],
                      train_dataset=RandomTokens(256, seq, 128, host_oom_at_batch, micro))
    if script_args.oom_while_saving_at and micro * seq > script_args.budget:
        # The Trainer saves the weights, then the optimizer, then trainer_state.json:
        # an OOM while gathering the optimizer state leaves a checkpoint without it.
        save_optimizer = trainer._save_optimizer_and_scheduler

        def oom_while_saving(output_dir):
            if trainer.state.global_step == script_args.oom_while_saving_at:
                raise torch.OutOfMemoryError(oom_message(micro * seq))
            save_optimizer(output_dir)

        trainer._save_optimizer_and_scheduler = oom_while_saving
    resume = start(training_args, *more) if start else training_args.resume_from_checkpoint
    if train:
        resume = train(trainer)
    else:
        if resume:
            print(f"resuming from {resume}", flush=True)
        trainer.train(resume_from_checkpoint=resume)

    if script_args.oomguard_report and trainer.is_world_process_zero():
        with open(script_args.oomguard_report, "a") as f:
            f.write(json.dumps({"micro": micro, "accum": accum, "world": world, "seq": seq,
                                "workers": workers,
                                "global_batch": micro * accum * world, "resumed_from": resume,
                                "global_step": trainer.state.global_step}) + "\n")
    print(f"training finished: global_step={trainer.state.global_step} global_batch={micro * accum * world}",
          flush=True)
    # Under torchrun: a gloo process group left alive at exit can abort the process
    # ("terminate called without an active exception") after training finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        # The same teardown can still abort at interpreter exit under load (see
        # ddp_oom.py): every file is written, leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
