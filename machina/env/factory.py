"""Envs built from an env config node for the parts that build envs of their own (evaluation, replays), through
machina's own env classes only.

The node may have been read from a file (eval.py rebuilds the evaluated run's env from its ``resolved_config.yaml``
or its checkpoint), so it is data: ``hydra.utils.instantiate`` would import and call whatever its ``_target_``
names, nested ones included (``height: {_target_: pathlib.Path.write_text, ...}`` runs while the node is built).
Here the ``_target_`` is looked up in ``ENVS`` (the optional envs' modules are imported by their fixed names below,
never by a name from the node), the other entries must be the class's arguments, with plain values (no ``_target_``
anywhere below), and nothing is resolved. A composed config (train.py's periodic evaluation) passes the same checks.

A Gymnasium env id of the form ``module:Env-v0`` makes Gymnasium import ``module``: that is code too, and whoever
reads the node from a file decides whether to allow it (``imported_module``).
"""

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from machina.env.base import Env
from machina.errors import ConfigError
from machina.files.stored_config import check_plain, shorten

# _target_ (as conf/env/*.yaml spells it) -> (module, class): the envs an env node may name.
GYMNASIUM = "machina.env.gymnasium.GymnasiumEnv"
ENVS = {
    "machina.env.machina_1.Machina1Env": ("machina.env.machina_1", "Machina1Env"),
    GYMNASIUM: ("machina.env.gymnasium", "GymnasiumEnv"),
    "machina.env.mettagrid.MettaGridArenaEnv": ("machina.env.mettagrid", "MettaGridArenaEnv"),
}
CONVERT_MODES = ("none", "partial", "object", "all")  # Hydra's ConvertMode values: values here are plain already
BUILDER_ARGS = ("num_envs", "seed", "device", "teacher", "stagger")  # set by make_env, as the builder sets them


def env_factory(config: Mapping[str, Any] | DictConfig, device: torch.device | str) -> Callable[..., Env]:
    """``make_env(num_envs=..., seed=..., stagger=..., teacher=...)``: the env that ``config`` (an env config node
    with its ``_target_``, e.g. a run's resolved ``env``) describes, on ``device``. ``config``'s own ``num_envs``
    gives way to the argument; ``seed``, ``device``, ``teacher`` and ``stagger`` are always passed, as the builder
    passes them. ``config`` is checked first (``check_env_settings``); a DictConfig is taken unresolved."""
    settings = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else dict(config)
    check_env_settings(settings)
    cls = env_class(settings["_target_"])
    kwargs = {k: v for k, v in settings.items() if k not in ("_target_", "_convert_", *BUILDER_ARGS)}
    accepted = inspect.signature(cls).parameters
    for key in kwargs:
        if key not in accepted:
            names = ", ".join(p for p in accepted if p not in BUILDER_ARGS)
            raise ConfigError(f"env.{key} is not a setting of {cls.__name__}; its settings: {names}")

    def make_env(*, num_envs: int, seed: int, stagger: bool = True, teacher: bool = False) -> Env:
        builder = {"num_envs": num_envs, "seed": seed, "device": str(device), "teacher": teacher, "stagger": stagger}
        try:
            return cls(**copy.deepcopy(kwargs), **builder)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:  # a value of the wrong type or range the class does not name itself
            why = " ".join(str(err).split())[:300]  # one line: pybind11's messages list signatures over many
            raise ConfigError(f"{cls.__name__} refuses its env settings ({type(err).__name__}: {why})") from None

    return make_env


def check_env_settings(settings: Any, source: str = "") -> None:
    """Refuse, with one line naming ``source`` (the file it was read from, if any) and the entry, an env node that
    is not one of ``ENVS`` with plain values: a ``_target_`` outside ``ENVS``, a Hydra key other than ``_convert_``
    (``_args_``, ``_partial_``, ...), a ``_target_`` anywhere below, an interpolation, or a value that is not plain."""
    prefix = f"{source}: " if source else ""
    if not isinstance(settings, dict):
        raise ConfigError(f"{prefix}env is {shorten(settings)}, not a mapping of env settings")
    check_plain(settings, source or "the env config", "env")
    target = settings.get("_target_")
    if not isinstance(target, str) or target not in ENVS:  # a list would not even hash
        raise ConfigError(f"{prefix}env._target_ is {shorten(target)}, not one of machina's envs ({', '.join(ENVS)})")
    if settings.get("_convert_", "all") not in CONVERT_MODES:
        raise ConfigError(
            f"{prefix}env._convert_ is {shorten(settings['_convert_'])}, not one of {', '.join(CONVERT_MODES)}"
        )
    for key, value in settings.items():
        if key.startswith("_") and key not in ("_target_", "_convert_"):
            raise ConfigError(f"{prefix}env.{key} is not an env setting; an env node names its class and its values")
        nested = find_target(value, f"env.{key}")
        if nested:
            raise ConfigError(
                f"{prefix}{nested} names an object to build; an env node names only its own class (one of machina's "
                "envs) and gives it plain values"
            )


def find_target(value: Any, key: str) -> str | None:
    """The key of the first ``_target_`` inside ``value`` (at ``key``), or None."""
    if isinstance(value, dict):
        if "_target_" in value:
            return f"{key}._target_"
        found = (find_target(item, f"{key}.{name}") for name, item in value.items())
    elif isinstance(value, list):
        found = (find_target(item, f"{key}[{i}]") for i, item in enumerate(value))
    else:
        return None
    return next((f for f in found if f), None)


def env_class(target: str) -> type[Env]:
    """The class ``ENVS`` lists under ``target``, imported from machina's module for it (the optional envs' modules
    import their packages only when an env is built)."""
    module, name = ENVS[target]
    return getattr(importlib.import_module(module), name)


def imported_module(settings: Mapping[str, Any]) -> str | None:
    """The module Gymnasium would import to build ``settings`` (``env.id=my_pkg.envs:MyEnv-v0`` -> ``my_pkg.envs``),
    or None."""
    env_id = settings.get("id")
    if settings.get("_target_") == GYMNASIUM and isinstance(env_id, str) and ":" in env_id:
        return env_id.split(":", 1)[0]
    return None
