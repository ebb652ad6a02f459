"""Sliced scripted cloner: agents split into student-led, teacher-led and PPO slices for each rollout."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.keys import Spec
from machina.losses.base import Loss
from machina.losses.functional import cloning_terms, lead_with_teacher
from machina.progress import Progress
from machina.schedules import Linear, as_schedule


class SlicedScriptedClonerLoss(Loss):
    """Cloning loss on the student-led and teacher-led slices; PPO sees only the PPO slice.

    Before each rollout every agent draws a slice: student-led with probability ``student_led_proportion``,
    teacher-led with ``teacher_led_proportion``, PPO otherwise (the two proportions must sum to at most 1 at every
    step, checked at start-up). Teacher-led agents execute and store the teacher's action, with its log-probability
    under the policy (so it needs ``FULL_LOG_PROBS`` at rollout). The masks are stored per step (``STUDENT_MASK``,
    ``TEACHER_MASK``, ``PPO_MASK`` bool [N]); PPO reads ``PPO_MASK`` from the minibatch and averages over that slice.

    Loss: ``loss_cloning = coef * mean over the student and teacher rows of w * -log pi(teacher_action)`` (w:
    importance weights).
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_outputs = frozenset({keys.TEACHER_ACTIONS})
    rollout_state = ("masks",)  # this rollout's slices
    MASKS = (keys.STUDENT_MASK, keys.TEACHER_MASK, keys.PPO_MASK)

    def __init__(
        self,
        action_loss_coef: float | Linear = 1.0,
        student_led_proportion: float | Linear = 0.2,
        teacher_led_proportion: float | Linear = 0.2,
    ):
        super().__init__()
        self.coef = as_schedule(action_loss_coef, "action_loss_coef")
        self.student_led = as_schedule(student_led_proportion, "student_led_proportion")
        self.teacher_led = as_schedule(teacher_led_proportion, "teacher_led_proportion")
        # Both schedules are piecewise linear, so their sum is too: checking it at every breakpoint checks it all.
        for step in {0, *self.student_led.breakpoints(), *self.teacher_led.breakpoints()}:
            student, teacher = self.student_led(step), self.teacher_led(step)
            if min(student, teacher) < 0.0 or student + teacher > 1.0:
                raise ConfigError(
                    f"student_led_proportion ({student:g}) and teacher_led_proportion ({teacher:g}) at agent step "
                    f"{step} must be >= 0 and sum to at most 1 (the rest is PPO's slice)"
                )
        self.masks: TensorDict | None = None
        self._proportions = (0.0, 0.0)

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        flag = ((), torch.bool)
        return {
            keys.TEACHER_ACTIONS: ((), torch.int64),
            keys.STUDENT_MASK: flag,
            keys.TEACHER_MASK: flag,
            keys.PPO_MASK: flag,
        }

    def rollout_state_like(self, name: str) -> TensorDict:
        flags = {key: torch.zeros(self.num_agents, dtype=torch.bool, device=self.device) for key in self.MASKS}
        return TensorDict(flags, batch_size=[self.num_agents])

    def on_rollout_start(self, progress: Progress) -> None:
        self._proportions = (self.student_led(progress.agent_step), self.teacher_led(progress.agent_step))
        self.masks = None  # drawn at the first step, where the agent count and device are known

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        if self.masks is None:
            student, teacher = self._proportions
            draw = torch.rand(step.batch_size, device=step.device)
            self.masks = TensorDict(
                {
                    keys.STUDENT_MASK: draw < student,
                    keys.TEACHER_MASK: (draw >= student) & (draw < student + teacher),
                    keys.PPO_MASK: draw >= student + teacher,
                },
                batch_size=step.batch_size,
            )
        lead_with_teacher(step, self.masks[keys.TEACHER_MASK])
        step.update(self.masks)

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict:
        cloned = minibatch[keys.STUDENT_MASK] | minibatch[keys.TEACHER_MASK]
        nll, agreement = cloning_terms(minibatch, policy_out, cloned)
        coef = self.coef(progress.agent_step)
        return {
            "loss_cloning": coef * nll,
            "cloning_loss": nll.detach(),
            "teacher_agreement": agreement,
            "student_led_proportion": self.student_led(progress.agent_step),
            "teacher_led_proportion": self.teacher_led(progress.agent_step),
            "ppo_fraction": minibatch[keys.PPO_MASK].float().mean(),
        }
