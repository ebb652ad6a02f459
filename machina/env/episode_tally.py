"""Episode statistics of host-side envs (MettaGrid, Gymnasium), kept in numpy and handed over as device tensors in
the shape ``Env.episode_stats`` and ``Env.last_episodes`` promise."""

import numpy as np
import torch

from machina.files import saved_state


class EpisodeTally:
    """Sums over the episodes ended since the last ``pop_sums`` and each env's latest episode.

    ``names``: the stats, ``names[0]`` being ``"episodes"`` (the count); ``add`` takes the others per ended episode.
    """

    def __init__(self, names: tuple[str, ...], num_envs: int):
        assert names[0] == "episodes"
        self.names = names
        self.totals = np.zeros(len(names))  # sums since the last pop_sums: episodes, then each stat
        self.last = np.zeros((num_envs, len(names)))  # per env: episodes ended since clear, then its latest stats

    def clear(self) -> None:
        self.totals[:] = 0
        self.last[:] = 0

    def add(self, envs: np.ndarray | int, stats: np.ndarray) -> None:
        """Episodes ended in ``envs`` (indices or a bool mask [E]), with ``stats`` [K, len(names) - 1] (or one row)."""
        stats = np.atleast_2d(np.asarray(stats, dtype=np.float64))
        self.totals += (len(stats), *stats.sum(0))
        self.last[envs, 0] += 1
        self.last[envs, 1:] = stats

    def pop_sums(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The sums as 0-d float32 tensors on ``device``; starts them again from zero."""
        totals = torch.tensor(self.totals, dtype=torch.float32, device=device)
        self.totals[:] = 0
        return {name: totals[i] for i, name in enumerate(self.names)}

    def latest(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Per env, float32 [E] on ``device``: episodes ended since ``clear`` and the stats of its latest one."""
        last = torch.tensor(self.last, dtype=torch.float32, device=device)
        return {name: last[:, i] for i, name in enumerate(self.names)}


def check_counters(
    state: dict[str, torch.Tensor], name: str, num_envs: int, stats: int, seed_stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A host env's saved episode counters ``state[name]`` and stat sums ``state["totals"]``, checked (ConfigError
    naming the entry): counters int64 [E] in [0, seed_stride) (env e's seeds are its base plus its counter, so a
    larger one would take env e + 1's), totals float64 [stats], finite, the episode count >= 0."""
    counters = saved_state.tensor(state, name, (num_envs,), torch.int64, 0, seed_stride - 1)
    totals = saved_state.tensor(state, "totals", (stats,), torch.float64)
    saved_state.values(totals[0], "totals[0] (episodes)", 0)
    return counters, totals
