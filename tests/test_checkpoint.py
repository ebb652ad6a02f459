"""Checkpoints, exact resume and clean stops: kill -9 and resume, deterministic resume == uninterrupted run, NaN
and signal stops, and checkpoints that must be refused."""

import argparse
import errno
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from machina.cli import report_errors
from machina.env.machina_1 import Machina1Env
from machina.errors import ConfigError
from machina.losses.base import Loss
from machina.policy.io import load_policy, policy_payload
from machina.run import train
from machina.training.checkpoint import load_checkpoint
from tests.conftest import ROOT, compose_config

EPOCH = 512  # agent steps per epoch below: 8 envs x 4 agents x 16 steps
TINY = [
    "debug=tiny",
    "env.num_envs=8",
    f"experience.batch_size={EPOCH}",
    "policy.encoder.embed_dim=32",
    "policy.encoder.hidden=32",
    "policy.core.hidden_size=32",
    "system.torch_deterministic=true",
    "trainer.checkpoint_interval=1",
    "wandb=disabled",
]


class NaNLoss(Loss):
    """Test-only loss: NaN in the epochs that start at agent step ``from_step`` or later."""

    def __init__(self, from_step: int):
        super().__init__()
        self.from_step = from_step

    def forward(self, minibatch, policy_out, progress):
        return {"loss_bad": torch.tensor(float("nan") if progress.agent_step >= self.from_step else 0.0)}


def run(run_dir, *overrides, epochs=2):
    return train(compose_config([*TINY, f"trainer.total_timesteps={epochs * EPOCH}", *overrides]), run_dir)


def reporting(call) -> tuple[int, str]:
    """Run ``call()`` (a training run) as train.py does, errors reported, not raised; return (exit code, logged
    error)."""
    with mock.patch("machina.cli.log.error") as error, pytest.raises(SystemExit) as stop, report_errors():
        call()
    return stop.value.code, error.call_args.args[1] + ": " + str(error.call_args.args[2])


def run_reporting(run_dir, *overrides, epochs=2) -> tuple[int, str]:
    return reporting(lambda: run(run_dir, *overrides, epochs=epochs))


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and "sps" not in k} for r in rows]


