"""What an environment tells the rest of machina about itself: plain data, no tensors on a device.

Three kinds of observations exist: token observations (``ObsSpec``: the built-in env and MettaGrid), flat vectors
(``VectorObsSpec``: Gymnasium ``Box`` spaces) and images stored as flat vectors (``ImageObsSpec``, a
``VectorObsSpec`` that also gives the image's shape: PettingZoo's ``(H, W, C)`` observations). Policies size their
encoders from the spec, and policy files store it as plain data (``obs_spec_to_dict`` / ``obs_spec_from_dict``), so a
file from elsewhere never names a class.
"""

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class ObsSpec:
    """Token observations: ``uint8[max_tokens, 3]`` per agent.

    Each token is (packed location ``dy << 4 | dx`` in an egocentric ``window x window`` view, feature id, value);
    unused slots are padding tokens whose three bytes are ``PAD_TOKEN``. ``feature_names[i]`` names feature id i
    and ``feature_norms[i]`` is the value that maps it to about [0, 1]; policies size their embeddings from these.
    """

    kind: ClassVar[str] = "tokens"

    max_tokens: int
    window: int
    feature_names: tuple[str, ...]
    feature_norms: tuple[float, ...]

    @property
    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass(frozen=True)
class VectorObsSpec:
    """Flat float32 vector observations of ``size`` features per agent (a Gymnasium ``Box`` of rank 1)."""

    kind: ClassVar[str] = "vector"

    size: int


@dataclass(frozen=True)
class ImageObsSpec(VectorObsSpec):
    """An image of ``height x width x channels`` (channels last) per agent, stored as its row-major flattening: OBS is
    float32 [N, size], size = height * width * channels, as for any vector (so every vector policy reads it too);
    ``policy=conv`` views it as [N, height, width, channels]."""

    kind: ClassVar[str] = "image"

    height: int
    width: int
    channels: int

    def __post_init__(self) -> None:
        sizes = (self.size, self.height, self.width, self.channels)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
            raise ValueError(f"an image obs_spec's sizes must be integers >= 1, got {self}")
        if self.size != self.height * self.width * self.channels:
            raise ValueError(
                f"an image obs_spec's size must be height x width x channels = "
                f"{self.height} x {self.width} x {self.channels}, got {self.size}"
            )


OBS_SPECS = {spec.kind: spec for spec in (ObsSpec, VectorObsSpec, ImageObsSpec)}


def obs_spec_to_dict(spec: ObsSpec | VectorObsSpec) -> dict[str, Any]:
    """Plain data: ``{"kind": ..., <fields>}`` (tuples become lists)."""
    return {"kind": spec.kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}}


def obs_spec_from_dict(data: dict[str, Any]) -> ObsSpec | VectorObsSpec:
    """The inverse of ``obs_spec_to_dict``; ``ValueError`` naming the entry for anything but the known fields with
    plain values (the dict may come from a file of unknown origin)."""
    if not isinstance(data, dict) or data.get("kind") not in OBS_SPECS:
        raise ValueError(f"obs_spec must be a dict with kind in {sorted(OBS_SPECS)}, got {data!r:.200}")
    cls = OBS_SPECS[data["kind"]]
    given = {k: v for k, v in data.items() if k != "kind"}
    expected = {f.name for f in fields(cls)}
    if set(given) != expected:
        raise ValueError(
            f"obs_spec of kind {data['kind']!r} must have the fields {sorted(expected)}, got {sorted(given)}"
        )
    for name, value in given.items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int | float | str) and not isinstance(v, bool) for v in items):
            raise ValueError(f"obs_spec.{name} must hold numbers or strings, got {value!r:.200}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


@dataclass(frozen=True)
class EnvSpec:
    """Shapes every env exposes: agents, observations, actions, and the optional outputs it can produce.

    ``outputs``: keys (``machina.keys``, e.g. ``TEACHER_ACTIONS``) that an env built with them in its ``outputs``
    argument returns with every step, besides what every env returns (``Env``). A loss asks for them with
    ``Loss.env_outputs``; the builder refuses a request for a key the env does not declare here, and asks for
    nothing else.
    ``observes_time``: the observation carries the episode's progress, so an episode cut at a time limit is a
    terminal state of the observed process and needs no bootstrap. When False, the env returns ``FINAL_OBS`` on
    steps where an episode was truncated, and the trainer bootstraps the truncated step from its value.
    """

    num_envs: int
    agents_per_env: int
    num_actions: int
    obs: ObsSpec | VectorObsSpec
    outputs: frozenset[str]
    observes_time: bool

    @property
    def num_agents(self) -> int:
        return self.num_envs * self.agents_per_env


PAD_TOKEN = 0xFF
