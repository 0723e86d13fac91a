#!/usr/bin/env python3
"""A real transformers.Trainer run (CPU, tiny GPT-2, no downloads) that dies of a real
torch.OutOfMemoryError while it loads a checkpoint's optimizer state (resuming) or while it
saves a checkpoint; training itself always fits.

    python tests/real/hf_trainer_phase_oom.py --oom_in load --oom_times 1 \
        --resume_from_checkpoint out/checkpoint-2 --max_steps 4 --save_steps 2 --output_dir out

--oom_in load: the optimizer's load_state_dict raises (a pre-hook registered on the real
optimizer as the Trainer loads the checkpoint's optimizer.pt into it,
`Optimizer.register_load_state_dict_pre_hook`), so the OOM
surfaces through the Trainer's _load_optimizer_and_scheduler as a real one does.
--oom_in save: the model's state_dict raises while the Trainer saves checkpoint-N
(--oom_save_at), through _save_checkpoint, save_model, save_pretrained.
The message is PyTorch's: the one allocation that failed and the memory in use.
--oom_times N: only the first N launches raise (a count kept in --output_dir); 0: always.
Each launch appends one line to --oomguard_report (if given).
"""
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_trainer_oom import N_POSITIONS, RandomTokens, oom_message  # noqa: E402


@dataclass
class ScriptArguments:
    max_seq_length: int = field(default=64)
    oom_in: str = field(default="none", metadata={"help": "load, save or none"})
    oom_times: int = field(default=1)
    oom_save_at: int = field(default=4)
    oomguard_report: Optional[str] = field(default=None)


def main():
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    defaults = ["--use_cpu", "--report_to", "none", "--logging_steps", "1", "--save_strategy", "steps",
                "--dataloader_num_workers", "0", "--seed", "0"]
    script_args, args = parser.parse_args_into_dataclasses(args=defaults + sys.argv[1:])
    micro, accum, seq = args.per_device_train_batch_size, args.gradient_accumulation_steps, script_args.max_seq_length
    print(f"micro={micro} accum={accum} seq={seq} "
          f"alloc_conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}", flush=True)
    os.makedirs(args.output_dir, exist_ok=True)
    count_file = os.path.join(args.output_dir, f".launches-{script_args.oom_in}")
    launches = int(open(count_file).read()) if os.path.exists(count_file) else 0
    launches += 1
    with open(count_file, "w") as f:
        f.write(str(launches))
    armed = script_args.oom_times == 0 or launches <= script_args.oom_times

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=N_POSITIONS,
                                       bos_token_id=0, eos_token_id=0))
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(256, seq, 128))

    if armed and script_args.oom_in == "load":
        def oom_while_loading(optimizer, state_dict):
            raise torch.OutOfMemoryError(oom_message(micro * seq * 2))
        load = trainer._load_optimizer_and_scheduler

        def load_with_hook(checkpoint):
            # Armed only for the checkpoint's load (accelerate reloads the state
            # itself when it wraps the optimizer).
            if checkpoint is not None:
                torch_optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
                torch_optimizer.register_load_state_dict_pre_hook(oom_while_loading)
            return load(checkpoint)
        trainer._load_optimizer_and_scheduler = load_with_hook
    if armed and script_args.oom_in == "save":
        def oom_while_saving(module, prefix, keep_vars):
            if trainer.state.global_step == script_args.oom_save_at:
                raise torch.OutOfMemoryError(oom_message(micro * seq * 2))
        model.register_state_dict_pre_hook(oom_while_saving)

    resume = args.resume_from_checkpoint
    if resume:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if script_args.oomguard_report:
        with open(script_args.oomguard_report, "a") as f:
            f.write(json.dumps({"micro": micro, "accum": accum, "resumed_from": resume,
                                "global_step": trainer.state.global_step,
                                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}) + "\n")
    print(f"training finished: global_step={trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
