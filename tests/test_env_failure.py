"""An env whose engine fails mid-epoch (a worker process died) ends the run with one clear line, a checkpoint of the
last finished epoch and the env closed; a start with the same run folder resumes from that checkpoint and finishes.
"""

import pytest

from machina.env.machina_1 import Machina1Env
from machina.errors import EnvFailed
from machina.training.checkpoint import load_checkpoint
from tests.test_checkpoint import EPOCH, metrics, run, run_reporting

STEPS_PER_EPOCH = 16  # TINY: 8 envs x 4 agents x 16 steps


class FailingEnv(Machina1Env):
    """machina_1 whose engine dies on its ``fail_at``-th step (0: never; a class attribute, so that the factory sees
    machina_1's settings), and which records each close."""

    fail_at = 0
    closed: list["FailingEnv"] = []

    def step(self, actions):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == self.fail_at:
            raise EnvFailed("env worker 1 (pid 4242) died with exit code -9 (SIGKILL)")
        return super().step(actions)

    def close(self):
        FailingEnv.closed.append(self)


@pytest.fixture
def failing(monkeypatch):
    monkeypatch.setattr(FailingEnv, "closed", [])
    monkeypatch.setattr(FailingEnv, "fail_at", 0)
    return ["env._target_=tests.test_env_failure.FailingEnv", "trainer.checkpoint_interval=0"]


def test_a_failed_env_stops_the_run_with_a_checkpoint_of_the_last_epoch_and_the_run_resumes(tmp_path, failing):
    FailingEnv.fail_at = 2 * STEPS_PER_EPOCH + 5  # in epoch 3
    code, message = run_reporting(tmp_path, *failing, epochs=4)
    assert code == 2
    assert "env worker 1 (pid 4242) died" in message and "stopped in epoch 3" in message
    assert "checkpoint_000002.pt" in message and "resumes" in message
    # checkpoint_interval=0 writes only at the end: this checkpoint exists because of the failure.
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == ["checkpoint_000002.pt"]
    saved = load_checkpoint(tmp_path / "checkpoints" / "checkpoint_000002.pt")["trainer"]
    assert (saved["epoch"], saved["agent_step"]) == (2, 2 * EPOCH)
    assert len(FailingEnv.closed) == 1  # the training env (no evaluation runs in these tiny runs)

    FailingEnv.fail_at = 0
    run(tmp_path, *failing, epochs=4)  # the same folder, no failure: resumes at epoch 3
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == [1, 2, 3, 4]
    assert len(FailingEnv.closed) == 2


def test_a_failure_in_the_first_epoch_keeps_no_checkpoint_and_says_so(tmp_path, failing):
    FailingEnv.fail_at = 3
    code, message = run_reporting(tmp_path, *failing, epochs=2)
    assert code == 2 and "stopped in epoch 1" in message and "no checkpoint was written" in message
    assert not list((tmp_path / "checkpoints").glob("checkpoint_*"))
