"""MettaGridArenaEnv: E real MettaGrid envs (``env=mettagrid_arena``, the ``mettagrid`` extra) behind the same
reset / step TensorDict interface as the built-in ``Machina1Env``, so no other part of machina changes.

The game (agents, walls, mine -> ore -> converter -> heart) is written with MettaGrid's config API in
``mettagrid_game.py``. Each env is one MettaGrid ``Simulation`` (its C++ core steps all of that env's agents); all
of them write straight into slices of one set of batch arrays that are views of torch tensors (pinned when the
trainer is on an accelerator), so observations arrive without a copy. One process steps every env: on the 2-core
machine this was written on, worker processes were slower (docs/mettagrid.md has the numbers).

Agent index = env_index * agents_per_env + slot. An env whose episode ended (every agent truncated at
``max_steps`` or terminated) restarts within the same ``step`` on a new map: REWARDS / TRUNCATED describe the step
that ended the episode, OBS is already the new episode's first observation. First episodes are staggered (ended
early at a random step in [1, max_steps]; not on hand-made maps) so that envs do not reset in lockstep. No teacher
actions.

Tokens are MettaGrid's (packed ``row << 4 | col`` location, feature id, value; padding 0xFF) with one change:
global tokens (episode progress, last reward), which MettaGrid marks with location 0xFE, are moved to the centre
of the window, where the agent's own inventory tokens are too, so every location lies inside the window.
"""

from collections.abc import Collection

import numpy as np
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.base import Env
from machina.env.episode_tally import EpisodeTally, check_counters
from machina.env.spec import EnvSpec, ObsSpec
from machina.errors import ConfigError

STAT_NAMES = ("episodes", "return", "length", "hearts_made", "resources_gathered")
GLOBAL_LOCATION = 0xFE  # MettaGrid's location byte for non-spatial tokens
SEED_STRIDE = 1_000_000  # map / simulation seeds of env e are base_e + episode, base_e = (seed * E + e) * stride
INSTALL_HINT = "env=mettagrid_arena needs the mettagrid extra: pip install -e '.[mettagrid]'"


