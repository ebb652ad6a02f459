"""Evaluation during training: metrics on held-out layouts every ``trainer.eval_interval`` epochs, and a replay GIF
every ``trainer.replay_interval`` epochs (saved in the run folder; the trainer hands it to its sinks as media).
How it plays is the ``evaluation`` node's (``conf/evaluation/default.yaml``, read by ``machina.run``). The policy it
is handed is the one the run produces (``Learner.produced_policy``: with ``learner.average_horizon``, the weight
average), the same view the policy files hold.

It runs on its own envs under a forked RNG (``machina.evaluation``), so training is the same with or without it;
the trainer times it apart from the epoch, so it costs the run its own time and no training SPS. Under torchrun
every rank plays its share of the episodes (its own layouts, seeded with the rank) and rank 0 combines the numbers:
no rank waits in a collective while another evaluates alone.
"""

import logging
import math
from pathlib import Path

from torch import nn

from machina.evaluation.evaluator import Evaluator
from machina.evaluation.gif import save_gif
from machina.training import distributed

log = logging.getLogger(__name__)


class PeriodicEval:
    """Args:
    evaluator: plays full episodes on fixed, held-out layouts (seeded apart from training).
    replay_dir: where ``replay_<epoch>.gif`` files go.
    """

    def __init__(self, evaluator: Evaluator, replay_dir: Path):
        self.evaluator, self.replay_dir = evaluator, Path(replay_dir)

    def evaluate(self, policy: nn.Module) -> dict[str, float]:
        """``eval/*`` metrics of the policy (see ``Evaluator.evaluate``), over every rank's episodes on rank 0 (and
        empty on the others)."""
        rows = distributed.gather_to_main(self.evaluator.evaluate(policy))
        return combine(rows) if rows is not None else {}

    def replay(self, policy: nn.Module, epoch: int) -> Path | None:
        """Record one full episode of the policy as ``replay_<epoch>.gif``; its path on rank 0, None on the others
        (which record nothing)."""
        if distributed.rank() != 0:
            return None
        frames = self.evaluator.episode_frames(policy)
        self.replay_dir.mkdir(parents=True, exist_ok=True)
        path = self.replay_dir / f"replay_{epoch:06d}.gif"
        save_gif(frames, path)
        log.info("replay of epoch %d: %s", epoch, path)
        return path


def combine(rows: list[dict[str, float]]) -> dict[str, float]:
    """One row from several ranks' rows of ``eval/<stat>``, ``eval/<stat>_std`` and ``eval/episodes``: means weighted
    by each rank's episodes, spreads from the pooled second moments (the spread of all episodes together)."""
    if len(rows) == 1:
        return rows[0]
    counts = [row["eval/episodes"] for row in rows]
    total = sum(counts)
    out = {"eval/episodes": total}
    for key in rows[0]:
        if key == "eval/episodes" or key.endswith("_std"):
            continue
        mean = sum(n * row[key] for n, row in zip(counts, rows, strict=True)) / total
        out[key] = mean
        if f"{key}_std" in rows[0]:
            second = sum(n * (row[f"{key}_std"] ** 2 + row[key] ** 2) for n, row in zip(counts, rows, strict=True))
            out[f"{key}_std"] = math.sqrt(max(second / total - mean**2, 0.0))
    return out
