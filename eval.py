"""Evaluate a policy: ``python eval.py checkpoint=PATH [episodes=N] [greedy=true] [env.<key>=VALUE ...]``.

Plays ``episodes`` full episodes on fixed layouts with the policy, the env's scripted teacher (where it has one) and
a random policy, prints the rows, writes them to ``eval.json`` and (``replay=true``) one env's episode to
``replay.gif`` in the output folder (``hydra.run.dir``). The env is the one the checkpoint's run trained on (its
``resolved_config.yaml``, or the training checkpoint's stored config), with the ``env.<key>=VALUE`` given on the
command line on top; ``env=<name>`` starts from that env's defaults instead.

The run's settings are read as data (``machina.files.stored_config``, ``machina.env.factory``): nothing in them is
resolved or instantiated, and the classes they and the policy file name must be named by the configuration in force
(``machina.files.trusted``: machina's ``conf/`` plus what this command puts on the search path, e.g.
``hydra.searchpath=[pkg://my_lab.conf]`` for a run of your own env or components), so a run folder or checkpoint from
elsewhere cannot run code. An env class named by this command (``env=<name>``, ``env._target_=...``) is the user's
choice and may be any ``machina.env.base.Env``. Every setting of eval.py is
checked before anything is evaluated or written; a bad one ends it with one line and exit code 2.
"""

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from machina import start_up_signals

if __name__ == "__main__":  # before the imports below (seconds): a Ctrl-C during them is one line too
    start_up_signals.install()

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina import checks
from machina.cli import report_errors
from machina.env.base import Env
from machina.env.factory import check_env_settings, env_factory, imported_module
from machina.errors import ConfigError
from machina.evaluation.evaluator import Evaluator
from machina.evaluation.gif import save_gif
from machina.evaluation.run_files import bound_settings, use_kept_game
from machina.files.atomic import atomic_write
from machina.files.stored_config import plain_mapping, read_yaml
from machina.files.trusted import Trusted, in_force
from machina.policy.io import load_policy, read_checkpoint_file
from machina.run_folder import run_record
from machina.startup import preflight, resolvers
from machina.startup.build import named_class
from machina.training.checkpoint import named_checkpoint, run_folder_of

resolvers.register()
log = logging.getLogger("machina.eval")

SETTINGS = ("checkpoint", "episodes", "greedy", "seed", "device", "replay", "replay_steps", "replay_fps", "replay_cell")
MAX_SEED = 2**32 - 1  # as system.seed: numpy's generators take seeds below 2**32
MAX_REPLAY_STEPS = 10_000  # the frames are held in memory: 10,000 at 24 pixels per cell of an 11x11 map are 3 GB
MAX_REPLAY_FPS = 100  # a GIF's frame delay counts hundredths of a second: faster cannot be shown
MAX_REPLAY_CELL = 64
FOLDER_HINT = "choose another with hydra.run.dir=PATH"
ABSENT = object()  # a key the command line deleted (~env.<key>)


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    # Nothing is written (Hydra's .hydra/ record and log included) until the results are
    # (machina.run_folder.run_record).
    with run_record.deferred(cfg), report_errors():
        hydra_cfg = HydraConfig.get()
        evaluate(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task))


