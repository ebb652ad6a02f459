"""The weight average (``learner.average_horizon``), checked against its definition: after epoch n the policy the run
produces is sum_k d^(n-k) theta_k / sum_k d^(n-k) over the epochs' weights theta_k, d = exp(-epoch steps / horizon).
Files and resumes are checked on real runs."""

import math
import shutil

import pytest
import torch
from torch import nn

from machina.files import checksum
from machina.policy.io import load_policy
from machina.training.checkpoint import load_checkpoint, write_file
from machina.training.weight_average import WeightAverage
from tests.test_checkpoint import EPOCH, metrics, run, run_reporting, without_timing

HORIZON = 2 * EPOCH  # d = exp(-1/2): every epoch's weights count, none dominates


def expected_average(thetas: list[dict[str, torch.Tensor]], decay: float) -> dict[str, torch.Tensor]:
    """The definition: weights d^(n-k) on epoch k's parameters, normalised."""
    n = len(thetas)
    weights = [decay ** (n - k) for k in range(1, n + 1)]
    return {
        name: sum(w * theta[name].double() for w, theta in zip(weights, thetas, strict=True)) / sum(weights)
        for name in thetas[0]
    }


def test_the_average_follows_its_definition_and_ignores_the_initial_weights():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    average = WeightAverage(module, horizon=3000, epoch_steps=1000)
    decay = math.exp(-1 / 3)
    thetas = []
    for _ in range(5):
        with torch.no_grad():
            for param in module.parameters():
                param.copy_(torch.randn_like(param) * 10)
        thetas.append({name: p.detach().clone() for name, p in module.named_parameters()})
        average.update()
        for name, value in expected_average(thetas, decay).items():
            torch.testing.assert_close(average.averaged[name].double(), value, rtol=1e-5, atol=1e-5)
        if len(thetas) == 1:  # the first epoch's weights are taken whole: the random start never enters
            assert all(torch.equal(average.averaged[n], thetas[0][n]) for n in thetas[0])


def test_applied_swaps_the_average_in_and_always_swaps_it_back():
    module = nn.Linear(3, 2)
    average = WeightAverage(module, horizon=10, epoch_steps=10)
    average.update()
    own = {name: p.detach().clone() for name, p in module.named_parameters()}
    with torch.no_grad():
        module.weight.add_(1.0)  # the policy moves on; the average stays where it was
    moved = module.weight.detach().clone()
    with average.applied():
        assert torch.equal(module.weight, own["weight"])
    assert torch.equal(module.weight, moved)
    with pytest.raises(RuntimeError, match="boom"), average.applied():
        raise RuntimeError("boom")
    assert torch.equal(module.weight, moved)


def training_weights(run_dir, epoch: int) -> dict[str, torch.Tensor]:
    """The policy's own weights (its parameters) in the checkpoint of ``epoch``."""
    data = load_checkpoint(run_dir / "checkpoints" / f"checkpoint_{epoch:06d}.pt")
    parameters = dict(load_policy(run_dir / "checkpoints" / f"policy_{epoch:06d}.pt")[0].named_parameters())
    return {name: value for name, value in data["trainer"]["policy"].items() if name in parameters}


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    """Three epochs with a checkpoint (and an evaluation) after each, averaging."""
    run_dir = tmp_path_factory.mktemp("averaged") / "run"
    run(run_dir, f"learner.average_horizon={HORIZON}", "trainer.eval_interval=1", epochs=3)
    return run_dir


def test_policy_files_and_checkpoints_hold_the_average_of_the_training_weights(averaged_run):
    thetas = [training_weights(averaged_run, epoch) for epoch in (1, 2, 3)]
    assert not torch.equal(thetas[1]["core.gates.weight"], thetas[2]["core.gates.weight"])  # it trained
    for epoch in (1, 2, 3):
        policy_file, _ = load_policy(averaged_run / "checkpoints" / f"policy_{epoch:06d}.pt")
        checkpoint_policy, _ = load_policy(averaged_run / "checkpoints" / f"checkpoint_{epoch:06d}.pt")
        expected = expected_average(thetas[:epoch], math.exp(-EPOCH / HORIZON))
        for name, value in expected.items():
            torch.testing.assert_close(dict(policy_file.named_parameters())[name].double(), value)
            assert torch.equal(dict(checkpoint_policy.named_parameters())[name], policy_file.get_parameter(name))
    with pytest.raises(AssertionError):  # the average differs from the last weights: the test can tell them apart
        torch.testing.assert_close(policy_file.get_parameter("core.gates.weight"), thetas[2]["core.gates.weight"])


def test_resume_continues_the_average_and_the_training_weights_exactly(averaged_run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(averaged_run, resumed)
    resume = f"resume={resumed / 'checkpoints' / 'checkpoint_000002.pt'}"
    run(resumed, f"learner.average_horizon={HORIZON}", "trainer.eval_interval=1", resume, epochs=3)
    rows = without_timing(metrics(resumed))
    assert any(key.startswith("eval/") for key in rows[-1])  # the evaluation of the average is compared too
    assert rows == without_timing(metrics(averaged_run))
    for name in ("policy_000003.pt", "checkpoint_000003.pt"):
        ours, _ = load_policy(resumed / "checkpoints" / name)
        theirs, _ = load_policy(averaged_run / "checkpoints" / name)
        assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))


def test_resume_without_the_average_trains_on_from_the_training_weights(averaged_run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(averaged_run, resumed)
    run(resumed, "trainer.eval_interval=1", f"resume={resumed / 'checkpoints' / 'checkpoint_000002.pt'}", epochs=3)
    training = [{k: v for k, v in row.items() if not k.startswith("eval/")} for row in without_timing(metrics(resumed))]
    straight = [
        {k: v for k, v in r.items() if not k.startswith("eval/")} for r in without_timing(metrics(averaged_run))
    ]
    assert training == straight  # epoch 3 trained from the same weights (not from their average)
    assert "average" not in load_checkpoint(resumed / "checkpoints" / "checkpoint_000003.pt")["trainer"]["learner"]
    produced, _ = load_policy(resumed / "checkpoints" / "policy_000003.pt")
    assert all(  # no average: the run now produces its own training weights
        torch.equal(produced.get_parameter(name), value) for name, value in training_weights(averaged_run, 3).items()
    )


def edited(source, target, change) -> str:
    data = load_checkpoint(source)
    change(data["trainer"]["learner"])
    write_file(target, checksum.seal({k: v for k, v in data.items() if k != "checksum"}))
    return f"resume={target}"


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda learner: learner["average"].update(updates=-1), "average.updates=-1 must be an integer in 0.."),
        (
            lambda learner: learner["average"]["weights"]["actor.net.0.weight"].fill_(float("nan")),
            "average.weights.actor.net.0.weight",
        ),
        (
            lambda learner: learner["average"]["weights"].pop("actor.net.0.bias"),
            "average.weights has the entries",
        ),
        (
            lambda learner: learner.update(extra={}),
            "learner has the entries ['average', 'extra', 'optimizer']: missing [], unexpected ['extra']",
        ),
    ],
)
def test_an_edited_average_in_a_checkpoint_is_refused(averaged_run, tmp_path, change, expected):
    resume = edited(averaged_run / "checkpoints" / "checkpoint_000002.pt", tmp_path / "edited.pt", change)
    run_dir = tmp_path / "run"
    code, message = run_reporting(run_dir, f"learner.average_horizon={HORIZON}", resume, epochs=3)
    assert code == 2 and expected in message, message
    assert not (run_dir / "metrics.jsonl").exists()
