"""The experience buffer: one preallocated TensorDict ``[segments, bptt_horizon]`` written row-aligned, and the verbs
the rollout and the learner use on it (neither reads its tensors directly).

Every agent steps at once (the env is batched), so all agents share one write position. A rollout is made of
``passes = segments / num_agents`` passes; pass ``p`` writes rows ``[p * N, (p + 1) * N)``, agent ``i`` owning row
``p * N + i`` and filling it in time order. Row bookkeeping therefore lives on the host as two Python ints and every
write is a slice assignment: no index tensors, no device reads.

The recurrent state at each row's first step is kept in ``row_state`` ``[segments]``, so training starts each BPTT
segment from the state the rollout had there. Rows ``i, N + i, 2N + i, ...`` are agent i's consecutive segments:
``trajectories`` joins them into one rollout per agent for the advantage maths (``machina.training.advantage``).

The training view (``prepare_training``, once per epoch) is what minibatches are cut from: the buffer itself, or with
``compact_tokens`` the buffer with token observations cut to the epoch's widest real observation.
"""

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.env.spec import PAD_TOKEN, EnvSpec
from machina.errors import ConfigError
from machina.files.saved_state import within
from machina.keys import Spec


def trajectory_spec(env_spec: EnvSpec) -> Spec:
    """What every rollout step stores for advantages and PPO-style losses, whatever the losses: the action's
    log-probability and value, its reward and how the episode ended after it (and V(final observation) for envs
    whose observation carries no time, and which agents acted for envs that declare ``ACTIVE``)."""
    scalar, flag = ((), torch.float32), ((), torch.bool)
    spec = {keys.ACT_LOG_PROB: scalar, keys.VALUES: scalar, keys.REWARDS: scalar}
    spec |= {keys.TERMINATED: flag, keys.TRUNCATED: flag}
    if not env_spec.observes_time:
        spec[keys.FINAL_VALUES] = scalar
    if keys.ACTIVE in env_spec.outputs:
        spec[keys.ACTIVE] = flag
    return spec