def random_policy_file(path, overrides=()):
    """Write a policy file with random weights (TINY's policy and env, with ``overrides``) to ``path``; return it."""
    cfg = compose_config([*TINY, *overrides])
    env = instantiate(cfg.env)  # only its spec is read
    policy = instantiate(cfg.policy, obs_spec=env.spec.obs, num_actions=env.spec.num_actions)
    torch.save(policy_payload(policy, OmegaConf.to_container(cfg.policy, resolve=True), env.spec.obs), path)
    return path


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A policy file with random weights: a teacher for eer_kickstarter."""
    return random_policy_file(tmp_path_factory.mktemp("teacher") / "policy.pt")


@pytest.fixture(scope="module")
def losses(teacher):
    """Exact resume must cover losses with rollout-time state (eer_kickstarter's teacher recurrent state) and reward
    shaping (both EER losses)."""
    return ["losses=[ppo,eer_cloner,eer_kickstarter]", f"losses.eer_kickstarter.teacher.path={teacher}"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, losses):
    """Two epochs, a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("short") / "run"
    run(run_dir, *losses)
    return run_dir


def test_checkpoint_layout_and_safe_loading(short_run):
    names = sorted(p.name for p in (short_run / "checkpoints").iterdir())
    assert names == ["checkpoint_000001.pt", "checkpoint_000002.pt", "policy_000001.pt", "policy_000002.pt"]
    data = load_checkpoint(short_run / "checkpoints" / "checkpoint_000002.pt")
    assert (data["trainer"]["epoch"], data["trainer"]["agent_step"]) == (2, 2 * EPOCH)
    assert {"policy", "trainer", "ranks", "run_id", "config"} <= set(data)
    assert {"optimizer"} == set(data["trainer"]["learner"]) and len(data["trainer"]["history"]) == 2
    training = data["trainer"]["policy"]  # no weight average: the produced policy is the training weights
    assert training.keys() == data["policy"]["state_dict"].keys()
    assert all(torch.equal(value, data["policy"]["state_dict"][name]) for name, value in training.items())
    (rank,) = data["ranks"]
    assert {"env", "rollout", "losses", "rng"} == set(rank)
    kickstarter = rank["losses"]["eer_kickstarter"]
    assert "_state" in kickstarter["_extra_state"]  # the teacher's recurrent state
    assert not any(key.startswith("teacher.") for key in kickstarter)  # the teacher comes from its file
    policy, _ = load_policy(short_run / "checkpoints" / "policy_000002.pt")
    assert policy.num_actions == 21


def test_resume_continues_exactly_like_the_uninterrupted_run(short_run, losses, tmp_path):
    straight = tmp_path / "straight"
    run(straight, *losses, epochs=3)
    resumed = tmp_path / "resumed"
    shutil.copytree(short_run, resumed)
    # A checkpoint from a future that resuming from epoch 2 abandons: removed by the next save.
    (resumed / "checkpoints" / "checkpoint_000009.pt").write_bytes(b"stale")
    resume = f"resume={resumed / 'checkpoints' / 'checkpoint_000002.pt'}"
    run(resumed, *losses, resume, "trainer.keep_checkpoints=2", epochs=3)
    assert [r["metric/epoch"] for r in metrics(resumed)] == [1, 2, 3]
    assert without_timing(metrics(resumed)) == without_timing(metrics(straight))
    assert sorted(p.name for p in (resumed / "checkpoints").glob("checkpoint_*")) == [
        "checkpoint_000002.pt",
        "checkpoint_000003.pt",
    ]


@pytest.mark.slow
def test_kill_9_between_checkpoints_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([*args, f"trainer.total_timesteps={1000 * EPOCH}"], cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "checkpoint_000002.pt").exists() and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.02)
    # The folder is in use: a second run on it stops at start-up, naming the process that holds it.
    second = subprocess.run([*args, "trainer.total_timesteps=1"], cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 2 and f"is in use by PID {proc.pid} on host" in second.stdout + second.stderr
    proc.kill()
    proc.wait()
    assert (run_dir / ".machina.lock").read_text().startswith(f"PID {proc.pid} ")  # stale: it must not block
    for path in (run_dir / "checkpoints").glob("*.pt"):
        load_checkpoint(path) if path.name.startswith("checkpoint") else load_policy(path)
    latest = max(load_checkpoint(p)["trainer"]["epoch"] for p in (run_dir / "checkpoints").glob("checkpoint_*.pt"))

    done = subprocess.run([*args, f"trainer.total_timesteps={(latest + 1) * EPOCH}"], cwd=ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = metrics(run_dir)  # whole JSON lines, every epoch once
    assert [r["metric/epoch"] for r in rows] == list(range(1, latest + 2))
    assert [r["metric/agent_step"] for r in rows] == [e * EPOCH for e in range(1, latest + 2)]
    assert (
        load_checkpoint(run_dir / "checkpoints" / f"checkpoint_{latest + 1:06d}.pt")["trainer"]["agent_step"]
        == rows[-1]["metric/agent_step"]
    )


def test_nan_loss_stops_with_exit_2_and_keeps_the_last_checkpoint(tmp_path):
    nan = [f"+losses.nan._target_={__name__}.NaNLoss", f"+losses.nan.from_step={EPOCH}"]  # epoch 2 starts there
    code, message = run_reporting(tmp_path, *nan, epochs=3)
    assert code == 2
    assert "non-finite loss at epoch 2" in message and "losses/nan/loss_bad=nan" in message
    assert "checkpoint_000001.pt" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == ["checkpoint_000001.pt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "checkpoint_000001.pt")["trainer"]["epoch"] == 1
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == [1]


@pytest.fixture
def ctrl_c_raises():
    """SIGINT handled as in a terminal (KeyboardInterrupt) for the test: a process started in the background by a
    non-interactive shell (``cmd &``, as a CI script may run pytest) inherits SIGINT ignored, and a second Ctrl-C
    then falls back to that."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signals", [1, 2])
def test_sigint_checkpoints_at_the_epoch_end_or_abandons_the_epoch(tmp_path, monkeypatch, signals, ctrl_c_raises):
    step, calls = Machina1Env.step, []

    def step_and_interrupt(self, actions):
        calls.append(1)
        if 3 <= len(calls) < 3 + signals:  # during epoch 1 (16 steps)
            signal.raise_signal(signal.SIGINT)  # handled before it returns: two are never merged into one
        return step(self, actions)

    monkeypatch.setattr(Machina1Env, "step", step_and_interrupt)
    code, message = run_reporting(tmp_path, "trainer.checkpoint_interval=0", epochs=4)
    assert code == 128 + signal.SIGINT
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*"))
    if signals == 1:
        assert "stopped by SIGINT after epoch 1" in message and checkpoints == ["checkpoint_000001.pt"]
    else:
        assert "interrupted twice" in message and "no checkpoint was written" in message and checkpoints == []


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        PermissionError(errno.EACCES, "Permission denied"),  # the folder became unwritable after start-up
    ],
    ids=["OSError", "unwritable"],
)
def test_failed_checkpoint_write_stops_naming_the_file_and_keeps_the_last(tmp_path, monkeypatch, failure):
    save, open_ = torch.save, Path.open

    def failing_save(data, f, *args, **kwargs):
        if data.get("trainer", {}).get("epoch") == 2:  # epoch 2's training checkpoint (its policy file comes first)
            raise failure
        return save(data, f, *args, **kwargs)

    def failing_open(path, mode="r", *args, **kwargs):
        if path.name.startswith(".checkpoint_000002") and ("w" in mode or "x" in mode):
            raise failure
        return open_(path, mode, *args, **kwargs)

    if isinstance(failure, PermissionError):
        monkeypatch.setattr(Path, "open", failing_open)
    else:
        monkeypatch.setattr(torch, "save", failing_save)
    code, message = run_reporting(tmp_path, epochs=3)
    assert code == 2 and "\n" not in message, message
    reason = "Permission denied" if isinstance(failure, PermissionError) else "No space left on device"
    assert "cannot write checkpoint" in message and "checkpoint_000002.pt" in message and reason in message
    assert "the last good checkpoint" in message and "checkpoint_000001.pt' is kept" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint_000001.pt"
    ]
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


def test_checkpoint_with_pickled_objects_or_truncated_is_refused(short_run, tmp_path):
    good = short_run / "checkpoints" / "checkpoint_000002.pt"
    pickled = tmp_path / "pickled.pt"
    torch.save({**load_checkpoint(good), "extra": argparse.Namespace(a=1)}, pickled)
    with pytest.raises(ConfigError, match="carries pickled objects, which are refused"):
        load_checkpoint(pickled)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:10_000])
    with pytest.raises(ConfigError, match="cannot be loaded safely"):
        load_checkpoint(truncated)
    with pytest.raises(ConfigError, match="not a training checkpoint"):
        load_checkpoint(short_run / "checkpoints" / "policy_000002.pt")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.total_timesteps=abc"], "trainer.total_timesteps='abc' has the wrong type"),
        (["optimizer.lr=fast"], "optimizer.lr='fast' has the wrong type"),
        (["learner.update_epochs=0"], "learner.update_epochs=0 must be an integer >= 1"),
        (["trainer.checkpoint_interval=-1"], "trainer.checkpoint_interval=-1 must be an integer >= 0"),
        (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints=0 must be an integer >= 1"),
        (["experience.batch_size=500"], "experience.batch_size=500 must be a multiple of agents x bptt_horizon"),
        (["system.device=tpu"], "system.device='tpu' is not a device"),
        (["env.num_envs=0"], "env.num_envs=0 must be an integer >= 1"),
        (["resume=/nonexistent/run"], "resume='/nonexistent/run' does not exist"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(tmp_path, overrides, expected):
    code, message = run_reporting(tmp_path, *overrides)
    assert code == 2 and expected in message, message


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["policy.core.hidden_size=16"], "policy.core.hidden_size: 32 -> 16"),
        (["env.num_vibes=4", "losses.eer_kickstarter.enabled=false"], "has a policy with 21 actions but the env has 9"),
        (["env.num_envs=4", "experience.batch_size=256"], "env.num_envs: 8 -> 4"),
    ],
)
def test_resume_from_an_incompatible_checkpoint_is_refused(short_run, losses, tmp_path, overrides, expected):
    code, message = run_reporting(tmp_path, *losses, f"resume={short_run}", *overrides, epochs=3)
    assert code == 2 and expected in message, message


def test_teacher_with_another_action_count_is_refused(losses, tmp_path):
    code, message = run_reporting(tmp_path, *losses, "env.num_vibes=4")
    assert code == 2 and "has 21 actions but the env has 9" in message, message


def test_unwritable_checkpoint_folder_is_refused_at_start_up(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the folder should be")
    code, message = run_reporting(tmp_path)
    assert code == 2 and "checkpoints' is not a folder" in message and "hydra.run.dir" in message, message
    assert not (tmp_path / "metrics.jsonl").exists()
