"""MettaGridEnv: E envs of any MettaGrid game (``env=mettagrid env.game=<name or file>``, the ``mettagrid`` extra)
behind the same reset / step TensorDict interface as the built-in ``Machina1Env``.

The game is a file read as data (``game_file.read_game``: a shipped game's name such as ``arena``, or the path of
a .yaml / .json MettaGridConfig); agents per env, actions, the observation window and token count, and the
feature names come from it. Each env is one MettaGrid ``Simulation`` whose C++ core writes straight into slices of
one set of batch arrays (``sims``), stepped in this process (``workers=0``) or by worker processes that
share the arrays (``workers=N`` or ``auto``; ``workers``). With ``overlap`` the envs form two groups
(``groups`` = 2) that ``send`` / ``recv`` step apart, so the workers step one group while the policy acts on the
other. An env's trajectory depends only on the seed, its index and the actions: any worker count and either
``overlap`` give the same numbers.

Agent index = env_index * agents_per_env + slot. An env whose episode ended (every agent truncated at
``max_steps`` or terminated) restarts within the same step on a new map: REWARDS / TRUNCATED describe the step
that ended the episode, OBS is already the new episode's first observation. First episodes are staggered (ended
early at a step in [1, max_steps]; only on random maps, i.e. a map builder with a ``seed``) so that envs do not
reset in lockstep. Games with the arena's chain (mines, converters, ore: ``teacher.missing``) declare the optional
output TEACHER_ACTIONS: asked for it (``outputs``), the process or worker that steps an env also writes the scripted
arena teacher's action for every new observation (``teacher.py``), and ``reset`` / ``observe`` / ``step`` return it.

Tokens are MettaGrid's (packed ``row << 4 | col`` location, feature id, value; padding 0xFF) with one change:
global tokens (episode progress, last reward), which MettaGrid marks with location 0xFE, are moved to the centre
of the window, where the agent's own inventory tokens are too, so every location lies inside the window.
"""

import hashlib
import logging
import os
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.base import Env, Grouped, Resumable
from machina.env.episode_tally import EpisodeTally, check_counters
from machina.env.mettagrid import game_file
from machina.env.mettagrid.teacher import ArenaTeacher, missing
from machina.env.spec import EnvSpec, ObsSpec
from machina.errors import ConfigError, EnvFailed
from machina.files import saved_state

log = logging.getLogger(__name__)

BASE_STATS = ("episodes", "return", "length")
KEPT_GAME_BYTES = 4 * game_file.MAX_BYTES  # a kept game is compact JSON of a file of at most MAX_BYTES
INSTALL_HINT = "env=mettagrid needs the mettagrid extra: pip install -e '.[mettagrid]'"