class Minibatch(NamedTuple):
    """One minibatch of B segments, views or gathers of the training view (nothing here is the buffer's memory).

    rows: the buffer rows it holds (a slice, or int64 [B]).
    stored: the stored steps [B, T] (the policy's training input).
    data: ``stored`` plus ``ADVANTAGES`` float32 [B, T] and ``PRIO_WEIGHTS`` float32 [B, T] (the sampler's importance
        weights, ones when it has none): what the losses read; a shallow copy, so losses may add keys.
    state: the recurrent state at each row's first step [B].
    """

    rows: torch.Tensor | slice
    stored: TensorDict
    data: TensorDict
    state: TensorDict


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
        compact_tokens: train on token observations (``OBS`` uint8 [M, 3]) cut to the epoch's widest real
            observation (``prepare_training``); ignored for other observations.
        device: where the buffer lives.

    ``last_values`` float32 [N] holds V of the observation each agent's rollout ends on (``store_last_values``):
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
        compact_tokens: bool = True,
        device: torch.device | str = "cpu",
    ):
        self.segments, self.minibatch_segments = check_sizes(num_agents, batch_size, bptt_horizon, minibatch_size)
        check_fits({**spec, keys.RATIO: ((), torch.float32)}, state_spec, self.segments, bptt_horizon, device)
        self.num_agents, self.bptt_horizon, self.batch_size = num_agents, bptt_horizon, batch_size
        self.num_minibatches = self.segments // self.minibatch_segments
        self.device = torch.device(device)
        with within("sampler."):  # the sampler names its settings relative to its node, experience.sampler
            self.sampler = sampler(
                segments=self.segments, minibatch_segments=self.minibatch_segments, device=self.device
            )

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

        # The training side, built once: the ratio column minibatches write back into, the uniform weights, the
        # contiguous row blocks of minibatch size, and what token compaction needs.
        self._ratio = self.buffer[keys.RATIO]
        self._uniform = torch.ones(self.minibatch_segments, bptt_horizon, device=self.device)
        self.blocks = tuple(
            slice(first, first + self.minibatch_segments) for first in range(0, self.segments, self.minibatch_segments)
        )
        obs_shape, obs_dtype = spec.get(keys.OBS, ((), None))
        self.compact_tokens = bool(compact_tokens) and obs_dtype == torch.uint8 and len(obs_shape) == 2
        # The dimensions of stored keys whose size changes between epochs (a compiled consumer marks them dynamic).
        self.varying_dims = {keys.OBS: 2} if self.compact_tokens else {}
        self._slot_number = torch.arange(1, obs_shape[0] + 1, device=self.device) if self.compact_tokens else None
        self._token_width: torch.Tensor | None = None
        self._training = self.buffer
        # Envs whose agents finish at different times store ACTIVE: its False rows are not transitions, so the
        # statistics leave them out and the sampler is told (Prioritized never draws a segment of them).
        self._active = self.buffer[keys.ACTIVE] if keys.ACTIVE in spec else None

    @property
    def full(self) -> bool:
        return self._step == len(self._columns)

    def reset_for_rollout(self) -> None:
        self._step = 0
        self._ratio.fill_(1.0)

    def store(self, step: Mapping[str, torch.Tensor], state: TensorDict, agents: slice | None = None) -> None:
        """Write one env step for all agents, or for the contiguous slice ``agents`` of them (an overlapped rollout
        stores each group of agents as its step arrives; the step is complete once the slice reaching N is stored).

        Args:
            step: every key of ``spec``, [n, ...] for the n agents written (a TensorDict or a dict of tensors).
            state: batch [n] recurrent state before this step; recorded when the step opens a row.
            agents: the agents written, None for all N; slices of one step must be stored in agent order.
        """
        p, t = divmod(self._step, self.bptt_horizon)
        whole = agents is None
        if t == 0:
            for key, rows in self._state_rows[p]:
                (rows if whole else rows[agents]).copy_(state[key])
        for key, column in self._columns[self._step]:
            (column if whole else column[agents]).copy_(step[key])
        if whole or agents.stop >= self.num_agents:
            self._step += 1

    def store_last_values(self, values: torch.Tensor) -> None:
        """Record float32 [N]: V of the observation each agent's rollout ends on (its last step's bootstrap)."""
        self.last_values.copy_(values)

    def stores(self, key: str) -> bool:
        return key in self.buffer.keys()

    def rows(self, key: str) -> torch.Tensor:
        """The stored ``key`` in the buffer's row layout [S, T, ...] (the buffer's memory: read, do not write)."""
        return self.buffer[key]

    def trajectories(self, key: str) -> torch.Tensor:
        """The stored ``key`` [S, T] as each agent's whole rollout in time order, [N, L] with L = S / N * T (a copy)."""
        return agent_major(self.buffer[key], self.num_agents)

    def to_rows(self, trajectories: torch.Tensor) -> torch.Tensor:
        """The inverse of ``trajectories``: [N, L] back to the buffer's row layout [S, T]."""
        return segment_major(trajectories, self.segments)

    def write_trajectories(self, key: str, trajectories: torch.Tensor) -> None:
        """Overwrite the stored ``key`` with ``trajectories`` [N, L] in ``trajectories``' layout (each agent's whole
        rollout in time order), e.g. rewards rewritten before the advantages are computed."""
        self.buffer[key].copy_(self.to_rows(trajectories))

    def prepare_training(self) -> None:
        """Build the epoch's training view, what minibatches are cut from: the buffer, or with ``compact_tokens`` the
        buffer with ``OBS`` uint8 [S, T, M, 3] as a view cut to [S, T, W, 3], W the last token slot that is real in
        any stored observation (every observation's later slots are padding). Its one host read is W."""
        if not self.compact_tokens:
            self._training = self.buffer
            return
        obs = self.buffer[keys.OBS]
        real_anywhere = (obs[..., 1] != PAD_TOKEN).flatten(0, -2).any(0)  # [M]
        self._token_width = (real_anywhere * self._slot_number).max().clamp(min=1)
        width = int(self._token_width)  # the epoch's one host read
        view = self.buffer.exclude(keys.OBS)
        view[keys.OBS] = obs[..., :width, :]
        self._training = view

    def prepare_minibatches(self, advantages: torch.Tensor, fraction: float) -> None:
        """Start an update pass: the sampler sees the pass's advantages [S, T], the fraction of training done and
        ``active``: bool [S, T], the rows whose agent acted, where the buffer stores ``ACTIVE`` (else None)."""
        self.sampler.prepare(advantages, fraction, self._active)

    def minibatch(self, i: int, advantages: torch.Tensor) -> Minibatch:
        """The pass's ``i``-th minibatch, as the sampler draws it, with its importance weights and ``advantages``'
        rows. No host read; gathers only where the sampler's rows are an index tensor."""
        rows, weights = self.sampler.minibatch(i)
        return self._minibatch(rows, self._uniform if weights is None else weights.expand_as(self._uniform), advantages)

    def first_minibatch(self, advantages: torch.Tensor) -> Minibatch:
        """The first ``minibatch_segments`` rows with uniform weights, whatever the sampler (checks, not training)."""
        return self._minibatch(self.blocks[0], self._uniform, advantages)

    def _minibatch(self, rows: torch.Tensor | slice, weights: torch.Tensor, advantages: torch.Tensor) -> Minibatch:
        stored = self._training[rows]
        data = stored.copy()  # shallow: losses may add keys without touching the buffer
        data[keys.ADVANTAGES] = advantages[rows]
        data[keys.PRIO_WEIGHTS] = weights
        return Minibatch(rows, stored, data, self.row_state[rows])

    def segments_at(self, rows: slice) -> tuple[TensorDict, TensorDict]:
        """(stored steps [B, T] of the training view, recurrent state [B] at their rows' starts) for ``rows``
        (one of ``blocks``): views, no copy. The view is ``prepare_training``'s: read after a new rollout but before
        it, its token observations are still cut to the last epoch's width."""
        return self._training[rows], self.row_state[rows]

    def record_ratios(self, rows: torch.Tensor | slice, stored: TensorDict, log_prob: torch.Tensor) -> None:
        """Write ``RATIO`` = pi(a|x) / mu(a|x) = exp(``log_prob`` - stored ``ACT_LOG_PROB``) into the buffer's own
        ``rows`` (not a copy): ``log_prob`` float32 [B, T] of the current policy, ``stored`` those rows' steps. A
        slice of rows is written in place without a temporary."""
        if isinstance(rows, slice):
            torch.sub(log_prob, stored[keys.ACT_LOG_PROB], out=self._ratio[rows]).exp_()
        else:
            self._ratio[rows] = (log_prob - stored[keys.ACT_LOG_PROB]).exp()

    def metrics(self) -> dict[str, torch.Tensor]:
        """The buffer's statistics as 0-d device tensors: ``experience/<key>_mean`` of the rewards, values and ratios
        (the ratios of the last update pass) over the rows whose agent acted (all rows unless ``ACTIVE`` is stored)
        and, with ``compact_tokens``, ``experience/token_width``."""
        out = {}
        active = self._active
        count = None if active is None else active.sum().clamp(min=1)
        for key in (keys.REWARDS, keys.VALUES, keys.RATIO):
            if self.stores(key):
                values = self.buffer[key].float()
                mean = values.mean() if active is None else values.where(active, 0.0).sum() / count
                out[f"experience/{key}_mean"] = mean
        if self._token_width is not None:
            out["experience/token_width"] = self._token_width.float()
        return out


