"""The options of argparse_helper.py, added by a helper as many repositories do: the
script's own source does not show them."""


def add_args(parser):
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--output_dir", default="out")


def add_batch_args(parser):
    """The options of argparse_helper_no_resume.py: a batch, accumulation and an output
    folder, and no --resume_from_checkpoint."""
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--output_dir", default="outputs")
