"""EER kickstarter: distil a teacher *network* (a machina policy file) into the policy, with reward shaping.

From "Distilling Policy Distillation" (Czarnecki et al. 2019), expected entropy regularised distillation, as in the
seed's stack. Which divergence: the reverse KL ``KL(pi_S || pi_T) = sum_a pi_S(a) (log pi_S(a) - log pi_T(a))``,
i.e. the cross-entropy to the teacher minus the student's entropy. It is the per-state term of the same objective
as the shaping reward ``r += lambda * log pi_T(a | s)`` plus PPO's entropy bonus (expected return minus the KL from
the teacher along the student's own trajectories), it is zero exactly when the student matches the teacher, and it
does not, unlike the seed's cross-entropy alone (``-sum_a pi_S log pi_T``, minimised by a one-hot student on the
teacher's mode), reward the student for collapsing onto one action.

Value distillation (``(V_T - V)^2``): the teacher's values estimate the env's returns, while PPO's critic learns the
shaped returns (with ``lambda * log pi_T`` added to every reward). They are consistent only without shaping, so the
value term is applied on updates where ``r_lambda`` is 0 (for example after a ``Linear`` schedule has annealed it)
and dropped while shaping is on; the metric ``value_coef`` shows which.
"""

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.keys import Spec
from machina.losses.base import Loss
from machina.losses.functional import live_rows, sample_mean
from machina.policy.inputs import next_state, rollout_input
from machina.progress import Progress
from machina.schedules import Linear, as_schedule


class EERKickstarterLoss(Loss):
    """Distils ``teacher`` (a frozen policy network, built by ``machina.startup.build`` from
    ``losses.eer_kickstarter.teacher.path``; it is part of this module but not of its ``state_dict``: a resumed run
    takes the teacher from its file, not from the checkpoint).

    Rollout: the teacher acts on every step (its own recurrent state, reset on episode starts); its
    ``FULL_LOG_PROBS`` and ``VALUES`` are stored as ``TEACHER_FULL_LOG_PROBS`` [A] and ``TEACHER_VALUES``, and the
    reward of each action a_t is shaped with ``r_lambda * log pi_T(a_t | s_t)``.

    Train: ``loss_action = action_loss_coef * mean(w * KL(pi_S || pi_T))`` and, while ``r_lambda`` is 0,
    ``loss_value = value_loss_coef * mean(w * (V_T - V)^2)`` (w: importance weights); reads policy
    ``FULL_LOG_PROBS`` and ``VALUES``.
    """

    consumes = frozenset({keys.FULL_LOG_PROBS, keys.VALUES})
    rollout_state = ("_state",)  # the teacher's recurrent state

    def __init__(
        self,
        teacher: nn.Module,
        action_loss_coef: float | Linear = 0.6,
        value_loss_coef: float | Linear = 1.0,
        r_lambda: float | Linear = 0.01,
    ):
        super().__init__()
        self.teacher = teacher
        self.action_coef = as_schedule(action_loss_coef, "action_loss_coef")
        self.value_coef = as_schedule(value_loss_coef, "value_loss_coef")
        self.r_lambda = as_schedule(r_lambda, "r_lambda")
        self._state: TensorDict | None = None

    def setup(self, env_spec: EnvSpec, device: torch.device, all_reduce) -> None:
        super().setup(env_spec, device, all_reduce)
        if self.teacher.num_actions != env_spec.num_actions:
            raise ConfigError(
                f"teacher has {self.teacher.num_actions} actions but the env has "
                f"{env_spec.num_actions}; use a teacher trained with the same env.num_vibes"
            )
        if self.teacher.obs_spec != env_spec.obs:
            raise ConfigError(
                f"teacher was trained on other observations ({self.teacher.obs_spec}) than this env's ({env_spec.obs})"
            )

    def state_dict(self, *args, **kwargs) -> dict:
        return {k: v for k, v in super().state_dict(*args, **kwargs).items() if not k.startswith("teacher.")}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        own = {f"teacher.{k}": v for k, v in self.teacher.state_dict().items()}
        return super().load_state_dict({**state_dict, **own}, strict=strict, assign=assign)

    def rollout_state_like(self, name: str) -> TensorDict:
        return self.teacher.initial_state(self.num_agents, self.device)

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {
            keys.TEACHER_FULL_LOG_PROBS: ((env_spec.num_actions,), torch.float32),
            keys.TEACHER_VALUES: ((), torch.float32),
        }

    @torch.no_grad()
    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        if self._state is None:
            self._state = self.teacher.initial_state(step.batch_size[0], step.device)
        out = self.teacher.act(rollout_input(step, self._state))
        self._state = next_state(out, self._state)
        step[keys.TEACHER_FULL_LOG_PROBS] = out[keys.FULL_LOG_PROBS]
        step[keys.TEACHER_VALUES] = out[keys.VALUES]

    def on_env_step(self, step: TensorDict, progress: Progress) -> None:
        log_prob = step[keys.TEACHER_FULL_LOG_PROBS].gather(-1, step[keys.ACTIONS].unsqueeze(-1)).squeeze(-1)
        step[keys.REWARDS] = step[keys.REWARDS] + self.r_lambda(progress.agent_step) * log_prob

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict:
        log_probs = policy_out[keys.FULL_LOG_PROBS]
        teacher = minibatch[keys.TEACHER_FULL_LOG_PROBS]
        weights = minibatch[keys.PRIO_WEIGHTS]
        rows = live_rows(minibatch)  # rows of inactive agents left out
        kl = sample_mean((log_probs.exp() * (log_probs - teacher)).sum(-1), weights, rows)
        value_error = sample_mean((minibatch[keys.TEACHER_VALUES] - policy_out[keys.VALUES]) ** 2, weights, rows)
        action_coef = self.action_coef(progress.agent_step)
        shaping = self.r_lambda(progress.agent_step) != 0.0
        value_coef = 0.0 if shaping else self.value_coef(progress.agent_step)
        return {
            "loss_action": action_coef * kl,
            "loss_value": value_coef * value_error,
            "ks_action_loss": kl.detach(),
            "ks_value_loss": value_error.detach(),
            "teacher_agreement": (log_probs.detach().argmax(-1) == teacher.argmax(-1)).float().mean(),
            "value_coef": value_coef,
        }
