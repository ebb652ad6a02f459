"""The env conformance check (``machina.conformance.env.check_env``) over every env ``conf/env`` names, an env with
only the required core that passes it, trains, checkpoints and resumes (its episodes anew, said in one warning),
and broken envs that fail it with the sentence that says what to implement."""

import logging

import hydra
import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.conformance.env import check_env
from machina.conformance.failure import ConformanceError
from machina.env.base import Env, Resumable
from machina.env.factory import env_factory
from machina.env.spec import EnvSpec, VectorObsSpec
from machina.run import train
from tests.conftest import CONF, compose_config

ENV_NAMES = sorted(path.stem for path in (CONF / "env").glob("*.yaml"))
LANE = [
    "env=gymnasium",
    "policy=mlp",
    "env._target_=tests.test_env_conformance.Lane",
    "~env.id",
    "~env.kwargs",
    "~env.vectorizer",
]
EPOCH = 256  # agent steps per epoch below: 16 lanes x 16 steps
SMALL = ["debug=tiny", f"experience.batch_size={EPOCH}", "experience.minibatch_size=64", "wandb=disabled"]


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_env_of_conf_passes_the_check(name):
    cfg = compose_config([f"env={name}", "debug=tiny"])
    if cfg.env._target_.startswith("machina.env.mettagrid."):
        pytest.importorskip("mettagrid")
    make_env = env_factory(cfg.env, "cpu", env_class=hydra.utils.get_class(cfg.env._target_))
    check_env(make_env)


class Lane(Env):
    """Only the required core: E one-agent lanes of ``length`` cells; actions 0 left, 1 stay, 2 right; reaching the
    last cell gives reward 1 and puts the agent back at the first. Episodes end at ``max_steps`` (observed: OBS is
    float32 [E, 2] = (position, time) as fractions)."""

    def __init__(self, length=4, max_steps=12, num_envs=4, seed=0, device="cpu", outputs=frozenset(), stagger=True):
        self.device, self.length, self.max_steps = torch.device(device), length, max_steps
        self.spec = EnvSpec(num_envs, 1, 3, VectorObsSpec(2), frozenset(), observes_time=True)
        self.start = torch.arange(num_envs, device=self.device) % max_steps if stagger else None
        self.reset()

    def reset(self):
        e = self.spec.num_envs
        self.pos = torch.zeros(e, dtype=torch.int64, device=self.device)
        self.t = self.start.clone() if self.start is not None else torch.zeros_like(self.pos)
        self.goals = torch.zeros(e, device=self.device)
        self.sums = {name: torch.zeros((), device=self.device) for name in ("episodes", "return", "length")}
        self.last = {name: torch.zeros(e, device=self.device) for name in ("episodes", "return", "length")}
        return self._out(torch.zeros(e, device=self.device), torch.zeros(e, dtype=torch.bool, device=self.device))

    def step(self, actions):
        self.pos = (self.pos + actions - 1).clamp(0, self.length - 1)
        reward = (self.pos == self.length - 1).float()
        self.pos = torch.where(reward > 0, 0, self.pos)
        self.goals += reward
        self.t += 1
        done = self.t >= self.max_steps
        ended = {"episodes": torch.ones_like(self.goals), "return": self.goals, "length": self.t.float()}
        for name, value in ended.items():
            self.sums[name] += (value * done).sum()
            self.last[name] = torch.where(done, self.last[name] + 1 if name == "episodes" else value, self.last[name])
        self.t = torch.where(done, 0, self.t)
        self.goals = torch.where(done, 0.0, self.goals)
        return self._out(reward, done)

    def episode_stats(self):
        stats = {name: value.clone() for name, value in self.sums.items()}
        for value in self.sums.values():
            value.zero_()
        return stats

    def last_episodes(self):
        return {name: value.clone() for name, value in self.last.items()}

    def _out(self, reward, done):
        obs = torch.stack([self.pos / (self.length - 1), self.t / self.max_steps], 1)
        out = {keys.OBS: obs, keys.REWARDS: reward, keys.TERMINATED: torch.zeros_like(done), keys.TRUNCATED: done}
        return TensorDict(out, batch_size=[self.spec.num_envs], device=self.device)


