"""The experience buffer: one preallocated TensorDict ``[segments, bptt_horizon]`` written row-aligned.

Every agent steps at once (the env is batched), so all agents share one write position. A rollout is made of
``passes = segments / num_agents`` passes; pass ``p`` writes rows ``[p * N, (p + 1) * N)``, agent ``i`` owning row
``p * N + i`` and filling it in time order. Row bookkeeping therefore lives on the host as two Python ints and every
write is a slice assignment: no index tensors, no device reads.

The recurrent state at each row's first step is kept in ``row_state`` ``[segments]``, so training starts each BPTT
segment from the state the rollout had there. Rows ``i, N + i, 2N + i, ...`` are agent i's consecutive segments: the
advantages run over them as one trajectory (``machina.training.advantage``).
"""

import math
from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.keys import Spec


def trajectory_spec(env_spec: EnvSpec) -> Spec:
    """What every rollout step stores for advantages and PPO-style losses, whatever the losses: the action's
    log-probability and value, its reward and how the episode ended after it (and V(final observation) for envs
    whose observation carries no time)."""
    scalar, flag = ((), torch.float32), ((), torch.bool)
    spec = {keys.ACT_LOG_PROB: scalar, keys.VALUES: scalar, keys.REWARDS: scalar}
    spec |= {keys.TERMINATED: flag, keys.TRUNCATED: flag}
    if not env_spec.observes_time:
        spec[keys.FINAL_VALUES] = scalar
    return spec


class Experience:
    """Row-aligned storage of rollout steps, and the sampler that picks the segments of each minibatch.

    Args:
        spec: per-step keys to store, ``{key: (shape, dtype)}``: the union of the policy's, the trajectory's and the
            losses' specs.
        state_spec: recurrent state keys stored at each row start, ``{key: (shape, dtype)}``.
        num_agents: agents stepped per env step (N).
        batch_size: agent steps per epoch; a multiple of ``num_agents * bptt_horizon``.
        bptt_horizon: steps per segment (T).
        minibatch_size: agent steps per minibatch; a multiple of ``bptt_horizon`` that divides ``batch_size``.
        sampler: a factory (``_partial_``) of a sampler (``machina.training.samplers``), called with the buffer's
            ``segments``, ``minibatch_segments`` and ``device``.
        device: where the buffer lives.

    ``last_values`` float32 [N] holds V of the observation each agent's rollout ends on (written by the rollout):
    the bootstrap of every agent's last stored step.
    """

    def __init__(
        self,
        spec: Spec,
        state_spec: Spec,
        num_agents: int,
        batch_size: int,
        bptt_horizon: int,
        minibatch_size: int,
        sampler: Callable[..., object],
        device: torch.device | str = "cpu",
    ):
        self.segments, self.minibatch_segments = check_sizes(num_agents, batch_size, bptt_horizon, minibatch_size)
        check_fits({**spec, keys.RATIO: ((), torch.float32)}, state_spec, self.segments, bptt_horizon, device)
        self.num_agents, self.bptt_horizon, self.batch_size = num_agents, bptt_horizon, batch_size
        self.num_minibatches = self.segments // self.minibatch_segments
        self.device = torch.device(device)
        self.sampler = sampler(segments=self.segments, minibatch_segments=self.minibatch_segments, device=self.device)

        shape = (self.segments, bptt_horizon)
        self.buffer = TensorDict(
            {key: torch.zeros(*shape, *s, dtype=d, device=self.device) for key, (s, d) in spec.items()},
            batch_size=shape,
        )
        self.buffer[keys.RATIO] = torch.ones(shape, device=self.device)
        self.row_state = TensorDict(
            {key: torch.zeros(self.segments, *s, dtype=d, device=self.device) for key, (s, d) in state_spec.items()},
            batch_size=(self.segments,),
        )
        self.last_values = torch.zeros(num_agents, device=self.device)
        self.step_keys = tuple(spec)
        self.state_keys = tuple(state_spec)
        # Where each env step of a rollout goes, as views built once (the buffer is only ever written in place, so
        # they stay valid): per step, every stored key's [N, ...] time column; per pass, the recurrent state's
        # [N, ...] rows. A step is then one copy per key, with no indexing.
        self._columns: list[list[tuple[str, torch.Tensor]]] = []
        self._state_rows: list[list[tuple[str, torch.Tensor]]] = []
        for first in range(0, self.segments, num_agents):
            rows = slice(first, first + num_agents)
            self._state_rows.append([(key, self.row_state[key][rows]) for key in self.state_keys])
            row_views = [(key, self.buffer[key][rows]) for key in self.step_keys]
            self._columns.extend([(key, view.select(1, t)) for key, view in row_views] for t in range(bptt_horizon))
        self._step = 0

    @property
    def full(self) -> bool:
        return self._step == len(self._columns)

    def reset_for_rollout(self) -> None:
        self._step = 0
        self.buffer[keys.RATIO].fill_(1.0)

    def store(self, step: Mapping[str, torch.Tensor], state: TensorDict) -> None:
        """Write one env step for all agents.

        Args:
            step: every key of ``spec``, [N, ...] (a TensorDict or a dict of tensors).
            state: batch [N] recurrent state before this step; recorded when the step opens a row.
        """
        p, t = divmod(self._step, self.bptt_horizon)
        if t == 0:
            for key, rows in self._state_rows[p]:
                rows.copy_(state[key])
        for key, column in self._columns[self._step]:
            column.copy_(step[key])
        self._step += 1


