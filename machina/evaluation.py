"""Evaluation: full episodes on fixed layouts, for a policy, the scripted teacher and a uniform random policy.

An ``Evaluator`` builds its own env (``SyncedEnv``: E = ``episodes`` envs, all starting at step 0 on layouts drawn
from ``seed``), plays exactly ``max_steps`` steps so that every env plays one full episode, and reduces each env's
episode stats to means and spreads. Every call replays the same layouts with the same action-sampling seed, so the
numbers of two checkpoints (or of the same one twice) compare like for like. It never touches the training env,
and it runs under a forked torch RNG, so the global RNG (and hence training) is the same with or without it.
"""

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.spec import EnvSpec, ObsSpec
from machina.errors import ConfigError
from machina.policy.inputs import next_state, rollout_input

# Columns of Machina1Env's per-env episode sums ``state["ep"]`` (return is summed over the env's agents there).
EPISODE_COLUMNS = ("return", "length", "hearts_made", "hearts_deposited", "resources_gathered")
# Set by the Evaluator itself, not taken from the env settings it is given.
OWN_SETTINGS = ("_target_", "num_envs", "seed", "device", "teacher")

Actor = Callable[[TensorDict], torch.Tensor]  # a step TensorDict [N] (OBS, EPISODE_START, ...) -> int64 actions [N]


class SyncedEnv(Machina1Env):
    """A Machina1Env whose envs all start their episodes at step 0 (no stagger): after ``max_steps`` steps every env
    has played exactly one full episode. ``last_episode`` float32 [E, 5] holds each env's sums (``EPISODE_COLUMNS``)
    of its last ended episode, which Machina1Env only reports summed over envs.

    It overrides two internals of Machina1Env (``_start_all``, ``_end_episodes``) and turns ``sync_free`` off; a
    ``stagger`` constructor option and per-env stats in the env itself would make this class unnecessary.
    """

    def _start_all(self) -> None:
        super()._start_all()
        self.state["t"].zero_()
        # Every env ends on the same step: reset exactly the ended envs, with a host sync per step (harmless outside
        # training), instead of a fixed number of envs per step sized for the stagger.
        self.sync_free = False
        self.last_episode = torch.zeros_like(self.state["ep"])

    def _end_episodes(self, done: torch.Tensor) -> None:
        self.last_episode = torch.where(done.unsqueeze(1), self.state["ep"], self.last_episode)
        super()._end_episodes(done)


class PolicyActor:
    """Acts with ``policy`` for ``num_agents`` agents, carrying each agent's recurrent state between calls.
    ``greedy`` takes the argmax of the logits; otherwise actions are sampled (from the global torch RNG).

    Where the step carries ``TEACHER_ACTIONS``, it also counts the steps whose most likely action is the teacher's
    (the training metric ``teacher_agreement``, measured here on the policy's own episodes).
    """

    def __init__(self, policy: nn.Module, num_agents: int, greedy: bool):
        self.policy, self.greedy = policy, greedy
        device = next(policy.parameters()).device
        self.state = policy.initial_state(num_agents, device)
        self.agreed = torch.zeros((), device=device)
        self.compared = 0

    def __call__(self, step: TensorDict) -> torch.Tensor:
        out = self.policy(rollout_input(step, self.state))
        self.state = next_state(out, self.state)
        likeliest = out[keys.LOGITS].argmax(-1).squeeze(1)
        if keys.TEACHER_ACTIONS in step.keys():
            self.agreed += (likeliest == step[keys.TEACHER_ACTIONS]).sum()
            self.compared += likeliest.numel()
        return likeliest if self.greedy else out[keys.ACTIONS].squeeze(1)

    def agreement(self) -> float:
        """Share of the compared agent-steps where the policy's most likely action was the teacher's."""
        return self.agreed.item() / max(self.compared, 1)


def teacher_actor(step: TensorDict) -> torch.Tensor:
    """The env's scripted teacher (needs an env built with ``teacher=True``)."""
    return step[keys.TEACHER_ACTIONS]


def random_actor(num_actions: int, generator: torch.Generator) -> Actor:
    """Uniform random actions drawn from ``generator`` (on the env's device)."""
    return lambda step: torch.randint(
        num_actions, step.batch_size, generator=generator, device=generator.device, dtype=torch.int64
    )


