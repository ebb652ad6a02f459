"""Evaluation during training: metrics on held-out layouts every ``trainer.eval_interval`` epochs, and a replay GIF
every ``trainer.replay_interval`` epochs (saved in the run folder and logged to W&B as media).

It runs on its own envs under a forked RNG (``machina.evaluation``), so training is the same with or without it;
the trainer times it apart from the epoch, so it costs the run its own time and no training SPS.
"""

import logging
from pathlib import Path

from torch import nn

from machina.evaluation.evaluator import Evaluator
from machina.evaluation.gif import save_gif

log = logging.getLogger(__name__)


class PeriodicEval:
    """Args:
    evaluator: plays full episodes on fixed, held-out layouts (seeded apart from training).
    replay_dir: where ``replay_<epoch>.gif`` files go.
    wandb: the run's W&B sink (or None); replays are logged to it as videos.
    """

    def __init__(self, evaluator: Evaluator, replay_dir: Path, wandb=None):
        self.evaluator, self.replay_dir, self.wandb = evaluator, Path(replay_dir), wandb

    def evaluate(self, policy: nn.Module) -> dict[str, float]:
        """``eval/*`` metrics of the policy (see ``Evaluator.evaluate``)."""
        return self.evaluator.evaluate(policy)

    def replay(self, policy: nn.Module, epoch: int, agent_step: int) -> Path:
        """Record one full episode of the policy as ``replay_<epoch>.gif`` and log it to W&B."""
        frames = self.evaluator.episode_frames(policy)
        self.replay_dir.mkdir(parents=True, exist_ok=True)
        path = self.replay_dir / f"replay_{epoch:06d}.gif"
        save_gif(frames, path)
        if self.wandb is not None:
            self.wandb.log_video("eval/replay", path, agent_step)
        log.info("replay of epoch %d: %s", epoch, path)
        return path
