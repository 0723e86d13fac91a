#!/usr/bin/env python3
"""hf_trainer_oom.py's real Trainer run in the shape of TRL's example scripts and
stanford_alpaca's train.py: the script builds its Trainer and calls trainer.train() with
no argument. --output_dir, --save_steps and the other TrainingArguments parse as
usual, and so does a resume path given on the command line, which the Trainer never
reads: every launch trains from step 0.
"""
import sys

import hf_trainer_oom


def train(trainer):
    trainer.train()
    return None


if __name__ == "__main__":
    # --on_gpu: the same start on gpu_hf_trainer.py's run (a real CUDA OOM; examples/gpu_checks.sh).
    if "--on_gpu" in sys.argv:
        sys.argv.remove("--on_gpu")
        import gpu_hf_trainer as runner
    else:
        runner = hf_trainer_oom
    runner.main(train=train)
