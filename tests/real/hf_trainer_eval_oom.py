#!/usr/bin/env python3
"""A real transformers.Trainer run (CPU, tiny GPT-2, no downloads) whose evaluation dies
of a real torch.OutOfMemoryError while per_device_eval_batch_size x max_seq_length >
--eval_budget; training always fits.

    python tests/real/hf_trainer_eval_oom.py --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 2 --max_seq_length 64 --eval_budget 256 \
        --eval_strategy steps --eval_steps 4 --save_steps 2 --max_steps 6 --output_dir /tmp/out

The OOM is raised from a forward pre-hook on the model when it runs in eval mode, so it
surfaces through the Trainer's own evaluation (prediction_step, evaluation_loop,
evaluate) as a real one does, with the message PyTorch prints: the one allocation that
failed and the memory in use. The Trainer evaluates before it saves at a step that does
both, so with --eval_steps 4 --save_steps 2 the OOM at step 4 leaves checkpoint-2 to
resume from. Each launch appends one line to --oomguard_report (if given): the settings
it ran with, the checkpoint it resumed from, the global_step it reached and the
evaluations it finished.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_trainer_oom import N_POSITIONS, RandomTokens, oom_message  # noqa: E402


@dataclass
class ScriptArguments:
    max_seq_length: int = field(default=64)
    eval_budget: int = field(default=256, metadata={
        "help": "largest per_device_eval_batch_size x seq_len that 'fits' in evaluation"})
    oomguard_report: Optional[str] = field(default=None)


class EvalCounter(TrainerCallback):
    evaluations = 0

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations += 1


def main():
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    defaults = ["--use_cpu", "--report_to", "none", "--logging_steps", "1", "--save_strategy", "steps",
                "--dataloader_num_workers", "0", "--seed", "0"]
    script_args, training_args = parser.parse_args_into_dataclasses(args=defaults + sys.argv[1:])
    seq, micro = script_args.max_seq_length, training_args.per_device_train_batch_size
    accum, world = training_args.gradient_accumulation_steps, training_args.world_size
    eval_batch = training_args.per_device_eval_batch_size
    print(f"micro={micro} accum={accum} world={world} seq={seq} eval_batch={eval_batch} "
          f"global_batch={micro * accum * world}", flush=True)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=N_POSITIONS,
                                       bos_token_id=0, eos_token_id=0))

    def fake_oom(module, inputs, kwargs):
        ids = kwargs.get("input_ids", inputs[0] if inputs else None)
        b, s = ids.shape
        if not module.training and b * s > script_args.eval_budget:
            raise torch.OutOfMemoryError(oom_message(b * s))

    model.register_forward_pre_hook(fake_oom, with_kwargs=True)
    counter = EvalCounter()
    trainer = Trainer(model=model, args=training_args, callbacks=[counter],
                      train_dataset=RandomTokens(256, seq, 128),
                      eval_dataset=RandomTokens(32, seq, 128))
    resume = training_args.resume_from_checkpoint
    if resume:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)

    if script_args.oomguard_report:
        with open(script_args.oomguard_report, "a") as f:
            f.write(json.dumps({"micro": micro, "accum": accum, "world": world, "seq": seq,
                                "eval_batch": eval_batch, "global_batch": micro * accum * world,
                                "resumed_from": resume, "global_step": trainer.state.global_step,
                                "evaluations": counter.evaluations}) + "\n")
    print(f"training finished: global_step={trainer.state.global_step} global_batch={micro * accum * world} "
          f"evaluations={counter.evaluations}", flush=True)


if __name__ == "__main__":
    main()