def agent_major(x: torch.Tensor, num_agents: int) -> torch.Tensor:
    """Buffer rows [S, T, ...] -> [N, L, ...] with L = S / N * T: row ``p * N + i`` is agent i's p-th segment, so
    agent i's rollout is its segments in pass order."""
    segments, horizon, *rest = x.shape
    passes = segments // num_agents
    return x.view(passes, num_agents, horizon, *rest).transpose(0, 1).reshape(num_agents, passes * horizon, *rest)


def segment_major(x: torch.Tensor, segments: int) -> torch.Tensor:
    """The inverse of ``agent_major`` for [N, L]: back to buffer rows [S, T]."""
    num_agents, length = x.shape
    passes = segments // num_agents
    return x.view(num_agents, passes, length // passes).transpose(0, 1).reshape(segments, length // passes)


def check_fits(spec: Spec, state_spec: Spec, segments: int, bptt_horizon: int, device: torch.device | str) -> None:
    """Refuse a buffer larger than the memory free on ``device`` before allocating it: an allocation the operating
    system grants lazily would otherwise end in the out-of-memory killer, not in a message."""
    step = sum(math.prod(shape) * dtype.itemsize for shape, dtype in spec.values())
    row = sum(math.prod(shape) * dtype.itemsize for shape, dtype in state_spec.values())
    needed = segments * (bptt_horizon * step + row)
    free = free_memory(torch.device(device))
    if free is not None and needed > free:
        raise ConfigError(
            f"batch_size={segments * bptt_horizon:,}: the buffer needs {needed / 2**30:.1f} GiB ({step} bytes per "
            f"agent step) and {free / 2**30:.1f} GiB are free on {device}; lower it"
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
    """Validate the batch arithmetic; return (segments, minibatch_segments). Errors name the setting to change,
    relative to the experience's node (``batch_size``; machina.startup.build puts ``experience.`` in front)."""
    for name, value in (
        ("batch_size", batch_size),
        ("bptt_horizon", bptt_horizon),
        ("minibatch_size", minibatch_size),
        ("num_agents", num_agents),
    ):
        checks.integer(name, value, 1)
    per_pass = num_agents * bptt_horizon
    if batch_size % per_pass:
        lower = max(per_pass, batch_size // per_pass * per_pass)
        raise ConfigError(
            f"batch_size={batch_size} must be a multiple of agents x bptt_horizon = {num_agents} x {bptt_horizon} = "
            f"{per_pass} (every agent fills whole rows); try batch_size={lower} or {lower + per_pass}, or change "
            "env.num_envs or bptt_horizon"
        )
    if minibatch_size % bptt_horizon:
        raise ConfigError(
            f"minibatch_size={minibatch_size} must be a multiple of bptt_horizon={bptt_horizon} (minibatches hold "
            "whole segments)"
        )
    if minibatch_size > batch_size or batch_size % minibatch_size:
        raise ConfigError(
            f"minibatch_size={minibatch_size} must divide batch_size={batch_size} "
            f"({batch_size / minibatch_size:.3g} minibatches per epoch is not a whole number >= 1)"
        )
    return batch_size // bptt_horizon, minibatch_size // bptt_horizon
