"""The stepping core of ``MettaGridEnv``: the MettaGrid ``Simulation`` of each env in a contiguous range, writing
straight into the batch arrays, whether it runs in the trainer's process (``env.workers=0``) or in a worker
(``workers.py``). This module imports numpy and mettagrid only (no torch), so a worker starts light.

The batch arrays (``batch_layout``) are numpy views of one flat byte buffer: process memory in the trainer, or a
``multiprocessing`` shared ``RawArray`` that every worker maps too. Per agent (N = envs x agents per env, agent
index = env * A + slot): ``observations`` and ``final_observations`` uint8 [N, M, 3], the engines' ``rewards``
float32 and ``terminals`` / ``truncations`` bool (a restarted engine clears its own), the last step's
``step_rewards`` / ``step_terminals`` / ``step_truncations`` (what the env returns), ``actions`` / ``vibe_actions``
int32 (vibe actions unused: machina emits one action), ``teacher_actions`` int64 (the arena teacher's action for
each current observation, written only when the env has the teacher: ``teacher.py``). Per env: ``ended`` bool
(the episode ended on the last step), ``ended_stats`` float64 [E, 2 + K] (that episode's per-agent mean return, its
length, then the K ``stats`` summed over its agents), ``episode`` int64 (episodes started: the next seed's offset).

An env's numbers depend only on the seed, its index and the actions, never on which process or range steps it:
its seeds are ``episode_seed(seed, e, episode)`` (map and engine: a mix of the three numbers into MettaGrid's
range, whatever the seed, the env count or the episode count), and the staggered first episodes
(random maps only: a builder with a ``seed`` field) end at step ``permutation(E)[e] % max_steps + 1`` of the
permutation drawn from ``seed``.
"""

import signal

import numpy as np
from mettagrid.simulator.simulator import Buffers, Simulation

from machina.errors import one_line

GLOBAL_LOCATION = 0xFE  # MettaGrid's location byte for non-spatial tokens
SEED_RANGE = 2**31 - 1  # engine and map seeds are in [0, SEED_RANGE): MettaGrid's C++ takes a 32-bit seed
MAX_EPISODES = 2**62  # episodes one env may start (its saved counter is checked against it)
MASK64 = 2**64 - 1
# Commands a worker takes, one byte each, followed by a group byte: step a group, start every env afresh (reset),
# start new episodes from the episode counters (a restored env), quit.
STEP, START_ALL, RESTART, QUIT = b"s", b"a", b"r", b"q"
ALL_GROUPS = 255  # the group byte that stands for every group (``step`` of the whole batch)
ENGINE_OUTCOMES = ("rewards", "terminals", "truncations")  # copied to ``step_<name>`` after each step


def mix64(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea and Flood, 2014): a bijection of 64-bit integers whose every output bit
    depends on every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def episode_seed(seed: int, env: int, episode: int) -> int:
    """The map and engine seed of episode ``episode`` (0, 1, ...) of env ``env`` in a run seeded ``seed``: the three
    numbers mixed in turn (``mix64(mix64(mix64(seed) ^ env) ^ episode)``) and reduced to ``[0, SEED_RANGE)``. It
    depends on nothing else (not the env count, not the worker that steps the env), fits MettaGrid's range for every
    seed machina accepts (0..2**32-1) and every env and episode count, and two (seed, env, episode) triples share a
    seed only by chance (about one pair in 2**31)."""
    return mix64(mix64(mix64(seed) ^ env) ^ episode) % SEED_RANGE


def batch_layout(num_agents: int, max_tokens: int, num_envs: int, num_stats: int) -> dict[str, tuple]:
    """Name -> (dtype, shape) of every batch array (see the module docstring), in buffer order."""
    return {
        "observations": (np.uint8, (num_agents, max_tokens, 3)),
        "final_observations": (np.uint8, (num_agents, max_tokens, 3)),
        "rewards": (np.float32, (num_agents,)),
        "terminals": (np.bool_, (num_agents,)),
        "truncations": (np.bool_, (num_agents,)),
        "step_rewards": (np.float32, (num_agents,)),
        "step_terminals": (np.bool_, (num_agents,)),
        "step_truncations": (np.bool_, (num_agents,)),
        "actions": (np.int32, (num_agents,)),
        "vibe_actions": (np.int32, (num_agents,)),
        "teacher_actions": (np.int64, (num_agents,)),
        "ended": (np.bool_, (num_envs,)),
        "ended_stats": (np.float64, (num_envs, 2 + num_stats)),
        "episode": (np.int64, (num_envs,)),
    }


