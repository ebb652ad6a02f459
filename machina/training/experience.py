"""The experience buffer: one preallocated TensorDict ``[segments, bptt_horizon]`` written row-aligned.

Every agent steps at once (the env is batched), so all agents share one write position. A rollout is made of
``passes = segments / num_agents`` passes; pass ``p`` writes rows ``[p * N, (p + 1) * N)``, agent ``i`` owning row
``p * N + i`` and filling it in time order. Row bookkeeping therefore lives on the host as two Python ints and every
write is a slice assignment: no index tensors, no device reads.

The recurrent state at each row's first step is kept in ``row_state`` ``[segments]``, so training starts each BPTT
segment from the state the rollout had there.
"""

import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


class Experience:
    """Row-aligned storage of rollout steps and sequential or prioritized minibatches of whole segments.

    Args:
        spec: per-step keys to store, ``{key: (shape, dtype)}``; the union of the policy's and the losses' specs.
        state_spec: recurrent state keys stored at each row start, ``{key: (shape, dtype)}``.
        num_agents: agents stepped per env step (N).
        batch_size: agent steps per epoch; a multiple of ``num_agents * bptt_horizon``.
        bptt_horizon: steps per segment (T).
        minibatch_size: agent steps per minibatch; a multiple of ``bptt_horizon`` that divides ``batch_size``.
        sampling: "sequential" (contiguous segment slices, zero-copy) or "prioritized" (by summed |advantage|).
        prio_alpha: priority exponent; 0 gives uniform sampling.
        prio_beta0: initial importance-weight exponent, annealed to 1 over training.
        device: where the buffer lives.
    """

    def __init__(
        self,
        spec: Spec,
        state_spec: Spec,
        num_agents: int,
        batch_size: int,
        bptt_horizon: int,
        minibatch_size: int,
        sampling: str = "sequential",
        prio_alpha: float = 0.6,
        prio_beta0: float = 0.4,
        device: torch.device | str = "cpu",
    ):
        self.segments, self.minibatch_segments = check_sizes(num_agents, batch_size, bptt_horizon, minibatch_size)
        if sampling not in ("sequential", "prioritized"):
            raise ConfigError(f"experience.sampling must be 'sequential' or 'prioritized', got {sampling!r}")
        self.num_agents, self.bptt_horizon, self.batch_size = num_agents, bptt_horizon, batch_size
        self.num_minibatches = self.segments // self.minibatch_segments
        self.sampling, self.prio_alpha, self.prio_beta0 = sampling, prio_alpha, prio_beta0
        self.device = torch.device(device)

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
        seg = self.minibatch_segments
        self.slices = [slice(i * seg, (i + 1) * seg) for i in range(self.num_minibatches)]
        self.step_keys = tuple(spec)
        self.state_keys = tuple(state_spec)
        self._pass = 0
        self._t = 0

    @property
    def full(self) -> bool:
        return self._pass * self.num_agents >= self.segments

    def reset_for_rollout(self) -> None:
        self._pass = 0
        self._t = 0
        self.buffer[keys.RATIO].fill_(1.0)

    def store(self, step: TensorDict, state: TensorDict) -> None:
        """Write one env step for all agents.

        Args:
            step: batch [N] holding every key of ``spec``.
            state: batch [N] recurrent state before this step; recorded when the step opens a row.
        """
        rows = slice(self._pass * self.num_agents, (self._pass + 1) * self.num_agents)
        if self._t == 0:
            for key in self.state_keys:
                self.row_state[key][rows] = state[key]
        for key in self.step_keys:
            self.buffer[key][rows, self._t] = step[key]
        self._t += 1
        if self._t == self.bptt_horizon:
            self._t = 0
            self._pass += 1

    def segment_probs(self, advantages: torch.Tensor) -> torch.Tensor:
        """Sampling probability of each segment, proportional to (sum_t |A|) ** alpha: float32 [segments].

        Computed once per update epoch (the advantages change only between epochs), then sampled per minibatch.
        """
        priority = advantages.abs().sum(dim=1).nan_to_num_(0.0).pow(self.prio_alpha) + 1e-6
        return priority / priority.sum()

    def sample_prioritized(self, probs: torch.Tensor, progress: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw one minibatch of segments from ``segment_probs``.

        Args:
            probs: float32 [segments], from ``segment_probs``.
            progress: fraction of training done, anneals beta from ``prio_beta0`` to 1.

        Returns:
            (idx int64 [minibatch_segments], weights float32 [minibatch_segments, 1]) with importance weights
            normalised so their maximum over the buffer is 1.
        """
        idx = torch.multinomial(probs, self.minibatch_segments, replacement=False)
        beta = self.prio_beta0 + (1.0 - self.prio_beta0) * min(max(progress, 0.0), 1.0)
        weights = (self.segments * probs[idx]).pow(-beta)
        weights = weights / (self.segments * probs.min()).pow(-beta)
        return idx, weights.unsqueeze(1)


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
    if bptt_horizon < 2:
        raise ConfigError(f"experience.bptt_horizon={bptt_horizon} must be at least 2 (one step bootstraps the rest)")
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
