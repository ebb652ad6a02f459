"""The interface every loss implements. The trainer calls these hooks and never names a loss."""

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.files import saved_state
from machina.files.snapshot import pack
from machina.keys import Spec
from machina.progress import Progress
from machina.schedules import Linear


class Loss(nn.Module):
    """A loss term of the update, with optional rollout hooks.

    Class attributes:
        consumes: policy outputs this loss reads (at rollout or in training). The ``consumes`` resolver reads it to
            derive ``policy.action_probs.emit_full_log_probs``, and start-up refuses a policy that does not emit
            one of them.
        env_outputs: optional env outputs this loss reads (keys an env may declare in ``EnvSpec.outputs``, e.g.
            ``TEACHER_ACTIONS``). The builder asks the env for exactly the outputs the enabled losses name, and
            refuses at start-up a loss whose output the env does not declare.
        rollout_state: names of the TensorDicts it keeps between rollout steps (saved in checkpoints).

    Every rollout step stores the trajectory keys (``machina.training.experience.trajectory_spec``); a loss declares
    only what it needs beyond them.
    """

    consumes: ClassVar[frozenset[str]] = frozenset()
    env_outputs: ClassVar[frozenset[str]] = frozenset()
    # Attributes the loss keeps between rollout steps: TensorDicts of batch [num_agents], or None before the first
    # step. Checkpoints carry them (``get_extra_state``), checked on restore against ``rollout_state_like``.
    rollout_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self):
        super().__init__()
        # Sums a device tensor over the data-parallel ranks in place (identity in a single process); set by setup.
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor
        self.device = torch.device("cpu")
        self.num_agents = 0  # the env's, set by setup

    def get_extra_state(self) -> dict[str, Any]:
        """The ``rollout_state`` TensorDicts that are set (a teacher's recurrent state, the slices of this rollout),
        as plain data: ``state_dict()`` carries them into checkpoints, so a resumed rollout continues with them."""
        return {
            name: {"tensordict": pack(getattr(self, name))}
            for name in self.rollout_state
            if getattr(self, name) is not None
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_extra_state``'s data once all of it is checked (ConfigError naming the entry): only
        ``rollout_state`` names, each a packed TensorDict with exactly the batch size, keys, shapes and dtypes of
        ``rollout_state_like(name)``, finite."""
        state = saved_state.mapping(state, "_extra_state")
        unknown = sorted(set(state) - set(self.rollout_state))
        if unknown:
            raise ConfigError(f"_extra_state.{unknown[0]} is not rollout state of this loss {list(self.rollout_state)}")
        restored = {name: self._restored(name, value) for name, value in state.items()}
        for name, value in restored.items():
            setattr(self, name, value)

    def _restored(self, name: str, saved: Any) -> TensorDict:
        """The rollout state ``name`` from its packed form in a checkpoint, checked against ``rollout_state_like``."""
        like, entry = self.rollout_state_like(name), f"_extra_state.{name}.tensordict"
        packed = saved_state.mapping(saved, f"_extra_state.{name}", ("tensordict",))["tensordict"]
        packed = saved_state.mapping(packed, entry, ("tensors", "batch_size"))
        if packed["batch_size"] != list(like.batch_size):
            raise ConfigError(f"{entry}.batch_size is {packed['batch_size']!r}, expected {list(like.batch_size)}")
        tensors = saved_state.like(packed["tensors"], dict(like.items()), f"{entry}.tensors")
        return TensorDict(tensors, batch_size=like.batch_size).to(self.device)

    def rollout_state_like(self, name: str) -> TensorDict:
        """An example (any values) of the ``rollout_state`` attribute ``name``, batch [num_agents]: what a checkpoint
        must hold for it. Losses with ``rollout_state`` implement it."""
        raise NotImplementedError

    def scheduled(self) -> list[str]:
        """Names of this loss's coefficients that change over training (``schedule.Linear``), for the settings that
        need constants (a captured CUDA graph)."""
        return [name for name, value in vars(self).items() if isinstance(value, Linear)]

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        """Per-step keys this loss needs stored in the experience buffer, ``{key: (shape, dtype)}``."""
        return {}

    def setup(
        self, env_spec: EnvSpec, device: torch.device, all_reduce: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Validate against the env, and keep what the loss is handed: its ``device``, the env's
        ``num_agents`` and ``all_reduce``, which sums a tensor over the ranks of a data-parallel run (no rank logic in
        losses). Subclasses extend it and call it first."""
        self.all_reduce, self.device, self.num_agents = all_reduce, torch.device(device), env_spec.num_agents

    def on_rollout_start(self, progress: Progress) -> None:
        """Called once before each rollout (e.g. to resample which agents the teacher leads)."""

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        """Called after the policy acted on ``step`` (batch [N]) and before the env executes ``step[ACTIONS]``.

        A loss may write keys it declared in ``experience_spec``, or make agents teacher-led: replace their
        ``ACTIONS`` and ``ACT_LOG_PROB`` (the policy's log-probability of the replacement), so that what is stored,
        what is trained on and what the env executes are the same action.
        """

    def on_env_step(self, step: TensorDict, progress: Progress) -> None:
        """Called after the env executed ``step[ACTIONS]``: ``REWARDS``, ``TERMINATED`` and ``TRUNCATED`` of ``step``
        now describe that action. A loss may shape ``REWARDS`` here (before the step is stored)."""

    def forward(
        self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress
    ) -> dict[str, torch.Tensor | float]:
        """Return ``loss_*`` terms (with grad; the learner sums them) and metrics: detached 0-d tensors on the
        minibatch's device, or Python floats for values known on the host (schedules), which the learner keeps
        apart and never sends to the device.

        Args:
            minibatch: batch [B, T]: stored keys plus ``ADVANTAGES`` and ``PRIO_WEIGHTS`` (importance weights,
                ones without prioritized sampling). Losses may add keys for losses after them (e.g.
                ``PPO_MASK``) but never change stored values in place.
            policy_out: batch [B, T]: the policy's outputs for the minibatch, shared by all losses.
        """
        raise NotImplementedError
