"""A click program: its options are the only ones it accepts (no accumulation option).
click refuses any other with "Error: No such option: --x" and exit 2."""
import click

from fake_train import train


@click.command()
@click.option("--per_device_train_batch_size", type=int, default=8)
@click.option("--gradient_checkpointing", is_flag=True, default=False)
@click.option("--output_dir", default="out")
def main(per_device_train_batch_size, gradient_checkpointing, output_dir):
    train(per_device_train_batch_size, 1, gradient_checkpointing)


if __name__ == "__main__":
    main()
