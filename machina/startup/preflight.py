"""Check a command line before Hydra starts a run: a misspelt group option or key, or a run folder that cannot be
written, is refused with one line and exit code 2, and nothing is created (Hydra makes the run folder before the
task function runs, so this check has to come first).

    python train.py losses=[ppo,supervisr]    -> 'supervisr' is not an option of group losses (did you mean ...?)
    python train.py trainer.total_timestep=10  -> no key trainer.total_timestep (did you mean ...?)

It parses the overrides with Hydra's own parser and composes the config with the compose API, which writes nothing.
What it cannot judge it leaves to Hydra untouched: ``+key`` additions, ``~key`` deletions, ``hydra.*`` keys, and
sweep values it cannot enumerate (Optuna's ``interval``, ``glob``). Each option a group override names is checked,
``hydra/*`` groups and every value of a sweep (``-m 'losses=[ppo],[ppo,supervisor]'``) included; a key is looked up
in the config composed with the first value of every sweep (and, before it is called unknown, with each other value
of a group sweep, one composition each).
"""

import difflib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from hydra import compose
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from machina.errors import ConfigError
from machina.run_folder.run_record import note_missing_folders
from machina.startup.renamed import renamed
from machina.startup.resolvers import register
from machina.startup.search_path import composing, search_path_of

# Sweeps whose values can be listed; interval() and glob() cannot be judged here.
LISTED_SWEEPS = (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP)


