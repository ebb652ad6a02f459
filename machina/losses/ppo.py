"""PPO: clipped surrogate, clipped value loss and entropy bonus (CleanRL's formulation)."""

import torch
from tensordict import TensorDict

from machina import distributed, keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.losses.base import Loss, Progress, Spec


class PPOLoss(Loss):
    """Reads minibatch ``ACT_LOG_PROB``, ``VALUES``, ``ADVANTAGES``, ``PRIO_WEIGHTS`` (and ``PPO_MASK`` when an
    earlier loss restricts PPO to a slice of agents) and the policy's fresh ``ACT_LOG_PROB``, ``ENTROPY``,
    ``VALUES``, all [B, T].

    Returns ``loss_policy``, ``loss_value``, ``loss_entropy`` and the metrics ``policy_loss``, ``value_loss``,
    ``entropy``, ``approx_kl``, ``clipfrac``.
    """

    consumes = frozenset({keys.ACT_LOG_PROB, keys.ENTROPY, keys.VALUES})

    def __init__(
        self,
        clip_coef: float = 0.2,
        vf_coef: float = 0.5,
        vf_clip_coef: float = 0.2,
        ent_coef: float = 0.01,
        norm_adv: bool = True,
        clip_vloss: bool = True,
    ):
        super().__init__()
        for name, value in (("clip_coef", clip_coef), ("vf_coef", vf_coef), ("ent_coef", ent_coef)):
            if value < 0:
                raise ConfigError(f"losses.ppo.{name} must be >= 0, got {value}")
        self.clip_coef, self.vf_coef, self.vf_clip_coef = clip_coef, vf_coef, vf_clip_coef
        self.ent_coef, self.norm_adv, self.clip_vloss = ent_coef, norm_adv, clip_vloss

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        scalar = ((), torch.float32)
        return {keys.ACT_LOG_PROB: scalar, keys.VALUES: scalar, keys.REWARDS: scalar}

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        weight = minibatch[keys.PRIO_WEIGHTS]
        if keys.PPO_MASK in minibatch.keys():
            weight = weight * minibatch[keys.PPO_MASK]
        # Weighted mean; the clamp keeps an empty PPO slice at zero loss instead of NaN.
        denom = weight.sum().clamp(min=1.0)

        def wmean(x: torch.Tensor) -> torch.Tensor:
            return (x * weight).sum() / denom

        advantages = minibatch[keys.ADVANTAGES]
        old_values = minibatch[keys.VALUES]
        returns = advantages + old_values
        if self.norm_adv:
            advantages = normalize(advantages, weight)

        logratio = policy_out[keys.ACT_LOG_PROB] - minibatch[keys.ACT_LOG_PROB]
        ratio = logratio.exp()
        pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - self.clip_coef, 1 + self.clip_coef))
        policy_loss = wmean(pg)

        values = policy_out[keys.VALUES]
        v_unclipped = (values - returns) ** 2
        if self.clip_vloss:
            v_clipped = old_values + (values - old_values).clamp(-self.vf_clip_coef, self.vf_clip_coef)
            value_loss = 0.5 * wmean(torch.max(v_unclipped, (v_clipped - returns) ** 2))
        else:
            value_loss = 0.5 * wmean(v_unclipped)

        entropy = wmean(policy_out[keys.ENTROPY])
        with torch.no_grad():
            approx_kl = wmean((ratio - 1) - logratio)
            clipfrac = wmean(((ratio - 1).abs() > self.clip_coef).float())
        return {
            "loss_policy": policy_loss,
            "loss_value": self.vf_coef * value_loss,
            "loss_entropy": -self.ent_coef * entropy,
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "approx_kl": approx_kl,
            "clipfrac": clipfrac,
        }


def normalize(advantages: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / (std + 1e-8)`` with weighted statistics over the minibatch, and under torchrun over every
    rank's minibatch: one all-reduce of ``[sum w*x, sum w*x^2, sum w]`` (queued on the device, no host sync)."""
    sums = distributed.all_reduce_sum(
        torch.stack([(weight * advantages).sum(), (weight * advantages**2).sum(), weight.sum()])
    )
    wx, wx2, w = sums.unbind()
    denom = w.clamp(min=1.0)  # as in wmean: an all-masked minibatch keeps finite statistics
    mean = wx / denom
    # sum w*(x - mean)^2 expanded, so the sums are all that crosses ranks.
    var = ((wx2 - 2 * mean * wx + mean**2 * w) / denom).clamp(min=0.0)
    return (advantages - mean) / (var.sqrt() + 1e-8)
