#!/usr/bin/env python3
"""hf_trainer_oom.py's real Trainer run, started the way transformers 4.x's example scripts
start (run_clm.py, run_mlm.py, run_translation.py, ... and the many scripts copied from them):
before training they look at --output_dir themselves.

    --example_start last_checkpoint   (4.x's examples) the folder's newest checkpoint-N is
        resumed from when --resume_from_checkpoint is not given; a folder with files but no
        checkpoint-N stops the run ("Output directory ... already exists and is not empty").
    --example_start listdir           (the older examples) any file in the folder stops the run.

--overwrite_output_dir turns both off. transformers 5's TrainingArguments has no such field,
so this script declares it, as scripts kept working on 5 do.
"""
import os
import sys
from dataclasses import dataclass, field

import hf_trainer_oom
from transformers.trainer_utils import get_last_checkpoint


@dataclass
class ExampleArguments:
    example_start: str = field(default="last_checkpoint", metadata={"help": "last_checkpoint or listdir"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Overwrite the content of the output directory."})


def start(training_args, example):
    out = training_args.output_dir
    last_checkpoint = None
    if os.path.isdir(out) and not example.overwrite_output_dir:
        if example.example_start == "listdir":
            if os.listdir(out):
                raise ValueError(f"Output directory ({out}) already exists and is not empty. "
                                 "Use --overwrite_output_dir to overcome.")
        else:
            last_checkpoint = get_last_checkpoint(out)
            if last_checkpoint is None and len(os.listdir(out)) > 0:
                raise ValueError(f"Output directory ({out}) already exists and is not empty. "
                                 "Use --overwrite_output_dir to overcome.")
            if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
                print(f"Checkpoint detected, resuming training at {last_checkpoint}.", flush=True)
    if training_args.resume_from_checkpoint is not None:
        return training_args.resume_from_checkpoint
    return last_checkpoint


if __name__ == "__main__":
    # --on_gpu: the same start on gpu_hf_trainer.py's run (a real CUDA OOM; examples/gpu_checks.sh).
    if "--on_gpu" in sys.argv:
        sys.argv.remove("--on_gpu")
        import gpu_hf_trainer as runner
    else:
        runner = hf_trainer_oom
    runner.main(extra=(ExampleArguments,), start=start)