def test_an_env_with_only_the_core_passes_trains_checkpoints_and_resumes_its_episodes_anew(tmp_path, caplog):
    check_env(Lane, {"length": 5})
    run_dir = tmp_path / "run"
    cfg = [*LANE, *SMALL, "trainer.checkpoint_interval=1"]
    train(compose_config([*cfg, f"trainer.total_timesteps={EPOCH}"]), run_dir)
    assert (run_dir / "checkpoints" / "checkpoint_000001.pt").exists()
    with caplog.at_level(logging.WARNING, logger="machina.training.trainer"):
        train(compose_config([*cfg, f"trainer.total_timesteps={2 * EPOCH}"]), run_dir)
    warned = [r.getMessage() for r in caplog.records if "resumable" in r.getMessage()]
    assert warned == ["Lane has no resumable state (machina.env.base.Resumable): its episodes start anew"]
    assert (run_dir / "checkpoints" / "checkpoint_000002.pt").exists()


class WideObs(Lane):
    def _out(self, reward, done):
        out = super()._out(reward, done)
        out[keys.OBS] = torch.cat([out[keys.OBS], out[keys.OBS][:, :1]], 1)
        return out


class DoubleRewards(Lane):
    def _out(self, reward, done):
        out = super()._out(reward, done)
        out[keys.REWARDS] = out[keys.REWARDS].double()
        return out


class NoLength(Lane):
    def episode_stats(self):
        stats = super().episode_stats()
        del stats["length"]
        return stats


class ForgetsTime(Lane, Resumable):
    """Claims resumable state but saves only the positions: a restored copy runs on another clock."""

    def observe(self):
        return self._out(torch.zeros(self.spec.num_envs), torch.zeros(self.spec.num_envs, dtype=torch.bool))

    def state_dict(self):
        return {"pos": self.pos.clone()}

    def load_state_dict(self, state):
        self.pos = state["pos"].clone()


class NoTeacher(Lane):
    """Declares teacher actions among its outputs but never returns them."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.spec = EnvSpec(self.spec.num_envs, 1, 3, VectorObsSpec(2), frozenset({keys.TEACHER_ACTIONS}), True)


class UndeclaredState(Lane):
    """Saves its state but does not say so: the trainer would never checkpoint it."""

    observe, state_dict, load_state_dict = ForgetsTime.observe, ForgetsTime.state_dict, ForgetsTime.load_state_dict


class Untimed(Lane):
    """Says its observation lacks the time, but never hands the final observation of a truncated episode."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.spec = EnvSpec(self.spec.num_envs, 1, 3, VectorObsSpec(2), frozenset(), observes_time=False)


class OldFlags(Lane):
    capturable = True


@pytest.mark.parametrize(
    "env_class, sentence",
    [
        (WideObs, "WideObs.reset returns env_obs as torch.float32 (4, 3): return torch.float32 (4, 2)"),
        (DoubleRewards, "DoubleRewards.reset returns rewards as torch.float64 (4,): return torch.float32 (4,)"),
        (NoLength, "NoLength.episode_stats returned ['episodes', 'return']: return a dict with at least episodes, "),
        (ForgetsTime, "ForgetsTime: a restored copy does not continue the original (observe() differs in env_obs)"),
        (NoTeacher, "NoTeacher.reset returns no teacher_actions: return every key the env contract and outputs"),
        (UndeclaredState, "UndeclaredState implements observe, state_dict, load_state_dict but is not machina.env."),
        (Untimed, "Untimed.step returns no final_obs on a step with a truncation: with spec.observes_time False, "),
        (OldFlags, "OldFlags sets capturable but is not machina.env.base.Capturable, so the trainer never reads it"),
    ],
)
def test_a_broken_env_fails_with_one_sentence_saying_what_to_implement(env_class, sentence):
    with pytest.raises(ConformanceError) as failed:
        check_env(env_class, num_envs=4)
    message = str(failed.value)
    assert message.startswith(sentence), message
    assert "\n" not in message and message.count(". ") == 0 and message.endswith(".")
