"""PPO: clipped surrogate, value loss (optionally clipped) and entropy bonus, as in CleanRL's ``ppo.py``."""

from collections.abc import Callable

import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.losses.base import Loss
from machina.losses.functional import live_rows, sample_mean
from machina.progress import Progress


class PPOLoss(Loss):
    """Reads minibatch ``ACT_LOG_PROB``, ``VALUES``, ``ADVANTAGES``, ``PRIO_WEIGHTS`` (and ``PPO_MASK`` when an
    earlier loss restricts PPO to a slice of agents, ``TEACHER_LED`` when the supervisor stores it, ``ACTIVE`` when the
    env has inactive agents: their rows are left out of every term) and the policy's fresh ``ACT_LOG_PROB``,
    ``ENTROPY``, ``VALUES``, all [B, T]. Every term is a mean over the (masked) samples of importance weight x term.

    Teacher-led rows (``TEACHER_LED``): the executed action was the teacher's, not a sample from pi_old, while the
    ratio and clip below are defined for actions sampled from pi_old; so the policy terms (``loss_policy``, the
    advantage normalisation, ``approx_kl``, ``clipfrac``) average over the rows that are in ``PPO_MASK`` and not
    teacher-led (a float mask: no host read). The value loss and entropy keep every row of ``PPO_MASK``: the value
    regression to R does not involve the behaviour's action probability, and the entropy bonus is the same whatever
    action was taken. With GAE, R of any row is the return of the behaviour that acted (policy and teacher mixed),
    teacher-led rows or not, so dropping them from the value loss would not make V the policy's value, only fit it
    on fewer states. With V-trace, the truncated ratios of teacher-led rows use the stored pi_old(a_teacher) as if
    pi_old had acted (see ``lead_with_teacher``), as before this mask.

    Terms (Schulman et al. 2017), with r = pi_new(a) / pi_old(a), A the advantages (normalised per minibatch to
    zero mean and unit std over the masked samples when ``norm_adv``) and R = A_raw + V_old the value targets:
        loss_policy  = mean(max(-A r, -A clip(r, 1 - clip_coef, 1 + clip_coef)))
        loss_value   = vf_coef * 0.5 * mean((V - R)^2), or with ``clip_vloss`` 0.5 * mean(max((V - R)^2,
                       (V_old + clip(V - V_old, -vf_clip_coef, vf_clip_coef) - R)^2))
        loss_entropy = -ent_coef * mean(H)
    Metrics: ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl`` (mean of (r - 1) - log r, Schulman's k3
    estimator), ``clipfrac`` (|r - 1| > clip_coef) and ``value_clipfrac`` (|V - V_old| > vf_clip_coef).

    Args:
        clip_coef: how far the probability ratio may leave 1 before the policy term stops pulling (epsilon).
        vf_coef: the value loss's weight.
        vf_clip_coef: how far the value may move from ``V_old`` in one update, with ``clip_vloss``.
        ent_coef: the entropy bonus's weight.
        norm_adv: normalise the advantages per minibatch.
        clip_vloss: clip the value loss as above (CleanRL's default).
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
        for name, value in (("clip_coef", clip_coef), ("vf_coef", vf_coef), ("vf_clip_coef", vf_clip_coef)):
            checks.finite(name, value, low=0)
        checks.finite("ent_coef", ent_coef, low=0)
        self.clip_coef, self.vf_coef, self.vf_clip_coef = clip_coef, vf_coef, vf_clip_coef
        self.ent_coef, self.norm_adv, self.clip_vloss = ent_coef, norm_adv, clip_vloss

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        weights = minibatch[keys.PRIO_WEIGHTS]
        mask = live_rows(minibatch, minibatch.get(keys.PPO_MASK, None))  # rows of inactive agents left out
        policy_mask = policy_rows(mask, minibatch.get(keys.TEACHER_LED, None))

        def mean(x: torch.Tensor) -> torch.Tensor:
            return sample_mean(x, weights, mask)

        advantages = minibatch[keys.ADVANTAGES]
        old_values = minibatch[keys.VALUES]
        returns = advantages + old_values
        if self.norm_adv:
            advantages = normalize(advantages, policy_mask, self.all_reduce)

        logratio = policy_out[keys.ACT_LOG_PROB] - minibatch[keys.ACT_LOG_PROB]
        ratio = logratio.exp()
        pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - self.clip_coef, 1 + self.clip_coef))
        policy_loss = sample_mean(pg, weights, policy_mask)

        values = policy_out[keys.VALUES]
        v_unclipped = (values - returns) ** 2
        if self.clip_vloss:
            v_clipped = old_values + (values - old_values).clamp(-self.vf_clip_coef, self.vf_clip_coef)
            value_loss = 0.5 * mean(torch.max(v_unclipped, (v_clipped - returns) ** 2))
        else:
            value_loss = 0.5 * mean(v_unclipped)

        entropy = mean(policy_out[keys.ENTROPY])
        with torch.no_grad():
            unweighted = torch.ones_like(weights)
            approx_kl = sample_mean((ratio - 1) - logratio, unweighted, policy_mask)
            clipfrac = sample_mean(((ratio - 1).abs() > self.clip_coef).float(), unweighted, policy_mask)
            value_clipfrac = sample_mean(((values - old_values).abs() > self.vf_clip_coef).float(), unweighted, mask)
        return {
            "loss_policy": policy_loss,
            "loss_value": self.vf_coef * value_loss,
            "loss_entropy": -self.ent_coef * entropy,
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "approx_kl": approx_kl,
            "clipfrac": clipfrac,
            "value_clipfrac": value_clipfrac,
        }


def policy_rows(mask: torch.Tensor | None, teacher_led: torch.Tensor | None) -> torch.Tensor | None:
    """The rows PPO's policy terms average over, as a float mask [B, T] (None: all): those in ``mask`` (PPO_MASK)
    whose action the policy sampled, i.e. not ``teacher_led``."""
    if teacher_led is None:
        return mask
    sampled = 1.0 - teacher_led.float()
    return sampled if mask is None else sampled * mask.float()


def normalize(advantages: torch.Tensor, mask: torch.Tensor | None, all_reduce: Callable) -> torch.Tensor:
    """``(A - mean) / (std + 1e-8)`` over the minibatch's (masked) samples, and with ``all_reduce`` summing over the
    ranks (torchrun) over every rank's minibatch: one all-reduce of ``[sum m*A, sum m*A^2, sum m]`` (queued on the
    device, no host sync). Unweighted: importance weights scale each sample's loss, not the advantage statistics."""
    m = torch.ones_like(advantages) if mask is None else mask.to(advantages.dtype)
    sums = all_reduce(torch.stack([(m * advantages).sum(), (m * advantages**2).sum(), m.sum()]))
    total, squares, count = sums.unbind()
    count = count.clamp(min=1.0)  # an all-masked minibatch keeps finite statistics
    mean = total / count
    var = (squares / count - mean**2).clamp(min=0.0)
    # Unbiased like torch.std (CleanRL's ``advantages.std()``).
    var = var * count / (count - 1.0).clamp(min=1.0)
    return (advantages - mean) / (var.sqrt() + 1e-8)
