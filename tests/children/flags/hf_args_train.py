"""HfArgumentParser over the script's own dataclass (not TrainingArguments): it accepts
the dataclass's fields only, and raises "Some specified arguments are not used by the
HfArgumentParser" for any other. No accumulation field, no checkpointing field."""
from dataclasses import dataclass

from transformers import HfArgumentParser

from fake_train import train


@dataclass
class Args:
    per_device_train_batch_size: int = 8
    output_dir: str = "out"


if __name__ == "__main__":
    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    train(args.per_device_train_batch_size)
