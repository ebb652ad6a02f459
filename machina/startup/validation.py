"""Start-up checks of the composed config: plain values against constructor annotations, and the ranges of the
settings whose constructors take any number. The check of one value, which constructors use too, is
``machina.checks``."""

import types
import typing
from typing import Any

from hydra.utils import get_object

from machina import checks
from machina.errors import ConfigError
from machina.training.epoch_metrics import summarize

SIMPLE_TYPES = (bool, int, float, str, type(None))


def check_types(node: Any, path: str = "") -> None:
    """Check every plain value of a ``_target_`` node against the constructor's annotation, so a command-line typo
    (``trainer.total_timesteps=abc``) is refused at start-up with the key's name, not deep inside a step.

    Only annotations made of bool/int/float/str/None are checked (a ``float | Linear`` value given as a plain value
    must be a float); values that are nodes or lists, and unannotated parameters, are left to the constructors.
    """
    if isinstance(node, list):
        for i, item in enumerate(node):
            check_types(item, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    hints = constructor_hints(node["_target_"]) if isinstance(node.get("_target_"), str) else {}
    for key, value in node.items():
        where = f"{path}.{key}" if path else str(key)
        if key in hints and isinstance(value, SIMPLE_TYPES) and not fits(value, hints[key]):
            raise ConfigError(
                f"{where}={value!r} has the wrong type: {node['_target_']} takes {key}: "
                f"{getattr(hints[key], '__name__', hints[key])}; fix the value of {where}"
            )
        check_types(value, where)


def constructor_hints(target: str) -> dict[str, Any]:
    try:
        obj = get_object(target)
        return typing.get_type_hints(obj.__init__ if isinstance(obj, type) else obj)
    except Exception:  # noqa: BLE001 - an unlocatable target or odd annotations: instantiate reports or accepts it
        return {}


def fits(value: Any, annotation: Any) -> bool:
    """Whether a plain config value can be ``annotation``; annotations with no plain member are not checked."""
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if is_union else (annotation,)
    plain = [m for m in members if m in SIMPLE_TYPES]
    if not plain:
        return True
    for member in plain:
        if member is float and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if member is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if member in (bool, str, type(None)) and isinstance(value, member):
            return True
    return False


# Keys whose value must be a finite number >= 0 (torch's optimizers refuse a negative one only with a traceback, and
# take an infinite one).
NON_NEGATIVE = ("optimizer.lr", "optimizer.eps")


def check_ranges(resolved: dict[str, Any]) -> None:
    """Refuse a non-finite or negative value of a ``NON_NEGATIVE`` key, naming the key and the value; a key the chosen
    option does not have is not checked."""
    for key in NON_NEGATIVE:
        node: Any = resolved
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            checks.finite(key, node, low=0)


def check_run(resolved: dict[str, Any]) -> None:
    """Every start-up check of a training config that needs no part built: types, ranges and the objective's name.
    (The ``evaluation`` node, read by ``machina.run`` and not by a constructor, is checked where it is read.)"""
    check_types(resolved)
    check_ranges(resolved)
    objectives = sorted(summarize([]))
    if resolved.get("objective") not in objectives:
        raise ConfigError(
            f"objective={resolved.get('objective')!r} is not a summary metric a run returns; choose one of "
            f"{', '.join(objectives)}"
        )
