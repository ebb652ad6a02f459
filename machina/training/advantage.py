"""Advantage estimators, chosen by ``_target_`` at ``learner.advantage`` (``conf/learner/advantage/``), as TorchRL
separates value estimators from losses. An estimator is called once per update pass with the experience and returns
float32 [S, T] advantages in the buffer's row layout; it reads the stored steps through the experience's verbs
(``trajectories``, ``last_values``, ``to_rows``), never the buffer. The default, ``VTrace``: GAE with V-trace's
clipped importance ratios, over each agent's whole rollout at once.

Step convention (as the rollout stores it): step t holds observation x_t, the action a_t taken on it, its value
V(x_t), the reward r_t of a_t, and whether the episode ended after a_t (``terminated`` / ``truncated``). A truncated
step whose env does not observe time carries V(final observation) in ``final_values``; every other ended step
bootstraps from 0. Termination wins (Gymnasium's semantics: terminated means the MDP ended, truncated that it was cut
short): a step flagged both bootstraps from 0 whatever its ``final_values``. The step after an agent's last one is
the observation the rollout ends on, whose value the rollout records once (``last_values``, CleanRL's
``next_value``). So every step has a successor, and every reward enters an advantage.
"""

import math

import torch

from machina import checks, keys


class VTrace:
    """GAE with V-trace's clipped importance ratios (``compute_advantages``) over each agent's whole rollout.

    Reads the trajectories (agent-major [N, L]) of ``VALUES``, ``REWARDS``, ``TERMINATED``, ``TRUNCATED``, ``RATIO``
    and, where the env does not observe time, ``FINAL_VALUES``, plus ``last_values`` [N]. The learner refreshes
    ``RATIO`` before every pass after the first, so pass 1 is GAE and later passes are V-trace with the current
    policy's ratios.

    Args:
        gamma: discount, in [0, 1].
        gae_lambda: GAE's lambda, in [0, 1].
        rho_clip, c_clip: V-trace's rho_bar and c_bar, clips of the importance ratio pi / mu (>= 0).
    """

    def __init__(self, gamma: float = 0.99, gae_lambda: float = 0.95, rho_clip: float = 1.0, c_clip: float = 1.0):
        checks.number("gamma", gamma, 0, 1)
        checks.number("gae_lambda", gae_lambda, 0, 1)
        checks.number("rho_clip", rho_clip, 0, math.inf)
        checks.number("c_clip", c_clip, 0, math.inf)
        self.gamma, self.gae_lambda, self.rho_clip, self.c_clip = gamma, gae_lambda, rho_clip, c_clip

    def __call__(self, experience) -> torch.Tensor:
        """float32 [S, T]: the advantages of every stored step, in the buffer's row layout."""
        trajectories = experience.trajectories
        values = trajectories(keys.VALUES)
        stores_final = experience.stores(keys.FINAL_VALUES)
        advantages = compute_advantages(
            values,
            trajectories(keys.REWARDS),
            trajectories(keys.TERMINATED),
            trajectories(keys.TRUNCATED),
            trajectories(keys.FINAL_VALUES) if stores_final else torch.zeros_like(values),
            experience.last_values,
            trajectories(keys.RATIO),
            self.gamma,
            self.gae_lambda,
            self.rho_clip,
            self.c_clip,
        )
        return experience.to_rows(advantages)


def compute_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    last_values: torch.Tensor,
    ratio: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> torch.Tensor:
    """Return float32 [N, L] advantages A_t = v_t - V(x_t), where v_t is the V-trace target (Espeholt et al. 2018):

        next_t  = 0 if terminated_t, else final_values_t if truncated_t, else V(x_{t+1})   (V(x_L) = last_values)
        delta_t = rho_t * (r_t + gamma * next_t - V(x_t))
        A_t     = delta_t + gamma * lambda * c_t * (1 - ended_t) * A_{t+1}

    with rho_t = min(ratio_t, rho_bar) and c_t = min(ratio_t, c_bar). With ratio = 1 this is GAE (Schulman et al.
    2016) with bootstrapping at the rollout's end.

    Args:
        values, rewards, final_values, ratio: float32 [N, L], one row per agent in time order; ``ratio`` is
            pi(a_t|x_t) / mu(a_t|x_t), pi the current policy (the one the advantages will train) and mu the
            behaviour policy that acted (ones right after a rollout; the learner refreshes them each update pass).
        terminated, truncated: bool [N, L].
        last_values: float32 [N]: V of the observation after each agent's last step.
    """
    ended = terminated | truncated
    next_values = torch.cat((values[:, 1:], last_values.unsqueeze(1)), 1)
    # Terminal wins: a step both terminated and truncated bootstraps from 0, not from V(final observation).
    next_values = torch.where(truncated, final_values, next_values).masked_fill(terminated, 0.0)
    rho = ratio.clamp(max=rho_bar)
    deltas = rho * (rewards + gamma * next_values - values)
    decay = (gamma * gae_lambda) * ratio.clamp(max=c_bar) * (~ended).to(values.dtype)
    advantages = torch.empty_like(values)
    running = torch.zeros_like(values[:, 0])
    # A loop over time only (L steps); every step is vectorised over all agents.
    for t in range(values.shape[1] - 1, -1, -1):
        running = deltas[:, t] + decay[:, t] * running
        advantages[:, t] = running
    return advantages
