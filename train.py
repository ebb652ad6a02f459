"""Train a machina experiment: ``python train.py [group=option ...] [key=value ...]`` (Hydra CLI)."""

import hydra
from omegaconf import DictConfig

from machina import resolvers
from machina.cli import report_errors

# Registered at import time, before @hydra.main composes (also in launcher subprocesses, which re-import this file).
resolvers.register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from machina.run import train

    with report_errors():
        return train(cfg)


if __name__ == "__main__":
    main()
