"""Supervisor: behaviour cloning of the env's scripted teacher, optionally with teacher-led rollouts."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.losses.base import Loss, Progress, Spec
from machina.losses.functional import agreement, executed_actions, masked_mean, teacher_nll
from machina.losses.schedule import Linear, as_schedule


class SupervisorLoss(Loss):
    """``loss_supervised = coef * mean(-log pi(teacher_action | s))``.

    Rollout: with probability ``teacher_led_proportion`` per agent and step, the env executes the teacher's action
    (written to ``ENV_ACTIONS``) while the buffer keeps what the policy sampled.
    Reads minibatch ``TEACHER_ACTIONS`` [B, T] and policy ``FULL_LOG_PROBS`` [B, T, A]. Metrics:
    ``supervised_loss``, ``teacher_agreement``, ``teacher_led_proportion``, ``action_loss_coef``.
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_keys = frozenset({keys.TEACHER_ACTIONS})

    def __init__(self, action_loss_coef: float | Linear = 1.0, teacher_led_proportion: float | Linear = 0.0):
        super().__init__()
        self.coef = as_schedule(action_loss_coef)
        self.teacher_led = as_schedule(teacher_led_proportion)

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {keys.TEACHER_ACTIONS: ((), torch.int64)}

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        proportion = self.teacher_led(progress.agent_step)
        if proportion <= 0.0:
            return
        led = torch.rand(step.batch_size, device=step.device) < proportion
        step[keys.ENV_ACTIONS] = torch.where(led, step[keys.TEACHER_ACTIONS], executed_actions(step))

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        log_probs = policy_out[keys.FULL_LOG_PROBS]
        teacher = minibatch[keys.TEACHER_ACTIONS]
        weight = minibatch.get(keys.PRIO_WEIGHTS, None)
        nll = masked_mean(teacher_nll(log_probs, teacher), weight)
        coef = self.coef(progress.agent_step)
        return {
            "loss_supervised": coef * nll,
            "supervised_loss": nll.detach(),
            "teacher_agreement": agreement(log_probs.detach(), teacher).mean(),
            "teacher_led_proportion": torch.tensor(self.teacher_led(progress.agent_step)),
            "action_loss_coef": torch.tensor(coef),
        }
