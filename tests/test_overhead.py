"""The launch-overhead benchmark (``python -m machina.bench overhead``): its narrow variant, which times a policy's
dispatch and Python work without the arithmetic, must run exactly the ops of the full-width policy."""

import pytest

from machina.speed import overhead


@pytest.mark.parametrize(
    "policy", [p if p == "policy=fast" else pytest.param(p, marks=pytest.mark.slow) for p in sorted(overhead.NARROW)]
)
def test_the_narrow_policy_runs_the_same_ops_per_rollout_step(policy, capsys):
    (result,) = overhead.main(["--json", policy])
    assert result["ops_per_step"] == result["ops_per_step_narrow"] > 100
    assert 0 < result["host_us_per_step_narrow"] < result["host_us_per_step"] * 2
    assert result["ops_per_minibatch"] > 0 and result["host_us_per_minibatch"] > 0
    assert '"ops_per_step_narrow"' in capsys.readouterr().out
