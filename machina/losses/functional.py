"""Loss math shared by the teacher losses."""

import torch

from machina import keys


def masked_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` weighted by ``weight`` (same shape, or None for a plain mean); 0 when the weights sum to 0."""
    if weight is None:
        return x.mean()
    weight = weight.to(x.dtype)
    return (x * weight).sum() / weight.sum().clamp(min=1.0)


def teacher_nll(full_log_probs: torch.Tensor, teacher_actions: torch.Tensor) -> torch.Tensor:
    """-log pi(teacher action): float [B, T] from ``full_log_probs`` [B, T, A] and ``teacher_actions`` [B, T]."""
    return -full_log_probs.gather(-1, teacher_actions.unsqueeze(-1)).squeeze(-1)


def agreement(full_log_probs: torch.Tensor, teacher_actions: torch.Tensor) -> torch.Tensor:
    """1.0 where the policy's most likely action is the teacher's: float [B, T]."""
    return (full_log_probs.argmax(-1) == teacher_actions).float()


def executed_actions(step) -> torch.Tensor:
    """The actions the env executes for a rollout step: a hook's override, else the policy's."""
    return step.get(keys.ENV_ACTIONS, step[keys.ACTIONS])
