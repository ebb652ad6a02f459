"""Evaluation, replays and eval.py: reproducible numbers on fixed layouts for any env, a GIF of the right length,
eval.json, and the env settings of the evaluated run."""

import json

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image
from tensordict import TensorDict

from machina import keys
from machina.env.base import Env
from machina.env.factory import env_factory
from machina.env.machina_1.env import STAT_NAMES
from machina.env.spec import EnvSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.evaluation.actors import PolicyActor, random_actor
from machina.evaluation.episodes import first_episodes
from machina.evaluation.evaluator import Evaluator
from machina.evaluation.gif import save_gif
from machina.policy.io import policy_payload
from tests.commands import Result, run_script
from tests.conftest import compose_config

TINY_ENV = ["env.height=7", "env.width=7", "env.max_steps=40"]


@pytest.fixture(scope="module")
def tiny():
    """A composed config of a 7x7 env with 40-step episodes, an Evaluator on it and a fresh policy."""
    cfg = compose_config(TINY_ENV)
    evaluator = Evaluator(env_factory(cfg.env, "cpu"), episodes=8, seed=3)
    torch.manual_seed(0)
    policy = instantiate(cfg.policy, obs_spec=evaluator.spec.obs, num_actions=evaluator.spec.num_actions)
    return cfg, evaluator, policy


def test_evaluation_is_reproducible_and_the_teacher_beats_random(tiny):
    cfg, evaluator, policy = tiny
    rng = torch.get_rng_state()
    first = evaluator.compare(policy)
    assert torch.equal(torch.get_rng_state(), rng), "evaluation must not move the global RNG"
    assert evaluator.compare(policy) == first
    for row in first.values():
        assert row["episodes"] == 8 and row["length"] == 40 and row["length_std"] == 0  # full episodes only
    assert first["teacher"]["return"] > first["random"]["return"] + 0.1
    assert first["teacher"]["hearts_made"] > 0 and first["random"]["hearts_made"] == 0

    metrics = evaluator.evaluate(policy)
    assert metrics == {f"eval/{k}": v for k, v in first["policy"].items()}
    greedy = Evaluator(env_factory(cfg.env, "cpu"), episodes=8, greedy=True, seed=3).evaluate(policy)
    assert greedy["eval/episodes"] == 8 and greedy != metrics


def test_policy_actor_counts_agreement_with_the_teacher(tiny):
    _, evaluator, policy = tiny
    env = evaluator.env(outputs=frozenset({keys.TEACHER_ACTIONS}))
    step = env.reset().clone()
    step[keys.EPISODE_START] = torch.ones(env.spec.num_agents)
    n = env.spec.num_agents
    with torch.no_grad():
        actor = PolicyActor(policy, n, greedy=True)
        likeliest = actor(step)  # greedy: the most likely actions
        actor(step.exclude(keys.TEACHER_ACTIONS))  # no teacher in the step: not counted
        expected = (likeliest == step[keys.TEACHER_ACTIONS]).sum().item() / n
        assert actor.compared == n and actor.agreement() == pytest.approx(expected)
        assert expected < 1.0  # an untrained policy does not play the teacher

        fresh = PolicyActor(policy, n, greedy=True)  # same state and step -> the same argmax
        fresh(step.clone().set(keys.TEACHER_ACTIONS, likeliest))
        assert fresh.agreement() == 1.0
    metrics = evaluator.evaluate(policy)
    assert 0.0 <= metrics["eval/teacher_agreement"] <= 1.0


def test_a_policy_for_other_observations_is_refused(tiny):
    cfg, evaluator, policy = tiny
    other = Evaluator(env_factory({**OmegaConf.to_container(cfg.env), "max_tokens": 64}, "cpu"))
    with pytest.raises(ConfigError, match="env.max_tokens"):
        other.check(evaluator.spec.obs, policy.num_actions)


def test_replay_frames_cover_one_episode_or_the_steps_asked(tiny, tmp_path):
    _, evaluator, policy = tiny
    episode, six = evaluator.episode_frames(policy), evaluator.episode_frames(policy, steps=6, cell=8)
    assert len(episode) == 40 and len(six) == 6 and episode[0].dtype.name == "uint8"
    assert six[0].shape[0] < episode[0].shape[0]  # 8 pixels per cell instead of 24
    save_gif(six, tmp_path / "replay.gif", fps=4)
    with Image.open(tmp_path / "replay.gif") as gif:
        assert gif.n_frames == 6 and gif.size == (six[0].shape[1], six[0].shape[0])


class Countdown(Env):
    """A test env of variable-length episodes: env i's episodes last i + 2 steps; reward 1 per step; vector obs."""

    def __init__(self, num_envs: int, seed: int, device: str = "cpu", outputs=frozenset(), stagger: bool = True):
        self.device = torch.device(device)
        self.spec = EnvSpec(num_envs, 1, 3, VectorObsSpec(2), frozenset(), False)
        self.length = torch.arange(num_envs) + 2
        self.t, self.ended, self.last = torch.zeros(num_envs), torch.zeros(num_envs), torch.zeros(num_envs)

    def reset(self):
        self.t.zero_()
        self.ended.zero_()
        return self._out(torch.zeros(self.spec.num_envs, dtype=torch.bool))

    def step(self, actions):
        self.t += 1
        done = self.t >= self.length
        self.last = torch.where(done, self.t, self.last)
        self.ended += done.float()
        self.t[done] = 0
        return self._out(done)

    def last_episodes(self):
        return {"episodes": self.ended.clone(), "return": self.last.clone(), "length": self.last.clone()}

    def _out(self, done):
        obs = torch.stack([self.t, self.length.float()], 1)
        out = {keys.OBS: obs, keys.REWARDS: torch.ones(len(done)), keys.TERMINATED: done, keys.TRUNCATED: done}
        return TensorDict(out, batch_size=[len(done)])


