"""Checks of one setting's value, shared by every constructor and start-up check that takes settings.

Each check takes the name, then the value: the setting's name as the caller knows it (a constructor names its own
settings relative to its config node, ``gamma``, and ``machina.startup.build`` puts the node's path in front:
``learner.advantage.gamma``; eval.py's ``episodes``; an entry of a file, ``trainer.epoch``), and the check refuses a
bad value with a ConfigError (a ValueError, so Hydra's instantiation errors unwrap to it) that names it and its value
(at most 80 characters of it): ``gamma=1.5 must be a number in [0, 1]``. Here ``true``/``false`` is never a number
(YAML's ``true`` is not 1) and NaN is in no range. A value that passes is returned unchanged.
"""

import math
from typing import Any

import torch

from machina.errors import ConfigError


def integer(name: str, value: Any, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value``, an integer in [low, high] (a bound of None: no bound); ``why`` is added to the refusal."""
    fits = is_integer(value) and (low is None or value >= low) and (high is None or value <= high)
    if not fits:
        bounds = f" in {low}..{high}" if low is not None and high is not None else ""
        bounds = bounds or (f" >= {low}" if low is not None else f" <= {high}" if high is not None else "")
        raise ConfigError(f"{name}={value!r:.80} must be an integer{bounds}{why}")
    return value


def number(name: str, value: Any, low: float, high: float, why: str = "") -> float:
    """``value``, a number in the closed range [low, high]; an infinite one only where a bound is infinite."""
    if not (is_number(value) and low <= value <= high):
        raise ConfigError(f"{name}={value!r:.80} must be a number in [{low}, {high}]{why}")
    return value


def finite(name: str, value: Any, low: float | None = None, why: str = "") -> float:
    """``value``, a finite number (>= ``low`` when given)."""
    if not (is_number(value) and math.isfinite(value) and (low is None or value >= low)):
        raise ConfigError(f"{name}={value!r:.80} must be a finite number{f' >= {low}' if low is not None else ''}{why}")
    return value


def flag(name: str, value: Any) -> bool:
    """``value``, true or false (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r:.80} must be true or false")
    return value


def device(name: str, value: str) -> torch.device:
    """The torch.device a device setting names: ``auto`` (cuda when present, else cpu), ``cpu``, ``cuda`` or
    ``cuda:N``; refused when it names no device, one this machine does not have, or another kind."""
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(value)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"{name}={value!r} is not a device; use auto, cpu, cuda or cuda:N") from err
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{name}={value!r} but CUDA is not available here; set it to cpu or auto")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise ConfigError(f"{name}={value!r} but only {torch.cuda.device_count()} CUDA devices exist")
    elif chosen.type != "cpu":
        raise ConfigError(f"{name}={value!r} is not supported; use auto, cpu, cuda or cuda:N")
    return chosen


def is_integer(value: Any) -> bool:
    """An int and not a bool (YAML's ``true`` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float and not a bool; NaN and the infinities are numbers here (``finite`` refuses them)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
