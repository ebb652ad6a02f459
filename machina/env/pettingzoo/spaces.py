"""The agents and spaces of a PettingZoo parallel env, checked once at start-up, and how one agent's observation is
written into its row: what ``PettingZooEnv`` needs to lay out E copies of A agents as N = E x A rows."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from machina.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """``agents``: ``possible_agents`` in order (slot i is agents[i]); ``obs_size``: the observation width (the widest,
    with padding); ``num_actions`` and ``action_start``: the shared ``Discrete`` action space."""

    agents: tuple[str, ...]
    obs_size: int
    num_actions: int
    action_start: int

    def write(self, row: np.ndarray, observation: Any) -> None:
        """One agent's observation into its float32 row [obs_size] (zero-padded when narrower)."""
        flat = np.asarray(observation, dtype=np.float32).reshape(-1)
        row[: flat.size] = flat
        row[flat.size :] = 0

    def live(self, env_id: str, agents: list) -> np.ndarray:
        """bool [A]: which slots are in ``agents`` (PettingZoo's ``env.agents``); refuses an agent outside
        ``possible_agents`` (agents that join mid-episode are not supported)."""
        present = set(agents)
        unknown = present.difference(self.agents)
        if unknown:
            raise ConfigError(
                f"env.id={env_id}: agents {sorted(map(str, unknown))} are not in possible_agents; machina gives each "
                "possible agent a fixed slot"
            )
        return np.fromiter((name in present for name in self.agents), dtype=bool, count=len(self.agents))


def layout(env_id: str, env: Any, pad_observations: bool) -> Layout:
    """The ``Layout`` of the parallel env ``env``: every agent a flat ``Box`` observation and one shared ``Discrete``
    action space, observations of one width unless ``pad_observations``. ConfigError, one line naming the agents,
    for anything else."""
    from gymnasium import spaces

    agents = tuple(getattr(env, "possible_agents", None) or ())
    if not agents:
        raise ConfigError(f"env.id={env_id} declares no possible_agents; a PettingZoo env lists its agents there")
    obs_spaces = {name: env.observation_space(name) for name in agents}
    action_spaces = {name: env.action_space(name) for name in agents}
    for name, space in obs_spaces.items():
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ConfigError(
                f"env.id={env_id}: agent {name}'s observation space {space} is not supported: machina takes a flat "
                "Box observation (a vector of shape (D,))"
            )
    for name, space in action_spaces.items():
        if not isinstance(space, spaces.Discrete):
            raise ConfigError(
                f"env.id={env_id}: agent {name}'s action space {space} is not supported: machina takes a Discrete "
                "action space"
            )
    differ(env_id, "action spaces", action_spaces, "", key=lambda s: (int(s.n), int(s.start)))
    sizes = {name: int(space.shape[0]) for name, space in obs_spaces.items()}
    if not pad_observations:
        differ(env_id, "observation widths", sizes, " (or pad them: env.pad_observations=true)", key=lambda s: s)
    first = action_spaces[agents[0]]
    return Layout(agents, max(sizes.values()), int(first.n), int(first.start))


def differ(env_id: str, what: str, per_agent: dict[str, Any], hint: str, key: Any) -> None:
    """Refuse, naming the agents of each kind, when the agents' ``what`` are not all equal (``key`` compares them)."""
    groups: dict[Any, list[str]] = {}
    for name, value in per_agent.items():
        groups.setdefault(key(value), []).append(name)
    if len(groups) > 1:
        kinds = "; ".join(f"{value} for {', '.join(names)}" for value, names in groups.items())
        raise ConfigError(
            f"env.id={env_id}: the agents' {what} differ ({kinds}); machina shares one policy across the agents, "
            f"so they must agree{hint}"
        )
