"""EER kickstarter: distil a teacher *network* (a machina policy file) into the policy, with reward shaping.

From "Distilling Policy Distillation" (expected entropy regularisation), as in the seed's stack.
"""

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.losses.base import Loss, Progress, Spec
from machina.losses.functional import executed_actions, masked_mean
from machina.losses.schedule import Linear, as_schedule
from machina.policy.inputs import next_state, rollout_input
from machina.policy.io import load_policy


class EERKickstarterLoss(Loss):
    """Rollout: the teacher acts on every step (its own recurrent state, reset on episode starts); its
    ``FULL_LOG_PROBS`` and ``VALUES`` are stored as ``TEACHER_FULL_LOG_PROBS`` [A] and ``TEACHER_VALUES``, and the
    reward of step t is shaped with ``r_lambda * log pi_T(a_{t-1} | s_{t-1})``.

    Train: ``loss_action = action_loss_coef * mean(-sum_a pi(a) log pi_T(a))`` (cross-entropy to the teacher) and
    ``loss_value = value_loss_coef * mean((V_T - V)^2)``; reads policy ``FULL_LOG_PROBS`` and ``VALUES``.
    """

    consumes = frozenset({keys.FULL_LOG_PROBS, keys.VALUES})

    def __init__(
        self,
        teacher_checkpoint: str | None = None,
        action_loss_coef: float | Linear = 0.6,
        value_loss_coef: float | Linear = 1.0,
        r_lambda: float | Linear = 0.01,
    ):
        super().__init__()
        if not teacher_checkpoint:
            raise ConfigError(
                "losses.eer_kickstarter needs a teacher: set losses.eer_kickstarter.teacher_checkpoint=PATH to a "
                "machina policy file (outputs/<run>/checkpoints/policy_*.pt)"
            )
        self.teacher_checkpoint = str(teacher_checkpoint)
        self.action_coef = as_schedule(action_loss_coef)
        self.value_coef = as_schedule(value_loss_coef)
        self.r_lambda = as_schedule(r_lambda)
        self.teacher: nn.Module | None = None
        self._state: TensorDict | None = None
        self._previous: TensorDict | None = None

    def setup(self, env_spec: EnvSpec, policy: nn.Module, device: torch.device) -> None:
        teacher, obs_spec = load_policy(self.teacher_checkpoint, device)
        if teacher.num_actions != env_spec.num_actions:
            raise ConfigError(
                f"teacher checkpoint {self.teacher_checkpoint!r} has {teacher.num_actions} actions but the env has "
                f"{env_spec.num_actions}; use a teacher trained with the same env.num_vibes"
            )
        if obs_spec != env_spec.obs:
            raise ConfigError(
                f"teacher checkpoint {self.teacher_checkpoint!r} was trained on another observation spec "
                f"({obs_spec.max_tokens} tokens, {obs_spec.num_features} features) than this env "
                f"({env_spec.obs.max_tokens} tokens, {env_spec.obs.num_features} features)"
            )
        teacher.action_probs.emit_full_log_probs = True
        teacher.requires_grad_(False).eval()
        # Kept out of the module tree: the teacher's weights are not trained and not part of this loss's state.
        self.__dict__["teacher"] = teacher

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {
            keys.TEACHER_FULL_LOG_PROBS: ((env_spec.num_actions,), torch.float32),
            keys.TEACHER_VALUES: ((), torch.float32),
        }

    @torch.no_grad()
    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        if self._state is None:
            self._state = self.teacher.initial_state(step.batch_size[0], step.device)
        out = self.teacher(rollout_input(step, self._state))
        self._state = next_state(out, self._state)
        previous = self._previous
        if previous is not None:
            log_prob = previous[keys.TEACHER_FULL_LOG_PROBS].gather(-1, executed_actions(previous).unsqueeze(-1))
            step[keys.REWARDS] = step[keys.REWARDS] + self.r_lambda(progress.agent_step) * log_prob.squeeze(-1)
        step[keys.TEACHER_FULL_LOG_PROBS] = out[keys.FULL_LOG_PROBS].squeeze(1)
        step[keys.TEACHER_VALUES] = out[keys.VALUES].squeeze(1)
        self._previous = step

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        log_probs = policy_out[keys.FULL_LOG_PROBS]
        weight = minibatch.get(keys.PRIO_WEIGHTS, None)
        cross_entropy = masked_mean(-(log_probs.exp() * minibatch[keys.TEACHER_FULL_LOG_PROBS]).sum(-1), weight)
        value_error = masked_mean((minibatch[keys.TEACHER_VALUES] - policy_out[keys.VALUES]) ** 2, weight)
        action_coef, value_coef = self.action_coef(progress.agent_step), self.value_coef(progress.agent_step)
        return {
            "loss_action": action_coef * cross_entropy,
            "loss_value": value_coef * value_error,
            "ks_action_loss": cross_entropy.detach(),
            "ks_value_loss": value_error.detach(),
            "teacher_agreement": (log_probs.detach().argmax(-1) == minibatch[keys.TEACHER_FULL_LOG_PROBS].argmax(-1))
            .float()
            .mean(),
        }
