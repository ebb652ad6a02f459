"""Envs built from an env config node the way the builder builds the training env, for the parts that build envs
of their own (evaluation, replays)."""

from collections.abc import Callable, Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from machina.env.base import Env


def env_factory(config: Mapping[str, Any] | DictConfig, device: torch.device | str) -> Callable[..., Env]:
    """``make_env(num_envs=..., seed=..., stagger=..., teacher=...)``: the env that ``config`` (an env config node
    with its ``_target_``, e.g. a run's resolved ``env``) describes, on ``device``. ``config``'s own ``num_envs``
    gives way to the argument; ``seed``, ``device``, ``teacher`` and ``stagger`` are always passed, as the builder
    passes them."""
    settings = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)

    def make_env(*, num_envs: int, seed: int, stagger: bool = True, teacher: bool = False) -> Env:
        node = {**settings, "num_envs": num_envs}
        return instantiate(node, seed=seed, device=str(device), teacher=teacher, stagger=stagger)

    return make_env