class MettaGridEnv(Env, Resumable, Grouped):
    """E envs of the MettaGrid game ``game``; see the module docstring.

    Settings: ``game`` (a shipped game's name or a .yaml / .json path), ``max_steps`` (None: the game's own episode
    length; a number overrides it, as ``debug=tiny`` does), ``workers`` (0: step in this process; N:
    N worker processes, at most one per env of a group; ``auto``: one per core but one), ``overlap`` (two groups
    stepped apart through ``send`` / ``recv``; needs workers; an odd ``num_envs`` steps as one group), ``stats``
    (episode stat name -> MettaGrid agent stat, summed over an env's agents when its episode ends), ``kept_game``
    (the game's content as a run keeps it, ``game_file.canonical``: eval.py passes a run's own, so that the run is
    evaluated on the game it trained on whatever the file ``game`` names today; ``game`` then only names it).
    ``outputs``
    may hold TEACHER_ACTIONS, which arena-like games declare (``spec.outputs``); other keys are ignored.
    ``stagger`` False plays whole first episodes (evaluation).

    Capabilities (``machina.env.base``): ``Resumable`` without continuing episodes (MettaGrid's C++ state is not
    saved: the episode counters and stat sums are, and a restored env starts new episodes with the seeds that follow
    them); ``Grouped`` (two groups with ``overlap``, ``host_processes`` worker processes).
    """

    continues_episodes = False

    def __init__(
        self,
        game: str = "arena",
        num_envs: int = 64,
        workers: int | str = 0,
        overlap: bool = False,
        stats: Mapping[str, str] | None = None,
        max_steps: int | None = None,
        kept_game: str | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        outputs: Collection[str] = frozenset(),
        stagger: bool = True,
    ):
        try:
            from machina.env.mettagrid import sims
            from machina.env.mettagrid import workers as worker_processes
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
        stats = dict(stats or {})
        check_settings(num_envs, workers, overlap, stats, max_steps)
        cfg, self.game_text = game_file.load_game(game, kept_game)
        self.game = game
        if max_steps is not None:
            cfg.game.max_steps = max_steps
        self.device = torch.device(device)
        self.num_envs, self.seed = num_envs, seed
        self.agents_per_env = a = cfg.game.num_agents
        self.num_agents = n = num_envs * a
        self.max_steps = cfg.game.max_steps
        max_tokens, window = cfg.game.obs.num_tokens, cfg.game.obs.width
        names, norms = game_file.feature_table(cfg)
        obs_spec = ObsSpec(max_tokens, window, names, norms)
        # Staggered first episodes end early and the observation carries no step counter: truncations are bootstrapped.
        declared = frozenset() if missing(cfg) else frozenset({keys.TEACHER_ACTIONS})
        num_actions = len(game_file.action_names(cfg))
        self.spec = EnvSpec(num_envs, a, num_actions, obs_spec, declared, observes_time=False)
        self.teacher = ArenaTeacher(cfg) if keys.TEACHER_ACTIONS in declared & frozenset(outputs) else None
        self.centre = (window // 2) << 4 | window // 2
        # Two equal groups of whole envs; an odd count (a replay's one env, say) steps as one group.
        self.groups = 2 if overlap and num_envs % 2 == 0 else 1
        self.tally = EpisodeTally((*BASE_STATS, *stats), num_envs)

        layout = sims.batch_layout(n, max_tokens, num_envs, len(stats))
        size = sims.buffer_size(layout)
        processes = worker_processes.worker_count(workers, num_envs // self.groups, usable_cores())
        if processes == 0:
            buffer = np.zeros(size, dtype=np.uint8)
            self.arrays = sims.batch_arrays(buffer, layout)
            self.runner = worker_processes.Local(
                cfg, num_envs, seed, stagger, tuple(stats.values()), self.arrays, self.teacher
            )
        else:
            buffer = worker_processes.shared_buffer(size)
            self.arrays = sims.batch_arrays(buffer, layout)
            self.runner = worker_processes.Workers(
                processes,
                self.groups,
                buffer,
                layout,
                cfg,
                num_envs,
                seed,
                stagger,
                tuple(stats.values()),
                self.teacher,
            )
        self.host_processes = processes
        self.commands = sims
        self.host = {name: torch.from_numpy(array) for name, array in self.arrays.items()}
        self.group_agents = [slice(g * n // self.groups, (g + 1) * n // self.groups) for g in range(self.groups)]
        self.group_envs = [
            slice(g * num_envs // self.groups, (g + 1) * num_envs // self.groups) for g in range(self.groups)
        ]
        self.everyone = slice(0, n)
        self.in_flight: deque[int] = deque()  # groups sent and not yet received, oldest first
        try:
            self._run(self.commands.START_ALL, "reset")
        except EnvFailed as err:  # the game passed every check but the engine cannot build it (or a worker died)
            self.close()
            raise ConfigError(f"env.game={game}: MettaGrid cannot start the game: {err}") from None

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The worker processes' ids (none for ``workers=0``): what a test kills to see a worker fail."""
        return self.runner.pids

    # ----------------------------------------------------------------------------------------------- public API
    def reset(self) -> TensorDict:
        """New maps for every env (staggered first episodes); clears episode stats. Returns ``observe()``."""
        self._run(self.commands.START_ALL, "reset")
        self.tally.clear()
        return self.observe()

    def observe(self) -> TensorDict:
        """The current observation TensorDict (zero rewards, no termination), as ``reset`` returns it."""
        self._check_idle("observe")
        zeros = torch.zeros(self.num_agents, dtype=torch.bool)
        out = {
            keys.OBS: self.host["observations"].clone(),
            keys.REWARDS: torch.zeros(self.num_agents),
            keys.TERMINATED: zeros,
            keys.TRUNCATED: zeros.clone(),
        }
        if self.teacher is not None:
            out[keys.TEACHER_ACTIONS] = self.host["teacher_actions"].clone()
        return TensorDict(out, batch_size=[self.num_agents]).to(self.device, non_blocking=True)

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every env by one step.

        actions: int64 (or int32) [N], ids in [0, num_actions). Returns a TensorDict, batch [N], on ``device``: OBS
        uint8 [N, M, 3], REWARDS float32 [N], TERMINATED bool [N], TRUNCATED bool [N] (see the module docstring for
        ended episodes), and FINAL_OBS uint8 [N, M, 3] on steps where some agent was truncated (the observation
        each truncated agent saw when its episode ended; rows of other agents are their current observation), and
        TEACHER_ACTIONS int64 [N] (the arena teacher's action for OBS) when built with it in ``outputs``. EnvFailed
        if a worker died or its engine raised.
        """
        self._check_idle("step")
        self._put_actions(self.everyone, actions)
        self._run(self.commands.STEP, "step")
        return self._output(self.everyone, slice(0, self.num_envs))

    def send(self, group: int, actions: torch.Tensor) -> None:
        """Start stepping group ``group`` (its agents' int64 ``actions`` [N / groups]); ``recv(group)`` returns the
        step. With workers, this returns at once and the workers step while the caller does other work."""
        if self.groups == 1:
            return super().send(group, actions)
        if group in self.in_flight or not 0 <= group < self.groups:
            raise ValueError(f"send({group}): group {group} is in flight or not one of the {self.groups} groups")
        self._put_actions(self.group_agents[group], actions)
        self.runner.start(self.commands.STEP, group)
        self.in_flight.append(group)

    def recv(self, group: int) -> TensorDict:
        """What ``step`` returns, for group ``group``'s agents (batch [N / groups]), once its workers are done.
        Groups are received in the order they were sent; EnvFailed if a worker died or its engine raised."""
        if self.groups == 1:
            return super().recv(group)
        if not self.in_flight or self.in_flight[0] != group:
            raise ValueError(f"recv({group}): the groups in flight, oldest first, are {list(self.in_flight)}")
        self.in_flight.popleft()
        self._finish()
        return self._output(self.group_agents[group], self.group_envs[group])

    def close(self) -> None:
        """Stop and join the worker processes (idempotent; also run when the env is collected or Python exits)."""
        self.runner.close()

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the env-episodes that ended since the last call, as 0-d float32 tensors on the device:
        ``episodes``, ``return`` (per-agent mean return of each episode, summed), ``length`` (steps), and each name
        of ``stats`` (its MettaGrid agent stat summed over the env's agents). Resets the sums."""
        return self.tally.pop_sums(self.device)

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per env, float32 [E]: ``episodes`` ended since ``reset`` and the other stats of its latest episode."""
        return self.tally.latest(self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Episode counters and stat sums, and the game itself: ``game`` its content as uint8 UTF-8 bytes
        (``game_file.canonical``) and ``game_sha256`` its digest, uint8 [32] (read back by ``kept_game``).
        MettaGrid's C++ state is not saved: a restored env starts new episodes with the seeds that follow the saved
        ones."""
        text = self.game_text.encode()
        return {
            "episode": self.host["episode"].clone(),
            "totals": torch.from_numpy(self.tally.totals.copy()),
            "game": torch.frombuffer(bytearray(text), dtype=torch.uint8),
            "game_sha256": torch.frombuffer(bytearray(hashlib.sha256(text).digest()), dtype=torch.uint8),
        }

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings and the same game (new episodes, see
        ``state_dict``), once checked (``episode_tally.check_counters``; ``kept_game``: ConfigError when the game
        differs from the one the state was saved with). A state saved before runs kept their game (no ``game``
        entry) is taken with a warning: there is no game to compare with."""
        kept = kept_game(d)
        if kept is None:
            log.warning("the checkpoint keeps no copy of its game (an older machina wrote it): env.game=%s is taken "
                        "as the run's from now on", self.game)  # fmt: skip
        elif kept != self.game_text:
            raise ConfigError(
                f"env.game={self.game}: not the game this run trained on (its checkpoint keeps that game, sha256 "
                f"{game_file.digest(kept)[:12]}; this one is {game_file.digest(self.game_text)[:12]}); restore that "
                "game, or start a new run in another folder"
            )
        episode, totals = check_counters(
            d, "episode", self.num_envs, len(self.tally.totals), self.commands.MAX_EPISODES
        )
        self.arrays["episode"][:] = episode.numpy()
        self._run(self.commands.RESTART, "load_state_dict")
        self.tally.totals[:] = totals.numpy()

    # ------------------------------------------------------------------------------------------------ internals
    def _check_idle(self, what: str) -> None:
        if self.in_flight:
            raise ValueError(f"{what} while groups {list(self.in_flight)} are sent and not received (recv them first)")

    def _run(self, command: bytes, what: str) -> None:
        """``command`` on every group, waited for."""
        self._check_idle(what)
        self.runner.start(command, self.commands.ALL_GROUPS)
        self._finish()

    def _finish(self) -> None:
        try:
            self.runner.finish()
        except EnvFailed:
            self.in_flight.clear()  # nothing more will come back: a checkpoint may read the counters now
            raise

    def _put_actions(self, agents: slice, actions: torch.Tensor) -> None:
        n = agents.stop - agents.start
        if actions.shape != (n,) or actions.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"actions must be int64 or int32 [{n}] (agents stepped), got {actions.dtype} {[*actions.shape]}"
            )
        ids = self.host["actions"][agents]
        ids.copy_(actions)  # a host env: the one device read of a step
        view = self.arrays["actions"][agents]
        if view.min() < 0 or view.max() >= self.spec.num_actions:
            raise ValueError(f"action ids must be in [0, {self.spec.num_actions})")

    def _output(self, agents: slice, envs: slice) -> TensorDict:
        """The step of ``agents`` (the envs ``envs``) as copies on ``device``; ended episodes into the tally."""
        ended = self.arrays["ended"][envs]
        if ended.any():
            ids = np.flatnonzero(ended) + envs.start
            self.tally.add(ids, self.arrays["ended_stats"][ids])
        host, arrays, n = self.host, self.arrays, agents.stop - agents.start
        # Copies on the device: the next step writes the batch arrays again.
        hand = torch.clone if self.device.type == "cpu" else self._to_device
        out = {
            keys.OBS: hand(host["observations"][agents]),
            keys.REWARDS: hand(host["step_rewards"][agents]),
            keys.TERMINATED: hand(host["step_terminals"][agents]),
            keys.TRUNCATED: hand(host["step_truncations"][agents]),
        }
        if self.teacher is not None:
            out[keys.TEACHER_ACTIONS] = hand(host["teacher_actions"][agents])
        truncated = arrays["step_truncations"][agents]
        if truncated.any():
            # Each agent's final observation where it was truncated, else its current one (one masked copy).
            final = host["observations"][agents].clone()
            np.copyto(final.numpy(), arrays["final_observations"][agents], where=truncated[:, None, None])
            out[keys.FINAL_OBS] = final if self.device.type == "cpu" else self._to_device(final)
        return TensorDict(out, batch_size=[n], device=self.device)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)


def kept_game(state: Mapping[str, Any]) -> str | None:
    """The game content a MettaGrid env's saved ``state`` keeps (``MettaGridEnv.state_dict``), checked against its
    digest; None for a state saved before games were kept. ConfigError naming the entry for a damaged one."""
    if "game" not in state:
        return None
    found = state["game"]
    size = found.numel() if isinstance(found, torch.Tensor) and found.dim() == 1 else 0
    text = saved_state.tensor(state, "game", (size,), torch.uint8)
    if not 0 < size <= KEPT_GAME_BYTES:
        raise ConfigError(f"game holds {size:,} bytes, not 1..{KEPT_GAME_BYTES:,}")
    digest = saved_state.tensor(state, "game_sha256", (32,), torch.uint8)
    content = bytes(text.numpy().tobytes())
    if hashlib.sha256(content).digest() != bytes(digest.numpy().tobytes()):
        raise ConfigError("game does not match its game_sha256 (the kept game was changed)")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("game is not UTF-8 text") from None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_settings(num_envs: object, workers: object, overlap: object, stats: dict, max_steps: object) -> None:
    """Refuse, in one line naming the setting, what the env cannot run."""
    for name, value in (("num_envs", num_envs), ("max_steps", max_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"env.{name}={value!r} must be a whole number >= 1")
    if num_envs is None:
        raise ConfigError("env.num_envs=None must be a whole number >= 1")
    if workers != "auto" and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(
            f"env.workers={workers!r} must be 0 (step in this process), a number of worker processes, or auto"
        )
    if not isinstance(overlap, bool):
        raise ConfigError(f"env.overlap={overlap!r} must be true or false")
    if overlap and workers == 0:
        raise ConfigError("env.overlap=true needs env.workers >= 1 (or auto): envs in this process cannot step aside")
    for name, stat in stats.items():
        if name in BASE_STATS or not isinstance(name, str) or not isinstance(stat, str):
            raise ConfigError(
                f"env.stats.{name}={stat!r}: each entry names a new episode stat (not {', '.join(BASE_STATS)}) and "
                "the MettaGrid agent stat it sums (a string, e.g. heart.made)"
            )