class MettaGridArenaEnv(Env):
    """E MettaGrid envs of ``agents_per_env`` agents each; see the module docstring and ``mettagrid_game.py``.

    ``map_rows``: a fixed ASCII map (border included; '#' wall, '.' empty, '@' agent, 'm' mine, 'c' converter) for
    every episode instead of random maps (tests, hand-made levels). ``outputs`` is taken for the common
    constructor signature; this env declares no optional outputs (``spec.outputs`` is empty), so it asks for
    nothing. ``stagger`` False plays whole first episodes (evaluation).
    """

    continues_episodes = False  # MettaGrid's C++ state is not saved: a restored env starts new episodes

    def __init__(
        self,
        num_envs: int = 64,
        agents_per_env: int = 4,
        height: int = 11,
        width: int = 11,
        walls: int = 10,
        mines: int = 4,
        converters: int = 2,
        ore_per_heart: int = 2,
        inventory_cap: int = 4,
        heart_reward: float = 1.0,
        max_steps: int = 200,
        max_tokens: int = 128,
        window: int = 11,
        map_rows: list[str] | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        outputs: Collection[str] = frozenset(),
        stagger: bool = True,
    ):
        try:
            from mettagrid.simulator.simulator import Buffers, Simulation

            from machina.env import mettagrid_game as game
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
        if min(num_envs, agents_per_env, max_steps, max_tokens) < 1 or not 1 <= window <= 15 or window % 2 == 0:
            raise ValueError("num_envs, agents_per_env, max_steps, max_tokens must be >= 1 and window odd in 1..15")
        self.device = torch.device(device)
        self.num_envs, self.agents_per_env, self.max_steps = num_envs, agents_per_env, max_steps
        self.num_agents = e_a = num_envs * agents_per_env
        self.seed, self.map_rows, self.stagger = seed, map_rows, stagger
        cfg = game.arena_config(
            agents_per_env, height, width, walls, mines, converters, ore_per_heart, inventory_cap, heart_reward,
            max_steps, max_tokens, window, list(map_rows) if map_rows else None,
        )  # fmt: skip
        names, norms = game.feature_table(cfg)
        num_actions = len(game.action_names(cfg))
        obs_spec = ObsSpec(max_tokens, window, names, norms)
        # Staggered first episodes end early and the observation carries no step counter: truncations are bootstrapped.
        self.spec = EnvSpec(num_envs, agents_per_env, num_actions, obs_spec, frozenset(), observes_time=False)
        self.centre = (window // 2) << 4 | window // 2
        self.stat_keys = (game.HEART_STAT, game.ORE_STAT)

        # Batch arrays: torch tensors whose memory the C++ envs write into (numpy views, sliced per env).
        pin = self.device.type != "cpu"
        self.obs = torch.empty(e_a, max_tokens, 3, dtype=torch.uint8, pin_memory=pin)
        self.buf = {
            "terminals": torch.zeros(e_a, dtype=torch.bool),
            "truncations": torch.zeros(e_a, dtype=torch.bool),
            "rewards": torch.zeros(e_a, dtype=torch.float32),
            "actions": torch.zeros(e_a, dtype=torch.int32),
            "vibe_actions": torch.zeros(e_a, dtype=torch.int32),  # unused: vibes are off
        }
        arrays = {"observations": self.obs.numpy(), **{k: v.numpy() for k, v in self.buf.items()}}
        self.buffers = [
            Buffers(
                masks=np.ones(agents_per_env, dtype=bool),
                teacher_actions=arrays["vibe_actions"][sl],
                **{k: v[sl] for k, v in arrays.items()},
            )
            for sl in (slice(e * agents_per_env, (e + 1) * agents_per_env) for e in range(num_envs))
        ]
        self.simulation = Simulation
        self.cfgs = [cfg.model_copy(deep=True) for _ in range(num_envs)]  # each env sets its own map seed per episode
        self.sims = [None] * num_envs
        self.episode = np.zeros(num_envs, dtype=np.int64)  # episodes started per env: the next seed offset
        self.tally = EpisodeTally(STAT_NAMES, num_envs)
        self._start_all()

    # ----------------------------------------------------------------------------------------------- public API
    def reset(self) -> TensorDict:
        """New maps for every env (staggered first episodes); clears episode stats. Returns ``observe()``."""
        self._start_all()
        return self.observe()

    def observe(self) -> TensorDict:
        """The current observation TensorDict (zero rewards, no termination), as ``reset`` returns it."""
        zeros = torch.zeros(self.num_agents, dtype=torch.bool)
        return self._output(torch.zeros(self.num_agents), zeros, zeros)

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every env by one step.

        actions: int64 (or int32) [N], ids in [0, num_actions). Returns a TensorDict, batch [N], on ``device``: OBS
        uint8 [N, M, 3], REWARDS float32 [N], TERMINATED bool [N], TRUNCATED bool [N] (see the module docstring for
        ended episodes), and FINAL_OBS uint8 [N, M, 3] on steps where some agent was truncated (the observation
        each agent saw when its episode ended; rows of other agents are their current observation). No
        TEACHER_ACTIONS.
        """
        if actions.shape != (self.num_agents,) or actions.dtype not in (torch.int64, torch.int32):
            got = f"{actions.dtype} {list(actions.shape)}"
            raise ValueError(f"actions must be int64 or int32 [{self.num_agents}] (num_agents), got {got}")
        actions = actions.cpu()
        if bool(((actions < 0) | (actions >= self.spec.num_actions)).any()):
            raise ValueError(f"action ids must be in [0, {self.spec.num_actions})")
        self.buf["actions"].copy_(actions)
        for e, sim in enumerate(self.sims):
            # The C++ step alone: Simulation.step adds stopwatch timers, talk and event handlers, which this game
            # does not use, at about a third of the env's time.
            sim._c_sim.step()
            if sim.current_step == self.first_len[e]:
                sim.end_episode()  # the staggered first episode: a time limit, like max_steps
        rewards, terminated, truncated = (self.buf[k].clone() for k in ("rewards", "terminals", "truncations"))
        self.ep_return += rewards.view(self.num_envs, -1).sum(1).double().numpy()
        done = (terminated | truncated).view(self.num_envs, -1).all(1).tolist()
        # The final observations, read before the ended envs' new episodes overwrite the batch arrays.
        final = self._tokens() if bool(truncated.any()) else None
        for e in (e for e, d in enumerate(done) if d):
            self._end_episode(e)
        out = self._output(rewards, terminated, truncated)
        if final is not None:
            out[keys.FINAL_OBS] = final.to(self.device, non_blocking=True)
        return out

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the env-episodes that ended since the last call, as 0-d float32 tensors on the device:
        ``episodes``, ``return`` (per-agent mean return of each episode, summed), ``length`` (steps),
        ``hearts_made`` and ``resources_gathered`` (ore mined; both summed over the env's agents). Resets the sums.
        """
        return self.tally.pop_sums(self.device)

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per env, float32 [E]: ``episodes`` ended since ``reset`` and the other stats of its latest episode."""
        return self.tally.latest(self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Episode counters and stat sums. MettaGrid's C++ state is not saved: a restored env starts new episodes
        with the seeds that follow the saved ones."""
        return {"episode": torch.from_numpy(self.episode.copy()), "totals": torch.from_numpy(self.tally.totals.copy())}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings (new episodes, see ``state_dict``), once
        checked (``episode_tally.check_counters``)."""
        episode, totals = check_counters(d, "episode", self.num_envs, len(self.tally.totals), SEED_STRIDE)
        self.episode[:] = episode.numpy()
        for e in range(self.num_envs):
            self._start_episode(e)
        self.tally.totals[:] = totals.numpy()

    # ------------------------------------------------------------------------------------------------ internals
    def _start_all(self) -> None:
        # Staggered first episodes, as in Machina1Env: lengths in [1, max_steps], spread evenly over the envs.
        rng = np.random.default_rng(self.seed)
        self.first_len = rng.permutation(self.num_envs) % self.max_steps + 1
        if self.map_rows is not None or not self.stagger:
            self.first_len[:] = 0  # whole episodes (step counters start at 1, so 0 never ends one)
        self.ep_return = np.zeros(self.num_envs)
        self.tally.clear()
        for e in range(self.num_envs):
            self._start_episode(e)

    def _start_episode(self, e: int) -> None:
        if self.sims[e] is not None:
            self.sims[e].close()
        seed = (self.seed * self.num_envs + e) * SEED_STRIDE + int(self.episode[e])
        if self.map_rows is None:
            self.cfgs[e].game.map_builder.seed = seed  # a new random map per episode, reproducible from the seed
        self.sims[e] = self.simulation(self.cfgs[e], seed=seed, buffers=self.buffers[e])
        self.episode[e] += 1
        self.ep_return[e] = 0.0

    def _end_episode(self, e: int) -> None:
        sim = self.sims[e]
        agents = sim.episode_stats["agent"]
        made, mined = (sum(a.get(k, 0.0) for a in agents) for k in self.stat_keys)
        self.tally.add(e, (self.ep_return[e] / self.agents_per_env, sim.current_step, made, mined))
        self.first_len[e] = 0  # later episodes run to max_steps
        self._start_episode(e)

    def _tokens(self) -> torch.Tensor:
        """The batch arrays' observations with global tokens moved to the centre: uint8 [N, M, 3] on the host."""
        # A copy, since the next step overwrites the batch arrays; numpy's, since torch's multi-threaded copy of
        # this small array was 30x slower on a loaded 2-core machine.
        obs = self.obs.numpy().copy()
        loc = obs[..., 0]
        loc[loc == GLOBAL_LOCATION] = self.centre
        return torch.from_numpy(obs)

    def _output(self, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> TensorDict:
        obs = self._tokens()
        out = {keys.OBS: obs, keys.REWARDS: rewards, keys.TERMINATED: terminated, keys.TRUNCATED: truncated}
        return TensorDict(out, batch_size=[self.num_agents]).to(self.device, non_blocking=True)
