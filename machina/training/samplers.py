"""Minibatch samplers: which buffer segments each minibatch trains on, and their importance weights.

A sampler is chosen by ``_target_`` (``conf/experience/sampler/*.yaml``) and owns its settings. The experience
buffer builds it with its geometry (``segments``, ``minibatch_segments``, ``device``); the learner calls
``prepare`` once per update epoch and ``minibatch(i)`` for each of its minibatches. Nothing here reads a device
value on the host.
"""

import torch


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

    def prepare(self, advantages: torch.Tensor, progress: float) -> None:
        if self.shuffle:
            self.order = torch.randperm(self.segments, device=self.device)

    def minibatch(self, i: int) -> tuple[torch.Tensor | slice, None]:
        rows = slice(i * self.minibatch_segments, (i + 1) * self.minibatch_segments)
        return (self.order[rows] if self.shuffle else rows), None


class Prioritized:
    """Prioritized experience replay over segments (Schaul et al. 2016, as PufferLib applies it to PPO segments).

    Segment i is drawn with probability P(i) = p_i / sum_j p_j, p_i = (sum_t |A_it|) ** alpha (+ 1e-6), without
    replacement within a minibatch (each minibatch is drawn independently, so a segment may recur across them).
    The draw is the Gumbel top-k trick (Vieira 2014; Kool et al. 2019): the k largest of log P(i) + Gumbel noise are
    a sample without replacement with exactly the probabilities of drawing one segment after another proportional
    to P, like ``torch.multinomial(P, k, replacement=False)``, but with fixed shapes and no host read.

    Importance weights correct the sampling back to uniform, normalised once by their maximum over the buffer:
    w_i = (S * P(i)) ** -beta / max_j (S * P(j)) ** -beta = (P_min / P(i)) ** beta, with beta annealed linearly from
    ``beta0`` to 1 over training. Losses average w * term over the samples (no second normalisation).
    """

    def __init__(
        self, segments: int, minibatch_segments: int, device: torch.device, alpha: float = 0.6, beta0: float = 0.4
    ):
        if not alpha >= 0.0 or not 0.0 <= beta0 <= 1.0:
            raise ValueError(f"prioritized sampling needs alpha >= 0 and beta0 in [0, 1], got {alpha}, {beta0}")
        self.segments, self.minibatch_segments, self.device = segments, minibatch_segments, device
        self.alpha, self.beta0 = alpha, beta0
        self.log_probs: torch.Tensor | None = None
        self.beta = beta0

    def prepare(self, advantages: torch.Tensor, progress: float) -> None:
        """Segment probabilities from this update epoch's advantages [S, T] (they change only between epochs)."""
        priority = advantages.abs().sum(dim=1).nan_to_num_(0.0).pow(self.alpha) + 1e-6
        self.log_probs = (priority / priority.sum()).log()
        self.beta = self.beta0 + (1.0 - self.beta0) * min(max(progress, 0.0), 1.0)

    def minibatch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx int64 [minibatch_segments], weights float32 [minibatch_segments, 1])."""
        gumbel = -torch.empty_like(self.log_probs).exponential_().log_()
        idx = (self.log_probs + gumbel).topk(self.minibatch_segments).indices
        weights = ((self.log_probs.min() - self.log_probs[idx]) * self.beta).exp()
        return idx, weights.unsqueeze(1)
