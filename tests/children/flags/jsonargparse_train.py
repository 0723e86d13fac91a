"""A jsonargparse CLI: its options come from the function's signature (no accumulation
option, no checkpointing option); jsonargparse refuses any other ("Unrecognized arguments")."""
from jsonargparse import CLI

from fake_train import train


def main(per_device_train_batch_size: int = 8, output_dir: str = "out"):
    """Train.

    Args:
        per_device_train_batch_size: samples per GPU per step
        output_dir: where checkpoints go
    """
    train(per_device_train_batch_size)


if __name__ == "__main__":
    CLI(main)
