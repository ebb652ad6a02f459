"""The config search path Hydra builds for a command line, for the checks that compose configs before Hydra runs
(``machina.startup.preflight``): a command that names its config (``-cn``, ``-cp``, ``-cd``, as sweep launchers do)
is checked on the config and folders Hydra will use for it, not on the program's own."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra import version
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.initialize import get_gh_backup, restore_gh_from_backup


def search_path_of(config_dir: Path, config_path: str | None, extra_dir: str | None) -> ConfigSearchPath | None:
    """The search path Hydra builds for the command (``hydra._internal.utils._run_hydra``): ``config_path``
    (``--config-path``: a folder, absolute or relative to the program's, or ``pkg://``) in place of ``config_dir``,
    ``extra_dir`` (``--config-dir``) in front. None when the ``--config-dir`` folder does not exist (Hydra says so)."""
    primary = str(config_dir.resolve())
    if config_path is not None:
        relative = not (config_path.startswith("pkg://") or os.path.isabs(config_path))
        primary = os.path.normpath(config_dir.resolve().parent / config_path) if relative else config_path
    search = create_config_search_path(primary)
    if extra_dir is not None:
        folder = os.path.abspath(extra_dir)
        if not os.path.isdir(folder):
            return None
        search.prepend(provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
    return search


@contextmanager
def composing(search: ConfigSearchPath) -> Iterator[None]:
    """Hydra's compose API on ``search`` for the block (``initialize_config_dir`` takes one folder only), Hydra's
    global state as it was afterwards."""
    backup = get_gh_backup()
    try:
        version.setbase("1.3")
        Hydra.create_main_hydra2(task_name="preflight", config_search_path=search)
        yield
    finally:
        restore_gh_from_backup(backup)