def play(env, actor: Actor, steps: int) -> Iterator[TensorDict]:
    """Step ``env`` from its current state ``steps`` times with ``actor``'s actions; yield each step TensorDict [N]
    before it is acted on (a fresh SyncedEnv shows t = 0 .. steps - 1). ``EPISODE_START`` is set as the trainer
    sets it."""
    step = env.observe()
    step[keys.EPISODE_START] = torch.ones(env.spec.num_agents, device=env.device)
    for _ in range(steps):
        yield step
        step = env.step(actor(step))
        step[keys.EPISODE_START] = (step[keys.TERMINATED] | step[keys.TRUNCATED]).float()


@contextmanager
def forked_rng(seed: int, device: torch.device):
    """Run the block on torch's global RNG (and the device's) seeded with ``seed``; restore both afterwards."""
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    devices = [index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class Evaluator:
    """Evaluates policies on ``episodes`` full episodes of fixed layouts.

    Args:
        env: the env settings (``Machina1Env`` constructor arguments as plain values, e.g. the resolved ``env``
            config); ``_target_``, ``num_envs``, ``seed``, ``device`` and ``teacher`` in it are ignored.
        episodes: episodes per evaluation, played side by side (one per env).
        greedy: argmax actions instead of sampled ones.
        seed: seeds the layouts and the action sampling.
        device: where the env and the policy run.
    """

    def __init__(
        self,
        env: Mapping[str, Any],
        episodes: int = 32,
        greedy: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
            raise ConfigError(f"episodes must be a positive integer, got {episodes!r}")
        self.settings = {k: v for k, v in env.items() if k not in OWN_SETTINGS}
        self.episodes, self.greedy, self.seed = episodes, bool(greedy), seed
        self.device = torch.device(device)
        self.spec: EnvSpec = self.make_env(num_envs=1).spec

    def make_env(self, num_envs: int | None = None, teacher: bool = False) -> SyncedEnv:
        """A fresh SyncedEnv on the evaluation layouts (``num_envs`` defaults to ``episodes``)."""
        return SyncedEnv(
            **self.settings, num_envs=num_envs or self.episodes, seed=self.seed, device=self.device, teacher=teacher
        )

    def check(self, obs_spec: ObsSpec, num_actions: int) -> None:
        """Refuse a policy built for other observations or actions than this env's, naming what differs."""
        if obs_spec != self.spec.obs or num_actions != self.spec.num_actions:
            raise ConfigError(
                f"the policy was trained on observations {obs_spec.max_tokens} tokens x {obs_spec.num_features} "
                f"features and {num_actions} actions, but this env has {self.spec.obs.max_tokens} tokens x "
                f"{self.spec.obs.num_features} features and {self.spec.num_actions} actions; evaluate with the "
                "training run's env settings (env.max_tokens, env.num_vibes, env.extractor_cooldown, "
                "env.inventory_cap)"
            )

    @torch.no_grad()
    def evaluate(self, policy: nn.Module) -> dict[str, float]:
        """Mean and spread of the policy's episodes: ``eval/return`` (per agent), ``eval/hearts_made``,
        ``eval/hearts_deposited``, ``eval/resources_gathered`` (per env), ``eval/length``, each with ``_std``, and
        ``eval/teacher_agreement`` (share of its agent-steps whose most likely action is the teacher's)."""
        return {f"eval/{k}": v for k, v in self._policy_row(policy).items()}

    @torch.no_grad()
    def compare(self, policy: nn.Module) -> dict[str, dict[str, float]]:
        """Rows ``policy``, ``teacher`` and ``random`` (keys as ``evaluate`` without the ``eval/`` prefix), all
        on the same layouts (each row plays a fresh env)."""
        generator = torch.Generator(self.device).manual_seed(self.seed)
        return {
            "policy": self._policy_row(policy),
            "teacher": self._run(self.make_env(teacher=True), teacher_actor),
            "random": self._run(self.make_env(), random_actor(self.spec.num_actions, generator)),
        }

    def _policy_row(self, policy: nn.Module) -> dict[str, float]:
        env = self.make_env(teacher=True)
        actor = PolicyActor(policy, env.spec.num_agents, self.greedy)
        with forked_rng(self.seed, self.device):
            row = self._run(env, actor)
        row["teacher_agreement"] = actor.agreement()
        return row

    def _run(self, env: SyncedEnv, actor: Actor) -> dict[str, float]:
        for _ in play(env, actor, env.max_steps):
            pass
        episodes = env.last_episode.clone()
        episodes[:, 0] /= env.agents_per_env  # per-agent return, as overview/reward reports it
        mean, std = episodes.mean(0).tolist(), episodes.std(0, correction=0).tolist()
        row = {"episodes": float(env.num_envs)}
        for i, name in enumerate(EPISODE_COLUMNS):
            row[name], row[f"{name}_std"] = mean[i], std[i]
        return row
