"""Evaluate a policy: ``python eval.py checkpoint=PATH [episodes=N] [greedy=true] [env.<key>=VALUE ...]``.

Plays ``episodes`` full episodes on fixed layouts with the policy, the scripted teacher and a random policy, prints
the three rows, writes them to ``eval.json`` and (``replay=true``) one env's episode to ``replay.gif`` in the output
folder (``hydra.run.dir``).
"""

import json
import logging
from functools import partial
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina import resolvers
from machina.cli import report_errors
from machina.errors import ConfigError
from machina.evaluation import Evaluator
from machina.policy.io import load_policy
from machina.replay import record_replay, save_gif
from machina.system import resolve_device
from machina.training.checkpoint import latest_checkpoint

resolvers.register()
log = logging.getLogger("machina.eval")

COLUMNS = ("return", "hearts_made", "hearts_deposited", "length")


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    with report_errors():
        evaluate(cfg, Path(HydraConfig.get().runtime.output_dir))


def evaluate(cfg: DictConfig, out_dir: Path) -> None:
    """Load the policy, compare it with the teacher and a random policy, write eval.json and replay.gif."""
    device = resolve_device(cfg.device)
    path = Path(cfg.checkpoint).expanduser()
    if path.is_dir():
        found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
        if found is None:
            raise ConfigError(f"checkpoint={cfg.checkpoint!r}: no checkpoint_*.pt in that folder or its checkpoints/")
        path = found
    policy, obs_spec = load_policy(path, device)
    evaluator = Evaluator(OmegaConf.to_container(cfg.env, resolve=True), cfg.episodes, cfg.greedy, cfg.seed, device)
    evaluator.check(obs_spec, policy.num_actions)
    rows = evaluator.compare(policy)

    log.info(
        "%d episodes of %d steps, seed %d, %s actions",
        cfg.episodes,
        cfg.env.max_steps,
        cfg.seed,
        "greedy" if cfg.greedy else "sampled",
    )
    log.info("%-8s" + "%22s" * len(COLUMNS), "", *COLUMNS)
    for name, row in rows.items():
        cells = [f"{row[c]:.3f} +- {row[c + '_std']:.3f}" for c in COLUMNS]
        log.info("%-8s" + "%22s" * len(COLUMNS), name, *cells)
    log.info("policy's agreement with the teacher (most likely action): %.3f", rows["policy"]["teacher_agreement"])
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"checkpoint": str(path), "episodes": cfg.episodes, "greedy": cfg.greedy, "seed": cfg.seed, **rows}
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.replay:
        steps = cfg.replay_steps or cfg.env.max_steps
        factory = partial(evaluator.make_env, num_envs=1)
        frames = record_replay(factory, policy, steps, cfg.greedy, cfg.seed, cell=cfg.replay_cell)
        save_gif(frames, out_dir / "replay.gif", cfg.replay_fps)
    log.info("wrote %s", out_dir)


if __name__ == "__main__":
    main()
