"""Where a refusal raised while the experiment's parts are built points: the setting that caused it.

- ``configured(path)``: a part's constructor names its settings relative to its own node (``clip_coef=-1 must be
  ...``); built inside ``configured("losses.ppo2")`` its refusal reads ``losses.ppo2.clip_coef=-1 must be ...``.
- ``allocating(cfg, groups)``: an allocation that fails while the parts are built (sizes too large for this machine)
  becomes a refusal naming the largest integer settings of those groups: the sizes to lower.
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.errors import InstantiationException
from omegaconf import DictConfig

from machina.errors import ConfigError


@contextmanager
def allocating(cfg: DictConfig, *groups: str) -> Iterator[None]:
    """Turn a failed allocation (the CPU allocator's RuntimeError, MemoryError, CUDA out of memory) while the parts
    are built into a ConfigError naming the largest integer settings of ``groups``: the sizes to lower."""
    try:
        yield
    except (RuntimeError, MemoryError, InstantiationException) as err:
        cause = err.__cause__ if isinstance(err, InstantiationException) else err
        text = f"{type(cause).__name__}: {cause}"
        if not isinstance(cause, MemoryError) and not ALLOCATION_FAILED.search(text):
            raise
        sizes = sorted(
            ((value, f"{group}.{key}") for group in groups for key, value in int_settings(cfg.get(group))),
            reverse=True,
        )
        largest = ", ".join(f"{key}={value:,}" for value, key in sizes[:4])
        raise ConfigError(
            f"the experiment does not fit in memory ({' '.join(text.split())[:160]}); lower the largest sizes: "
            f"{largest}"
        ) from None


# How torch and Python report an allocation that cannot be served.
ALLOCATION_FAILED = re.compile(r"can't allocate memory|out of memory|MemoryError|Cannot allocate memory", re.I)


def int_settings(node, prefix: str = "") -> Iterator[tuple[str, int]]:
    """``(dotted key, value)`` of every integer under ``node`` (a config node, or None)."""
    if not isinstance(node, DictConfig):
        return
    for key, value in node.items_ex(resolve=True):
        if isinstance(value, DictConfig):
            yield from int_settings(value, f"{prefix}{key}.")
        elif isinstance(value, int) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


@contextmanager
def configured(path: str) -> Iterator[None]:
    """Put ``path``, where the part being built is configured, in front of a ConfigError raised while it is built;
    one raised by a node that Hydra builds inside it (a schedule under a loss, a teacher) gets that node's path. A
    message that already begins with the path (a part that names its settings in full) is left as it is. Only parts
    whose refusals name their own settings are built inside it: the env, the policy, the learner and the trainer
    name theirs in full, and pass on refusals that name other nodes."""
    try:
        yield
    except InstantiationException as err:
        if not isinstance(err.__cause__, ConfigError):
            raise
        node = re.search(r"^full_key: (\S+)$", str(err), re.M)  # Hydra's path of the node it was building
        inner = node.group(1) if node else ""
        # The path from the root of what was instantiated: absolute for a config node, relative for a plain dict.
        where = inner if inner == path or inner.startswith(f"{path}.") else ".".join(filter(None, (path, inner)))
        raise ConfigError(placed(where, str(err.__cause__))) from None
    except ConfigError as err:
        raise ConfigError(placed(path, str(err))) from None


def placed(path: str, message: str) -> str:
    """``message`` with ``path.`` in front, unless it already begins with ``path``."""
    return message if message.startswith((f"{path}.", f"{path}=", f"{path} ")) else f"{path}.{message}"
