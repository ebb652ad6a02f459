"""The interface every loss implements. The trainer calls these hooks and never names a loss."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import EnvSpec

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass
class Progress:
    """Where training stands; losses read it for schedules (host ints, never device tensors)."""

    agent_step: int
    total_timesteps: int

    @property
    def fraction(self) -> float:
        return min(self.agent_step / max(self.total_timesteps, 1), 1.0)


class Loss(nn.Module):
    """A loss term of the update, with optional rollout hooks.

    Class attributes:
        consumes: policy outputs this loss reads (at rollout or in training). The ``consumes`` resolver reads it to
            derive ``policy.action_probs.emit_full_log_probs``, and start-up refuses a policy that does not emit
            one of them.
        env_keys: env outputs this loss needs besides observations and rewards (e.g. ``TEACHER_ACTIONS``); the
            env computes teacher actions only when a loss asks for them.
    """

    consumes: ClassVar[frozenset[str]] = frozenset()
    env_keys: ClassVar[frozenset[str]] = frozenset()

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        """Per-step keys this loss needs stored in the experience buffer, ``{key: (shape, dtype)}``."""
        return {}

    def setup(self, env_spec: EnvSpec, policy: nn.Module, device: torch.device) -> None:
        """Validate against the env and policy, and build what needs them (e.g. a teacher network)."""

    def on_rollout_start(self, progress: Progress) -> None:
        """Called once before each rollout (e.g. to resample which agents the teacher leads)."""

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        """Called after the policy acted on ``step`` (batch [N]) and before it is stored.

        A loss may edit rewards (shaping), write keys it declared in ``experience_spec``, or set
        ``keys.ENV_ACTIONS`` to make the env execute other actions than the stored ones (teacher-led rollouts).
        """

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        """Return ``loss_*`` terms (with grad; the trainer sums them) and detached 0-d metrics.

        Args:
            minibatch: batch [B, T]: stored keys plus ``ADVANTAGES`` and ``PRIO_WEIGHTS``. Losses may add keys
                for losses after them (e.g. ``PPO_MASK``) but never change stored values in place.
            policy_out: batch [B, T]: the policy's outputs for the minibatch, shared by all losses.
        """
        raise NotImplementedError
