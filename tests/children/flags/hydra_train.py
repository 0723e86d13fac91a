"""A Hydra application that builds its trainer from the config (lightning-hydra-template's
way: `hydra.utils.instantiate(cfg.trainer)`). Hydra accepts an added
`++trainer.accumulate_grad_batches=2`, but the trainer has no such argument: the call
fails ("got an unexpected keyword argument 'accumulate_grad_batches'")."""
import hydra
from hydra.utils import instantiate

from fake_train import train


class Trainer:
    def __init__(self, max_steps=2):
        self.max_steps = max_steps


@hydra.main(version_base=None, config_path="hydra_conf", config_name="config")
def main(cfg) -> None:
    trainer = instantiate(cfg.trainer)
    train(cfg.data.batch_size, 1, False, trainer.max_steps)


if __name__ == "__main__":
    main()
