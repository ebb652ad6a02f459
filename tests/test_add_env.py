"""Adding an env: a class defined here, named by a composed config (``env._target_=tests.test_add_env.Corridor``),
trains through the one env factory, declares an optional output that a loss reads, and is evaluated with every
stat it reports; a loss that reads an output it does not declare is refused with one line; settings read from a
file may still name only machina's own envs."""

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.conformance.env import check_env
from machina.env.base import Env
from machina.env.factory import env_factory
from machina.env.spec import EnvSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.evaluation.evaluator import Evaluator
from machina.files.trusted import in_force
from machina.losses.base import Loss
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config

CORRIDOR = [
    "env=gymnasium",
    "policy=mlp",
    "env._target_=tests.test_add_env.Corridor",
    "~env.id",
    "~env.kwargs",
    "~env.vectorizer",
]
ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled"]
LANDMARKS = "landmarks"  # an optional output no env declares
RIGHT = 2


class Corridor(Env):
    """E one-agent corridors of ``length`` cells: actions 0 left, 1 stay, 2 right; reaching the last cell gives
    reward 1 and puts the agent back at the first. Episodes end at ``max_steps`` (observed: OBS is float32 [E, 2] =
    (position, time) as fractions). Optional output: ``TEACHER_ACTIONS`` (always right). Stats: ``goals``."""

    def __init__(self, length=5, max_steps=40, num_envs=4, seed=0, device="cpu", outputs=frozenset(), stagger=True):
        self.device, self.length, self.max_steps = torch.device(device), length, max_steps
        self.teacher = keys.TEACHER_ACTIONS in outputs
        declared = frozenset({keys.TEACHER_ACTIONS})
        self.spec = EnvSpec(num_envs, 1, 3, VectorObsSpec(2), declared, observes_time=True)
        self.start = torch.arange(num_envs, device=self.device) % max_steps if stagger else None
        self.reset()

    def reset(self):
        e = self.spec.num_envs
        self.pos = torch.zeros(e, dtype=torch.int64, device=self.device)
        self.t = self.start.clone() if self.start is not None else torch.zeros_like(self.pos)
        self.goals = torch.zeros(e, device=self.device)
        self.totals = {name: torch.zeros((), device=self.device) for name in ("episodes", "return", "length")}
        self.totals["goals"] = torch.zeros((), device=self.device)
        self.last = {name: torch.zeros(e, device=self.device) for name in ("return", "length", "goals")}
        self.ended = torch.zeros(e, device=self.device)
        return self.observe()

    def observe(self):
        return self._out(torch.zeros(self.spec.num_envs, device=self.device), self.t < 0)

    def step(self, actions):
        self.pos = (self.pos + actions.to(self.device) - 1).clamp(0, self.length - 1)
        reward = (self.pos == self.length - 1).float()
        self.pos = torch.where(reward > 0, 0, self.pos)
        self.goals += reward
        self.t += 1
        done = self.t >= self.max_steps
        ended = {"return": self.goals, "length": self.t.float(), "goals": self.goals}
        for name, value in ended.items():
            self.totals[name] += (value * done).sum()
            self.last[name] = torch.where(done, value, self.last[name])
        self.totals["episodes"] += done.sum()
        self.ended += done
        self.t = torch.where(done, 0, self.t)
        self.goals = torch.where(done, 0.0, self.goals)
        return self._out(reward, done)

    def episode_stats(self):
        stats = {name: value.clone() for name, value in self.totals.items()}
        for value in self.totals.values():
            value.zero_()
        return stats

    def last_episodes(self):
        return {"episodes": self.ended.clone(), **{name: value.clone() for name, value in self.last.items()}}

    def _out(self, reward, done):
        obs = torch.stack([self.pos / (self.length - 1), self.t / self.max_steps], 1)
        out = {keys.OBS: obs, keys.REWARDS: reward, keys.TERMINATED: torch.zeros_like(done), keys.TRUNCATED: done}
        if self.teacher:
            out[keys.TEACHER_ACTIONS] = torch.full_like(self.pos, RIGHT)
        return TensorDict(out, batch_size=[self.spec.num_envs], device=self.device)


class WantsLandmarks(Loss):
    """Reads an env output that no env declares."""

    env_outputs = frozenset({LANDMARKS})

    def forward(self, minibatch, policy_out, progress):
        return {}


def test_the_new_env_passes_the_conformance_check():
    """What its author runs in one line: the core, its optional output, its episode statistics."""
    check_env(Corridor, {"length": 4, "max_steps": 10})


def test_a_new_env_trains_one_debug_epoch_and_a_loss_gets_its_optional_output():
    cfg = compose_config([*CORRIDOR, *ONE_EPOCH, "losses=[ppo,supervisor]"])
    parts = build(cfg)
    assert isinstance(parts.env, Corridor) and parts.env.teacher  # the builder asked for what supervisor reads
    trainer = build_trainer(cfg, parts, sinks=[])
    trainer.train()
    assert trainer.agent_step == 1024
    stored = parts.experience.buffer[keys.TEACHER_ACTIONS]
    assert (stored == RIGHT).all()  # the env's output reached the loss's buffer column

    plain = build(compose_config([*CORRIDOR, *ONE_EPOCH, "losses=[ppo]"]))
    assert not plain.env.teacher  # no loss reads it: the env is not asked for it


def test_a_loss_reading_an_output_the_env_does_not_declare_is_refused_in_one_line():
    wants = "+losses.wants._target_=tests.test_add_env.WantsLandmarks"
    with pytest.raises(ConfigError) as refused:
        build(compose_config([*CORRIDOR, *ONE_EPOCH, wants]))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "loss 'wants' reads the env output landmarks, which env tests.test_add_env.Corridor does not declare "
        "(its optional outputs: teacher_actions)"
    )
    assert "losses.wants.enabled=false" in message


def test_the_evaluation_uses_the_builder_s_factory_and_reports_every_stat_of_the_env():
    parts = build(compose_config([*CORRIDOR, *ONE_EPOCH]))
    evaluator = Evaluator(parts.make_env, episodes=3, seed=1)
    rows = evaluator.compare(parts.policy)
    assert rows.keys() == {"policy", "teacher", "random"}  # the teacher row: the env declares TEACHER_ACTIONS
    assert {"return", "length", "goals", "goals_std", "teacher_agreement"} <= rows["policy"].keys()
    assert rows["teacher"]["goals"] == 40 // 4  # right every step: 4 steps per goal, 40-step episodes


def test_settings_read_from_a_file_name_a_new_env_only_when_the_configuration_in_force_does():
    settings = {"_target_": "tests.test_add_env.Corridor", "length": 3}
    with pytest.raises(ConfigError, match="which no config on the search path names.*env._target_=") as refused:
        env_factory(settings, "cpu")  # as eval.py reads a run folder: no class named by a file is imported
    assert "\n" not in str(refused.value)
    env = env_factory(settings, "cpu", Corridor)(seed=0, num_envs=2, outputs={keys.TEACHER_ACTIONS})
    assert isinstance(env, Corridor) and env.length == 3 and (env.reset()[keys.TEACHER_ACTIONS] == RIGHT).all()
    # A command whose own configuration names the class (its search path or its composed config) trusts the file.
    trusted = in_force(compose_config([*CORRIDOR, *ONE_EPOCH]))
    env = env_factory(settings, "cpu", trusted=trusted)(seed=0, num_envs=2)
    assert isinstance(env, Corridor) and env.length == 3
    with pytest.raises(ConfigError, match="must subclass machina.env.base.Env"):
        env_factory({"_target_": "collections.OrderedDict"}, "cpu", dict)
