"""PettingZooEnv: any PettingZoo parallel env (``env=pettingzoo env.id=mpe2.simple_spread_v3``; the ``pettingzoo``
extra) behind machina's env interface: E copies stepped in this process, A = ``len(possible_agents)`` agent slots
per copy, agent index = env * A + slot (slot i is ``possible_agents[i]``), one shared policy.

PettingZoo's parallel API (https://pettingzoo.farama.org/api/parallel/) and how each part maps onto machina's:

- ``step(actions)`` takes a dict over the agents of ``env.agents`` (the live ones) and returns observations,
  rewards, ``terminations`` and ``truncations`` dicts over them. A slot's REWARDS / TERMINATED / TRUNCATED are its
  agent's entries; an agent both terminated and truncated counts as terminated (nothing to bootstrap).
- Agents that finish before others leave ``env.agents`` while the others play on. From the step after its end until
  its copy's episode ends, a slot is inactive: ``ACTIVE`` False on its observation (zeros), its action is not sent,
  and each of its steps comes back with zero reward and TERMINATED (so no return flows across them and the recurrent
  state starts afresh with the next episode). Those rows are not transitions: every loss leaves out the rows whose
  stored ``ACTIVE`` is False (``machina.losses.functional.live_rows``), and the builder asks every env for
  ``ACTIVE`` (``keys.ACTIVE``).
- A copy's episode ends when ``env.agents`` is empty (or at ``max_steps``); it is then reset in place (OBS is the new
  first observation; a slot still playing without a flag is marked truncated). A truncated agent's last observation
  is its ``FINAL_OBS`` row (``spec.observes_time`` is False: PettingZoo observations do not carry the step count).
- Seeds go through ``reset``: copy e's k-th episode is reset with ``seed=(seed * E + e) * SEED_STRIDE + k``.
- Episode statistics per copy: ``return`` is the mean over its A agents of their returns (the env contract's
  per-agent return), ``team_return`` their sum, ``length`` the copy's steps.

Spaces (``machina.env.pettingzoo.spaces``): every agent must have an observation space of the same shape, a ``Box``
(any rank and dtype, cast to float32 and flattened row-major; an (H, W, C) Box with 1 to 4 channels is an image,
``ImageObsSpec``, which ``policy=conv`` reads) or a ``Discrete`` (one-hot), and the same ``Discrete`` action space;
otherwise the env is refused in one line naming the agents that differ, unless ``pad_observations`` is set
(observations of different shapes flattened and zero-padded to the widest; the action spaces must still agree).
"""

from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.env.base import Env, Renderable, Resumable
from machina.env.episode_tally import EpisodeTally, check_counters
from machina.env.pettingzoo.ids import INSTALL_HINT, constructor, parallel
from machina.env.pettingzoo.spaces import Layout, layout
from machina.env.spec import EnvSpec
from machina.env.time_limit import time_limit
from machina.errors import ConfigError

STAT_NAMES = ("episodes", "return", "length", "team_return")
SEED_STRIDE = 1_000_000  # copy e's seeds are (seed * E + e) * stride + episodes it ended before