def check_fits(spec: Spec, state_spec: Spec, segments: int, bptt_horizon: int, device: torch.device | str) -> None:
    """Refuse a buffer larger than the memory free on ``device`` before allocating it: an allocation the operating
    system grants lazily would otherwise end in the out-of-memory killer, not in a message."""
    step = sum(math.prod(shape) * dtype.itemsize for shape, dtype in spec.values())
    row = sum(math.prod(shape) * dtype.itemsize for shape, dtype in state_spec.values())
    needed = segments * (bptt_horizon * step + row)
    free = free_memory(torch.device(device))
    if free is not None and needed > free:
        raise ConfigError(
            f"experience.batch_size={segments * bptt_horizon:,}: the buffer needs {needed / 2**30:.1f} GiB "
            f"({step} bytes per agent step) and {free / 2**30:.1f} GiB are free on {device}; lower "
            "experience.batch_size"
        )


def free_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (a CPU's MemAvailable on Linux), or None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_sizes(num_agents: int, batch_size: int, bptt_horizon: int, minibatch_size: int) -> tuple[int, int]:
    """Validate the batch arithmetic; return (segments, minibatch_segments). Errors name the setting to change."""
    for name, value in (
        ("experience.batch_size", batch_size),
        ("experience.bptt_horizon", bptt_horizon),
        ("experience.minibatch_size", minibatch_size),
        ("env.num_envs * env.agents_per_env", num_agents),
    ):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    per_pass = num_agents * bptt_horizon
    if batch_size % per_pass:
        lower = max(per_pass, batch_size // per_pass * per_pass)
        raise ConfigError(
            f"experience.batch_size={batch_size} must be a multiple of agents x bptt_horizon = {num_agents} x "
            f"{bptt_horizon} = {per_pass} (every agent fills whole rows); try experience.batch_size={lower} "
            f"or {lower + per_pass}, or change env.num_envs or experience.bptt_horizon"
        )
    if minibatch_size % bptt_horizon:
        raise ConfigError(
            f"experience.minibatch_size={minibatch_size} must be a multiple of experience.bptt_horizon="
            f"{bptt_horizon} (minibatches hold whole segments)"
        )
    if minibatch_size > batch_size or batch_size % minibatch_size:
        raise ConfigError(
            f"experience.minibatch_size={minibatch_size} must divide experience.batch_size={batch_size} "
            f"({batch_size / minibatch_size:.3g} minibatches per epoch is not a whole number >= 1)"
        )
    return batch_size // bptt_horizon, minibatch_size // bptt_horizon
