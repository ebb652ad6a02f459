"""The configs the kit builds parts from: machina's ``conf/`` composed as ``train.py`` composes it, with the
command line's overrides (a user's own package joins with ``hydra.searchpath=[pkg://my_lab.conf]``), at the sizes of
``debug=tiny``."""

from collections.abc import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

from machina.files.trusted import MACHINA_CONF
from machina.startup import resolvers

# Seconds-long runs with nothing sent anywhere: debug=tiny's sizes, one epoch unless the caller says otherwise.
TINY = ("debug=tiny", "wandb=disabled", "trainer.total_timesteps=1024")


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/config.yaml`` composed with ``TINY`` and then ``overrides`` (later ones win), as ``train.py``
    composes it."""
    resolvers.register()
    with initialize_config_dir(config_dir=str(MACHINA_CONF), version_base="1.3", job_name="conformance"):
        return hydra_compose(config_name="config", overrides=[*TINY, *overrides])
