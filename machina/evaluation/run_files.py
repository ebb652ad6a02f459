"""What ``eval.py`` takes from the evaluated run's files beyond its env settings, and the bounds it puts on them.

A run folder may come from elsewhere, so what its files say is bounded by what this machine and this command can do:

- ``env.workers`` (processes): at most this machine's usable cores (``bound_settings`` lowers it, with one line);
- ``env.max_steps``: at most the steps an evaluation plays (``STEP_LIMIT``; more is refused before an env is built);
- a MettaGrid run's game is the one it trained on, kept in its training checkpoints (``MettaGridEnv.state_dict``:
  the game's content and its sha256), not whatever its ``env.game`` path holds today (``use_kept_game``). A run that
  kept none (written before games were kept) is evaluated on a shipped game it names; a file path it names is not
  read (it could name any ``.yaml`` on this disk): ``env.game=PATH`` on the command line chooses one.

Episode lengths beyond what an evaluation plays are refused by the ``Evaluator`` itself.
"""

import logging
from pathlib import Path
from typing import Any

from machina.env.mettagrid import game_file
from machina.env.mettagrid.env import kept_game, usable_cores
from machina.errors import ConfigError
from machina.evaluation.evaluator import STEP_LIMIT
from machina.files.saved_state import within
from machina.policy.io import read_checkpoint_file
from machina.training.checkpoint import latest_checkpoint, run_folder_of

log = logging.getLogger("machina.eval")

METTAGRID = "machina.env.mettagrid.MettaGridEnv"


def bound_settings(settings: dict[str, Any], given: list[str], where: str) -> None:
    """Lower, in place and with one line each, the settings the run's files (``where``) give beyond this machine:
    ``workers`` above its usable cores; refuse a ``max_steps`` beyond the steps an evaluation plays (ConfigError).
    ``given``: the env keys the command line set itself (left as they are)."""
    steps = settings.get("max_steps")
    if "max_steps" not in given and isinstance(steps, int) and steps > STEP_LIMIT:
        raise ConfigError(
            f"{where}: env.max_steps={steps}: an evaluation plays at most {STEP_LIMIT:,} steps, and these episodes "
            f"are longer; give env.max_steps=N (at most {STEP_LIMIT:,})"
        )
    workers, cores = settings.get("workers"), usable_cores()
    if "workers" not in given and isinstance(workers, int) and not isinstance(workers, bool) and workers > cores:
        settings["workers"] = "auto"
        log.info("%s: env.workers=%d is more than this machine's %d cores: evaluating with env.workers=auto",
                 where, workers, cores)  # fmt: skip


def use_kept_game(settings: dict[str, Any], given: list[str], path: Path, where: str) -> str:
    """For a MettaGrid run's ``settings`` (read from ``where``), evaluated from ``path``: set ``kept_game`` to the
    game the run kept and return a few words for the table ("" for another env, or a game the command line gives).
    ConfigError when the run kept no game and names a file."""
    if settings.get("_target_") != METTAGRID or "game" in given or "kept_game" in given:
        return ""
    settings.pop("kept_game", None)  # the checkpoint's copy, or none: never a text the settings file holds
    text = game_of_run(path)
    if text is not None:
        settings["kept_game"] = text
        return f"the game it kept (sha256 {game_file.digest(text)[:12]})"
    game = settings.get("game", "arena")
    if game_file.is_shipped(game):
        return f"the shipped game {game} (the run kept no copy)"
    raise ConfigError(
        f"{where}: env.game names a file, and the run kept no copy of its game (runs of an older machina): "
        "eval.py reads no file a run's settings name; give the game on the command line: env.game=PATH"
    )


def game_of_run(path: Path) -> str | None:
    """The game kept by the training checkpoint ``path``, or (a policy file) by the latest training checkpoint of
    its run folder; None where there is none."""
    data = read_checkpoint_file(path)
    if "ranks" not in data:
        latest = latest_checkpoint(run_folder_of(path) / "checkpoints")
        if latest is None:
            return None
        path, data = latest, read_checkpoint_file(latest)
    ranks = data.get("ranks")
    env = ranks[0].get("env") if isinstance(ranks, list) and ranks and isinstance(ranks[0], dict) else None
    if not isinstance(env, dict):
        return None
    with within(f"checkpoint {str(path)!r}: ranks[0].env."):
        return kept_game(env)
