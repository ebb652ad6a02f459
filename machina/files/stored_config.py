"""Configs read back from files, as data: a run folder's ``resolved_config.yaml`` and a training checkpoint's stored
``config``.

A run folder or a checkpoint may come from anyone, and reading one must not run code. An OmegaConf node resolves its
``${...}`` interpolations and resolvers when read (``${consumes:...}`` imports the class it names, ``${oc.env:...}``
reads the environment), and ``hydra.utils.instantiate`` imports and calls whatever a ``_target_`` names. So a stored
config is read here as plain values only:

- YAML through ``yaml.safe_load`` (no tag builds an object), never ``OmegaConf.load``;
- the result must be a tree of dicts with string keys, lists, str, int, float, bool and None; anything else (a date,
  a set, bytes, a tensor, a YAML alias that repeats a node) is refused;
- a string holding ``${`` is refused: it is an interpolation or a resolver call, which only OmegaConf would evaluate,
  and a config machina writes is resolved, so it never holds one. Nothing read from a file is ever resolved.

Each refusal is one ConfigError naming the file and the key (``env.height``, ``env.map_rows[2]``). What the values
may name (a ``_target_``) is checked where they are used: an env's by ``machina.env.factory``.
"""

from pathlib import Path
from typing import Any

import yaml

from machina.errors import ConfigError
from machina.files.bounded import read_regular

PLAIN = (str, int, float, bool, type(None))
MAX_BYTES = 4 * 1024 * 1024  # a resolved config is a few KB, a game's map included well under 1 MB
MAX_DEPTH = 32  # nesting levels; a machina config has about 5, and a deeper walk could exhaust the stack
WHAT = "a stored config is data: plain values only, never resolved or instantiated"


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping of plain values the YAML file ``path`` holds; ConfigError if it is missing, not a regular file (a
    FIFO is never waited on), over ``MAX_BYTES``, not YAML, not a mapping, or holds anything but plain values (see
    the module docstring)."""
    try:
        data = read_regular(path, MAX_BYTES, str(path), "a stored config")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: cannot be read (no such file)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot be read (not UTF-8 text)") from None
    return plain_mapping(parse_yaml(text, str(path)), str(path))


def parse_yaml(text: str | bytes, source: str) -> Any:
    """The document YAML ``text`` (read from ``source``) holds, by ``yaml.safe_load``: no tag builds an object, and
    an interpolation stays a string. ConfigError naming ``source`` when it is not YAML (an impossible date such as
    2024-13-45 included), or nests too deeply to be read. The one YAML reader of machina's stored configs and of
    the run folders that ``machina.run_folder.reading`` summarises."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as err:  # ValueError: a timestamp or number YAML cannot build
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).split("\n")[0] or type(err).__name__
        raise ConfigError(f"{source}: not valid YAML{at} ({problem})") from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ConfigError(f"{source}: nested too deeply to be read") from None


def plain_mapping(data: Any, source: str) -> dict[str, Any]:
    """``data`` (a config read from ``source``), checked to be a mapping of plain values."""
    if not isinstance(data, dict):
        # Its type, not its value: the file may be any file on the disk (a link), a secret in it is not to be printed.
        raise ConfigError(f"{source}: holds a {type(data).__name__}, not a mapping of settings; {WHAT}")
    check_plain(data, source)
    return data


def check_plain(value: Any, source: str, key: str = "") -> None:
    """Refuse anything in ``value`` (read from ``source``; ``key`` is its place there) that is not a tree of plain
    values, and every string holding ``${``."""
    seen: set[int] = set()

    def walk(node: Any, key: str, depth: int) -> None:
        if isinstance(node, str) and "${" in node:
            raise refuse(source, key, "is a string with ${...}, an interpolation or resolver call")
        if isinstance(node, PLAIN):
            return
        if not isinstance(node, dict | list):
            raise refuse(source, key, f"is a {type(node).__name__}, not a plain value")
        if depth >= MAX_DEPTH:
            raise refuse(source, key, f"is nested deeper than {MAX_DEPTH} levels")
        # A YAML alias (or a shared object in a checkpoint) repeats a node: a tree cannot, and walking every repeat
        # of a repeat (a "billion laughs" file) would never end.
        if id(node) in seen:
            raise refuse(source, key, "repeats another entry (a YAML alias); a stored config is a tree")
        seen.add(id(node))
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{key}[{i}]", depth + 1)
            return
        for name, item in node.items():
            if not isinstance(name, str):
                raise refuse(source, key, f"has a key of type {type(name).__name__}, not a string")
            walk(item, join(key, name), depth + 1)

    walk(value, key, 0)


def join(key: str, name: str) -> str:
    """``key.name``, or ``key['name']`` when ``name`` is not a plain word (so the message stays one readable line)."""
    if name.isidentifier():
        return f"{key}.{name}" if key else name
    return f"{key}[{name!r}]"


def shorten(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def refuse(source: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: {key or 'the config'} {why}; {WHAT}")
