"""The one env factory: training (``machina.startup.build``), evaluation (``eval.py``, periodic evaluation) and
replays all build their envs from an env config node here, so every env passes the same checks.

The node names its class (``_target_``) and gives the class's own settings, plain values only: no ``_target_``
anywhere below, no Hydra key but ``_convert_``, no setting the class does not take, and nothing resolved. The
factory adds the builder's arguments (``num_envs``, ``seed``, ``device``, ``outputs``, ``stagger``; the node's own
``seed`` / ``device`` / ``outputs`` / ``stagger``, if any, give way to them). Refusals are one-line ConfigErrors.

Which class a node may name depends on where the node comes from:

- read from a FILE (eval.py rebuilding the evaluated run's env from its ``resolved_config.yaml`` or its checkpoint):
  the node is data, and a file must not run code, so its ``_target_`` must be an env class that the configuration in
  force names (``machina.files.trusted``: a ``_target_`` of a YAML file on the command's config search path, such
  as ``conf/env/*.yaml`` or a user's package put on it with ``hydra.searchpath``), and is imported only then;
- COMPOSED (conf/ and the command line: train.py, eval.py's ``env=<name>`` / ``env._target_=...``): the user chose
  the class, so any subclass of ``machina.env.base.Env`` may be named. The caller that holds the composed config
  looks the class up (``machina.startup.build``, ``eval.py``: the modules allowed to import by name) and passes it
  as ``env_class``.

A Gymnasium env id of the form ``module:Env-v0`` makes Gymnasium import ``module``, and a PettingZoo env id names
code to import (``machina.env.pettingzoo.ids``): that is code too, and whoever reads the node from a file decides
whether to allow it (``imported_module``).
"""

import copy
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from machina.env.base import Env
from machina.env.pettingzoo import ids
from machina.errors import ConfigError, one_line
from machina.files.stored_config import check_plain, shorten
from machina.files.trusted import Trusted, in_force

GYMNASIUM = "machina.env.gymnasium.GymnasiumEnv"  # its env ids may name a module to import (``imported_module``)
PETTINGZOO = "machina.env.pettingzoo.PettingZooEnv"  # its env ids name code (``machina.env.pettingzoo.ids``)
CONVERT_MODES = ("none", "partial", "object", "all")  # Hydra's ConvertMode values: values here are plain already
BUILDER_ARGS = ("num_envs", "seed", "device", "outputs", "stagger")  # set by make_env


def env_factory(
    config: Mapping[str, Any] | DictConfig,
    device: torch.device | str,
    env_class: type[Env] | None = None,
    trusted: Trusted | None = None,
) -> Callable[..., Env]:
    """``make_env(seed=..., num_envs=None, stagger=True, outputs=frozenset())``: the env that ``config`` (an env
    config node with its ``_target_``) describes, on ``device``. ``num_envs`` None keeps the node's own (or the
    class's default); ``outputs`` asks for optional outputs (keys of the env's ``spec.outputs``; see ``base.py``).

    ``env_class``: the class a composed config's ``_target_`` names, looked up by the caller; None (a node read from
    a file) allows only an env class the ``trusted`` configuration names (None: ``machina.files.trusted.in_force``).
    ``config`` is checked first (``check_env_settings``); a DictConfig is taken unresolved."""
    settings = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else dict(config)
    check_env_settings(settings, composed=env_class is not None, trusted=trusted)
    cls = env_class or (trusted or in_force()).resolve(settings["_target_"], Env, "env._target_")
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ConfigError(f"env._target_={settings['_target_']} is not an env: it must subclass machina.env.base.Env")
    kwargs = {k: v for k, v in settings.items() if k not in ("_target_", "_convert_", *BUILDER_ARGS)}
    own_num_envs = {"num_envs": settings["num_envs"]} if "num_envs" in settings else {}
    accepted = inspect.signature(cls).parameters
    for key in kwargs:
        if key not in accepted:
            names = ", ".join(p for p in accepted if p not in BUILDER_ARGS)
            raise ConfigError(f"env.{key} is not a setting of {cls.__name__}; its settings: {names}")

    def make_env(
        *, seed: int, num_envs: int | None = None, stagger: bool = True, outputs: Collection[str] = frozenset()
    ) -> Env:
        sizes = own_num_envs if num_envs is None else {"num_envs": num_envs}
        builder = {"seed": seed, "device": str(device), "outputs": frozenset(outputs), "stagger": stagger, **sizes}
        try:
            return cls(**copy.deepcopy(kwargs), **builder)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:  # a value of the wrong type or range the class does not name itself
            why = one_line(err)  # pybind11's messages list signatures over many lines
            raise ConfigError(f"{cls.__name__} refuses its env settings ({type(err).__name__}: {why})") from None

    return make_env


def check_env_settings(settings: Any, source: str = "", composed: bool = False, trusted: Trusted | None = None) -> None:
    """Refuse, with one line naming ``source`` (the file it was read from, if any) and the entry, an env node that
    is not a class with plain values: a ``_target_`` that the ``trusted`` configuration (None:
    ``machina.files.trusted.in_force``) does not name (unless the node is ``composed``: then any class name), a
    Hydra key other than ``_convert_`` (``_args_``, ``_partial_``, ...), a ``_target_`` anywhere below, an
    interpolation, or a value that is not plain."""
    prefix = f"{source}: " if source else ""
    if not isinstance(settings, dict):
        raise ConfigError(f"{prefix}env is of type {type(settings).__name__}, not a mapping of env settings")
    check_plain(settings, source or "the env config", "env")
    target = settings.get("_target_")
    if not isinstance(target, str):
        raise ConfigError(f"{prefix}env._target_ is of type {type(target).__name__}, not the name of an env class")
    if not composed and not (trusted or in_force()).allows(target):
        raise ConfigError(
            f"{prefix}env._target_ is {shorten(target)}, which no config on the search path names; settings read "
            "from a file may name only env classes the configuration in force names (put the package's configs on "
            "it with hydra.searchpath=[pkg://<package>.conf], or name the class on the command line: "
            "env._target_=...)"
        )
    if settings.get("_convert_", "all") not in CONVERT_MODES:
        raise ConfigError(f"{prefix}env._convert_ is not one of {', '.join(CONVERT_MODES)}")
    for key, value in settings.items():
        if key.startswith("_") and key not in ("_target_", "_convert_"):
            raise ConfigError(f"{prefix}env.{key} is not an env setting; an env node names its class and its values")
        nested = find_target(value, f"env.{key}")
        if nested:
            raise ConfigError(
                f"{prefix}{nested} names an object to build; an env node names only its own class and gives it plain "
                "values"
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


def imported_module(settings: Mapping[str, Any]) -> str | None:
    """The module Gymnasium would import to build ``settings`` (``env.id=my_pkg.envs:MyEnv-v0`` -> ``my_pkg.envs``),
    or the code a PettingZoo env id names that a file may not name (``ids.file_may_name``), or None."""
    env_id = settings.get("id")
    if settings.get("_target_") == GYMNASIUM and isinstance(env_id, str) and ":" in env_id:
        return env_id.split(":", 1)[0]
    if settings.get("_target_") == PETTINGZOO and not ids.file_may_name(env_id):
        return str(env_id).split(":", 1)[0]
    return None
