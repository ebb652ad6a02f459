"""The rollout phase: act in the env until the experience buffer is full.

One step, for all N agents at once:
    policy acts on the current observation (recurrent state carried per agent, zeroed where an episode began)
    -> losses' ``on_rollout_step`` (teacher-led actions) -> env.step(ACTIONS) -> the step gets the action's reward
    and episode end (and V(final observation) on truncations the env does not observe) -> losses' ``on_env_step``
    (reward shaping) -> store.
After the last step, one more forward gives V of the observation the rollout ends on: the bootstrap of every
agent's last stored step. Nothing here reads a device value on the host.
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
from machina.training.state import pack, unpack

# What every stored step takes from the env's output for the action it executed.
OUTCOME_KEYS = (keys.REWARDS, keys.TERMINATED, keys.TRUNCATED)
# Policy outputs the loss hooks read at rollout even when the buffer does not store them.
HOOK_INPUTS = frozenset({keys.FULL_LOG_PROBS})


class Rollout:
    """Owns the live env state between epochs: the latest observation and each agent's recurrent state.

    Args:
        env: a batched env (``machina.env.base.Env``).
        policy: the component policy; called with batch [N, 1].
        losses: enabled losses, in order; their rollout hooks run around the env step.
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
        self.bootstrap_truncations = not env.spec.observes_time
        self.step_td = self._next_step(env.reset(), torch.ones(self.num_agents, dtype=torch.bool, device=self.device))
        self.state = policy.initial_state(self.num_agents, self.device)
        # Policy outputs that rollout hooks and the buffer may read: those the policy writes per step.
        self.policy_keys = tuple(k for k in policy.output_keys() if k in experience.step_keys or k in HOOK_INPUTS)
        # The rollout forward: input batch [N] with T = 1 -> outputs including the next state.
        if cuda_graphs:
            self.forward = GraphedForward(policy, keep=(*self.policy_keys, *keys.NEXT_STATE.values()))
        else:
            self.forward = policy

    def state_dict(self) -> dict:
        """The observation the next rollout acts on and each agent's recurrent state, as plain data."""
        return {"step": pack(self.step_td), "state": pack(self.state)}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from ``saved`` (after the env's own ``load_state_dict``). Keys the env emits now but did not then
        (a teacher switched on by a loss added on resume) come from the env's current observation. An env that
        started new episodes on load (``continues_episodes`` False) is acted on from its first observations with
        fresh recurrent state: the saved ones belong to episodes that no longer exist."""
        if not self.env.continues_episodes:
            start = torch.ones(self.num_agents, dtype=torch.bool, device=self.device)
            self.step_td = self._next_step(self.env.observe(), start)
            self.state = self.policy.initial_state(self.num_agents, self.device)
            return
        step = unpack(saved["step"], self.device)
        missing = [key for key in self.step_td.keys() if key not in step.keys()]
        if missing:
            current = self.env.observe()
            for key in missing:
                step[key] = current[key]
        self.step_td = step.select(*self.step_td.keys())
        self.state = unpack(saved["state"], self.device)

    @torch.no_grad()
    def run(self, progress: Progress) -> int:
        """Fill the buffer; return the number of agent steps taken."""
        exp, sw = self.experience, self.stopwatch
        exp.reset_for_rollout()
        with sw.time("rollout.prepare"):
            self.env.prepare_rollout(exp.batch_size // self.num_agents)
        for loss in self.losses.values():
            loss.on_rollout_start(progress)
        steps = 0
        while not exp.full:
            step = self.step_td
            with sw.time("rollout.inference"):
                out = self.forward(rollout_input(step, self.state))
                for key in self.policy_keys:
                    step[key] = out[key].squeeze(1)
                state_after = next_state(out, self.state)
            with sw.time("rollout.hooks"):
                for loss in self.losses.values():
                    loss.on_rollout_step(step, progress)
            with sw.time("rollout.env"):
                result = self.env.step(step[keys.ACTIONS])
            with sw.time("rollout.hooks"):
                step.update({key: result[key] for key in OUTCOME_KEYS})
                if self.bootstrap_truncations:
                    step[keys.FINAL_VALUES] = self._final_values(result, state_after)
                for loss in self.losses.values():
                    loss.on_env_step(step, progress)
            with sw.time("rollout.store"):
                exp.store(step, self.state)
            self.state = state_after
            self.step_td = self._next_step(result, result[keys.TERMINATED] | result[keys.TRUNCATED])
            steps += self.num_agents
        with sw.time("rollout.inference"):
            exp.last_values.copy_(self.forward(rollout_input(self.step_td, self.state))[keys.VALUES].squeeze(1))
        return steps

    def _final_values(self, result: TensorDict, state_after: TensorDict) -> torch.Tensor:
        """V(FINAL_OBS) where an agent was truncated, else 0: float32 [N]. The final observation continues the
        episode the state belongs to, so the policy sees it with that state and no reset."""
        if keys.FINAL_OBS not in result.keys():  # no truncation on this step (a key check, not a device read)
            return torch.zeros(self.num_agents, device=self.device)
        final = TensorDict(
            {keys.OBS: result[keys.FINAL_OBS], keys.EPISODE_START: torch.zeros(self.num_agents, device=self.device)},
            batch_size=[self.num_agents],
        )
        values = self.forward(rollout_input(final, state_after))[keys.VALUES].squeeze(1)
        return torch.where(result[keys.TRUNCATED], values, 0.0)

    @staticmethod
    def _next_step(result: TensorDict, episode_start: torch.Tensor) -> TensorDict:
        """The step the policy acts on next: the env's observation (and teacher actions), marking episode starts."""
        step = result.exclude(*OUTCOME_KEYS, keys.FINAL_OBS)
        step[keys.EPISODE_START] = episode_start.float()
        return step