def evaluate(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> None:
    """Load the policy, compare it with the teacher and a random policy, write eval.json and replay.gif.
    ``overrides``: the command line's overrides (which ``env`` settings the user gave)."""
    device = check_settings(cfg)
    check_output_folder(out_dir)
    path = named_checkpoint("checkpoint", str(cfg.checkpoint))
    trusted = in_force(cfg)  # what the files may name: this command's search path and its own settings
    policy, obs_spec = load_policy(path, device, trusted=trusted)
    env_cfg, source, where, own_class = env_settings(cfg, path, overrides, trusted)
    env_class = named_class("env._target_", env_cfg.get("_target_"), Env, "an env") if own_class else None
    try:
        evaluator = Evaluator(env_factory(env_cfg, device, env_class, trusted), cfg.episodes, cfg.greedy, cfg.seed)
        evaluator.check(obs_spec, policy.num_actions)
    except ConfigError as err:
        raise ConfigError(f"{err} (env settings from {where})") from None
    frames = replay_frames(cfg, evaluator, policy)
    rows = evaluator.compare(policy)

    columns = [name for name in rows["policy"] if f"{name}_std" in rows["policy"]]  # every stat the env reports
    width = max(22, *(len(c) + 2 for c in columns))
    lines = [
        f"checkpoint {path}",
        f"env {env_cfg['_target_']} with {source}",
        f"{cfg.episodes} episodes, seed {cfg.seed}, {'greedy' if cfg.greedy else 'sampled'} actions",
        f"{'':<8}" + "".join(f"{c:>{width}}" for c in columns),
    ]
    for name, row in rows.items():
        cells = (f"{row[c]:.3f} +- {row[c + '_std']:.3f}" for c in columns)
        lines.append(f"{name:<8}" + "".join(f"{cell:>{width}}" for cell in cells))
    if "teacher_agreement" in rows["policy"]:
        agreement = rows["policy"]["teacher_agreement"]
        lines.append(f"policy's agreement with the teacher (most likely action): {agreement:.3f}")
    log.info("\n".join(lines))  # one record: the table's rows carry no log prefix
    result = {"checkpoint": str(path), "episodes": cfg.episodes, "greedy": cfg.greedy, "seed": cfg.seed, **rows}
    write_results(out_dir, result, frames, cfg.replay_fps)
    log.info("wrote %s", out_dir)


def check_settings(cfg: DictConfig) -> torch.device:
    """Refuse, naming the setting, what eval.py cannot use; return the device. Checked: no setting but eval.yaml's
    (and ``env``); ``checkpoint`` given; ``episodes`` an integer >= 1; ``seed`` an integer in 0..2**32-1; ``greedy``
    and ``replay`` true or false; ``replay_steps`` null or an integer in 1..MAX_REPLAY_STEPS; ``replay_fps`` a number
    in (0, MAX_REPLAY_FPS]; ``replay_cell`` an integer in 1..MAX_REPLAY_CELL; ``device`` present here."""
    unknown = [key for key in cfg if key not in (*SETTINGS, "env")]
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a setting of eval.py; its settings: {', '.join(SETTINGS)}, env.<key>")
    if OmegaConf.is_missing(cfg, "checkpoint") or cfg.checkpoint in (None, ""):
        raise ConfigError("give checkpoint=PATH: a policy file, a training checkpoint, or a run folder (its latest)")
    if isinstance(cfg.checkpoint, bool) or not isinstance(cfg.checkpoint, str | int):
        raise ConfigError(f"checkpoint={cfg.checkpoint!r} is not a path")
    checks.integer("episodes", cfg.episodes, 1)
    checks.integer("seed", cfg.seed, 0, MAX_SEED)
    for key in ("greedy", "replay"):
        checks.flag(key, cfg[key])
    if cfg.replay_steps is not None:
        checks.integer("replay_steps", cfg.replay_steps, 1, MAX_REPLAY_STEPS, " (or null: one full episode)")
    fps = cfg.replay_fps
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= MAX_REPLAY_FPS:
        raise ConfigError(f"replay_fps={fps!r} must be a number > 0 and <= {MAX_REPLAY_FPS} (GIF frames per second)")
    checks.integer("replay_cell", cfg.replay_cell, 1, MAX_REPLAY_CELL, " (pixels per map cell)")
    return checks.device("device", cfg.device)


def check_output_folder(out_dir: Path) -> None:
    """The output folder, or the folder it will be made in, must be a writable folder: checked before the evaluation,
    so that its numbers are not lost at the end."""
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problem = "not a folder" if not existing.is_dir() else "not writable"
        raise ConfigError(f"cannot write to the output folder '{out_dir}': '{existing}' is {problem}; {FOLDER_HINT}")


def write_results(out_dir: Path, result: dict[str, Any], frames: list | None, fps: float) -> None:
    """eval.json and (with frames) replay.gif in ``out_dir``, each written whole or not at all."""
    text = json.dumps(result, indent=2) + "\n"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        run_record.accept()
        atomic_write(out_dir / "eval.json", lambda f: f.write(text.encode()))
        if frames is not None:
            save_gif(frames, out_dir / "replay.gif", fps)
    except OSError as err:
        why = err.strerror or err
        raise ConfigError(f"cannot write to the output folder '{out_dir}' ({why}); {FOLDER_HINT}") from None


def replay_frames(cfg: DictConfig, evaluator: Evaluator, policy: torch.nn.Module) -> list | None:
    """The replay's frames (``replay=true``), or None. An env that cannot draw is refused before anything is played
    (``Evaluator.check_replays``)."""
    if not cfg.replay:
        return None
    evaluator.check_replays("replay=false")
    return evaluator.episode_frames(policy, cfg.replay_steps, cell=cfg.replay_cell)


def env_settings(
    cfg: DictConfig, path: Path, overrides: list[str], trusted: Trusted
) -> tuple[dict[str, Any], str, str, bool]:
    """The env settings to evaluate on, where they came from (for the table), the place to name in errors, and
    whether their ``_target_`` is this command's (eval.yaml's or the command line's: any env class) rather than a
    file's (a class the ``trusted`` configuration names): the run's env settings (its resolved_config.yaml, else the
    checkpoint's stored config) with the command line's ``env.<key>`` overrides on top; eval.yaml's env (with the
    overrides) when the command line picks ``env=<name>`` or the run's settings cannot be found.

    A Gymnasium env id naming a module (``my_pkg.envs:MyEnv-v0``) makes Gymnasium import it, and a PettingZoo id
    names code (``machina.env.pettingzoo.ids.file_may_name``): from the run's settings such an id is refused, unless
    the command line gives ``env.id`` itself. What else the run's files give is bounded and a MettaGrid run's game is
    the one it kept (``machina.evaluation.run_files``)."""
    given = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    env_keys = [k.removeprefix("env.") for k in given if k.startswith("env.")]
    # eval's own config (conf/ and this command line), not a file: the user's interpolations are theirs to resolve.
    chosen = OmegaConf.to_container(cfg.env, resolve=True)
    run = None if "env" in given else run_env(path, trusted)
    if run is None:
        return chosen, "eval.yaml's env settings and the command line's", "eval.yaml and the command line", True
    settings, where = run
    for key in env_keys:
        put(settings, key, lookup(chosen, key))
    module = imported_module(settings)
    if module is not None and "id" not in env_keys:
        raise ConfigError(
            f"{where}: env.id={settings['id']!r} makes the env import the module {module!r}, which is code, and "
            "eval.py runs no code named in a file; if you trust that module, give the id on the command line: "
            f"+env.id={settings['id']}"
        )
    bound_settings(settings, env_keys, where)
    game = use_kept_game(settings, env_keys, path, where)
    changed = f", changed on the command line: {', '.join(env_keys)}" if env_keys else ""
    on_game = f", on {game}" if game else ""
    return settings, f"the run's env settings ({where}){changed}{on_game}", where, "_target_" in env_keys


def run_env(path: Path, trusted: Trusted) -> tuple[dict[str, Any], str] | None:
    """The env settings of the run that wrote ``path`` (checked: plain values naming an env class the ``trusted``
    configuration names), and the file they came from; None if the run left none (a policy file outside a run
    folder)."""
    folder = run_folder_of(path)
    resolved = folder / "resolved_config.yaml"
    if resolved.is_file():
        config, where = read_yaml(resolved), str(resolved)
    else:
        config, where = read_checkpoint_file(path).get("config"), str(path)
        if config is None:
            return None
        config = plain_mapping(config, f"{where} (its stored config)")
    if "env" not in config:
        raise ConfigError(f"{where}: has no env settings (no 'env' entry); evaluate with env=<name> and env.<key>=...")
    check_env_settings(config["env"], where, trusted=trusted)
    return config["env"], where


def lookup(node: Any, key: str) -> Any:
    """The value at the dotted ``key`` of the plain ``node``, or ABSENT."""
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def put(settings: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` of the plain ``settings`` to ``value`` (ABSENT: delete it), making mappings on the way."""
    *parents, leaf = key.split(".")
    node = settings
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if value is ABSENT:
        node.pop(leaf, None)
    else:
        node[leaf] = value


if __name__ == "__main__":
    # A misspelt setting, an unknown env=<name> or an unwritable output folder stops here (exit 2), before Hydra
    # starts.
    with start_up_signals.reported():
        sys.argv[1:] = preflight.check_or_exit(sys.argv[1:], Path(__file__).resolve().parent / "conf", "eval")
        main()
