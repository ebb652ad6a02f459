"""A tiny PettingZoo parallel env written from the parallel API's definition (https://pettingzoo.farama.org/api/
parallel/), and PettingZoo's own ``parallel_api_test`` on it: the adapter's tests (``tests/test_pettingzoo.py``)
build it by id, ``tests.test_pettingzoo_relay:relay``.

Relay: agents ``runner_0 .. runner_{A-1}``; ``runner_i`` terminates after ``finish[i]`` steps (agents finish at
different times) and leaves ``env.agents``; every agent still running at step ``max_cycles`` is truncated. The
observation is ``[t, slot, tag, last action]`` (t: steps taken, tag: drawn from the env's generator at reset, so
the seed decides it); the reward of ``runner_i`` for action a is ``(i + 1) + a / 10``: different per agent.
"""

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.test import parallel_api_test
from pettingzoo.utils.conversions import parallel_to_aec

FINISH = (2, 4, 5)


class Relay(ParallelEnv):
    metadata = {"name": "relay_v0", "render_modes": []}

    def __init__(
        self, finish=FINISH, max_cycles=100, obs_sizes=None, actions=3, box_actions=False, grid=None, masks=False
    ):
        self.finish, self.max_cycles = tuple(finish), max_cycles
        self.possible_agents = [f"runner_{i}" for i in range(len(self.finish))]
        sizes = obs_sizes or [4] * len(self.finish)
        # grid: every observation an array of that shape (the vector above laid out row-major, then 7s); masks: a
        # Dict of it and an action mask, as PettingZoo's classic games observe.
        self.grid = tuple(grid) if grid else None
        self.observation_spaces = {
            name: spaces.Box(-np.inf, np.inf, self.grid or (size,), np.float32)
            for name, size in zip(self.possible_agents, sizes, strict=True)
        }
        if masks:
            self.observation_spaces = {
                name: spaces.Dict({"observation": space, "action_mask": spaces.MultiBinary(actions)})
                for name, space in self.observation_spaces.items()
            }
        counts = actions if isinstance(actions, list) else [actions] * len(self.finish)
        acts = [spaces.Box(-1, 1, (2,)) if box_actions else spaces.Discrete(n) for n in counts]
        self.action_spaces = dict(zip(self.possible_agents, acts, strict=True))
        self.agents = []
        self.np_random = np.random.default_rng()

    @functools.cache  # noqa: B019 - PettingZoo's documented pattern; one env per test
    def observation_space(self, agent):
        return self.observation_spaces[agent]

    @functools.cache  # noqa: B019
    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t, self.tag = 0, float(self.np_random.uniform())
        return {a: self._obs(a, 0) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}, live agents {self.agents}"
        self.t += 1
        slot = {a: self.possible_agents.index(a) for a in self.agents}
        obs = {a: self._obs(a, actions[a]) for a in self.agents}
        rewards = {a: slot[a] + 1 + float(actions[a]) / 10 for a in self.agents}
        terms = {a: self.t >= self.finish[slot[a]] for a in self.agents}
        truncs = {a: self.t >= self.max_cycles and not terms[a] for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def _obs(self, agent, action):
        shape = self.observation_spaces[agent].shape
        size = int(np.prod(shape))
        values = [self.t, self.possible_agents.index(agent), self.tag, float(action)] + [7.0] * (size - 4)
        return np.array(values[:size], dtype=np.float32).reshape(shape)


class Sequential(AECEnv):
    """An AEC env that does not declare itself parallelizable: the adapter must refuse it."""

    metadata = {"name": "sequential_v0", "render_modes": []}
    possible_agents = ["a", "b"]


def relay(**kwargs):
    return Relay(**kwargs)


def relay_aec(**kwargs):
    """The relay as an AEC env (PettingZoo's parallel_to_aec), parallelizable."""
    return parallel_to_aec(Relay(**kwargs))


def sequential():
    return Sequential()


def not_an_env():
    return object()


def test_relay_passes_pettingzoo_parallel_api_test():
    parallel_api_test(Relay(), num_cycles=50)
    parallel_api_test(Relay(finish=(3, 3), max_cycles=2), num_cycles=50)


def test_mpe_spread_passes_pettingzoo_parallel_api_test():
    from mpe2 import simple_spread_v3

    parallel_api_test(simple_spread_v3.parallel_env(max_cycles=25), num_cycles=60)