class PettingZooEnv(Env, Resumable, Renderable):
    """E copies of the PettingZoo env ``id``; see the module docstring.

    Args:
        id: an env module (``mpe2.simple_spread_v3``: its ``parallel_env``, else its AEC ``env`` converted) or
            ``module:function`` returning a ``ParallelEnv`` or a parallelizable ``AECEnv``
            (``machina.env.pettingzoo.ids``).
        kwargs: keyword arguments of that function (``{"N": 3, "max_cycles": 25}``).
        pad_observations: zero-pad agents' observations of different widths to the widest.
        max_steps: a time limit of machina's own: after that many steps every agent still playing is truncated and
            the copy starts its next episode (None: the env's own limits only, e.g. MPE's ``max_cycles``).
        num_envs, seed, device, outputs, stagger: the env factory's arguments (``base.py``). ``outputs`` may ask for
            ``ACTIVE``, the one optional output; ``stagger`` changes nothing.

    Capabilities: ``Resumable`` without continuing episodes (the episode counters and stat sums are saved; a restored
    env starts new episodes with the seeds that follow them); ``Renderable`` where the env draws ``rgb_array``.
    """

    continues_episodes = False

    def __init__(
        self,
        id: str = "mpe2.simple_spread_v3",
        kwargs: dict[str, Any] | None = None,
        pad_observations: bool = False,
        max_steps: int | None = None,
        num_envs: int = 4,
        seed: int = 0,
        device: str | torch.device = "cpu",
        outputs: Collection[str] = frozenset(),
        stagger: bool = True,
    ):
        checks.integer("env.num_envs", num_envs, 1)
        if max_steps is not None:
            checks.integer("env.max_steps", max_steps, 1)
        self.max_steps = max_steps
        kwargs = dict(kwargs or {})
        fn = constructor(id)
        probe = self._made(id, fn, kwargs)
        self.layout: Layout = layout(id, probe, pad_observations)
        if "rgb_array" in probe.metadata.get("render_modes", ()) and "render_mode" not in kwargs:
            kwargs["render_mode"] = "rgb_array"  # frames for replays, drawn only when asked for
        probe.close()
        self.envs = [self._made(id, fn, kwargs) for _ in range(num_envs)]
        self.id, self.seed, self.device = id, seed, torch.device(device)
        self.names = self.layout.agents
        self.num_envs, self.slots = num_envs, len(self.names)
        self.num_agents = num_envs * self.slots
        self.report_active = keys.ACTIVE in outputs
        self.spec = EnvSpec(
            num_envs,
            agents_per_env=self.slots,
            num_actions=self.layout.num_actions,
            obs=self.layout.obs,
            outputs=frozenset({keys.ACTIVE}),
            observes_time=False,
        )
        n, size = self.num_agents, self.layout.obs.size
        # Host buffers, as numpy views of torch tensors (pinned on an accelerator: each step's copy is asynchronous).
        host = {
            keys.OBS: torch.zeros(n, size),
            keys.REWARDS: torch.zeros(n),
            keys.TERMINATED: torch.zeros(n, dtype=torch.bool),
            keys.TRUNCATED: torch.zeros(n, dtype=torch.bool),
            keys.ACTIVE: torch.zeros(n, dtype=torch.bool),
        }
        self.host = TensorDict(host if self.report_active else {k: v for k, v in host.items() if k != keys.ACTIVE}, [n])
        self.final_obs = torch.zeros(n, size)
        if self.pinned:
            self.host, self.final_obs = self.host.pin_memory(), self.final_obs.pin_memory()
        self.active = host[keys.ACTIVE].numpy() if not self.report_active else self.host[keys.ACTIVE].numpy()
        self.obs, self.rewards = self.host[keys.OBS].numpy(), self.host[keys.REWARDS].numpy()
        self.terminated, self.truncated = self.host[keys.TERMINATED].numpy(), self.host[keys.TRUNCATED].numpy()
        self.final = self.final_obs.numpy()
        self.acted = np.zeros(n, dtype=bool)  # the slots that acted in the step being taken
        self.returns = np.zeros((num_envs, self.slots))  # per copy and slot: reward summed over the live episode
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.episodes = np.zeros(num_envs, dtype=np.int64)  # episodes ended per copy since the first reset
        self.tally = EpisodeTally(STAT_NAMES, num_envs)
        self._start_all()

    # ----------------------------------------------------------------------------------------------- public API
    def reset(self) -> TensorDict:
        """New first episodes in every copy, seeded from ``seed``; clears episode stats. Returns ``observe()``."""
        self.episodes[:] = 0
        self._start_all()
        return self.observe()

    def observe(self) -> TensorDict:
        """The current observations (float32 [N, D]; ``ACTIVE`` bool [N] when asked for) with zero rewards and no
        episode ends, as ``reset`` returns them."""
        self.rewards[:] = 0
        self.terminated[:] = False
        self.truncated[:] = False
        return self._output()

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every copy by one step.

        actions: int64 (or int32) [N], ids in [0, num_actions); inactive slots' actions are not sent. Returns a
        TensorDict, batch [N], on ``device``: OBS float32 [N, D] (D = ``spec.obs.size``, flattened; zeros for
        inactive slots; the next episode's first observation where a copy's episode ended), REWARDS float32 [N],
        TERMINATED / TRUNCATED bool [N], ACTIVE bool [N] (when asked for: the slot acts on this OBS) and, on steps
        where some agent was truncated, FINAL_OBS float32 [N, D] (its last observation; other rows are their current
        observation).
        """
        if actions.shape != (self.num_agents,) or actions.dtype not in (torch.int64, torch.int32):
            got = f"{actions.dtype} {list(actions.shape)}"
            raise ValueError(f"actions must be int64 or int32 [{self.num_agents}] (num_envs x agents), got {got}")
        ids = actions.cpu().numpy()  # a host env: the one device read of a step
        if ((ids < 0) | (ids >= self.spec.num_actions)).any():
            raise ValueError(f"action ids must be in [0, {self.spec.num_actions})")
        ids = ids.reshape(self.num_envs, self.slots) + self.layout.action_start
        np.copyto(self.acted, self.active)
        self.rewards[:] = 0
        self.truncated[:] = False
        self.terminated[:] = ~self.active  # an inactive slot's step: a terminal row, masked out of the losses
        for e, env in enumerate(self.envs):  # a host env: PettingZoo steps one copy at a time, from dicts
            self._step_copy(e, env, ids[e])
        out = self._output()
        if self.truncated.any():
            rows = ~self.truncated
            self.final[rows] = self.obs[rows]
            out[keys.FINAL_OBS] = (
                self.final_obs.to(self.device, non_blocking=True) if self.pinned else self.final_obs.clone()
            )
        return out

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the episodes that ended since the last call, as 0-d float32 tensors on the device:
        ``episodes``, ``return`` (per-agent mean), ``length`` (steps), ``team_return`` (agents' sum). Resets them."""
        return self.tally.pop_sums(self.device)

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per copy, float32 [E]: ``episodes`` ended since ``reset`` and the stats of its latest one."""
        return self.tally.latest(self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Episode counters and stat sums (a PettingZoo env's state cannot be saved: a restored env starts new
        episodes, seeded with the seeds that follow the saved counters)."""
        return {
            "episodes": torch.from_numpy(self.episodes.copy()),
            "totals": torch.from_numpy(self.tally.totals.copy()),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings (new episodes), once checked."""
        episodes, totals = check_counters(state, "episodes", self.num_envs, len(self.tally.totals), SEED_STRIDE)
        self.episodes[:] = episodes.numpy()
        self._start_all()
        self.tally.totals[:] = totals.numpy()

    def render(self, env_index: int = 0, **options: object) -> np.ndarray:
        """Copy ``env_index``'s frame as uint8 RGB [H, W, 3], where the env renders ``rgb_array`` (machina_1's
        drawing options such as ``cell`` are ignored)."""
        env = self.envs[env_index]
        if getattr(env, "render_mode", None) != "rgb_array":
            raise NotImplementedError(
                f"{self.id} cannot render frames (no rgb_array render mode), so it has no replays"
            )
        return np.asarray(env.render(), dtype=np.uint8)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------------------------------------ internals
    @property
    def pinned(self) -> bool:
        return self.device.type != "cpu"

    @staticmethod
    def _made(env_id: str, fn: Any, kwargs: dict[str, Any]) -> Any:
        try:
            with time_limit(f"env.id={env_id}: its constructor"):
                return parallel(env_id, fn(**kwargs))
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
        except TypeError as err:  # the function does not take a keyword of env.kwargs
            raise ConfigError(f"env.id={env_id}: {' '.join(str(err).split())}; check env.kwargs") from None

    def _step_copy(self, e: int, env: Any, ids: np.ndarray) -> None:
        """Step copy ``e`` with its slots' action ids, writing its rows; reset it when its last agent is done."""
        rows = slice(e * self.slots, (e + 1) * self.slots)
        active = self.active[rows]
        acting = [(i, name) for i, name in enumerate(self.names) if active[i]]
        obs, rewards, terms, truncs, _ = env.step({name: ids[i] for i, name in acting})
        first = e * self.slots
        for i, name in acting:
            row = first + i
            self.rewards[row] = rewards.get(name, 0.0)
            self.terminated[row] = bool(terms.get(name, False))
            self.truncated[row] = bool(truncs.get(name, False)) and not self.terminated[row]
            if name in obs:
                self.layout.write(i, self.final[row] if self.truncated[row] else self.obs[row], obs[name])
            elif self.truncated[row]:  # no last observation given: the one it acted on
                self.final[row] = self.obs[row]
        self.returns[e] += self.rewards[rows]
        self.lengths[e] += 1
        live = self.layout.live(self.id, env.agents)
        ended = self.terminated[rows] | self.truncated[rows]
        active[:] = live & ~ended
        if self.max_steps is not None and self.lengths[e] >= self.max_steps:
            active[:] = False  # the time limit: every agent still playing is cut below
        if active.any():
            self.obs[rows][~active] = 0
            return
        cut = self.acted[rows] & ~ended  # the episode ended without a flag for these agents: truncated
        self.truncated[rows] |= cut
        self.final[rows][cut] = self.obs[rows][cut]
        team = self.returns[e].sum()
        self.tally.add(e, [team / self.slots, self.lengths[e], team])
        self.episodes[e] += 1
        self._start(e)

    def _start(self, e: int) -> None:
        """Reset copy ``e`` with the seed of its next episode; its slots become active as ``env.agents`` says."""
        observations, _ = self.envs[e].reset(seed=(self.seed * self.num_envs + e) * SEED_STRIDE + int(self.episodes[e]))
        rows = slice(e * self.slots, (e + 1) * self.slots)
        self.active[rows] = self.layout.live(self.id, self.envs[e].agents)
        self.obs[rows] = 0
        for i, name in enumerate(self.names):
            if name in observations:
                self.layout.write(i, self.obs[e * self.slots + i], observations[name])
        self.returns[e] = 0
        self.lengths[e] = 0

    def _start_all(self) -> None:
        for e in range(self.num_envs):
            self._start(e)
        self.tally.clear()

    def _output(self) -> TensorDict:
        if self.pinned:
            return self.host.to(self.device, non_blocking=True)
        return self.host.clone()  # the host buffers are rewritten by the next step
