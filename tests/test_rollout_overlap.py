"""An overlapped rollout (an env of two groups, stepped through send / recv) stores what happened: for each agent
and step, the observation it acted on, the action the env executed, the reward and episode end the env returned
for that action, and the recurrent state the policy acted with."""

import dataclasses

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.base import Env, Grouped
from machina.logging.stopwatch import Stopwatch
from machina.policy.inputs import training_input
from machina.progress import Progress
from machina.startup.build import build
from machina.training.experience import agent_major
from machina.training.rollout import Rollout
from tests.conftest import compose_config

TINY = ["debug=tiny", "env.num_envs=8", "env.max_steps=12", "experience.bptt_horizon=8", "wandb=disabled"]


class TwoGroups(Env, Grouped):
    """Two independent envs side by side as the two groups of one env; records what each group was sent and what
    each recv returned, and checks the protocol: a group is received only after it was sent, and at most once."""

    groups = 2

    def __init__(self, first: Env, second: Env):
        self.inner = (first, second)
        self.device = first.device
        self.spec = dataclasses.replace(first.spec, num_envs=first.spec.num_envs + second.spec.num_envs)
        self.sent: list[list[torch.Tensor]] = [[], []]
        self.results: list[list[TensorDict]] = [[], []]
        self.in_flight = [None, None]
        self.calls: list[tuple[str, int]] = []

    def reset(self) -> TensorDict:
        return torch.cat([env.reset() for env in self.inner])

    def observe(self) -> TensorDict:
        return torch.cat([env.observe() for env in self.inner])

    def send(self, group: int, actions: torch.Tensor) -> None:
        assert self.in_flight[group] is None, "a group was sent twice before its step was received"
        self.calls.append(("send", group))
        self.in_flight[group] = actions.clone()

    def recv(self, group: int) -> TensorDict:
        actions, self.in_flight[group] = self.in_flight[group], None
        assert actions is not None, "a group was received before it was sent"
        self.calls.append(("recv", group))
        result = self.inner[group].step(actions)
        self.sent[group].append(actions)
        self.results[group].append(result.clone())
        return result

    def step(self, actions: torch.Tensor) -> TensorDict:
        raise AssertionError("an overlapped rollout steps through send / recv only")

    def prepare_rollout(self, steps: int | None = None) -> None:
        for env in self.inner:
            env.prepare_rollout(steps)


def overlapped_rollout(overrides: list[str]):
    cfg = compose_config([*TINY, *overrides])
    parts = build(cfg)
    env = TwoGroups(parts.make_env(seed=11, num_envs=4), parts.make_env(seed=12, num_envs=4))
    rollout = Rollout(env, parts.policy, parts.losses, parts.experience, Stopwatch())
    first_obs = env.observe()[keys.OBS].clone()
    return parts, env, rollout, first_obs


@pytest.mark.parametrize("policy", ["policy=fast", "policy.core=none"])
def test_each_group_stores_its_observation_action_and_outcome(policy):
    parts, env, rollout, first_obs = overlapped_rollout([policy])
    assert rollout.groups == 2
    steps = rollout.run(Progress(0, 1))
    exp = parts.experience
    n = exp.num_agents
    half = n // 2
    assert steps == exp.batch_size
    t_total = exp.batch_size // n
    # Every step's sends and recvs alternate so that one group steps while the other is acted on.
    assert env.calls[:4] == [("send", 0), ("send", 1), ("recv", 0), ("send", 0)]
    assert all(len(sent) == t_total for sent in env.sent)
    for g in range(2):
        agents = slice(g * half, (g + 1) * half)
        actions = torch.stack(env.sent[g], 1)  # [half, T]
        assert torch.equal(agent_major(exp.buffer[keys.ACTIONS], n)[agents], actions)
        for key in (keys.REWARDS, keys.TERMINATED, keys.TRUNCATED):
            want = torch.stack([r[key] for r in env.results[g]], 1)
            assert torch.equal(agent_major(exp.buffer[key], n)[agents], want), key
        # The observation acted on at step t is the reset's (t = 0) or the one step t - 1 returned.
        seen = torch.stack([first_obs[agents], *(r[keys.OBS] for r in env.results[g][:-1])], 1)
        assert torch.equal(agent_major(exp.buffer[keys.OBS], n)[agents], seen)
    # The stored log-probabilities are the policy's for the stored observations and row states: the recurrent
    # state each group acted with is the one stored at its rows' starts.
    with torch.no_grad():
        parts.policy.eval()
        again = parts.policy(training_input(exp.buffer, exp.row_state))[keys.ACT_LOG_PROB]
    torch.testing.assert_close(exp.buffer[keys.ACT_LOG_PROB], again, rtol=1e-4, atol=1e-5)


def test_losses_with_step_hooks_keep_whole_steps():
    """A loss that sees each step (the supervisor leads agents with the teacher) needs every agent's step at once,
    so the rollout steps the env whole (``step``) even when the env offers groups."""
    parts, env, rollout, _ = overlapped_rollout(["losses=[ppo,supervisor]"])
    assert rollout.groups == 1