def _offsets(layout: dict[str, tuple]) -> tuple[dict[str, int], int]:
    offsets, end = {}, 0
    for name, (dtype, shape) in layout.items():
        offsets[name] = end
        end += -(-np.dtype(dtype).itemsize * int(np.prod(shape)) // 64) * 64  # each array 64-byte aligned
    return offsets, end


def buffer_size(layout: dict[str, tuple]) -> int:
    """Bytes of the flat buffer that holds ``layout``'s arrays."""
    return _offsets(layout)[1]


def batch_arrays(buffer, layout: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Numpy views of ``layout``'s arrays in ``buffer`` (anything with the buffer protocol, ``buffer_size`` bytes)."""
    flat = np.frombuffer(buffer, dtype=np.uint8)
    offsets, _ = _offsets(layout)
    views = {}
    for name, (dtype, shape) in layout.items():
        size = np.dtype(dtype).itemsize * int(np.prod(shape))
        views[name] = flat[offsets[name] : offsets[name] + size].view(dtype).reshape(shape)
    return views


class Sims:
    """The envs ``envs`` (a contiguous range of the E envs) of game ``cfg``, stepping in ``arrays``.

    ``stats``: MettaGrid agent stats recorded per ended episode (``ended_stats[:, 2:]``). ``stagger``: staggered
    first episodes (random maps only). ``teacher``: an ``ArenaTeacher`` that writes ``teacher_actions`` for the
    observations of every start and step, or None. Envs are started by ``start_all`` or ``restart``, not on
    construction.
    """

    def __init__(self, cfg, envs: range, num_envs: int, seed: int, stagger: bool, stats: tuple[str, ...], arrays,
                 teacher=None):  # fmt: skip
        game = cfg.game
        self.cfg, self.envs, self.num_envs, self.seed, self.stats = cfg, envs, num_envs, seed, stats
        self.teacher = teacher
        a = self.agents = game.num_agents
        n = len(envs)
        self.rows = slice(envs.start * a, envs.stop * a)
        self.arrays = arrays
        self.seeded = "seed" in type(game.map_builder).model_fields  # a random map per episode seed
        self.stagger = stagger and self.seeded and game.max_steps > 0
        # MettaGrid's event handlers (ending an episode on game stats) run only in Simulation.step; without them
        # the C++ step alone does the same work, without a third of the time in timers.
        self.full_step = bool(game.end_episode_on_game_stats)
        obs = arrays["observations"]
        self.buffers = [
            Buffers(
                observations=obs[e * a : (e + 1) * a],
                terminals=arrays["terminals"][e * a : (e + 1) * a],
                truncations=arrays["truncations"][e * a : (e + 1) * a],
                rewards=arrays["rewards"][e * a : (e + 1) * a],
                masks=np.ones(a, dtype=bool),
                actions=arrays["actions"][e * a : (e + 1) * a],
                teacher_actions=arrays["vibe_actions"][e * a : (e + 1) * a],
            )
            for e in envs
        ]
        window = game.obs.width
        self.centre = (game.obs.height // 2) << 4 | window // 2
        self.loc = obs[self.rows, :, 0]  # location bytes of this range's tokens (a strided view)
        self.is_global = np.empty(self.loc.shape, dtype=bool)
        # Scratch of one step, allocated once.
        self.done = np.empty((n, a), dtype=bool)
        self.env_done = np.empty(n, dtype=bool)
        self.env_reward = np.empty(n, dtype=np.float32)
        self.step_arrays = [(arrays[k][self.rows], arrays[f"step_{k}"][self.rows]) for k in ENGINE_OUTCOMES]
        self.sims: list = [None] * n
        self.c_sims: list = [None] * n
        self.ep_return = np.zeros(n)
        self.first_len = np.zeros(n, dtype=np.int64)
        self.staggered: list[int] = []  # envs whose first episode is still running to its staggered end

    def run(self, command: bytes) -> None:
        """The command ``command`` (STEP, START_ALL or RESTART) on these envs."""
        {STEP: self.step, START_ALL: self.start_all, RESTART: self.restart}[command]()

    def start_all(self) -> None:
        """Every env afresh (new maps, staggered first episodes), its episode counter kept."""
        if self.stagger:
            # As Machina1Env: first-episode lengths in [1, max_steps], spread evenly over all E envs.
            lengths = np.random.default_rng(self.seed).permutation(self.num_envs) % self.cfg.game.max_steps + 1
            self.first_len[:] = lengths[self.envs.start : self.envs.stop]
        self.staggered = [i for i in range(len(self.envs)) if self.first_len[i] > 0]
        self.restart()

    def restart(self) -> None:
        """A new episode in every env, seeded from its episode counter."""
        self.arrays["ended"][self.envs.start : self.envs.stop] = False
        for i in range(len(self.envs)):
            self._start(i)
        self._move_globals(self.rows)
        self._teach()

    def step(self) -> None:
        """One step of every env with the actions in ``arrays["actions"]``; ended episodes are recorded
        (``ended``, ``ended_stats``, ``final_observations``) and restarted."""
        arrays, a = self.arrays, self.agents
        arrays["ended"][self.envs.start : self.envs.stop] = False
        if self.full_step:
            for sim in self.sims:
                sim.step()
        else:
            for c_sim in self.c_sims:
                c_sim.step()
        if self.staggered:
            for i in self.staggered:
                if self.c_sims[i].current_step == self.first_len[i]:
                    self.sims[i].end_episode()  # the staggered first episode: a time limit, like max_steps
            self.staggered = [i for i in self.staggered if self.c_sims[i].current_step < self.first_len[i]]
        rows = self.rows
        for engine, step in self.step_arrays:
            np.copyto(step, engine)  # restarting an env below clears its engine's rewards and flags
        arrays["step_rewards"][rows].reshape(-1, a).sum(1, out=self.env_reward)
        self.ep_return += self.env_reward
        np.logical_or(arrays["step_terminals"][rows], arrays["step_truncations"][rows], out=self.done.reshape(-1))
        self.done.all(1, out=self.env_done)
        self._move_globals(rows)
        if self.env_done.any():
            for i in np.flatnonzero(self.env_done):
                self._end(int(i))
        self._teach()

    def _teach(self) -> None:
        """The teacher's actions for this range's current observations (after restarts: the new episodes')."""
        if self.teacher is not None:
            rows = self.rows
            self.teacher.actions(self.arrays["observations"][rows], self.arrays["teacher_actions"][rows])

    def _start(self, i: int) -> None:
        if self.sims[i] is not None:
            self.sims[i].close()
        e = self.envs.start + i
        episode = self.arrays["episode"]
        seed = episode_seed(self.seed, e, int(episode[e]))
        if self.seeded:
            self.cfg.game.map_builder.seed = seed  # read once, while the Simulation builds its map
        self.sims[i] = Simulation(self.cfg, seed=seed, buffers=self.buffers[i])
        self.c_sims[i] = self.sims[i]._c_sim
        episode[e] += 1
        self.ep_return[i] = 0.0

    def _end(self, i: int) -> None:
        """Record env i's ended episode and start its next one."""
        arrays, a, e = self.arrays, self.agents, self.envs.start + i
        rows = slice(e * a, (e + 1) * a)
        sim = self.sims[i]
        agents = sim.episode_stats["agent"]
        stats = arrays["ended_stats"][e]
        stats[0], stats[1] = self.ep_return[i] / a, sim.current_step
        stats[2:] = [sum(agent.get(name, 0.0) for agent in agents) for name in self.stats]
        arrays["ended"][e] = True
        arrays["final_observations"][rows] = arrays["observations"][rows]
        self.first_len[i] = 0  # later episodes run to max_steps
        self._start(i)
        self._move_globals(rows)

    def _move_globals(self, rows: slice) -> None:
        """Global tokens (location 0xFE) to the window centre, in place, for agent rows ``rows``."""
        start = rows.start - self.rows.start
        loc = self.loc[start : start + rows.stop - rows.start]
        is_global = self.is_global[start : start + rows.stop - rows.start]
        np.equal(loc, GLOBAL_LOCATION, out=is_global)
        np.copyto(loc, self.centre, where=is_global)


def serve(conn, buffer, layout: dict[str, tuple], cfg, parts: list[range], num_envs: int, seed: int, stagger: bool,
          stats: tuple[str, ...], teacher=None) -> None:  # fmt: skip
    """A worker's loop (``workers``): the envs of ``parts`` (one range per group) in the shared
    ``buffer``, stepped on the parent's commands through ``conn`` (two bytes: command, group), each answered with
    b"" or, once an engine raised, the error's one line (then the worker exits). Exits when the parent closes its
    end of the pipe or dies. Ignores SIGINT: the trainer decides what a Ctrl-C stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        arrays = batch_arrays(buffer, layout)
        groups = [Sims(cfg, part, num_envs, seed, stagger, stats, arrays, teacher) for part in parts]
        error = b""
    except Exception as err:  # reported with the first answer
        error = one_line(f"{type(err).__name__}: {err}").encode()
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        command, group = message[:1], message[1]
        if command == QUIT:
            return
        if not error:
            try:
                for sims in groups if group == ALL_GROUPS else (groups[group],):
                    sims.run(command)
            except Exception as err:
                error = one_line(f"{type(err).__name__}: {err}").encode()
        try:
            conn.send_bytes(error)
        except OSError:
            return
        if error:
            return
