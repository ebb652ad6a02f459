"""The numbers of an evaluation: full episodes on fixed layouts, for a policy, the env's scripted teacher (where the
env declares ``TEACHER_ACTIONS`` among its outputs) and a uniform random policy.

An ``Evaluator`` builds its own envs with an env factory (``machina.env.factory.env_factory``): E = ``episodes``
envs from ``seed``, all starting at step 0 (``stagger=False``), played until every env has ended one episode, and
reduces each env's first episode (``Env.last_episodes``) to means and spreads. Every call replays the same layouts
with the same action-sampling seed, so the numbers of two checkpoints (or of the same one twice) compare like for
like. It never touches the training env, and it runs under a forked torch RNG, so the global RNG (and hence
training) is the same with or without it, and with no bf16-rounded products (``machina.precision``), so a run's
periodic evaluation and ``eval.py`` score a policy alike on a CPU whatever the run's speed settings. It uses only
the public ``Env`` API, so it works for every env.
"""

from collections.abc import Callable
from contextlib import closing

import numpy as np
import torch
from torch import nn

from machina import keys
from machina.env.base import Env, Renderable
from machina.env.spec import EnvSpec, ObsSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.evaluation.actors import Actor, PolicyActor, random_actor, teacher_actor
from machina.evaluation.episodes import first_episodes, play
from machina.evaluation.rng import forked_rng
from machina.precision import float32_products

TEACHER = frozenset({keys.TEACHER_ACTIONS})
STEP_LIMIT = 100_000  # steps an evaluation plays at most, waiting for every env to end an episode


