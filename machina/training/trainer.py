"""The epoch loop: rollout, update, then one device read to log the epoch's metrics."""

import logging
import math
import time

import torch
from torch import nn

from machina import keys
from machina.errors import TrainingStopped
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss, Progress
from machina.training.experience import Experience
from machina.training.learner import Learner
from machina.training.rollout import Rollout

log = logging.getLogger(__name__)


class Trainer:
    """Trains ``policy`` on ``env`` until ``total_timesteps`` agent steps.

    Per epoch it logs (to every sink) ``metric/agent_step``, ``metric/epoch``, ``overview/sps`` (agent steps of the
    epoch / wall time of the whole epoch), ``overview/sps_cumulative``, ``overview/reward`` (mean return of the
    episodes that ended in the epoch), ``timing/<phase>`` seconds and ``timing/<phase>_frac`` fractions,
    ``losses/<loss>/<metric>``, ``env/<stat>`` and ``experience/<stat>``.

    Args:
        total_timesteps: agent steps to train for.
        update_epochs, max_grad_norm, gamma, gae_lambda, vtrace_rho_clip, vtrace_c_clip: see ``Learner``.
        checkpoint_interval: epochs between checkpoints (used by the checkpointer).
        eval_interval: epochs between evaluations; 0 turns them off.
        env, policy, losses, experience, optimizer: the parts, built by ``machina.run``.
        sinks: objects with ``log(dict)``, ``close()``.
    """

    def __init__(
        self,
        total_timesteps: int,
        update_epochs: int,
        max_grad_norm: float,
        gamma: float,
        gae_lambda: float,
        vtrace_rho_clip: float,
        vtrace_c_clip: float,
        checkpoint_interval: int,
        eval_interval: int,
        env,
        policy: nn.Module,
        losses: dict[str, Loss],
        experience: Experience,
        optimizer: torch.optim.Optimizer,
        sinks: list,
    ):
        self.total_timesteps = total_timesteps
        self.checkpoint_interval, self.eval_interval = checkpoint_interval, eval_interval
        self.env, self.policy, self.losses, self.experience = env, policy, losses, experience
        self.optimizer, self.sinks = optimizer, sinks
        self.stopwatch = Stopwatch()
        self.rollout = Rollout(env, policy, losses, experience, self.stopwatch)
        self.learner = Learner(
            policy,
            losses,
            experience,
            optimizer,
            self.stopwatch,
            update_epochs,
            max_grad_norm,
            gamma,
            gae_lambda,
            vtrace_rho_clip,
            vtrace_c_clip,
        )
        self.agent_step = 0
        self.epoch = 0
        self.history: list[dict[str, float]] = []

    @property
    def progress(self) -> Progress:
        return Progress(self.agent_step, self.total_timesteps)

    def train(self) -> dict[str, float]:
        """Run epochs until ``total_timesteps``; return the summary (final/best reward, SPS, steps, time)."""
        start = time.perf_counter()
        start_step = self.agent_step
        epoch_start = start
        while self.agent_step < self.total_timesteps:
            self.policy.eval()
            steps = self.rollout.run(self.progress)
            self.agent_step += steps
            self.policy.train()
            self.learner.run(self.progress)
            self.epoch += 1
            now = time.perf_counter()
            metrics = self._epoch_metrics(steps, now - epoch_start, (self.agent_step - start_step) / (now - start))
            epoch_start = now
            self._check_finite(metrics)
            for sink in self.sinks:
                sink.log(metrics)
            self.history.append(metrics)
        return summarize(self.history, time.perf_counter() - start)

    def _epoch_metrics(self, steps: int, seconds: float, sps_cumulative: float) -> dict[str, float]:
        device_metrics = self.learner.pop_metrics()
        device_metrics.update(episode_metrics(self.env.episode_stats()))
        device_metrics.update(buffer_metrics(self.experience))
        # The one host read of the epoch: every device metric at once.
        values = torch.stack([v.float() for v in device_metrics.values()]).tolist()
        metrics = dict(zip(device_metrics, values, strict=True))
        metrics.update(
            {
                "metric/agent_step": self.agent_step,
                "metric/epoch": self.epoch,
                "overview/sps": steps / seconds,
                "overview/sps_cumulative": sps_cumulative,
                "overview/reward": metrics.get("env/return", float("nan")),
            }
        )
        timings = self.stopwatch.pop()
        for phase, secs in sorted(timings.items()):
            metrics[f"timing/{phase}"] = secs
            metrics[f"timing/{phase}_frac"] = secs / seconds
        metrics["timing/epoch"] = seconds
        return metrics

    def _check_finite(self, metrics: dict[str, float]) -> None:
        bad = [k for k, v in metrics.items() if k.startswith("losses/") and "/loss_" in k and not math.isfinite(v)]
        if bad:
            raise TrainingStopped(
                f"non-finite loss at epoch {self.epoch} (agent step {self.agent_step}): "
                + ", ".join(f"{k}={metrics[k]}" for k in bad)
            )


def episode_metrics(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-episode means of the env's summed stats (NaN when no episode ended), plus the episode count."""
    episodes = stats["episodes"]
    out = {"env/episodes": episodes}
    for name, total in stats.items():
        if name != "episodes":
            out[f"env/{name}"] = torch.where(episodes > 0, total / episodes.clamp(min=1), float("nan"))
    return out


def buffer_metrics(experience: Experience) -> dict[str, torch.Tensor]:
    buffer = experience.buffer
    out = {}
    for key in (keys.REWARDS, keys.VALUES, keys.RATIO):
        if key in buffer.keys():
            out[f"experience/{key}_mean"] = buffer[key].float().mean()
    return out


def summarize(history: list[dict[str, float]], wall_time: float) -> dict[str, float]:
    """Run summary for the W&B runs table and for sweepers: final/best reward, mean/max SPS, steps, wall time."""
    rewards = [m["overview/reward"] for m in history if math.isfinite(m["overview/reward"])]
    sps = [m["overview/sps"] for m in history]
    return {
        "summary/final_reward": rewards[-1] if rewards else float("nan"),
        "summary/best_reward": max(rewards) if rewards else float("nan"),
        "summary/sps_mean": sum(sps) / len(sps) if sps else 0.0,
        "summary/sps_max": max(sps) if sps else 0.0,
        "summary/agent_steps": history[-1]["metric/agent_step"] if history else 0,
        "summary/wall_time": wall_time,
    }
