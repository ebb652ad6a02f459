"""Checks of state read back from a file, for the code that restores it.

A checkpoint can hold anything: its checksum proves no author (``machina.files.checksum``) and ``torch.load`` guarantees
only plain data (``machina.files.torch_file``). So every entry is checked before it is used, and a bad one raises a
ConfigError naming it (an integer entry through ``machina.checks.integer``, with ``INT64_MAX`` as its bound where it
has no other). Names are relative to what the checking code was handed (``pos``, ``state.lstm_h``);
``within`` puts the name of the enclosing part in front (``ranks[0].env.pos``), and the loader the file's.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from machina.errors import ConfigError

INT64_MAX = 2**63 - 1  # what a count must fit in: it becomes an int64 tensor or metric


@contextmanager
def within(prefix: str) -> Iterator[None]:
    """Put ``prefix`` in front of the message of a ConfigError raised inside (``"env."``, ``"checkpoint 'x': "``)."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"{prefix}{err}") from None


def describe(value: Any) -> str:
    """``value``'s kind in a few words: "a tensor of shape [8, 4] and dtype torch.int64", "a str"."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def mapping(value: Any, name: str, keys: tuple[str, ...] | None = None, optional: tuple[str, ...] = ()) -> dict:
    """``value``, which must be a dict with string keys (when ``keys`` is given: all of ``keys``, and no others but
    ``optional``)."""
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ConfigError(f"{name} is {describe(value)}, not a mapping of names")
    if keys is not None and not set(keys) <= set(value) <= set(keys) | set(optional):
        missing, extra = sorted(set(keys) - set(value)), sorted(set(value) - set(keys) - set(optional))
        raise ConfigError(f"{name} has the entries {sorted(value)}: missing {missing}, unexpected {extra}")
    return value


def tensor(
    state: Mapping,
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    low: float | None = None,
    high: float | None = None,
) -> torch.Tensor:
    """``state[name]``: a tensor of exactly ``shape`` and ``dtype``, finite if floating point, with every value in
    [low, high] (a bound left None is not checked)."""
    value = state.get(name)
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape) or value.dtype != dtype:
        found = describe(value) if name in state else "absent"
        raise ConfigError(
            f"{name} is missing or has the wrong shape or dtype ({found}; expected shape {list(shape)}, {dtype})"
        )
    values(value, name, low, high)
    return value


def values(value: torch.Tensor, name: str, low: float | None = None, high: float | None = None) -> None:
    """Refuse NaN or infinite values in a floating-point ``value``, and values outside [low, high]."""
    bad = torch.zeros(value.shape, dtype=torch.bool, device=value.device)
    if value.is_floating_point():
        bad |= ~value.isfinite()
    if low is not None:
        bad |= value < low
    if high is not None:
        bad |= value > high
    expected = ["finite"] * value.is_floating_point() + [f">= {low}"] * (low is not None)
    expected += [f"<= {high}"] * (high is not None)
    refuse_any(bad, value, name, " and ".join(expected))


def refuse_any(bad: torch.Tensor, value: torch.Tensor, name: str, expected: str) -> None:
    """Refuse ``value`` where the bool mask ``bad`` (its shape) is set, naming the first such element's index."""
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        at = f"[{', '.join(map(str, index))}]" if index else ""
        raise ConfigError(f"{name}{at} is {value[index].item()}, expected {expected}")


def like(saved: Any, live: Mapping[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """``saved``: a mapping of exactly ``live``'s keys to tensors of the same shapes and dtypes, finite when floating
    point (state that a restore copies into ``live``)."""
    saved = mapping(saved, name, tuple(live))
    for key, own in live.items():
        with within(f"{name}."):
            tensor(saved, key, tuple(own.shape), own.dtype)
    return saved