def test_episodes_of_variable_length_count_each_env_s_first_episode_up_to_the_step_limit():
    evaluator = Evaluator(lambda **settings: Countdown(**settings), episodes=5)
    assert evaluator.spec.outputs == frozenset()  # no teacher: the evaluator asks for no output it does not declare
    policy = instantiate(compose_config(["policy=mlp"]).policy, obs_spec=VectorObsSpec(2), num_actions=3)
    rows = evaluator.compare(policy)
    assert rows.keys() == {"policy", "random"} and "teacher_agreement" not in rows["policy"]

    def lengths(step_limit):
        actor = random_actor(3, torch.Generator().manual_seed(0))
        return first_episodes(evaluator.env(), actor, step_limit)["length"].tolist()

    assert lengths(100) == [2, 3, 4, 5, 6]  # each env's first episode, though env 0 ended three times by then
    assert lengths(4) == [2, 3, 4]  # envs 3 and 4 had not ended by the limit


def test_eval_py_writes_eval_json_and_a_replay_with_the_table_unprefixed(tiny, tmp_path):
    cfg, evaluator, policy = tiny
    payload = policy_payload(policy, OmegaConf.to_container(cfg.policy, resolve=True), evaluator.spec.obs)
    torch.save(payload, tmp_path / "policy.pt")
    out = tmp_path / "eval"
    args = [f"checkpoint={tmp_path / 'policy.pt'}", "episodes=4", "replay_steps=5", f"hydra.run.dir={out}"]
    result = run_eval([*TINY_ENV, *args], tmp_path)
    report = json.loads((out / "eval.json").read_text())
    assert {"policy", "teacher", "random"} <= report.keys()
    assert report["teacher"]["return"] > report["random"]["return"]
    log = (out / "eval.log").read_text()
    assert f"checkpoint {tmp_path / 'policy.pt'}" in log and "eval.yaml's env settings" in log
    assert any(line.startswith("teacher ") for line in log.splitlines())  # a row with no log prefix
    header = next(line for line in log.splitlines() if line.startswith(" " * 8))
    assert header.split() == [name for name in STAT_NAMES if name != "episodes"]  # every stat the env reports
    assert "teacher " in result.stderr + result.stdout
    with Image.open(out / "replay.gif") as gif:
        assert gif.n_frames == 5


def test_eval_py_evaluates_on_the_run_s_env_settings_unless_the_command_line_changes_them(tiny, tmp_path):
    cfg, evaluator, policy = tiny
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), run / "resolved_config.yaml")
    payload = policy_payload(policy, OmegaConf.to_container(cfg.policy, resolve=True), evaluator.spec.obs)
    torch.save(payload, run / "checkpoints" / "policy_000001.pt")
    base = [f"checkpoint={run / 'checkpoints' / 'policy_000001.pt'}", "episodes=2", "replay=false"]
    run_eval([*base, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)  # eval.yaml's env says 11x11, 200 steps
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["policy"]["length"] == 40
    assert "the run's env settings" in (tmp_path / "a" / "eval.log").read_text()
    run_eval([*base, "env.max_steps=30", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
    assert json.loads((tmp_path / "b" / "eval.json").read_text())["policy"]["length"] == 30
    assert "changed on the command line: max_steps" in (tmp_path / "b" / "eval.log").read_text()


def run_eval(args: list[str], cwd) -> Result:
    """``python eval.py ARGS`` from ``cwd``, run in this process (``tests.commands``); it must succeed."""
    result = run_script("eval.py", *args, cwd=cwd)
    assert result.returncode == 0, result.output[-3000:]
    return result


@pytest.mark.slow
def test_periodic_eval_rows_and_replays_during_training(tmp_path):
    from tests.test_train import TINY

    run_dir = tmp_path / "run"
    result = run_script(
        "train.py",
        *TINY,
        "trainer.total_timesteps=5120",
        "trainer.eval_interval=2",
        "trainer.replay_interval=4",
        "evaluation.episodes=4",
        "wandb=disabled",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # At the intervals and after the last epoch (5), so the curve ends where the run does.
    assert [r["metric/epoch"] for r in rows if "eval/return" in r] == [2, 4, 5]
    assert all(r["eval/length"] == 40 and r["timing/eval"] > 0 for r in rows if "eval/return" in r)
    assert "eval/return" not in rows[0]
    gifs = sorted((run_dir / "replays").glob("replay_*.gif"))
    assert [gif.name for gif in gifs] == ["replay_000004.gif", "replay_000005.gif"]
    for gif in gifs:
        with Image.open(gif) as image:
            assert image.n_frames == 40
