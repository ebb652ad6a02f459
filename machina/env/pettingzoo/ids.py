"""``env.id`` of ``env=pettingzoo``: which code it names, whether a file may name it, and the PettingZoo parallel env
it builds (AEC envs through PettingZoo's own ``aec_to_parallel``).

Three forms, each PettingZoo's own convention:

- a registered name (``sisl/pursuit-v5``, ``classic/rps-v2``): ``pettingzoo.make("parallel", id)``, PettingZoo's
  registry (PettingZoo >= 1.27);
- ``package.env_module`` (``mpe2.simple_spread_v3``, ``pettingzoo.butterfly.pistonball_v6``): every PettingZoo env
  module has ``parallel_env`` (taken first) and ``env`` (AEC, converted);
- ``module:function`` (``my_lab.envs:make_maze``): a function returning a ``ParallelEnv`` or an ``AECEnv``.

An id is code to import. From the command line (the composed config) it is the user's choice. Read from a run
folder's file (``eval.py`` rebuilding the run's env), only a registered name (PettingZoo's own code: reading a file
imports nothing that could register one) or a module-form id of the maintained families in ``FILE_FAMILIES`` is
taken as it stands; any other must be given again on the command line (``machina.env.factory.imported_module``
names the module, eval.py refuses it).
"""

import importlib
import re
from collections.abc import Callable
from typing import Any

from machina.errors import ConfigError

FILE_FAMILIES = ("mpe2.", "pettingzoo.")  # module-form ids a run folder's file may name: the maintained families
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
REGISTERED = re.compile(r"[\w.-]+(/[\w.-]+)+")
INSTALL_HINT = "env=pettingzoo needs the pettingzoo extra: pip install -e '.[pettingzoo]'"


def parse(env_id: object) -> tuple[str, str | None]:
    """``(module, function)`` of ``env_id`` (function None for the module form); ConfigError for anything else."""
    module, _, function = env_id.partition(":") if isinstance(env_id, str) else ("", "", "")
    if not MODULE.fullmatch(module) or (function and not function.isidentifier()) or env_id.endswith(":"):
        raise ConfigError(
            f"env.id={env_id!r} is not a PettingZoo env: give an env module (mpe2.simple_spread_v3) or "
            "module:function (my_lab.envs:make_env)"
        )
    return module, function or None


def registered(env_id: object) -> bool:
    """Whether ``env_id`` has the form of a name in PettingZoo's registry (``family/name-vN``)."""
    return isinstance(env_id, str) and REGISTERED.fullmatch(env_id) is not None


def file_may_name(env_id: object) -> bool:
    """Whether a run folder's file may name ``env_id``: a registered name, or the module form of a maintained family
    (``FILE_FAMILIES``)."""
    if registered(env_id):
        return True
    if not isinstance(env_id, str) or ":" in env_id or not MODULE.fullmatch(env_id):
        return False
    return env_id.startswith(FILE_FAMILIES)


def constructor(env_id: str) -> Callable[..., Any]:
    """The function ``env_id`` names (importing its module): ``parallel_env`` or ``env`` of a module, or the named
    function, or PettingZoo's ``make`` of a registered name. ConfigError, one line, when the module cannot be
    imported, has no such function, or the name is not registered."""
    if registered(env_id):
        return from_registry(env_id)
    module_name, function = parse(env_id)
    try:
        importlib.import_module("pettingzoo")
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of a user's module on import is a bad env.id
        why = " ".join(str(err).split()) or type(err).__name__
        missing = getattr(err, "name", None) in ("pettingzoo", "mpe2")  # a package of the extra, not a typo
        hint = f"; {INSTALL_HINT}" if missing else ""
        raise ConfigError(f"env.id={env_id}: cannot import {module_name} ({why}){hint}") from None
    names = (function,) if function else ("parallel_env", "env")
    fn = next((getattr(module, name) for name in names if callable(getattr(module, name, None))), None)
    if fn is None:
        wanted = function or "parallel_env or env (name the function: module:function)"
        raise ConfigError(f"env.id={env_id}: {module_name} has no {wanted}")
    return fn


def from_registry(env_id: str) -> Callable[..., Any]:
    """``make(**kwargs)``: PettingZoo's registered env ``env_id`` as a parallel env."""
    try:
        import pettingzoo
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    names = list(getattr(pettingzoo, "parallel_registry", {}))
    if env_id not in names:
        raise ConfigError(f"env.id={env_id} is not a registered PettingZoo env; registered: {', '.join(names)}")
    from pettingzoo.env_registry.exceptions import PettingZooRegistryError

    def make(**kwargs: Any) -> Any:
        try:
            return pettingzoo.make("parallel", env_id, **kwargs)
        except PettingZooRegistryError as err:  # e.g. the env's own dependencies are not installed
            raise ConfigError(f"env.id={env_id}: {' '.join(str(err).split())}") from None

    return make


def parallel(env_id: str, made: object) -> Any:
    """``made`` as a PettingZoo ``ParallelEnv``: as it is, or an ``AECEnv`` through ``aec_to_parallel`` when its
    metadata says it is parallelizable; anything else is refused in one line."""
    try:
        from pettingzoo import AECEnv, ParallelEnv
        from pettingzoo.utils.conversions import aec_to_parallel
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    if isinstance(made, ParallelEnv):
        return made
    if isinstance(made, AECEnv):
        if not made.metadata.get("is_parallelizable", False):
            raise ConfigError(
                f"env.id={env_id} is an AEC env whose metadata does not set is_parallelizable, so PettingZoo's "
                "aec_to_parallel cannot convert it: machina steps every agent at once (give a parallel env)"
            )
        return aec_to_parallel(made)
    raise ConfigError(f"env.id={env_id} returned {type(made).__name__}, not a PettingZoo ParallelEnv or AECEnv")
