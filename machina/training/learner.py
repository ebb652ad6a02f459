"""The training phase: ``update_epochs`` passes of minibatches over the full buffer.

Per minibatch: one policy forward shared by all losses, the sum of their ``loss_*`` terms, backward, grad-norm clip,
optimizer step, ``zero_grad(set_to_none=True)``. Metrics stay on the device and are summed; the trainer reads them
once per epoch. Under torchrun the forward goes through DDP (``machina.distributed.wrap``), which averages the
gradients over the ranks during backward.
"""

import torch
from tensordict import TensorDict
from torch import nn

from machina import distributed, keys
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss, Progress
from machina.policy.inputs import training_input
from machina.training.advantage import compute_advantages
from machina.training.experience import Experience


class Learner:
    """Updates the policy from a full experience buffer.

    Args:
        policy, losses, experience, optimizer: the parts it drives.
        update_epochs: passes over the buffer per epoch.
        max_grad_norm: global gradient-norm clip.
        gamma, gae_lambda, vtrace_rho_clip, vtrace_c_clip: advantage settings (see ``compute_advantages``).
    """

    def __init__(
        self,
        policy: nn.Module,
        losses: dict[str, Loss],
        experience: Experience,
        optimizer: torch.optim.Optimizer,
        stopwatch: Stopwatch,
        update_epochs: int,
        max_grad_norm: float,
        gamma: float,
        gae_lambda: float,
        vtrace_rho_clip: float,
        vtrace_c_clip: float,
    ):
        self.policy, self.losses, self.experience, self.optimizer = policy, losses, experience, optimizer
        self.model = distributed.wrap(policy)  # the policy itself in a single process
        self.stopwatch = stopwatch
        self.update_epochs, self.max_grad_norm = update_epochs, max_grad_norm
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.rho_bar, self.c_bar = vtrace_rho_clip, vtrace_c_clip
        buffer = experience.buffer
        self.has_values = keys.VALUES in buffer.keys() and keys.REWARDS in buffer.keys()
        self.has_log_prob = keys.ACT_LOG_PROB in buffer.keys()
        seg, horizon = experience.minibatch_segments, experience.bptt_horizon
        self._ones = torch.ones(seg, horizon, device=experience.device)
        self.sums: dict[str, torch.Tensor] = {}
        self.minibatches = 0

    def run(self, progress: Progress) -> None:
        exp, sw = self.experience, self.stopwatch
        buffer = exp.buffer
        for _ in range(self.update_epochs):
            with sw.time("train.advantage"):
                advantages = self._advantages(buffer)
                if exp.sampling == "prioritized":
                    probs = exp.segment_probs(advantages)
            for mb_index in range(exp.num_minibatches):
                with sw.time("train.sample"):
                    if exp.sampling == "prioritized":
                        idx, weights = exp.sample_prioritized(probs, progress.fraction)
                        weights = weights.expand_as(self._ones)
                    else:
                        idx, weights = exp.slices[mb_index], self._ones
                    stored = buffer[idx]
                    minibatch = stored.copy()  # shallow: losses may add keys without touching the buffer
                    minibatch[keys.ADVANTAGES] = advantages[idx]
                    minibatch[keys.PRIO_WEIGHTS] = weights
                    state = exp.row_state[idx]
                with sw.time("train.forward"):
                    policy_out = self.model(training_input(stored, state))
                    total = self._losses(minibatch, policy_out, progress)
                    if self.model is not self.policy:
                        total = total + distributed.zero_term(self.policy)
                with sw.time("train.backward"):
                    total.backward()
                with sw.time("train.optimizer"):
                    grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self._add("train/grad_norm", grad_norm)
                    if self.has_log_prob:
                        # Written into the buffer itself (not a copy), so the next pass's V-trace sees it.
                        new_log_prob = policy_out[keys.ACT_LOG_PROB].detach()
                        buffer[keys.RATIO][idx] = (new_log_prob - stored[keys.ACT_LOG_PROB]).exp()
                self.minibatches += 1

    def _advantages(self, buffer: TensorDict) -> torch.Tensor:
        if not self.has_values:
            return torch.zeros(buffer.batch_size, device=self.experience.device)
        return compute_advantages(
            buffer[keys.VALUES],
            buffer[keys.REWARDS],
            buffer[keys.EPISODE_START],
            buffer[keys.RATIO],
            self.gamma,
            self.gae_lambda,
            self.rho_bar,
            self.c_bar,
        )

    def _losses(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> torch.Tensor:
        total = torch.zeros((), device=self.experience.device)
        for name, loss in self.losses.items():
            for key, value in loss(minibatch, policy_out, progress).items():
                if key.startswith("loss_"):
                    total = total + value
                    self._add(f"losses/{name}/{key}", value.detach())
                else:
                    self._add(f"losses/{name}/{key}", value)
        return total

    def _add(self, name: str, value: torch.Tensor) -> None:
        if name in self.sums:
            self.sums[name] += value
        else:
            self.sums[name] = value.detach().clone()

    def pop_metrics(self) -> dict[str, torch.Tensor]:
        """Mean of every metric over the minibatches since the last call, as 0-d device tensors."""
        n = max(self.minibatches, 1)
        means = {name: total / n for name, total in self.sums.items()}
        self.sums, self.minibatches = {}, 0
        return means
