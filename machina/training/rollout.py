"""The rollout phase: act in the env until the experience buffer is full.

One step, for all N agents at once:
    policy acts on the current observation (recurrent state carried per agent, zeroed where an episode began)
    -> each loss's rollout hook (teacher-led actions, reward shaping) -> store -> env.step.
Nothing here reads a device value on the host.
"""

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss, Progress
from machina.policy.inputs import next_state, rollout_input
from machina.training.cuda_graph import GraphedForward
from machina.training.experience import Experience


class Rollout:
    """Owns the live env state between epochs: the latest observation and each agent's recurrent state.

    Args:
        env: a batched env (``reset``/``step`` returning TensorDicts of batch [N]).
        policy: the component policy; called with batch [N, 1].
        losses: enabled losses, in order; their rollout hooks run after the policy.
        experience: the buffer to fill.
        cuda_graphs: run the policy's forward through a CUDA graph captured at the first step (``cuda_graph.py``).
    """

    def __init__(
        self,
        env,
        policy: nn.Module,
        losses: dict[str, Loss],
        experience: Experience,
        stopwatch: Stopwatch,
        cuda_graphs: bool = False,
    ):
        self.env, self.policy, self.losses, self.experience, self.stopwatch = env, policy, losses, experience, stopwatch
        self.device = experience.device
        self.num_agents = env.spec.num_agents
        self.step_td = self._with_dones(env.reset(), torch.ones(self.num_agents, device=self.device))
        self.state = policy.initial_state(self.num_agents, self.device)
        # Policy outputs that rollout hooks and the buffer may read.
        self.policy_keys = (keys.ACTIONS, keys.ACT_LOG_PROB, keys.VALUES, keys.FULL_LOG_PROBS)
        # The rollout forward: input batch [N] with T = 1 -> outputs including the next state.
        if cuda_graphs:
            self.forward = GraphedForward(policy, keep=(*self.policy_keys, *keys.NEXT_STATE.values()))
        else:
            self.forward = policy

    @torch.no_grad()
    def run(self, progress: Progress) -> int:
        """Fill the buffer; return the number of agent steps taken."""
        exp, sw = self.experience, self.stopwatch
        exp.reset_for_rollout()
        for loss in self.losses.values():
            loss.on_rollout_start(progress)
        steps = 0
        while not exp.full:
            step = self.step_td
            with sw.time("rollout.inference"):
                out = self.forward(rollout_input(step, self.state))
                for key in self.policy_keys:
                    if key in out.keys():
                        step[key] = out[key].squeeze(1)
                state_after = next_state(out, self.state)
            with sw.time("rollout.hooks"):
                for loss in self.losses.values():
                    loss.on_rollout_step(step, progress)
            with sw.time("rollout.store"):
                exp.store(step, self.state)
            self.state = state_after
            with sw.time("rollout.env"):
                actions = step.get(keys.ENV_ACTIONS, step[keys.ACTIONS])
                result = self.env.step(actions)
                self.step_td = self._with_dones(result, (result[keys.TERMINATED] | result[keys.TRUNCATED]).float())
            steps += self.num_agents
        return steps

    @staticmethod
    def _with_dones(td: TensorDict, dones: torch.Tensor) -> TensorDict:
        td[keys.EPISODE_START] = dones
        return td
