"""Train a machina experiment: ``python train.py [group=option ...] [key=value ...]`` (Hydra CLI)."""

import sys
from pathlib import Path

from machina import start_up_signals

if __name__ == "__main__":  # before the imports below (seconds): a signal during them is one line too
    start_up_signals.install(" outside training; the same command continues the folder's last checkpoint, if any")

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from machina.cli import report_errors
from machina.run_folder import run_record
from machina.startup import preflight, resolvers
from machina.training import distributed

# Registered at import time, before @hydra.main composes (also in launcher subprocesses, which re-import this file).
resolvers.register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@record  # under torchrun: a failing rank's traceback goes to torchrun's failure report (a no-op otherwise)
def main(cfg: DictConfig) -> float:
    from machina.run import train

    # Nothing is written to the run folder until the run is accepted (machina.run_folder.run_record); under torchrun
    # this process is one rank of a data-parallel job (docs/tutorials/distributed.md); alone it is the job.
    with run_record.deferred(cfg), report_errors(), distributed.process_group(cfg.system.device):
        return train(cfg)


if __name__ == "__main__":
    # Keys that moved keep their old spelling; a misspelt option or key, or an unwritable run folder, stops here
    # (exit 2), before Hydra makes a run folder; the run folder is pinned, so the one checked is the one used.
    with start_up_signals.reported():
        sys.argv[1:] = preflight.check_or_exit(sys.argv[1:], Path(__file__).resolve().parent / "conf")
        main()
