"""What an environment tells the rest of machina about itself: plain data, no tensors on a device."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ObsSpec:
    """Token observations: ``uint8[max_tokens, 3]`` per agent.

    Each token is (packed location ``dy << 4 | dx`` in an egocentric ``window x window`` view, feature id, value);
    unused slots are padding tokens whose three bytes are ``PAD_TOKEN``. ``feature_names[i]`` names feature id i
    and ``feature_norms[i]`` is the value that maps it to about [0, 1]; policies size their embeddings from these.
    """

    max_tokens: int
    window: int
    feature_names: tuple[str, ...]
    feature_norms: tuple[float, ...]

    @property
    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass(frozen=True)
class EnvSpec:
    """Shapes every env exposes: agents, observations, actions, and whether it provides teacher actions."""

    num_envs: int
    agents_per_env: int
    num_actions: int
    obs: ObsSpec
    action_names: tuple[str, ...]
    provides_teacher: bool

    @property
    def num_agents(self) -> int:
        return self.num_envs * self.agents_per_env


PAD_TOKEN = 0xFF
