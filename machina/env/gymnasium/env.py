"""GymnasiumEnv: any registered Gymnasium env (``env=gymnasium env.id=CartPole-v1``, the ``gym`` extra) behind the
same reset / step TensorDict interface as the built-in env, one agent per env.

E copies of the env run in a ``gymnasium.vector.SyncVectorEnv`` (one process; the default, fastest for cheap envs
such as classic control) or an ``AsyncVectorEnv`` (one worker process per env, for slow envs), wrapped in
Gymnasium's ``wrappers.vector.RecordEpisodeStatistics`` for episode returns and lengths.

Autoreset: the vector env runs in ``AutoresetMode.SAME_STEP`` (Gymnasium >= 1.1): an env whose episode ends on a
step is reset within that step, the observation it returns is already the new episode's first one, and the final
observation of the ended episode comes in ``infos["final_obs"]``. That is machina's contract (``Env`` in
``base.py``): REWARDS / TERMINATED / TRUNCATED describe the action just taken, OBS is what the policy acts on next.
(Gymnasium's default NEXT_STEP mode would instead spend one extra step per episode on a no-op reset.)

Time limits (``TimeLimit``, ``max_episode_steps``) are not in the observation, so ``spec.observes_time`` is False:
on steps where an env was truncated, ``FINAL_OBS`` carries its final observation and the trainer bootstraps the
truncated step from V(final observation). A step that both terminates and truncates counts as terminated only (a
terminal state has no future to bootstrap).

Spaces: a flat ``Box`` observation (rank 1, any dtype, cast to float32) and a ``Discrete`` action space (a
non-zero ``start`` is added to machina's action ids 0..n-1). Anything else is refused at start-up; image
observations are a later step.

Seeding: env e's first episode is seeded with ``(seed * E + e) * SEED_STRIDE``; later episodes follow from each
env's own generator (Gymnasium's autoreset calls ``reset()`` without a seed), so the same seed gives the same
trajectories for the same actions.
"""

from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.env.base import Env, Renderable, Resumable
from machina.env.episode_tally import EpisodeTally, check_counters
from machina.env.spec import EnvSpec, VectorObsSpec
from machina.errors import ConfigError

STAT_NAMES = ("episodes", "return", "length")
SEED_STRIDE = 1_000_000  # env e's seeds are (seed * E + e) * stride + episodes it ended before (see load_state_dict)
VECTORIZERS = ("sync", "async")
INSTALL_HINT = "env=gymnasium needs the gym extra: pip install -e '.[gym]' (gymnasium>=1.1 with classic control)"


