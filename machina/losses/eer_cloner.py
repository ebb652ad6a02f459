"""EER cloner: behaviour cloning of the scripted teacher plus reward shaping for agreeing with it."""

import math

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.losses.base import Loss, Progress, Spec
from machina.losses.functional import agreement, executed_actions, masked_mean, teacher_nll
from machina.losses.schedule import Linear, as_schedule


class EERClonerLoss(Loss):
    """``loss_cloning = coef * mean(-log pi(teacher_action | s))`` and, at rollout,
    ``r_t += r_lambda * log p`` with ``p = 1`` if the action executed at t-1 was the teacher's, else
    ``teacher_prob_floor``.

    The reward at step t pays for the action of step t-1, so the shaping term uses the previous step's executed
    action and teacher action, kept per agent between steps (never across a missing previous step).
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_keys = frozenset({keys.TEACHER_ACTIONS})

    def __init__(
        self,
        action_loss_coef: float | Linear = 1.0,
        r_lambda: float | Linear = 0.01,
        teacher_prob_floor: float = 0.01,
    ):
        super().__init__()
        if not 0.0 < teacher_prob_floor <= 1.0:
            raise ValueError(f"losses.eer_cloner.teacher_prob_floor must be in (0, 1], got {teacher_prob_floor}")
        self.coef = as_schedule(action_loss_coef)
        self.r_lambda = as_schedule(r_lambda)
        self.log_floor = math.log(teacher_prob_floor)
        self._previous: TensorDict | None = None

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {keys.TEACHER_ACTIONS: ((), torch.int64)}

    def on_rollout_step(self, step: TensorDict, progress: Progress) -> None:
        previous = self._previous
        if previous is not None:
            agreed = executed_actions(previous) == previous[keys.TEACHER_ACTIONS]
            bonus = torch.where(agreed, 0.0, self.log_floor)
            step[keys.REWARDS] = step[keys.REWARDS] + self.r_lambda(progress.agent_step) * bonus
        # Kept by reference: later hooks may still set ENV_ACTIONS on this step, and the shaping must see them.
        self._previous = step

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict[str, torch.Tensor]:
        log_probs = policy_out[keys.FULL_LOG_PROBS]
        teacher = minibatch[keys.TEACHER_ACTIONS]
        nll = masked_mean(teacher_nll(log_probs, teacher), minibatch.get(keys.PRIO_WEIGHTS, None))
        coef = self.coef(progress.agent_step)
        return {
            "loss_cloning": coef * nll,
            "cloning_loss": nll.detach(),
            "teacher_agreement": agreement(log_probs.detach(), teacher).mean(),
            "r_lambda": torch.tensor(self.r_lambda(progress.agent_step)),
        }