def check_or_exit(argv: list[str], config_dir: Path, config_name: str = "config") -> list[str]:
    """``check`` the command line ``argv`` (without the program), its moved keys in their new spelling
    (``machina.startup.renamed``), and return it as Hydra should get it; on a ConfigError print it and exit with 2."""
    try:
        return check(renamed(argv), config_dir, config_name)
    except ConfigError as err:
        print(f"ConfigError: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def check(argv: list[str], config_dir: Path, config_name: str = "config") -> list[str]:
    """Raise ConfigError for an unknown group option, an unknown key or an unwritable run folder in ``argv``; return
    ``argv`` with a single run's folder pinned (``pin_run_folder``).

    ``config_dir`` is the config folder the program's ``@hydra.main`` names, in the program's folder; a command that
    names another config (``-cn``/``--config-name``, ``-cp``/``--config-path``, ``-cd``/``--config-dir``, as sweep
    launchers do) is checked on the config and search path Hydra will use for it (``search_path_of``). Command
    lines that only ask Hydra for help, overrides Hydra cannot parse and a config folder that does not exist are left
    to Hydra, which reports them before it creates anything.
    """
    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion or args.experimental_rerun or args.cfg:
        return argv
    search = search_path_of(Path(config_dir), args.config_path, args.config_dir)
    if search is None:
        return argv
    config_name = args.config_name or config_name
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException:
        return argv
    if any(o.is_sweep_override() for o in overrides) and not args.multirun:
        return argv  # Hydra explains that a sweep needs --multirun
    register()
    with composing(search):
        if (
            not GlobalHydra.instance()
            .config_loader()
            .repository.config_exists(f"{config_name.removesuffix('.yaml')}.yaml")
        ):
            return argv  # Hydra reports a config it cannot find
        # The search path in force: conf/ plus the folders and packages the command line puts on it, where the
        # options of a user's own groups (env=my_env from hydra.searchpath=[pkg://my_lab.conf]) are found.
        searchpath = [o.input_line for o in overrides if o.key_or_group == "hydra.searchpath"]
        options = GroupOptions(GlobalHydra.instance().config_loader(), config_name, searchpath)
        groups = [o for o in overrides if options.is_group(o)]
        for override in groups:
            check_group_option(options, override)
        keys = [o for o in overrides if not (options.is_group(o) or hydra_key(o))]
        if any(o.type == OverrideType.CHANGE for o in keys):
            check_keys(keys, [o for o in groups if not hydra_key(o)], config_name, searchpath)
        if args.multirun:
            check_run_folder(folder_given(overrides, "hydra.sweep.dir") or Path("outputs"), "hydra.sweep.dir")
            return argv
        return pin_run_folder(argv, overrides, config_name)


def pin_run_folder(argv: list[str], overrides: list[Override], config_name: str) -> list[str]:
    """Resolve a single run's folder once, check it, and remember which of its folders do not exist yet
    (``machina.run_folder.run_record`` removes them again if the command is refused). A folder with an interpolation
    (the
    default ``outputs/${now:...}``) is passed to Hydra resolved (``hydra.run.dir=<folder>``), so the folder checked
    here is the one Hydra makes, not one a second later."""
    given = folder_given(overrides, "hydra.run.dir")
    folder = given
    if folder is None or "${" in str(folder):
        try:
            lines = [o.input_line for o in overrides]
            cfg = compose(config_name=config_name, overrides=lines, return_hydra_config=True)
            folder = Path(str(cfg.hydra.run.dir))
        except (HydraException, OmegaConfBaseException):
            return argv  # Hydra will report why the config does not compose
        argv = [a for a in argv if not a.startswith("hydra.run.dir=")] + [f"hydra.run.dir={quoted(str(folder))}"]
    check_run_folder(folder, "hydra.run.dir")
    note_missing_folders(folder)
    return argv


def folder_given(overrides: list[Override], key: str) -> Path | None:
    given = [o.value() for o in overrides if o.key_or_group == key and not o.is_sweep_override()]
    return Path(str(given[-1])) if given else None


def quoted(value: str) -> str:
    """``value`` as one quoted Hydra override value (a folder may hold characters Hydra's grammar reads: ``=``,
    ``,``, spaces, brackets)."""
    return "'" + value.replace("'", "\\'") + "'"


class GroupOptions:
    """The config groups and their options on the search path in force (``searchpath``: the command line's
    ``hydra.searchpath=...`` overrides, which Hydra applies when it composes), each group listed once."""

    def __init__(self, loader, config_name: str, searchpath: list[str]):
        self.loader, self.config_name, self.searchpath = loader, config_name, searchpath
        self.listed: dict[tuple[str, bool], list[str]] = {}

    def options(self, group: str, configs_only: bool = True) -> list[str]:
        if (group, configs_only) not in self.listed:
            self.listed[group, configs_only] = self.loader.get_group_options(
                group,
                results_filter=ObjectType.CONFIG if configs_only else None,
                config_name=self.config_name,
                overrides=self.searchpath,
            )
        return self.listed[group, configs_only]

    def is_group(self, override: Override) -> bool:
        return bool(self.options(override.key_or_group, configs_only=False))


def hydra_key(override: Override) -> bool:
    return override.key_or_group == "hydra" or override.key_or_group.startswith(("hydra.", "hydra/"))


def check_group_option(groups: GroupOptions, override: Override) -> None:
    """Every option the override names (each value of a sweep, each item of a list) must be in its group."""
    if override.type == OverrideType.DEL:
        return
    options = groups.options(override.key_or_group)
    for value in values(override):
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str) and name not in options:
                raise ConfigError(
                    f"{override.input_line}: '{name}' is not an option of group {override.key_or_group}"
                    f"{did_you_mean(closest(name, options))}; options: {', '.join(options)}"
                )


def values(override: Override) -> list:
    """The values an override sets: one, or each of a listed sweep; none for sweeps that cannot be listed."""
    if not override.is_sweep_override():
        return [override.value()]
    return list(override.sweep_iterator()) if override.value_type in LISTED_SWEEPS else []


def check_keys(keys: list[Override], groups: list[Override], config_name: str, searchpath: list[str]) -> None:
    """Each changed key must exist in the config composed with the group choices (and key additions / deletions) on
    the search path in force."""
    structural = [*searchpath, *map(first_value, (o for o in keys if o.type != OverrideType.CHANGE))]
    keys = [o for o in keys if o.type == OverrideType.CHANGE]
    variants = compositions(groups)
    base = compose_paths(config_name, [*next(variants), *structural])
    if base is None:
        return  # Hydra will report why the config does not compose
    missing = [o for o in keys if o.key_or_group not in base]
    for choice in variants:
        if not missing:
            return
        paths = compose_paths(config_name, [*choice, *structural]) or set()
        missing = [o for o in missing if o.key_or_group not in paths]
    if missing:
        override = missing[0]
        raise ConfigError(unknown_key(override.key_or_group, override.input_line, base))


