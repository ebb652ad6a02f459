"""Start-up refusals: a bad value stops the run before any training, with exit code 2 and one line that names the key
and the value (no traceback). One list of cases for every setting checked at start-up."""

import pytest

from tests.test_checkpoint import run_reporting

REFUSED = [
    (["learner.advantage.gamma=1.5"], "learner.advantage.gamma=1.5 must be a number in [0, 1]"),
    (["learner.advantage.gamma=-0.1"], "learner.advantage.gamma=-0.1 must be a number in [0, 1]"),
    (["learner.advantage.gamma=nan"], "learner.advantage.gamma=nan must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=2"], "learner.advantage.gae_lambda=2 must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=inf"], "learner.advantage.gae_lambda=inf must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=nan"], "learner.advantage.gae_lambda=nan must be a number in [0, 1]"),
    (["optimizer.lr=-0.001"], "optimizer.lr=-0.001 must be a finite number >= 0"),
    (["optimizer.lr=nan"], "optimizer.lr=nan must be a finite number >= 0"),
    (["optimizer.lr=inf"], "optimizer.lr=inf must be a finite number >= 0"),
    (["optimizer.eps=-1e-8"], "optimizer.eps=-1e-08 must be a finite number >= 0"),
    (["optimizer.eps=nan"], "optimizer.eps=nan must be a finite number >= 0"),
    (["losses=[]"], "losses=[] enables no loss"),
    (["learner.average_horizon=-1"], "learner.average_horizon=-1 must be an integer >= 0"),
    (["learner.average_horizon=1.5"], "learner.average_horizon=1.5 has the wrong type"),
]


@pytest.mark.parametrize("overrides, expected", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_values_are_refused_at_start_up(tmp_path, overrides, expected):
    code, message = run_reporting(tmp_path, *overrides, epochs=1)
    assert code == 2 and expected in message and "\n" not in message, message
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