class Evaluator:
    """Evaluates policies on ``episodes`` episodes of fixed layouts.

    Args:
        make_env: ``make_env(seed=..., num_envs=..., stagger=..., outputs=...)`` -> an env (``env_factory``); the
            evaluation's envs are on that env's device, where the policy must be too.
        episodes: episodes per evaluation, played side by side (one per env).
        greedy: argmax actions instead of sampled ones.
        seed: seeds the layouts and the action sampling.
        step_limit: steps played at most; envs that have not ended an episode by then are left out of the numbers
            (``episodes`` says how many were counted).
    """

    def __init__(
        self,
        make_env: Callable[..., Env],
        episodes: int = 32,
        greedy: bool = False,
        seed: int = 0,
        step_limit: int = STEP_LIMIT,
    ):
        if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
            raise ConfigError(f"episodes must be a positive integer, got {episodes!r}")
        self.make_env, self.episodes, self.greedy, self.seed = make_env, episodes, bool(greedy), seed
        self.step_limit = step_limit
        with closing(make_env(num_envs=1, seed=seed, stagger=False)) as probe:
            self.spec: EnvSpec = probe.spec
            self.device = probe.device
            episode = getattr(probe, "max_steps", None)  # an episode's length, where the env tells it
        if isinstance(episode, int) and not 0 < episode <= step_limit:
            why = "have no time limit" if episode <= 0 else "are longer"
            raise ConfigError(
                f"env.max_steps={episode}: an evaluation plays at most {step_limit:,} steps, and its episodes {why}; "
                f"give env.max_steps=N (at most {step_limit:,})"
            )

    def env(self, num_envs: int | None = None, outputs: frozenset[str] = frozenset()) -> Env:
        """A fresh env on the evaluation layouts (``num_envs`` defaults to ``episodes``) returning the optional
        ``outputs`` it declares among those asked for."""
        outputs = outputs & self.spec.outputs
        return self.make_env(num_envs=num_envs or self.episodes, seed=self.seed, stagger=False, outputs=outputs)

    def check(self, obs_spec: ObsSpec | VectorObsSpec, num_actions: int) -> None:
        """Refuse a policy built for other observations or actions than this env's, naming what differs."""
        if obs_spec != self.spec.obs or num_actions != self.spec.num_actions:
            raise ConfigError(
                f"the policy was trained on observations {obs_spec} and {num_actions} actions, but this env has "
                f"{self.spec.obs} and {self.spec.num_actions} actions; evaluate with the training run's env settings "
                "(its env.* values, e.g. env.max_tokens or env.num_vibes)"
            )

    @torch.no_grad()
    def evaluate(self, policy: nn.Module) -> dict[str, float]:
        """Mean and spread of the policy's episodes: ``eval/<stat>`` and ``eval/<stat>_std`` for every stat of the
        env's episodes (machina_1: ``return`` per agent, ``length``, ``hearts_made``, ``hearts_deposited``,
        ``resources_gathered`` per env), ``eval/episodes`` (how many were counted) and, where the env declares
        ``TEACHER_ACTIONS``, ``eval/teacher_agreement`` (share of its agent-steps whose most likely action is the
        teacher's)."""
        return {f"eval/{k}": v for k, v in self._policy_row(policy).items()}

    @torch.no_grad()
    def compare(self, policy: nn.Module) -> dict[str, dict[str, float]]:
        """Rows ``policy``, ``teacher`` (where the env declares ``TEACHER_ACTIONS``) and ``random`` (keys as
        ``evaluate`` without the
        ``eval/`` prefix), all on the same layouts (each row plays a fresh env)."""
        generator = torch.Generator(self.device).manual_seed(self.seed)
        rows = {"policy": self._policy_row(policy)}
        if keys.TEACHER_ACTIONS in self.spec.outputs:
            rows["teacher"] = self._row(self.env(outputs=TEACHER), teacher_actor)
        rows["random"] = self._row(self.env(), random_actor(self.spec.num_actions, generator))
        return rows

    def check_replays(self, way_out: str) -> None:
        """Refuse, before anything is played, an env that cannot draw replay frames: one that is not
        ``machina.env.base.Renderable``, or whose ``render`` refuses (NotImplementedError: a Gymnasium env without
        ``rgb_array`` frames). ``way_out`` is the setting that turns replays off (``replay=false``). It asks for a
        frame without drawing options, which every ``render`` takes."""
        with closing(self.env(num_envs=1)) as env:
            if not isinstance(env, Renderable):
                raise ConfigError(
                    f"{type(env).__name__} cannot render frames (it is not machina.env.base.Renderable), so it has no "
                    f"replays; set {way_out}"
                )
            try:
                env.render(0)
            except NotImplementedError as err:
                raise ConfigError(f"{err}; set {way_out}") from None

    @torch.no_grad()
    def episode_frames(self, policy: nn.Module, steps: int | None = None, **render: object) -> list[np.ndarray]:
        """Frames (``Renderable.render``, with the ``render`` options; ``check_replays`` first) of the first env's
        episode with the policy, one per step before it acts: ``steps`` of them, or the whole first episode. Sampling
        as in ``evaluate``."""
        env = self.env(num_envs=1)
        actor = PolicyActor(policy, env.spec.num_agents, self.greedy)
        frames = []
        with closing(env), forked_rng(self.seed, self.device), float32_products(), policy.weights_fixed():
            for step_count, _ in enumerate(play(env, actor)):
                ended = step_count > 0 and env.last_episodes()["episodes"][0] > 0
                if step_count == (steps or self.step_limit) or (steps is None and ended):
                    break
                frames.append(env.render(0, **render))
        return frames

    def _policy_row(self, policy: nn.Module) -> dict[str, float]:
        env = self.env(outputs=TEACHER)  # the teacher's actions, where declared, for the policy's agreement with them
        actor = PolicyActor(policy, env.spec.num_agents, self.greedy)
        with forked_rng(self.seed, self.device), float32_products(), policy.weights_fixed():
            row = self._row(env, actor)
        if keys.TEACHER_ACTIONS in self.spec.outputs:
            row["teacher_agreement"] = actor.agreement()
        return row

    def _row(self, env: Env, actor: Actor) -> dict[str, float]:
        """The row of ``env``'s first episodes played by ``actor``; closes ``env``."""
        with closing(env):
            stats = first_episodes(env, actor, self.step_limit)
        row = {"episodes": float(len(next(iter(stats.values()))))}
        for name, values in stats.items():
            row[name], row[f"{name}_std"] = values.mean().item(), values.std(correction=0).item()
        return row
