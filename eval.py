"""Evaluate a policy: ``python eval.py checkpoint=PATH [episodes=N] [greedy=true] [env.<key>=VALUE ...]``.

Plays ``episodes`` full episodes on fixed layouts with the policy, the env's scripted teacher (where it has one) and
a random policy, prints the rows, writes them to ``eval.json`` and (``replay=true``) one env's episode to
``replay.gif`` in the output folder (``hydra.run.dir``). The env is the one the checkpoint's run trained on (its
``resolved_config.yaml``, or the training checkpoint's stored config), with the ``env.<key>=VALUE`` given on the
command line on top; ``env=<name>`` starts from that env's defaults instead.
"""

import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina import resolvers
from machina.cli import report_errors
from machina.env.factory import env_factory
from machina.errors import ConfigError
from machina.evaluation.evaluator import Evaluator
from machina.evaluation.gif import save_gif
from machina.policy.io import load_policy, read_checkpoint_file
from machina.system import resolve_device
from machina.training.checkpoint import latest_checkpoint

resolvers.register()
log = logging.getLogger("machina.eval")

COLUMNS = ("return", "hearts_made", "hearts_deposited", "length")


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    with report_errors():
        hydra_cfg = HydraConfig.get()
        evaluate(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task))


def evaluate(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> None:
    """Load the policy, compare it with the teacher and a random policy, write eval.json and replay.gif.
    ``overrides``: the command line's overrides (which ``env`` settings the user gave)."""
    device = resolve_device(cfg.device)
    path = find_policy(cfg.checkpoint)
    policy, obs_spec = load_policy(path, device)
    env_cfg, source = env_settings(cfg, path, overrides)
    evaluator = Evaluator(env_factory(env_cfg, device), cfg.episodes, cfg.greedy, cfg.seed)
    evaluator.check(obs_spec, policy.num_actions)
    rows = evaluator.compare(policy)

    columns = [c for c in COLUMNS if c in rows["policy"]]
    lines = [
        f"checkpoint {path}",
        f"env {env_cfg['_target_']} with {source}",
        f"{cfg.episodes} episodes, seed {cfg.seed}, {'greedy' if cfg.greedy else 'sampled'} actions",
        f"{'':<8}" + "".join(f"{c:>22}" for c in columns),
    ]
    for name, row in rows.items():
        cells = (f"{row[c]:.3f} +- {row[c + '_std']:.3f}" for c in columns)
        lines.append(f"{name:<8}" + "".join(f"{cell:>22}" for cell in cells))
    if "teacher_agreement" in rows["policy"]:
        agreement = rows["policy"]["teacher_agreement"]
        lines.append(f"policy's agreement with the teacher (most likely action): {agreement:.3f}")
    log.info("\n".join(lines))  # one record: the table's rows carry no log prefix
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"checkpoint": str(path), "episodes": cfg.episodes, "greedy": cfg.greedy, "seed": cfg.seed, **rows}
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.replay:
        frames = evaluator.episode_frames(policy, cfg.replay_steps, cell=cfg.replay_cell)
        save_gif(frames, out_dir / "replay.gif", cfg.replay_fps)
    log.info("wrote %s", out_dir)


def find_policy(checkpoint: str) -> Path:
    """The file ``checkpoint=`` names: a policy file, a training checkpoint, or a run folder's latest checkpoint."""
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
        if found is None:
            raise ConfigError(f"checkpoint={checkpoint!r}: no checkpoint_*.pt in that folder or its checkpoints/")
        path = found
    return path


def env_settings(cfg: DictConfig, path: Path, overrides: list[str]) -> tuple[DictConfig, str]:
    """The env config to evaluate on, and where it came from: the run's env settings (its resolved_config.yaml,
    else the checkpoint's stored config) with the command line's ``env.<key>`` overrides on top; eval.yaml's env
    (with the overrides) when the command line picks ``env=<name>`` or the run's settings cannot be found."""
    given = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    env_keys = [k.removeprefix("env.") for k in given if k.startswith("env.")]
    run = None if "env" in given else run_env(path)
    if run is None:
        return cfg.env, "eval.yaml's env settings and the command line's"
    settings, where = run
    for key in env_keys:
        OmegaConf.update(settings, key, OmegaConf.select(cfg.env, key), force_add=True)
    changed = f", changed on the command line: {', '.join(env_keys)}" if env_keys else ""
    return settings, f"the run's env settings ({where}){changed}"


def run_env(path: Path) -> tuple[DictConfig, str] | None:
    """The env settings of the run that wrote ``path``, and the file they came from; None if not found."""
    folder = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    resolved = folder / "resolved_config.yaml"
    if resolved.is_file():
        return OmegaConf.load(resolved).env, str(resolved)
    config = read_checkpoint_file(path).get("config")
    if isinstance(config, dict) and isinstance(config.get("env"), dict):
        return OmegaConf.create(config["env"]), str(path)
    return None


if __name__ == "__main__":
    main()
