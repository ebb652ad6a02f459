"""Advantages: GAE with V-trace-style clipped importance ratios, over all segments at once.

Row convention (as stored by the rollout): ``rewards[:, t]`` and ``dones[:, t]`` arrive with observation t and
belong to the transition t-1 -> t; ``values[:, t]`` is V(observation t). The last step of every segment has no
successor inside the segment, so it only bootstraps the step before it and gets advantage 0.
"""

import torch


def compute_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    ratio: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> torch.Tensor:
    """Return float32 [S, T] advantages.

    For t = T-2 ... 0, with rho_t = min(ratio_t, rho_bar) and c_t = min(ratio_t, c_bar):
        delta_t = rho_t * (r_{t+1} + gamma * V_{t+1} * (1 - d_{t+1}) - V_t)
        A_t     = delta_t + gamma * lambda * c_t * (1 - d_{t+1}) * A_{t+1}
    With ratio = 1 this is GAE truncated at the segment edge.

    Args:
        values, rewards, dones, ratio: float32 [S, T]; ``ratio`` is pi_new / pi_old (ones right after a rollout).
    """
    rho = ratio.clamp(max=rho_bar)
    c = ratio.clamp(max=c_bar)
    not_done = 1.0 - dones[:, 1:]
    deltas = rho[:, :-1] * (rewards[:, 1:] + gamma * values[:, 1:] * not_done - values[:, :-1])
    decay = gamma * gae_lambda * c[:, :-1] * not_done
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    # A loop over time only (T steps); every step is vectorised over all segments.
    for t in range(values.shape[1] - 2, -1, -1):
        running = deltas[:, t] + decay[:, t] * running
        advantages[:, t] = running
    return advantages
