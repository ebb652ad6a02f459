"""The agents and spaces of a PettingZoo parallel env, checked once at start-up, and how one agent's observation is
written into its row: what ``PettingZooEnv`` needs to lay out E copies of A agents as N = E x A rows."""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from machina.env.spec import ImageObsSpec, VectorObsSpec
from machina.errors import ConfigError

MAX_CHANNELS = 4  # a Box (H, W, C) with 1 to 4 channels is an image (gray, RGB, RGBA, or a few feature planes)


@dataclass(frozen=True)
class Layout:
    """``agents``: ``possible_agents`` in order (slot i is agents[i]); ``obs``: what each row holds (its ``size``, the
    widest observation, with padding; an ``ImageObsSpec`` where the agents see one image shape); ``one_hot``: per
    slot, the ``start`` of its ``Discrete`` observation space (written one-hot) or None (a Box, flattened);
    ``num_actions`` and ``action_start``: the shared ``Discrete`` action space."""

    agents: tuple[str, ...]
    obs: VectorObsSpec
    one_hot: tuple[int | None, ...]
    num_actions: int
    action_start: int

    def write(self, slot: int, row: np.ndarray, observation: Any) -> None:
        """Slot ``slot``'s observation into its float32 row [obs.size]: a Box flattened row-major, a Discrete value
        one-hot; zero-padded when narrower."""
        start = self.one_hot[slot]
        if start is not None:
            row[:] = 0
            row[int(observation) - start] = 1
            return
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
    """The ``Layout`` of the parallel env ``env``: every agent a ``Box`` observation (flattened; an image where it is
    (H, W, C) with 1 to 4 channels) or a ``Discrete`` one (one-hot), of one shape unless ``pad_observations``, and one
    shared ``Discrete`` action space. ConfigError, one line naming the agents, for anything else."""
    from gymnasium import spaces

    agents = tuple(getattr(env, "possible_agents", None) or ())
    if not agents:
        raise ConfigError(f"env.id={env_id} declares no possible_agents; a PettingZoo env lists its agents there")
    obs_spaces = {name: env.observation_space(name) for name in agents}
    action_spaces = {name: env.action_space(name) for name in agents}
    for name, space in obs_spaces.items():
        if not isinstance(space, spaces.Box | spaces.Discrete):
            raise ConfigError(
                f"env.id={env_id}: agent {name}'s observation space {str(space):.200} is not supported: machina takes "
                "a Box observation (flattened; an (H, W, C) image with 1-4 channels for policy=conv) or a Discrete one "
                "(one-hot); Dict observations (such as action masks) are not"
            )
    for name, space in action_spaces.items():
        if not isinstance(space, spaces.Discrete):
            raise ConfigError(
                f"env.id={env_id}: agent {name}'s action space {space} is not supported: machina takes a Discrete "
                "action space"
            )
    differ(env_id, "action spaces", action_spaces, "", key=lambda s: (int(s.n), int(s.start)))
    described = {name: describe(space) for name, space in obs_spaces.items()}
    if not pad_observations:
        hint = " (or pad them: env.pad_observations=true)"
        differ(env_id, "observation shapes", described, hint, key=lambda d: d[0])
    one_hot = tuple(int(s.start) if isinstance(s, spaces.Discrete) else None for s in obs_spaces.values())
    shapes = {shape for shape, _ in described.values()}
    size = max(row for _, row in described.values())
    if len(shapes) == 1 and is_image(first := shapes.pop()):
        obs: VectorObsSpec = ImageObsSpec(size, *first)
    else:
        obs = VectorObsSpec(size)
    first_action = action_spaces[agents[0]]
    return Layout(agents, obs, one_hot, int(first_action.n), int(first_action.start))


def describe(space: Any) -> tuple[Any, int]:
    """(how an agent's observation space is compared with the others', its row width): a Box's width (rank 1) or
    shape, flattened; a Discrete's name (``Discrete(4)``), written one-hot."""
    if not hasattr(space, "n"):  # a Box
        shape = tuple(int(n) for n in space.shape)
        return (shape[0] if len(shape) == 1 else shape), math.prod(shape)
    return f"Discrete({int(space.n)})", int(space.n)


def is_image(shape: Any) -> bool:
    """A Box of shape (H, W, C) with 1 to ``MAX_CHANNELS`` channels last (PettingZoo's images); any other Box is a
    vector, flattened."""
    return isinstance(shape, tuple) and len(shape) == 3 and 1 <= shape[2] <= MAX_CHANNELS


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
