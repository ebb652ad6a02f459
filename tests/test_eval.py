"""Evaluation, replays and eval.py: reproducible numbers on fixed layouts, a GIF of the right length, eval.json."""

import json
import subprocess
import sys
from functools import partial

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from machina import keys
from machina.errors import ConfigError
from machina.evaluation import Evaluator, PolicyActor
from machina.policy.io import policy_payload
from machina.replay import record_replay, save_gif
from tests.conftest import ROOT, compose_config, run_train

TINY_ENV = ["env.height=7", "env.width=7", "env.max_steps=40"]


@pytest.fixture(scope="module")
def tiny():
    """A composed config of a 7x7 env with 40-step episodes, an Evaluator on it and a fresh policy."""
    cfg = compose_config(TINY_ENV)
    evaluator = Evaluator(OmegaConf.to_container(cfg.env, resolve=True), episodes=8, seed=3)
    torch.manual_seed(0)
    policy = instantiate(cfg.policy, obs_spec=evaluator.spec.obs, num_actions=evaluator.spec.num_actions)
    return cfg, evaluator, policy


def test_evaluation_is_reproducible_and_the_teacher_beats_random(tiny):
    _, evaluator, policy = tiny
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
    greedy = Evaluator(evaluator.settings, episodes=8, greedy=True, seed=3).evaluate(policy)
    assert greedy["eval/episodes"] == 8 and greedy != metrics


def test_policy_actor_counts_agreement_with_the_teacher(tiny):
    _, evaluator, policy = tiny
    env = evaluator.make_env(teacher=True)
    step = env.observe()
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
    _, evaluator, policy = tiny
    other = Evaluator({**evaluator.settings, "max_tokens": 64})
    with pytest.raises(ConfigError, match="env.max_tokens"):
        other.check(evaluator.spec.obs, policy.num_actions)


def test_replay_gif_has_one_frame_per_step(tiny, tmp_path):
    _, evaluator, policy = tiny
    frames = record_replay(partial(evaluator.make_env, num_envs=1), policy, steps=6)
    teacher = record_replay(partial(evaluator.make_env, num_envs=1, teacher=True), None, steps=6)
    assert len(frames) == 6 and frames[0].shape == teacher[0].shape and frames[0].dtype.name == "uint8"
    save_gif(frames, tmp_path / "replay.gif", fps=4)
    with Image.open(tmp_path / "replay.gif") as gif:
        assert gif.n_frames == 6 and gif.size == (frames[0].shape[1], frames[0].shape[0])


def test_eval_py_writes_eval_json_with_three_rows_and_a_replay(tiny, tmp_path):
    cfg, evaluator, policy = tiny
    payload = policy_payload(policy, OmegaConf.to_container(cfg.policy, resolve=True), evaluator.spec.obs)
    torch.save(payload, tmp_path / "policy.pt")
    out = tmp_path / "eval"
    args = [f"checkpoint={tmp_path / 'policy.pt'}", "episodes=4", "replay_steps=5", f"hydra.run.dir={out}"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), *TINY_ENV, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert {"policy", "teacher", "random"} <= report.keys()
    assert report["teacher"]["return"] > report["random"]["return"]
    assert "teacher" in (out / "eval.log").read_text()
    with Image.open(out / "replay.gif") as gif:
        assert gif.n_frames == 5


@pytest.mark.slow
def test_periodic_eval_rows_and_replays_during_training(tmp_path):
    from tests.test_train import TINY

    run_dir = tmp_path / "run"
    result = run_train(
        [
            *TINY,
            "trainer.total_timesteps=4096",
            "trainer.eval_interval=2",
            "trainer.replay_interval=4",
            "evaluation.episodes=4",
            "wandb=disabled",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/epoch"] for r in rows if "eval/return" in r] == [2, 4]
    assert all(r["eval/length"] == 40 and r["timing/eval"] > 0 for r in rows if "eval/return" in r)
    assert "eval/return" not in rows[0]
    (gif,) = (run_dir / "replays").glob("replay_*.gif")
    assert gif.name == "replay_000004.gif"
    with Image.open(gif) as image:
        assert image.n_frames == 40
