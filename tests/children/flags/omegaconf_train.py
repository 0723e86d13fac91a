"""OmegaConf alone: `key=value` arguments from the command line merged onto a structured
schema, which refuses a key it does not have ("ConfigKeyError: Key ... not in 'Config'").
The schema has `batch_size` but no accumulation key."""
from dataclasses import dataclass

from omegaconf import OmegaConf

from fake_train import train


@dataclass
class Config:
    batch_size: int = 8
    output_dir: str = "out"


if __name__ == "__main__":
    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.from_cli())
    train(cfg.batch_size)
