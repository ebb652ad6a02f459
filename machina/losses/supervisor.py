"""Supervisor: behaviour cloning of the env's scripted teacher, optionally with teacher-led rollouts."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.keys import Spec
from machina.losses.base import Loss, Progress
from machina.losses.functional import cloning_terms, lead_with_teacher
from machina.losses.schedule import Linear, as_schedule


class SupervisorLoss(Loss):
    """``loss_supervised = coef * mean(w * -log pi(teacher_action | s))`` over the minibatch (w: importance weights).

    Rollout: with probability ``teacher_led_proportion`` per agent and step, the agent acts as the teacher: its
    stored and executed action is the teacher's, with the policy's log-probability of it (so PPO, when enabled,
    trains only on actions the env executed). Reads minibatch ``TEACHER_ACTIONS`` [B, T] and policy
    ``FULL_LOG_PROBS`` [B, T, A]. Metrics: ``supervised_loss``, ``teacher_agreement``, and the host values
    ``teacher_led_proportion``, ``action_loss_coef``.
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_keys = frozenset({keys.TEACHER_ACTIONS})

    def __init__(self, action_loss_coef: float | Linear = 1.0, teacher_led_proportion: float | Linear = 0.0):
        super().__init__()
        self.coef = as_schedule(action_loss_coef, "losses.supervisor.action_loss_coef")
        self.teacher_led = as_schedule(teacher_led_proportion, "losses.supervisor.teacher_led_proportion")

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {keys.TEACHER_ACTIONS: ((), torch.int64)}

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        proportion = self.teacher_led(progress.agent_step)
        if proportion > 0.0:
            lead_with_teacher(step, torch.rand(step.batch_size, device=step.device) < proportion)

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict:
        nll, agreement = cloning_terms(minibatch, policy_out)
        coef = self.coef(progress.agent_step)
        return {
            "loss_supervised": coef * nll,
            "supervised_loss": nll.detach(),
            "teacher_agreement": agreement,
            "teacher_led_proportion": self.teacher_led(progress.agent_step),
            "action_loss_coef": coef,
        }
