"""An exponential moving average of the policy's weights over epochs (``learner.average_horizon``): with it on, the
averaged weights are the policy the run produces (periodic evaluation, replays, ``policy_<epoch>.pt`` and the policy
entry of each checkpoint), while training goes on from the policy's own weights.

Why: at a constant learning rate the weights keep moving about a good region rather than settling in it, so the
policy of any one epoch is a noisy draw. Averaging the iterates (Polyak and Juditsky, 1992; the exponential average
of Polyak-Ruppert averaging) keeps the region and drops the noise;
docs/explanation/lab_notebook.md measures what it gives.

After the update of epoch n (n = 1, 2, ...), with the policy's weights theta_n:

    avg_n = sum_{k=1..n} d^(n-k) theta_k / sum_{k=1..n} d^(n-k),    d = exp(-epoch_steps / horizon)

``epoch_steps`` being the agent steps of an epoch (every rank's) and ``horizon`` the average's time constant in agent
steps. It is kept recursively, avg_n = avg_{n-1} + w_n (theta_n - avg_{n-1}) with w_n = (1 - d) / (1 - d^n): the
first epoch's weights are taken whole (w_1 = 1), so the random initial weights never enter the average (the same
correction as Adam's for its moment estimates).
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from machina import checks
from machina.files import saved_state
from machina.files.saved_state import within


class WeightAverage:
    """The average of ``policy``'s parameters (its buffers are not averaged: they are not trained).

    Args:
        policy: the module whose parameters are averaged (the policy itself, not a DDP wrapper).
        horizon: the average's time constant in agent steps (> 0).
        epoch_steps: agent steps per epoch, every rank's.
    """

    def __init__(self, policy: nn.Module, horizon: int, epoch_steps: int):
        self.params = dict(policy.named_parameters())
        self.decay = math.exp(-epoch_steps / horizon)
        self.averaged = {name: param.detach().clone() for name, param in self.params.items()}
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """Fold the policy's current weights in (after each epoch's update); no host read."""
        self.updates += 1
        weight = (1.0 - self.decay) / (1.0 - self.decay**self.updates)
        for name, param in self.params.items():
            self.averaged[name].lerp_(param, weight)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The policy holds the averaged weights inside the block and its own again after it, even if the block
        raises. In place, so a compiled or graphed policy plays the average without being built again. Before the
        first update (a run that starts averaging on resume) there is no average yet: the policy keeps its own."""
        if self.updates == 0:
            yield
            return
        with torch.no_grad():
            own = {name: param.detach().clone() for name, param in self.params.items()}
            for name, param in self.params.items():
                param.copy_(self.averaged[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    param.copy_(own[name])

    def state_dict(self) -> dict:
        """The update count and the averaged weights (copies, so the snapshot stays what it was when taken)."""
        return {"updates": self.updates, "weights": {name: value.clone() for name, value in self.averaged.items()}}

    @torch.no_grad()
    def load_state_dict(self, saved: dict) -> None:
        """Restore ``state_dict``'s output into the average alone: the policy's weights are not read or written, so
        it does not matter whether they were restored before or after. Names, shapes, dtypes and finiteness are
        checked first (ConfigError naming the entry)."""
        saved = saved_state.mapping(saved, "average", ("updates", "weights"))
        with within("average."):
            updates = checks.integer("updates", saved["updates"], 0, saved_state.INT64_MAX)
            weights = saved_state.like(saved["weights"], self.averaged, "weights")
        for name, value in self.averaged.items():
            value.copy_(weights[name])
        self.updates = updates
