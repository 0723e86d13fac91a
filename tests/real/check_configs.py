#!/usr/bin/env python3
"""Feed config files to the real parsers: DeepSpeed's DeepSpeedConfig for *.json,
accelerate's config loader for *.yaml. Prints one line per file; exits 1 if any
file is refused.

    python tests/real/check_configs.py run/attempt-*/ds.json run/attempt-*/acc.yaml
"""
import sys


def main():
    from accelerate.commands.config.config_args import load_config_from_file
    from deepspeed.runtime.config import DeepSpeedConfig

    bad = 0
    for path in sys.argv[1:]:
        try:
            if path.endswith(".json"):
                c = DeepSpeedConfig(path)
                print(f"ok deepspeed {path}: micro={c.train_micro_batch_size_per_gpu} "
                      f"accum={c.gradient_accumulation_steps} train_batch_size={c.train_batch_size} "
                      f"stage={c.zero_optimization_stage} "
                      f"offload_optimizer={c.zero_config.offload_optimizer.device if c.zero_config.offload_optimizer else 'none'} "
                      f"offload_param={c.zero_config.offload_param.device if c.zero_config.offload_param else 'none'}")
            else:
                c = load_config_from_file(path)
                print(f"ok accelerate {path}: distributed_type={c.distributed_type} "
                      f"deepspeed_config={c.deepspeed_config}")
        except Exception as e:  # any refusal is a failure of the derived file
            bad += 1
            print(f"REFUSED {path}: {type(e).__name__}: {e}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
