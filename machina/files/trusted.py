"""What a file may name: the classes the configuration in force names, and no others.

A file read from disk (a policy file, a checkpoint, a run folder's ``resolved_config.yaml``) is data. A class it
names is looked up only when the trusted configuration names the same class: a ``_target_`` in a YAML file of the
config search path in force (machina's ``conf/``, which holds ``experiments/``, plus the folders and packages the
command line or the primary config put on it with ``hydra.searchpath``), or in the composed config itself (a
command line's ``env._target_=my_lab.envs.Maze``). A user who puts a package's configs on the search path has chosen
to run its code; a name a file holds but no trusted config holds is refused before anything is imported.

The set is built from the command's own configuration before any file is read, so a search path or class name
written inside a file never widens it (``in_force`` builds it for the running command). Membership is by the
exact ``_target_`` string; a member is imported only then, and must still be of the kind the slot takes (a policy
component, an env).
"""

import importlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina.errors import ConfigError

TARGET = "_target_"
MAX_FILES = 10_000  # YAML files read from one search-path entry: a config tree, not a disk
MACHINA_CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class Trusted:
    """The ``_target_`` strings a file may name (``targets``), and where they came from (``sources``, for
    messages)."""

    targets: frozenset[str]
    sources: tuple[str, ...] = ()

    def allows(self, target: Any) -> bool:
        return isinstance(target, str) and target in self.targets

    def resolve(self, target: Any, base: type, entry: str) -> type:
        """The class ``target`` names, a subclass of ``base``; a ConfigError naming ``entry`` (``source: key``)
        when no trusted config names it, it cannot be imported, or it is of another kind."""
        if not self.allows(target):
            raise ConfigError(
                f"{entry} is {str(target)[:200]!r}, which no config on the search path names; a file may name only "
                f"classes the configuration in force names ({self.describe()}); put the package's configs on it "
                "with hydra.searchpath=[pkg://<package>.conf] if you trust that code"
            )
        module, _, name = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"{entry} is {target!r}, which cannot be imported ({err})") from None
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ConfigError(f"{entry} is {target!r}, which is not a {base.__module__}.{base.__qualname__}")
        return cls

    def with_targets(self, targets: Iterable[str], source: str) -> "Trusted":
        """This set and ``targets`` (those of a composed config: the command line chose them)."""
        return Trusted(self.targets | frozenset(targets), (*self.sources, source))

    def describe(self) -> str:
        return "the search path " + ", ".join(self.sources) if self.sources else "no config"


def in_force(composed: DictConfig | dict | None = None) -> Trusted:
    """The classes the configuration in force names: the YAML files on the running Hydra app's config search path
    (machina's ``conf/`` alone outside one: tests, benchmarks) and the ``composed`` config (the command's own
    composition, its command line included), if given. Hydra's own configs (its launchers and sweepers) name no
    part and are left out."""
    trusted = from_search_path(hydra_search_path()) if HydraConfig.initialized() else machina_trusted()
    if composed is not None:
        plain = OmegaConf.to_container(composed, resolve=False) if isinstance(composed, DictConfig) else composed
        trusted = trusted.with_targets(targets_in(plain), "the composed config")
    return trusted


def hydra_search_path() -> list[tuple[str, Traversable]]:
    """The running Hydra app's config search path as ``(name, folder)`` entries, without Hydra's own configs."""
    roots = []
    for source in HydraConfig.get().runtime.config_sources:
        if source.provider == "hydra" or source.schema not in ("file", "pkg"):
            continue
        if source.schema == "file":
            roots.append((f"file://{source.path}", Path(source.path).resolve()))
        else:
            package = source.path.replace("/", ".").rstrip(".")
            roots.append((f"pkg://{package}", package_folder(package)))
    return roots


def package_folder(package: str) -> Traversable:
    """The folder of a ``pkg://`` search-path entry (Hydra has imported the package already to read it)."""
    try:
        return resources.files(package)
    except ModuleNotFoundError as err:
        raise ConfigError(f"hydra.searchpath names pkg://{package}, which cannot be imported ({err})") from None


def machina_trusted() -> Trusted:
    """The classes machina's own ``conf/`` names: what a command without its own search path trusts."""
    return Trusted(conf_targets(MACHINA_CONF), (MACHINA_CONF.as_uri(),))


def from_search_path(roots: Iterable[tuple[str, Traversable]]) -> Trusted:
    """The classes the YAML files under ``roots`` (``(name, folder)``: a search path's entries) name."""
    targets: set[str] = set()
    names = []
    for name, root in roots:
        targets |= conf_targets(root) if isinstance(root, Path) else walk_targets(root)
        names.append(name)
    return Trusted(frozenset(targets), tuple(names))


@lru_cache(maxsize=16)
def conf_targets(root: Path) -> frozenset[str]:
    """``walk_targets`` of a folder on disk, read once per process."""
    return walk_targets(root)


def walk_targets(root: Traversable) -> frozenset[str]:
    """Every plain ``_target_`` string in the ``*.yaml`` files below ``root`` (links followed: machina's
    ``conf/experiment`` is a link to ``experiments/``)."""
    found: set[str] = set()
    for count, text in enumerate(yaml_texts(root)):
        if count >= MAX_FILES:
            raise ConfigError(f"the search path entry {root} holds more than {MAX_FILES:,} YAML files")
        for document in yaml.safe_load_all(text):
            found.update(targets_in(document))
    return frozenset(found)


def yaml_texts(root: Traversable, seen: frozenset[str] = frozenset()) -> Iterator[str]:
    """The text of each YAML file below ``root``, each folder visited once (a link cycle ends)."""
    key = os.path.realpath(root) if isinstance(root, Path) else str(root)
    if key in seen or not root.is_dir():
        return
    for child in sorted(root.iterdir(), key=lambda c: c.name):
        if child.is_dir():
            yield from yaml_texts(child, seen | {key})
        elif child.name.endswith((".yaml", ".yml")) and child.is_file():
            yield child.read_text(encoding="utf-8")


def targets_in(node: Any) -> Iterator[str]:
    """The ``_target_`` strings at any depth of a plain ``node`` (interpolations are not names: left out)."""
    if isinstance(node, dict):
        target = node.get(TARGET)
        if isinstance(target, str) and "${" not in target:
            yield target
        for value in node.values():
            yield from targets_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from targets_in(item)
