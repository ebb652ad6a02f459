"""Who acts in an evaluation: a policy, the env's scripted teacher, or uniform random actions.

An actor maps a step TensorDict [N] (``OBS``, ``EPISODE_START``, and ``TEACHER_ACTIONS`` when the env provides
them) to int64 actions [N].
"""

from collections.abc import Callable

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.policy.inputs import next_state, rollout_input

Actor = Callable[[TensorDict], torch.Tensor]


class PolicyActor:
    """Acts with ``policy`` for ``num_agents`` agents, carrying each agent's recurrent state between calls.
    ``greedy`` takes the argmax of the logits; otherwise actions are sampled (from the global torch RNG).

    Where the step carries ``TEACHER_ACTIONS``, it also counts the steps whose most likely action is the teacher's
    (the training metric ``teacher_agreement``, measured here on the policy's own episodes).
    """

    def __init__(self, policy: nn.Module, num_agents: int, greedy: bool):
        self.policy, self.greedy = policy, greedy
        device = next(policy.parameters()).device
        self.state = policy.initial_state(num_agents, device)
        self.agreed = torch.zeros((), device=device)
        self.compared = 0

    def __call__(self, step: TensorDict) -> torch.Tensor:
        out = self.policy.act(rollout_input(step, self.state))
        self.state = next_state(out, self.state)
        likeliest = out[keys.LOGITS].argmax(-1)
        if keys.TEACHER_ACTIONS in step.keys():
            self.agreed += (likeliest == step[keys.TEACHER_ACTIONS]).sum()
            self.compared += likeliest.numel()
        return likeliest if self.greedy else out[keys.ACTIONS]

    def agreement(self) -> float:
        """Share of the compared agent-steps where the policy's most likely action was the teacher's."""
        return self.agreed.item() / max(self.compared, 1)


def teacher_actor(step: TensorDict) -> torch.Tensor:
    """The env's scripted teacher (needs an env built with ``TEACHER_ACTIONS`` in its ``outputs``)."""
    return step[keys.TEACHER_ACTIONS]


def random_actor(num_actions: int, generator: torch.Generator) -> Actor:
    """Uniform random actions drawn from ``generator`` (on the env's device)."""
    return lambda step: torch.randint(
        num_actions, step.batch_size, generator=generator, device=generator.device, dtype=torch.int64
    )
