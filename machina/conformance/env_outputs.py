"""What one call of an env returns, checked against its spec and the env contract (``machina.env.base``): a step
(``reset``, ``step``, ``observe``) and episode statistics. The parts of ``machina.conformance.env.check_env`` that
look at one result; each failure is a ``ConformanceError`` of one sentence."""

from collections.abc import Callable
from typing import NoReturn

import torch
from tensordict import TensorDict

from machina import keys
from machina.conformance.failure import ConformanceError
from machina.env.base import Env
from machina.env.spec import EnvSpec, ObsSpec

OUTCOMES = {keys.REWARDS: torch.float32, keys.TERMINATED: torch.bool, keys.TRUNCATED: torch.bool}
BASE_STATS = ("episodes", "return", "length")


def fail(message: str) -> NoReturn:
    raise ConformanceError(message)


def obs_layout(spec: EnvSpec) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of ``OBS`` that ``spec`` describes."""
    n = spec.num_agents
    if isinstance(spec.obs, ObsSpec):
        return (n, spec.obs.max_tokens, 3), torch.uint8
    return (n, spec.obs.size), torch.float32


def check_step(td: object, where: str, env: Env, outputs: frozenset[str], first_step: bool = False) -> TensorDict:
    """What ``reset`` (``first_step``: zero rewards, no ends) or ``step`` returned, against the spec."""
    spec, n = env.spec, env.spec.num_agents
    if not isinstance(td, TensorDict) or td.batch_size != torch.Size([n]):
        fail(
            f"{where} returned {type(td).__name__} {getattr(td, 'batch_size', '')}: return a TensorDict of batch [{n}]."
        )
    required = {keys.OBS, *OUTCOMES, *outputs}
    missing = sorted(required - set(td.keys()))
    if missing:
        fail(f"{where} returns no {', '.join(missing)}: return every key the env contract and outputs ask for.")
    extra = sorted(set(td.keys()) - required - {keys.FINAL_OBS})
    if extra:
        fail(f"{where} returns {', '.join(extra)} unasked: return an optional output only when outputs names it.")
    obs_shape, obs_dtype = obs_layout(spec)
    expected = {keys.OBS: (obs_shape, obs_dtype), keys.FINAL_OBS: (obs_shape, obs_dtype)}
    expected.update({key: ((n,), dtype) for key, dtype in OUTCOMES.items()})
    for key, value in td.items():
        shape, dtype = expected.get(key, ((n, *value.shape[1:]), value.dtype))
        if tuple(value.shape) != shape or value.dtype != dtype:
            fail(
                f"{where} returns {key} as {value.dtype} {tuple(value.shape)}: return {dtype} {shape}, as the spec "
                "and the env contract say."
            )
        if value.device.type != env.device.type:
            fail(f"{where} returns {key} on {value.device}: return every tensor on the env's device ({env.device}).")
    truncated = bool(td[keys.TRUNCATED].any())
    if first_step and (bool(td[keys.REWARDS].any()) or truncated or bool(td[keys.TERMINATED].any())):
        fail(f"{where} returns rewards or episode ends: a first observation comes with zero rewards and no ends.")
    has_final = keys.FINAL_OBS in td.keys()
    if spec.observes_time and has_final:
        fail(f"{where} returns {keys.FINAL_OBS} although spec.observes_time is True: return it only when False.")
    if not spec.observes_time and has_final != truncated:
        given, step = ("a", "without") if has_final else ("no", "with")
        fail(
            f"{where} returns {given} {keys.FINAL_OBS} on a step {step} a truncation: with spec.observes_time "
            "False, return it on exactly the steps where an agent is truncated."
        )
    return td


def action_source(spec: EnvSpec, device: torch.device, seed: int) -> Callable[[], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return lambda: torch.randint(0, spec.num_actions, (spec.num_agents,), generator=generator).to(device)


def check_stats(stats: object, where: str, env: Env, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    if not isinstance(stats, dict) or not set(BASE_STATS) <= set(stats):
        fail(
            f"{where} returned {sorted(stats) if isinstance(stats, dict) else stats!r}: return a dict with at "
            f"least {', '.join(BASE_STATS)}."
        )
    for key, value in stats.items():
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or tuple(value.shape) != shape:
            fail(f"{where}['{key}'] is not a float32 tensor of shape {shape}: return float32 {shape} tensors.")
        if value.device.type != env.device.type:
            fail(f"{where}['{key}'] is on {value.device}: keep episode statistics on the env's device ({env.device}).")
    return stats
