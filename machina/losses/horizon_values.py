"""Values at other horizons as an auxiliary task: the critic also predicts the return at a few shorter discounts.

One network serves actor and critic, so what the critic must predict shapes the encoder and core the actor reads.
A value at gamma 0.995 blends everything the next few hundred steps bring; values at 0.9 or 0.97 must tell apart
what the next 10 or 30 steps bring (a heart about to be deposited, a resource within reach). Predicting returns at
several horizons as an auxiliary task is Fedus et al. 2019 ("Hyperbolic discounting and learning over multiple
horizons"); here the extra values only train the shared layers, PPO's advantages still use ``VALUES`` alone.
"""

from collections.abc import Sequence

import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.errors import ConfigError
from machina.losses.base import Loss
from machina.losses.functional import compute_advantages, live_rows, sample_mean
from machina.progress import Progress


class HorizonValueLoss(Loss):
    """Regress the policy's ``HORIZON_VALUES`` [B, T, K] on lambda-returns at the K discounts ``gammas``.

    Reads the minibatch's ``REWARDS``, ``TERMINATED``, ``TRUNCATED``, ``PRIO_WEIGHTS`` (and ``ACTIVE`` where stored)
    [B, T] and the policy's fresh ``HORIZON_VALUES``, which the critic outputs with ``policy.critic.horizons`` = K.
    The targets are GAE's lambda-returns (Schulman et al. 2016) of the behaviour that acted, computed per segment
    from the fresh values, detached: for discount g_k,

        R_t^k = V_k(x_t) + A_t^k,  A^k from ``compute_advantages`` with gamma g_k, ratio 1,

    within each segment's first T - 1 steps, the last step's value V_k(x_{T-1}) the bootstrap (the segment holds no
    later observation, so the last step gets no target). An ended episode bootstraps from 0; a truncated step of an
    env that does not observe time (the buffer stores ``FINAL_VALUES``, the value at ``gamma`` only) bootstraps
    from V_k of its own observation, an approximation where the main value is exact.

        loss_horizon_values = coef * 0.5 * mean over k and the samples of (V_k - R^k)^2

    Metrics: ``horizon_value_loss`` (the mean before ``coef``).

    Args:
        gammas: the K discounts, each in [0, 1]; the critic's ``horizons`` must be len(gammas).
        gae_lambda: lambda of the targets, in [0, 1].
        coef: the loss's weight.
    """

    consumes = frozenset({keys.HORIZON_VALUES})

    def __init__(self, gammas: Sequence[float] = (0.9, 0.97, 0.99), gae_lambda: float = 0.95, coef: float = 1.0):
        super().__init__()
        gammas = list(gammas)
        if not gammas:
            raise ConfigError("losses.horizon_values.gammas is empty; give at least one discount in [0, 1]")
        for gamma in gammas:
            checks.number("gammas", gamma, 0, 1)
        checks.number("gae_lambda", gae_lambda, 0, 1)
        checks.finite("coef", coef, low=0)
        self.gae_lambda, self.coef = gae_lambda, coef
        self.register_buffer("gammas", torch.tensor(gammas, dtype=torch.float32), persistent=False)

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        values = policy_out[keys.HORIZON_VALUES]
        k = self.gammas.numel()
        if values.shape[-1] != k:
            raise ConfigError(
                f"the critic outputs {values.shape[-1]} horizon values but losses.horizon_values.gammas has {k}; "
                f"set policy.critic.horizons={k} (+policy.critic.horizons={k} where the config lacks it)"
            )
        if values.shape[1] < 2:
            raise ConfigError(
                "losses.horizon_values needs training segments of 2 steps or more (its targets come from the steps "
                f"that follow within a segment); experience.bptt_horizon is {values.shape[1]}"
            )
        with torch.no_grad():
            targets = horizon_returns(values.detach(), minibatch, self.gammas, self.gae_lambda)
        mask = live_rows(minibatch)
        mask = None if mask is None else mask[:, :-1]
        squared = ((values[:, :-1] - targets) ** 2).mean(-1)
        loss = 0.5 * sample_mean(squared, minibatch[keys.PRIO_WEIGHTS][:, :-1], mask)
        return {"loss_horizon_values": self.coef * loss, "horizon_value_loss": loss.detach()}


def horizon_returns(
    values: torch.Tensor, minibatch: TensorDict, gammas: torch.Tensor, gae_lambda: float
) -> torch.Tensor:
    """float32 [B, T - 1, K]: the lambda-returns of each segment's first T - 1 steps at each discount, from
    ``values`` [B, T, K] (V_k of every step) and the minibatch's ``REWARDS``, ``TERMINATED``, ``TRUNCATED`` [B, T]:
    the K discounts are folded into the batch so that one pass of ``compute_advantages`` serves them all."""
    b, t, k = values.shape
    folded = values.permute(2, 0, 1).reshape(k * b, t)  # row k * B + i: segment i at discount k

    def steps(key: str) -> torch.Tensor:
        return minibatch[key][:, :-1].repeat(k, 1)

    head = folded[:, :-1]
    # Where the buffer stores FINAL_VALUES, truncation is not observed: bootstrap from the step's own V_k.
    final = head if keys.FINAL_VALUES in minibatch.keys() else torch.zeros_like(head)
    gamma = gammas.repeat_interleave(b).unsqueeze(1)  # [K * B, 1]
    advantages = compute_advantages(
        head,
        steps(keys.REWARDS),
        steps(keys.TERMINATED),
        steps(keys.TRUNCATED),
        final,
        folded[:, -1],
        torch.ones_like(head),
        gamma,
        gae_lambda,
    )
    return (head + advantages).reshape(k, b, t - 1).permute(1, 2, 0)
