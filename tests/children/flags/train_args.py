"""The options of argparse_helper.py, added by a helper as many repositories do: the
script's own source does not show them."""


def add_args(parser):
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--output_dir", default="out")
