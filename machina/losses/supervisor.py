"""Supervisor: behaviour cloning of the env's scripted teacher, optionally with teacher-led rollouts."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.keys import Spec
from machina.losses.base import Loss
from machina.losses.functional import cloning_terms, lead_with_teacher
from machina.progress import Progress
from machina.schedules import Linear, as_schedule


class SupervisorLoss(Loss):
    """``loss_supervised = coef * mean(w * -log pi(teacher_action | s))`` over the minibatch (w: importance weights).

    Rollout: with probability ``teacher_led_proportion`` per agent and step, the agent acts as the teacher: its
    stored and executed action is the teacher's, stored with the policy's log-probability of it. That action was
    not sampled from pi_old, so PPO's ratio and clipping (Schulman et al. 2017), defined for actions drawn from
    pi_old, do not apply to it: the supervisor marks those steps ``TEACHER_LED`` (bool [N], stored whenever the
    schedule is ever above 0) and PPO leaves them out of its policy terms (surrogate, advantage normalisation,
    ``approx_kl``, ``clipfrac``), as it leaves out the sliced scripted cloner's teacher-led slice. Why masking
    rather than storing the true behaviour probability (1 for the teacher's action) and correcting by it: the
    corrected ratio pi_new(a) / 1 starts far from 1, so PPO's clip to [1 - eps, 1 + eps] (a trust region around
    pi_old) would be meaningless on those rows, and pulling the policy towards the teacher's action is the cloning
    loss's job. The coin that makes a step teacher-led is drawn independently of the state, so the remaining rows
    are exactly actions sampled from pi_old, which is all PPO's surrogate needs. PPO's value loss and entropy bonus
    still use every row: neither depends on which behaviour chose the action (see ``PPOLoss``).

    Reads minibatch ``TEACHER_ACTIONS`` [B, T] and policy ``FULL_LOG_PROBS`` [B, T, A]. Metrics:
    ``supervised_loss``, ``teacher_agreement``, and the host values ``teacher_led_proportion``,
    ``action_loss_coef``.
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_outputs = frozenset({keys.TEACHER_ACTIONS})

    def __init__(self, action_loss_coef: float | Linear = 1.0, teacher_led_proportion: float | Linear = 0.0):
        super().__init__()
        self.coef = as_schedule(action_loss_coef, "action_loss_coef")
        self.teacher_led = as_schedule(teacher_led_proportion, "teacher_led_proportion")
        # Piecewise linear: positive somewhere iff positive at a breakpoint or at 0 (constant after its last one).
        steps = {0, *self.teacher_led.breakpoints()}
        self.leads = any(self.teacher_led(step) > 0.0 for step in steps)

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        spec = {keys.TEACHER_ACTIONS: ((), torch.int64)}
        if self.leads:
            spec[keys.TEACHER_LED] = ((), torch.bool)
        return spec

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        if not self.leads:
            return
        proportion = self.teacher_led(progress.agent_step)
        if proportion > 0.0:
            led = torch.rand(step.batch_size, device=step.device) < proportion
            lead_with_teacher(step, led)
        else:
            led = torch.zeros(step.batch_size, dtype=torch.bool, device=step.device)
        step[keys.TEACHER_LED] = led

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