class GymnasiumEnv(Env, Resumable, Renderable):
    """E copies of the Gymnasium env ``id``; see the module docstring.

    Args:
        id: a registered env id (``CartPole-v1``), or ``module:Env-v0`` to import ``module`` first (the module
            registers the id with ``gymnasium.register``).
        kwargs: keyword arguments of ``gymnasium.make`` for the env (``{"sutton_barto_reward": true}``).
        vectorizer: ``sync`` (one process) or ``async`` (a worker process per env).
        max_steps: the episode time limit, passed to ``gymnasium.make`` as ``max_episode_steps`` (None: the
            registered one).
        num_envs, seed, device, outputs, stagger: the env factory's arguments (``base.py``). A Gymnasium env
            declares no optional outputs (``spec.outputs`` is empty), so ``outputs`` asks for nothing; ``stagger``
            changes nothing, since episodes of Gymnasium envs end at different steps by themselves.

    Capabilities (``machina.env.base``): ``Resumable`` without continuing episodes (a Gymnasium env's state cannot
    be saved: the episode counters and stat sums are, and a restored env starts new episodes with the seeds that
    follow them); ``Renderable`` where the env draws ``rgb_array`` frames.
    """

    continues_episodes = False

    def __init__(
        self,
        id: str = "CartPole-v1",
        kwargs: dict[str, Any] | None = None,
        vectorizer: str = "sync",
        max_steps: int | None = None,
        num_envs: int = 4,
        seed: int = 0,
        device: str | torch.device = "cpu",
        outputs: Collection[str] = frozenset(),
        stagger: bool = True,
    ):
        try:
            import gymnasium as gym
            from gymnasium.wrappers.vector import RecordEpisodeStatistics
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
        if not hasattr(gym.vector, "AutoresetMode"):
            raise ConfigError(f"env=gymnasium needs gymnasium>=1.1 (autoreset modes), found {gym.__version__}")
        if vectorizer not in VECTORIZERS:
            raise ConfigError(f"env.vectorizer={vectorizer!r} must be one of {', '.join(VECTORIZERS)}")
        checks.integer("env.num_envs", num_envs, 1)
        self.device = torch.device(device)
        self.num_envs = self.num_agents = num_envs
        self.id, self.seed = id, seed
        make_kwargs = dict(kwargs or {})
        if max_steps is not None:
            make_kwargs["max_episode_steps"] = max_steps

        try:
            probe = gym.make(id, **make_kwargs)
        except (gym.error.Error, ImportError) as err:  # an unknown id, or a module in the id that does not import
            raise ConfigError(f"env.id={id}: {' '.join(str(err).split())}") from None
        except TypeError as err:  # the env's constructor does not take a keyword of env.kwargs
            raise ConfigError(f"env.id={id}: {err}; check env.kwargs") from None
        obs_space, action_space = probe.observation_space, probe.action_space
        can_render = "rgb_array" in probe.metadata.get("render_modes", ())
        probe.close()
        check_spaces(id, obs_space, action_space, gym.spaces)
        if can_render:
            make_kwargs.setdefault("render_mode", "rgb_array")  # frames for replays; drawn only when asked for

        vector_cls = gym.vector.SyncVectorEnv if vectorizer == "sync" else gym.vector.AsyncVectorEnv
        fns = [lambda: gym.make(id, **make_kwargs) for _ in range(num_envs)]
        self.vec = RecordEpisodeStatistics(vector_cls(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
        self.vec.action_space.seed(seed)
        self.action_start = int(action_space.start)
        obs_size = int(obs_space.shape[0])
        self.spec = EnvSpec(
            num_envs,
            agents_per_env=1,
            num_actions=int(action_space.n),
            obs=VectorObsSpec(obs_size),
            outputs=frozenset(),
            observes_time=False,
        )

        # Host staging buffers: pinned on an accelerator, so each step's copy to the device is asynchronous. They
        # are rewritten only on the next step, after its actions.cpu() has waited for the copies queued before.
        pin = self.device.type != "cpu"
        self.host = TensorDict(
            {
                keys.OBS: torch.zeros(num_envs, obs_size),
                keys.REWARDS: torch.zeros(num_envs),
                keys.TERMINATED: torch.zeros(num_envs, dtype=torch.bool),
                keys.TRUNCATED: torch.zeros(num_envs, dtype=torch.bool),
            },
            batch_size=[num_envs],
        )
        self.final_obs = torch.zeros(num_envs, obs_size)
        if pin:
            self.host, self.final_obs = self.host.pin_memory(), self.final_obs.pin_memory()
        self.episodes = np.zeros(num_envs, dtype=np.int64)  # episodes ended per env since the first reset
        self.tally = EpisodeTally(STAT_NAMES, num_envs)
        self._start(self.episodes)

    # ----------------------------------------------------------------------------------------------- public API
    def reset(self) -> TensorDict:
        """New first episodes in every env, seeded from ``seed``; clears episode stats. Returns ``observe()``."""
        self.episodes[:] = 0
        self._start(self.episodes)
        return self.observe()

    def observe(self) -> TensorDict:
        """The current observations (float32 [N, D]) with zero rewards and no episode ends, as ``reset`` returns."""
        self.host[keys.REWARDS].zero_()
        self.host[keys.TERMINATED].zero_()
        self.host[keys.TRUNCATED].zero_()
        return self._output()

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every env by one step.

        actions: int64 (or int32) [N], ids in [0, num_actions). Returns a TensorDict, batch [N], on ``device``: OBS
        float32 [N, D] (the next episode's first observation where one ended), REWARDS float32 [N], TERMINATED and
        TRUNCATED bool [N], and FINAL_OBS float32 [N, D] on steps where some env was truncated (its final
        observation; rows of the other envs are their current observation).
        """
        if actions.shape != (self.num_envs,) or actions.dtype not in (torch.int64, torch.int32):
            got = f"{actions.dtype} {list(actions.shape)}"
            raise ValueError(f"actions must be int64 or int32 [{self.num_envs}] (num_envs), got {got}")
        ids = actions.cpu().numpy()  # a host env: the one device read of a step
        if ((ids < 0) | (ids >= self.spec.num_actions)).any():
            raise ValueError(f"action ids must be in [0, {self.spec.num_actions})")
        obs, rewards, terminated, truncated, infos = self.vec.step(ids + self.action_start)
        truncated = truncated & ~terminated
        self._write_obs(obs)
        self.host[keys.REWARDS].copy_(torch.from_numpy(np.asarray(rewards, dtype=np.float32)))
        self.host[keys.TERMINATED].copy_(torch.from_numpy(terminated))
        self.host[keys.TRUNCATED].copy_(torch.from_numpy(truncated))
        if "episode" in infos:
            self._record(infos["_episode"], infos["episode"])
        out = self._output()
        if truncated.any():
            final = self.final_obs
            final.copy_(self.host[keys.OBS])
            for e in np.flatnonzero(truncated):
                final[e] = torch.from_numpy(np.asarray(infos["final_obs"][e], dtype=np.float32))
            out[keys.FINAL_OBS] = final.to(self.device, non_blocking=True) if self.pinned else final.clone()
        return out

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the episodes that ended since the last call, as 0-d float32 tensors on the device:
        ``episodes``, ``return`` (undiscounted), ``length`` (steps). Resets the sums."""
        return self.tally.pop_sums(self.device)

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per env, float32 [E]: ``episodes`` ended since ``reset`` and the return and length of its latest one."""
        return self.tally.latest(self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Episode counters and stat sums. A Gymnasium env's state cannot be saved: a restored env starts new
        episodes, seeded with the seeds that follow the saved counters."""
        return {
            "episodes": torch.from_numpy(self.episodes.copy()),
            "totals": torch.from_numpy(self.tally.totals.copy()),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings (new episodes, see ``state_dict``), once
        checked (``episode_tally.check_counters``)."""
        episodes, totals = check_counters(state, "episodes", self.num_envs, len(self.tally.totals), SEED_STRIDE)
        self.episodes[:] = episodes.numpy()
        self._start(self.episodes)
        self.tally.totals[:] = totals.numpy()

    def render(self, env_index: int = 0, **options: object) -> np.ndarray:
        """Env ``env_index``'s frame as uint8 RGB [H, W, 3], where the env renders ``rgb_array`` (drawing options
        such as ``cell`` are machina_1's and are ignored here)."""
        if self.vec.render_mode != "rgb_array":
            raise NotImplementedError(
                f"{self.id} cannot render frames (no rgb_array render mode), so it has no replays"
            )
        if hasattr(self.vec.unwrapped, "envs"):  # SyncVectorEnv: draw only the env asked for
            return np.asarray(self.vec.unwrapped.envs[env_index].render(), dtype=np.uint8)
        return np.asarray(self.vec.unwrapped.call("render")[env_index], dtype=np.uint8)

    # ------------------------------------------------------------------------------------------------ internals
    @property
    def pinned(self) -> bool:
        return self.device.type != "cpu"

    def _start(self, episodes: np.ndarray) -> None:
        """Reset every env with its seed for the given episode counters, and clear the stats."""
        seeds = [(self.seed * self.num_envs + e) * SEED_STRIDE + int(episodes[e]) for e in range(self.num_envs)]
        obs, _ = self.vec.reset(seed=seeds)
        self._write_obs(obs)
        self.tally.clear()

    def _record(self, ended: np.ndarray, episode: dict[str, np.ndarray]) -> None:
        """Add the episodes RecordEpisodeStatistics reports as ended (``ended`` bool [E]) to the sums."""
        self.tally.add(ended, np.stack([episode["r"][ended], episode["l"][ended]], axis=1))
        self.episodes += ended

    def _write_obs(self, obs: np.ndarray) -> None:
        self.host[keys.OBS].copy_(torch.from_numpy(np.asarray(obs, dtype=np.float32)))

    def _output(self) -> TensorDict:
        if self.pinned:
            return self.host.to(self.device, non_blocking=True)
        return self.host.clone()  # the host buffers are rewritten by the next step


def check_spaces(env_id: str, obs_space: Any, action_space: Any, spaces: Any) -> None:
    """Refuse, naming the space, anything but a flat Box observation and a Discrete action space."""
    if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(
            f"env.id={env_id}: observation space {obs_space} is not supported: machina takes a flat Box observation "
            "(a vector of shape (D,); images are a later step)"
        )
    if not isinstance(action_space, spaces.Discrete):
        raise ConfigError(
            f"env.id={env_id}: action space {action_space} is not supported: machina takes a Discrete action space"
        )