def compositions(groups: list[Override]) -> Iterator[list[str]]:
    """Group overrides as compose() takes them: first every sweep's first value, then each other value of each
    sweep in turn (the rest at their first values); a key unknown in all of them is unknown."""
    firsts = [first_value(o) for o in groups]
    yield [f for f in firsts if f is not None]
    for i, override in enumerate(groups):
        for value in values(override)[1:] if override.is_sweep_override() else []:
            choice = [*firsts[:i], f"{override.get_key_element()}={as_text(value)}", *firsts[i + 1 :]]
            yield [c for c in choice if c is not None]


def first_value(override: Override) -> str | None:
    """The override as one compose() override: a listed sweep at its first value, other sweeps dropped."""
    if not override.is_sweep_override():
        return override.input_line
    listed = values(override)
    return f"{override.get_key_element()}={as_text(listed[0])}" if listed else None


def as_text(value) -> str:
    return f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)


def compose_paths(config_name: str, overrides: list[str]) -> set[str] | None:
    """Every dotted key path of the composed (unresolved) config, or None when it does not compose."""
    try:
        cfg = compose(config_name=config_name, overrides=[o for o in overrides if o is not None])
    except HydraException:
        return None
    return set(key_paths(OmegaConf.to_container(cfg, resolve=False)))


def key_paths(node, prefix: str = "") -> Iterator[str]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        path = f"{prefix}{key}"
        yield path
        yield from key_paths(value, f"{path}.")


def unknown_key(key: str, override: str, paths: set[str]) -> str:
    """The message for a key that is not in the config: the closest existing key (a sibling with a similar name, a
    similar path, or a key with a similar name anywhere), else the keys under its deepest existing parent."""
    parent, _, leaf = key.rpartition(".")
    match = (
        closest(leaf, children(parent, paths), prefix=f"{parent}." if parent else "")
        or closest(key, [p for p in paths if p.count(".") == key.count(".")], cutoff=0.8)
        or closest(leaf, sorted({p.rpartition(".")[2] for p in paths}), cutoff=0.8, paths=paths)
    )
    hint = did_you_mean(match)
    if not hint:
        while parent and parent not in paths:
            parent = parent.rpartition(".")[0]
        hint = f"; keys {'under ' + parent if parent else 'at the top'}: {', '.join(children(parent, paths))}"
    program = Path(sys.argv[0]).name if sys.argv[0].endswith(".py") else "train.py"
    if program == "eval.py" and key.startswith("env.") and not override.startswith("+"):
        # eval.yaml composes machina_1's env; the evaluated run's env (MettaGrid's game, Gymnasium's id) may differ.
        hint += f"; to change a setting of the run's own env that eval.yaml's env lacks, add it: +{override}"
    return f"{override}: no key '{key}' in the config{hint} ('python {program} --cfg job' prints them all)"


def did_you_mean(match: str) -> str:
    return f" (did you mean '{match}'?)" if match else ""


def children(parent: str, paths: set[str]) -> list[str]:
    """The names of the keys directly under ``parent`` ("" for the top)."""
    prefix = f"{parent}." if parent else ""
    return sorted({p[len(prefix) :] for p in paths if p.startswith(prefix) and "." not in p[len(prefix) :]})


def closest(name: str, options: list[str], cutoff: float = 0.6, prefix: str = "", paths: set[str] | None = None) -> str:
    """The option closest to ``name`` (with ``prefix``), or ""; with ``paths``, every path ending in it."""
    match = difflib.get_close_matches(name, options, n=1, cutoff=cutoff)
    if not match:
        return ""
    if paths is not None:
        return "' or '".join(sorted(p for p in paths if p.rpartition(".")[2] == match[0]))
    return prefix + match[0]


def check_run_folder(folder: Path, key: str) -> None:
    """The run (or sweep) folder, or the folder it will be made in, must be a writable directory. A folder with an
    interpolation left (a sweep folder's ``${now:...}``) is checked at its fixed part."""
    if "${" in str(folder):
        folder = Path(str(folder).split("${", 1)[0] or ".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        problem = f"'{existing}' is not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"'{existing}' is not writable"
    else:
        return
    raise ConfigError(f"cannot use the run folder '{folder}': {problem}; choose another with {key}=PATH")
