"""Loss math shared by the losses, and ``compute_advantages`` (GAE with V-trace's clipped ratios), which the advantage
estimators (machina/training/advantage.py, its step convention) and the horizon-values loss's targets share."""

import torch
from tensordict import TensorDict

from machina import keys


def sample_mean(x: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the samples of ``weights * x`` (all [B, T]); with ``mask``, over the masked samples only (0 when
    none is). The denominator counts samples: importance weights are normalised once, by the sampler."""
    if mask is None:
        return (x * weights).sum() / x.numel()
    mask = mask.to(x.dtype)
    return (x * weights * mask).sum() / mask.sum().clamp(min=1.0)


def live_rows(minibatch: TensorDict, mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """The rows a loss averages over, bool [B, T] (None: all): those of ``mask`` whose agent acted (``ACTIVE``, stored
    for envs whose agents can finish before the others: the other rows are not transitions)."""
    active = minibatch.get(keys.ACTIVE, None)
    if active is None:
        return mask
    return active if mask is None else active & mask


def teacher_nll(full_log_probs: torch.Tensor, teacher_actions: torch.Tensor) -> torch.Tensor:
    """-log pi(teacher action): float [B, T] from ``full_log_probs`` [B, T, A] and ``teacher_actions`` [B, T]."""
    return -full_log_probs.gather(-1, teacher_actions.unsqueeze(-1)).squeeze(-1)


def agreement(full_log_probs: torch.Tensor, teacher_actions: torch.Tensor) -> torch.Tensor:
    """1.0 where the policy's most likely action is the teacher's: float [B, T]."""
    return (full_log_probs.argmax(-1) == teacher_actions).float()


def cloning_terms(
    minibatch: TensorDict, policy_out: TensorDict, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What every teacher-cloning loss computes: (the weighted mean of -log pi(teacher action) over the samples, or
    over the ``mask``ed ones, rows of inactive agents left out: ``live_rows``; the share of all samples whose most
    likely action is the teacher's, detached). Reads ``TEACHER_ACTIONS`` and ``PRIO_WEIGHTS`` [B, T] from
    ``minibatch`` and ``FULL_LOG_PROBS`` [B, T, A] from ``policy_out``; both results are 0-d."""
    log_probs = policy_out[keys.FULL_LOG_PROBS]
    teacher = minibatch[keys.TEACHER_ACTIONS]
    nll = sample_mean(teacher_nll(log_probs, teacher), minibatch[keys.PRIO_WEIGHTS], live_rows(minibatch, mask))
    return nll, agreement(log_probs.detach(), teacher).mean()


def lead_with_teacher(step: TensorDict, led: torch.Tensor) -> None:
    """Make the agents in ``led`` (bool [N]) act as the teacher: their ``ACTIONS`` become ``TEACHER_ACTIONS`` and
    their ``ACT_LOG_PROB`` the policy's log-probability of it (from ``FULL_LOG_PROBS`` [N, A]), so the env executes
    and the buffer stores the same action.

    The stored log-probability is not the behaviour's: the teacher chose that action (probability 1), the policy
    did not sample it. PPO's ratio and clipping (Schulman et al. 2017) hold only for actions sampled from pi_old,
    so the caller must mark these rows for PPO to leave out of its policy terms: the sliced scripted cloner keeps
    them out of ``PPO_MASK``, the supervisor stores ``TEACHER_LED``. The value kept here is what the learner's
    ``RATIO`` write-back (for V-trace) divides by."""
    teacher = step[keys.TEACHER_ACTIONS]
    teacher_log_prob = step[keys.FULL_LOG_PROBS].gather(-1, teacher.unsqueeze(-1)).squeeze(-1)
    step[keys.ACT_LOG_PROB] = torch.where(led, teacher_log_prob, step[keys.ACT_LOG_PROB])
    step[keys.ACTIONS] = torch.where(led, teacher, step[keys.ACTIONS])


def compute_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    last_values: torch.Tensor,
    ratio: torch.Tensor,
    gamma: float | torch.Tensor,
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
        gamma: the discount, or float32 [N, 1]: one per row (the horizon-values loss folds its discounts into rows).
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
