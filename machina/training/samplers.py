"""Minibatch samplers: which buffer segments each minibatch trains on, and their importance weights.

A sampler is chosen by ``_target_`` (``conf/experience/sampler/*.yaml``) and owns its settings. The experience
buffer builds it with its geometry (``segments``, ``minibatch_segments``, ``device``); the learner calls
``prepare(advantages, progress, active)`` once per update epoch and ``minibatch(i)`` for each of its minibatches.
``active`` is None, or for envs whose agents finish at different times bool [S, T]: the rows whose agent acted
(``keys.ACTIVE``; the losses leave the others out). Nothing here reads a device value on the host.
"""

import torch

from machina import checks


class Sequential:
    """Every segment once per update epoch, ``minibatch_segments`` at a time.

    ``shuffle``: a fresh random order of the segments each update epoch (CleanRL's ``np.random.shuffle`` of the batch
    indices, here over whole segments); otherwise contiguous slices of the buffer in row order (zero-copy views).
    Weights are None: every sample counts once.
    """

    def __init__(self, segments: int, minibatch_segments: int, device: torch.device, shuffle: bool = True):
        self.segments, self.minibatch_segments, self.shuffle = segments, minibatch_segments, bool(shuffle)
        self.device = device
        self.order: torch.Tensor | None = None

    def prepare(self, advantages: torch.Tensor, progress: float, active: torch.Tensor | None = None) -> None:
        """A fresh order when ``shuffle``. ``active`` changes nothing: a segment's inactive rows are left out by the
        losses, and every segment is visited once."""
        if self.shuffle:
            self.order = torch.randperm(self.segments, device=self.device)

    def minibatch(self, i: int) -> tuple[torch.Tensor | slice, None]:
        rows = slice(i * self.minibatch_segments, (i + 1) * self.minibatch_segments)
        return (self.order[rows] if self.shuffle else rows), None


class Prioritized:
    """Prioritized experience replay over segments (Schaul et al. 2016, as PufferLib applies it to PPO segments).

    Segment i is drawn with probability P(i) = p_i / sum_j p_j, p_i = (sum_t |A_it|) ** alpha (+ 1e-6), with
    replacement: each of a minibatch's ``minibatch_segments`` rows is an independent draw from P (so a segment may
    appear twice in one minibatch, and recur across minibatches). The draw is inverse-CDF sampling: uniform noise
    located with ``torch.searchsorted`` in the cumulative probabilities (float64, so that segments of tiny priority
    keep their probability), with fixed shapes and no host read.

    Why with replacement: PER's importance weights are exact only for independent draws. With draws i_1..i_k ~ P,
    E[(1/k) sum_n w_{i_n} f(i_n)] = sum_i P(i) w_i f(i), and w_i proportional to 1 / P(i) (at beta = 1) makes that
    the uniform mean of f over the segments up to the constant below. A draw without replacement (the Gumbel top-k
    used before) includes segment i with a probability pi_i != k P(i) (large P(i) are drawn less often than k P(i),
    small more), so the same weights were biased: about +14% on a 5-segment example with unequal priorities, a few
    percent at the default sizes.

    Importance weights correct the sampling back to uniform, normalised once by their maximum over the buffer:
    w_i = (S * P(i)) ** -beta / max_j (S * P(j)) ** -beta = (P_min / P(i)) ** beta, with beta annealed linearly from
    ``beta0`` to 1 over training. Losses average w * term over the samples (no second normalisation), so at beta = 1
    the expected minibatch loss is S * P_min times the uniform mean over all segments (S * P_min = 1 / max_j of the
    unnormalised weights; it is also E[w], the expected mean weight of a minibatch).

    Given ``active`` (envs whose agents finish at different times), the sum runs over the rows whose agent acted, and
    a segment with none has p_i = 0: it is never drawn, and P_min is the smallest P of the segments that can be
    (should no row of the buffer be active, every segment is drawn uniformly).

    Args:
        alpha: how strongly priorities shape the draw (0: uniform).
        beta0: the importance-weight exponent at the start, annealed to 1.
    """

    def __init__(
        self, segments: int, minibatch_segments: int, device: torch.device, alpha: float = 0.6, beta0: float = 0.4
    ):
        checks.finite("alpha", alpha, low=0)
        checks.number("beta0", beta0, 0, 1)
        self.segments, self.minibatch_segments, self.device = segments, minibatch_segments, device
        self.alpha, self.beta0 = alpha, beta0
        self.log_probs: torch.Tensor | None = None
        self.min_log_prob: torch.Tensor | None = None
        self.cdf: torch.Tensor | None = None
        self.beta = beta0

    def prepare(self, advantages: torch.Tensor, progress: float, active: torch.Tensor | None = None) -> None:
        """Segment probabilities from this update epoch's advantages [S, T] (they change only between epochs) and,
        when given, ``active`` bool [S, T]: the rows whose agent acted (the others count for nothing)."""
        magnitude = advantages.abs() if active is None else advantages.abs().where(active, 0.0)
        priority = magnitude.sum(dim=1).nan_to_num_(0.0).pow(self.alpha) + 1e-6
        if active is not None:
            drawable = active.any(dim=1)
            priority = priority.where(drawable | ~drawable.any(), 0.0)
        self.log_probs = (priority / priority.sum()).log()
        self.min_log_prob = self.log_probs.where(priority > 0, float("inf")).min()
        cdf = priority.double().cumsum(0)
        self.cdf = cdf / cdf[-1:]  # [S], ends at exactly 1
        self.beta = self.beta0 + (1.0 - self.beta0) * min(max(progress, 0.0), 1.0)

    def minibatch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx int64 [minibatch_segments], weights float32 [minibatch_segments, 1]): independent draws from P."""
        u = torch.rand(self.minibatch_segments, dtype=self.cdf.dtype, device=self.cdf.device)
        # The first i with cdf[i] > u: P(i) = cdf[i] - cdf[i - 1]. u < 1 = cdf[-1]; the clamp only guards rounding.
        idx = torch.searchsorted(self.cdf, u, right=True).clamp_(max=self.segments - 1)
        weights = ((self.min_log_prob - self.log_probs[idx]) * self.beta).exp()
        return idx, weights.unsqueeze(1)
