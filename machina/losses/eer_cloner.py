"""EER cloner: behaviour cloning of the scripted teacher plus reward shaping for agreeing with it."""

import math

import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.keys import Spec
from machina.losses.base import Loss
from machina.losses.functional import cloning_terms
from machina.progress import Progress
from machina.schedules import Linear, as_schedule


class EERClonerLoss(Loss):
    """``loss_cloning = coef * mean(w * -log pi(teacher_action | s))`` and, at rollout, the reward of action a_t is
    shaped ``r_t += r_lambda * log p`` with ``p = 1`` if a_t was the teacher's action for s_t, else
    ``teacher_prob_floor`` (the teacher as a near-deterministic policy: log p is its log-probability of a_t).
    """

    consumes = frozenset({keys.FULL_LOG_PROBS})
    env_outputs = frozenset({keys.TEACHER_ACTIONS})

    def __init__(
        self,
        action_loss_coef: float | Linear = 1.0,
        r_lambda: float | Linear = 0.01,
        teacher_prob_floor: float = 0.01,
    ):
        super().__init__()
        if not (checks.is_number(teacher_prob_floor) and 0.0 < teacher_prob_floor <= 1.0):
            raise ConfigError(f"teacher_prob_floor={teacher_prob_floor!r:.80} must be a number in (0, 1]")
        self.coef = as_schedule(action_loss_coef, "action_loss_coef")
        self.r_lambda = as_schedule(r_lambda, "r_lambda")
        self.log_floor = math.log(teacher_prob_floor)

    def experience_spec(self, env_spec: EnvSpec) -> Spec:
        return {keys.TEACHER_ACTIONS: ((), torch.int64)}

    def on_env_step(self, step: TensorDict, progress: Progress) -> None:
        agreed = step[keys.ACTIONS] == step[keys.TEACHER_ACTIONS]
        bonus = torch.where(agreed, 0.0, self.log_floor)
        step[keys.REWARDS] = step[keys.REWARDS] + self.r_lambda(progress.agent_step) * bonus

    def forward(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress) -> dict:
        nll, agreement = cloning_terms(minibatch, policy_out)
        coef = self.coef(progress.agent_step)
        return {
            "loss_cloning": coef * nll,
            "cloning_loss": nll.detach(),
            "teacher_agreement": agreement,
            "r_lambda": self.r_lambda(progress.agent_step),
        }
