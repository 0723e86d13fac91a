#!/usr/bin/env python3
"""A real transformers.Trainer on CUDA that hits a GENUINE CUDA out-of-memory error.

For sessions with a GPU (nothing here runs in CI). The process's share of the GPU is
capped with torch.cuda.set_per_process_memory_fraction, so the caching allocator
itself raises torch.OutOfMemoryError (its message then also says "... allowed;").
The tiny-ish GPT-2 (4 layers, 512 wide, vocab 8192, fp32, eager attention) needs
roughly 7.6 GiB of saved activations at micro-batch 32 x 512 tokens and 1.9 GiB at 8
(measured on CPU with saved_tensors_hooks), plus ~0.3 GiB of weights and Adam state,
so with the default cap of 4 GiB: 32 OOMs, 16 OOMs (or barely fits), 8 fits.
The script prints torch.cuda.max_memory_allocated() at the end: adjust
--gpu_mem_gib if a GPU/PyTorch version lands elsewhere.

Run it under oomguard (from the repository root, venv from tests/run.sh active):

    cargo build
    target/debug/oomguard --run-dir /tmp/gpu-run \
        python tests/real/gpu_hf_trainer.py --per_device_train_batch_size 32 \
        --gradient_accumulation_steps 1 --max_seq_length 512 \
        --output_dir /tmp/gpu-out --max_steps 20 --save_steps 5 --short_until_step 7

Expected: attempt 1 trains steps 1-6 on short batches, saves checkpoint-5, OOMs at
step 7; oomguard halves the micro-batch (32x1 -> 16x2 -> 8x4, global batch 32) and
relaunches with --resume_from_checkpoint /tmp/gpu-out/checkpoint-5 until it fits;
then checkpoint-20/trainer_state.json has global_step 20. Without
--short_until_step the first step already OOMs and there is nothing to resume.
"""
import os
import sys
from dataclasses import dataclass, field
from typing import List

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel,
                          HfArgumentParser, Trainer, TrainerCallback, TrainingArguments)


@dataclass
class ScriptArguments:
    max_seq_length: int = field(default=512)
    gpu_mem_gib: float = field(default=4.0, metadata={"help": "cap on this process's CUDA memory (0: none)"})
    model_name_or_path: str = field(default="", metadata={
        "help": "a folder with a config.json: that model, randomly initialised (default: the small GPT-2 below)"})
    attn_implementation: str = field(default="", metadata={
        "help": "eager, sdpa, ...; default eager for the small GPT-2, sdpa for --model_name_or_path"})
    short_until_step: int = field(default=0, metadata={
        "help": "steps before this one see batches cut to a quarter of max_seq_length "
                "(like a dataset whose long samples come later), so a checkpoint exists before the OOM"})
    torch_dtype: str = field(default="", metadata={
        "help": "dtype the weights are made in (bfloat16, float16, float32; default float32)"})
    use_peft: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) on a frozen base"})
    lora_r: int = field(default=16)
    lora_target_modules: List[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab):
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepCounter(TrainerCallback):
    step = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1


def main(extra=(), start=None, train=None):
    """The run. `extra`: more argument dataclasses; `start`: called with (training_args,
    *extra's instances) before training, returns the checkpoint to resume from (default:
    --resume_from_checkpoint); `train`: called with the Trainer instead of
    trainer.train(resume_from_checkpoint=...), returns the checkpoint it resumed from."""
    if not torch.cuda.is_available():
        sys.exit("gpu_hf_trainer.py needs a CUDA GPU (use hf_trainer_oom.py on CPU)")
    parser = HfArgumentParser((ScriptArguments, TrainingArguments, *extra))
    defaults = ["--report_to", "none", "--logging_steps", "1", "--save_strategy", "steps", "--seed", "0"]
    script_args, training_args, *more = parser.parse_args_into_dataclasses(args=defaults + sys.argv[1:])
    resume = start(training_args, *more) if start else training_args.resume_from_checkpoint

    total = torch.cuda.get_device_properties(0).total_memory
    if script_args.gpu_mem_gib > 0:
        torch.cuda.set_per_process_memory_fraction(min(1.0, script_args.gpu_mem_gib * 1024 ** 3 / total), 0)
    micro, accum = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    seq, world = script_args.max_seq_length, training_args.world_size
    print(f"micro={micro} accum={accum} world={world} seq={seq} global_batch={micro * accum * world} "
          f"gradient_checkpointing={training_args.gradient_checkpointing} cap={script_args.gpu_mem_gib} GiB",
          flush=True)

    torch.manual_seed(0)
    dtype = getattr(torch, script_args.torch_dtype) if script_args.torch_dtype else torch.float32
    if script_args.model_name_or_path:
        config = AutoConfig.from_pretrained(script_args.model_name_or_path)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=script_args.attn_implementation or "sdpa", torch_dtype=dtype)
    else:
        config = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=1024,
                            bos_token_id=0, eos_token_id=0,
                            attn_implementation=script_args.attn_implementation or "eager")
        model = GPT2LMHeadModel(config)
    if script_args.use_peft:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=script_args.lora_r, lora_alpha=2 * script_args.lora_r,
                                                 target_modules=script_args.lora_target_modules,
                                                 task_type="CAUSAL_LM"))
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters", flush=True)
    counter = StepCounter()

    def shorten_early_batches(module, args, kwargs):
        if module.training and counter.step < script_args.short_until_step:
            keep = max(1, seq // 4)
            kwargs = {k: (v[:, :keep] if torch.is_tensor(v) and v.dim() == 2 else v) for k, v in kwargs.items()}
        return args, kwargs

    model.register_forward_pre_hook(shorten_early_batches, with_kwargs=True)
    trainer = Trainer(model=model, args=training_args, callbacks=[counter],
                      train_dataset=RandomTokens(4096, seq, config.vocab_size))
    if train:
        resume = train(trainer)
    else:
        if resume:
            print(f"resuming from {resume}", flush=True)
        trainer.train(resume_from_checkpoint=resume)
    gib = 1024 ** 3
    free, total = torch.cuda.mem_get_info()
    # The CUDA context and other non-PyTorch memory of this process: what the GPU has
    # in use beyond what the allocator holds (this process is alone on the GPU).
    context = (total - free) - torch.cuda.memory_reserved()
    print(f"max memory allocated: {torch.cuda.max_memory_allocated() / gib:.3f} GiB", flush=True)
    print(f"max memory reserved: {torch.cuda.max_memory_reserved() / gib:.3f} GiB", flush=True)
    print(f"non-PyTorch memory (context): {context / gib:.3f} GiB", flush=True)
    # At rest after training the allocator holds the weights and the optimizer's states
    # (the Trainer frees the gradients after each step): add the gradients back.
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    print(f"model states (weights, gradients, optimizer): "
          f"{(torch.cuda.memory_allocated() + grads) / gib:.2f} GiB", flush=True)
    print(f"peak device memory: {(torch.cuda.max_memory_reserved() + context) / gib:.2f} GiB", flush=True)
    print(f"training finished: global_step={trainer.state.global_step} global_batch={micro * accum * world}",
          flush=True)


if __name__ == "__main__":
    main()
