"""End-to-end training: a real `python train.py` subprocess, its run folder, metrics.jsonl and offline W&B run;
and the rule that a rollout step makes no host-device sync."""

import json

import pytest

from machina.bench import count_host_reads
from machina.build import build, build_trainer
from machina.training.trainer import Trainer
from tests.conftest import compose_config, run_train
from tests.wandb_reader import find_runs, read_run

TINY = [
    "env.num_envs=16",
    "env.max_steps=40",
    "experience.batch_size=1024",
    "experience.bptt_horizon=16",
    "experience.minibatch_size=256",
    "trainer.total_timesteps=3072",
]


def test_train_writes_metrics_jsonl_and_an_offline_wandb_run(tmp_path, wandb_dirs):
    run_dir = tmp_path / "run"
    result = run_train([*TINY, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/epoch"] for r in rows] == [1, 2, 3]
    assert [r["metric/agent_step"] for r in rows] == [1024, 2048, 3072]
    for row in rows:
        assert row["overview/sps"] > 0 and row["overview/sps_cumulative"] > 0
        assert "losses/ppo/loss_policy" in row and "losses/ppo/approx_kl" in row
        assert row["timing/rollout.env"] > 0 and 0 < row["timing/train.backward_frac"] < 1
        assert "overview/reward" in row and "env/hearts_deposited" in row
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "epoch     3" in (run_dir / "train.log").read_text()

    (run_file,) = find_runs(run_dir / "wandb")
    run = read_run(run_file)
    history = run["history"]
    assert len(history) == 3
    assert [h["metric/agent_step"] for h in history] == [1024, 2048, 3072]
    assert all(h["overview/sps"] > 0 for h in history)
    assert run["config"]["policy"]["action_probs"]["emit_full_log_probs"] is False
    assert "loss:ppo" in list(run["run"].tags) and "deterministic:false" in list(run["run"].tags)


def test_bad_setting_exits_with_a_message_not_a_traceback(tmp_path):
    result = run_train([*TINY, "experience.batch_size=1000", f"hydra.run.dir={tmp_path}", "wandb=disabled"])
    assert result.returncode == 2
    assert "experience.batch_size=1000 must be a multiple of agents x bptt_horizon" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_unknown_group_option_is_reported(tmp_path):
    result = run_train(["policy=nope", f"hydra.run.dir={tmp_path}"])
    assert result.returncode != 0
    assert "Could not find 'policy/nope'" in result.stderr


def make_trainer(overrides) -> Trainer:
    """The parts and trainer as machina.run builds them, without the run folder and sinks."""
    cfg = compose_config([*TINY, *overrides])
    return build_trainer(cfg, build(cfg), sinks=[])


@pytest.mark.parametrize("losses", ["[ppo]", "[ppo,supervisor]", "[sliced_scripted_cloner,ppo]", "[ppo,eer_cloner]"])
def test_rollout_and_update_make_no_host_sync(losses):
    trainer = make_trainer([f"losses={losses}"])
    syncs: list[str] = []
    with count_host_reads(syncs):
        steps = trainer.rollout.run(trainer.progress)
        trainer.learner.run(trainer.progress)
    assert steps == trainer.experience.batch_size
    assert syncs == []  # env, policy, rollout hooks, buffer writes and the update: no host read of a tensor
