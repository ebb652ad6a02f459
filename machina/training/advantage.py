"""Advantage estimators, chosen by ``_target_`` at ``learner.advantage`` (``conf/learner/advantage/``), as TorchRL
separates value estimators from losses. An estimator is called once per update pass with the experience and returns
float32 [S, T] advantages in the buffer's row layout; it reads the stored steps through the experience's verbs
(``trajectories``, ``last_values``, ``to_rows``), never the buffer. The default, ``VTrace``: GAE with V-trace's
clipped importance ratios, over each agent's whole rollout at once (the math, ``compute_advantages``, is in
machina/losses/functional.py, which a loss's own return targets share).

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
from machina.losses.functional import compute_advantages


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
