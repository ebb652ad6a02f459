"""The trainer's checkpoint state, from the outside: its parts restore in any order to the same state, the produced
policy (the weight average) is what every reader of the run's policy sees, and a ``machina.checkpoint/2`` file (the
layout before the training weights moved into ``trainer.policy``) still resumes exactly."""

import shutil

import pytest
import torch
from omegaconf import OmegaConf

from machina.errors import ConfigError
from machina.files import checksum
from machina.policy.io import load_policy
from machina.startup.build import build, build_trainer
from machina.training.checkpoint import Checkpointer, load_checkpoint, write_file
from tests.conftest import compose_config
from tests.test_checkpoint import EPOCH, TINY, metrics, run, without_timing

AVERAGE = f"learner.average_horizon={2 * EPOCH}"


def trainer_of(*overrides, epochs: int = 2, **extra):
    cfg = compose_config([*TINY, f"trainer.total_timesteps={epochs * EPOCH}", AVERAGE, *overrides])
    return cfg, build_trainer(cfg, build(cfg), sinks=[], **extra)


def parameters(policy) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in policy.named_parameters()}


def assert_same(a, b, where="state"):
    """Equal nested state: the same keys, equal tensors (bit for bit) and equal plain values."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{index}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_the_parts_restore_in_any_order_to_the_same_state():
    _, trained = trainer_of()
    for _ in range(2):
        trained.run_epoch()
    saved = trained.state_dict()
    with trained.learner.produced_policy() as policy:
        produced = parameters(policy)

    _, in_order = trainer_of()
    in_order.load_state_dict(saved)
    _, reversed_order = trainer_of()
    with torch.no_grad():  # whatever the policy holds before the restore must not matter
        for param in reversed_order.learner.policy.parameters():
            param.fill_(3.0)
    reversed_order.learner.load_state_dict(saved["learner"])  # the learner before the policy it trains
    reversed_order.learner.policy.load_state_dict(saved["policy"])
    reversed_order.epoch, reversed_order.agent_step = saved["epoch"], saved["agent_step"]
    reversed_order.history = list(saved["history"])

    for restored in (in_order, reversed_order):
        assert_same(restored.state_dict(), saved)
        with restored.learner.produced_policy() as policy:
            assert_same(parameters(policy), produced, "produced")
        assert_same(parameters(restored.learner.policy), parameters(trained.learner.policy), "training")
    assert not torch.equal(produced["core.gates.weight"], saved["policy"]["core.gates.weight"])


class Recorder:
    """A periodic evaluator that records the weights of the policy it is handed."""

    def __init__(self):
        self.seen: dict[str, dict[str, torch.Tensor]] = {}

    def evaluate(self, policy) -> dict[str, float]:
        self.seen["evaluation"] = parameters(policy)
        return {"eval/return": 0.0}

    def replay(self, policy, epoch: int) -> None:
        self.seen["replay"] = parameters(policy)


def test_evaluation_replays_policy_files_and_the_checkpoint_see_the_produced_policy(tmp_path):
    recorder = Recorder()
    cfg, trainer = trainer_of("trainer.eval_interval=1", "trainer.replay_interval=1", evaluator=recorder)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    spec = trainer.rollout.env.spec
    trainer.checkpointer = Checkpointer(tmp_path / "checkpoints", resolved["policy"], spec, resolved, "id")
    trainer.checkpointer.prepare()
    trainer.train()

    with trainer.learner.produced_policy() as policy:
        produced = parameters(policy)
    training = parameters(trainer.learner.policy)
    assert not torch.equal(produced["core.gates.weight"], training["core.gates.weight"])  # they can be told apart
    assert_same(recorder.seen["evaluation"], produced, "evaluation")
    assert_same(recorder.seen["replay"], produced, "replay")
    for name in ("policy_000002.pt", "checkpoint_000002.pt"):
        assert_same(parameters(load_policy(tmp_path / "checkpoints" / name)[0]), produced, name)
    saved = load_checkpoint(tmp_path / "checkpoints" / "checkpoint_000002.pt")["trainer"]["policy"]
    assert_same({name: saved[name] for name in training}, training, "trainer.policy")


def as_format_2(data: dict) -> dict:
    """A checkpoint laid out as ``machina.checkpoint/2`` wrote it: the produced policy under ``policy``, no
    ``trainer.policy`` (with a weight average, the training parameters under ``trainer.learner.average
    .training_weights``, the average being the policy entry), the run's id under ``wandb_run_id``."""
    trainer = {key: value for key, value in data["trainer"].items() if key != "policy"}
    learner = dict(trainer["learner"])
    if "average" in learner:
        average = learner.pop("average")
        training = {name: data["trainer"]["policy"][name] for name in average["weights"]}
        learner["average"] = {"updates": average["updates"], "training_weights": training}
    rest = {key: value for key, value in data.items() if key not in ("format", "trainer", "run_id", "checksum")}
    old = {**rest, "format": "machina.checkpoint/2", "trainer": {**trainer, "learner": learner}}
    return checksum.seal({**old, "wandb_run_id": data["run_id"]})


@pytest.mark.parametrize("average", [True, False], ids=["averaging", "not averaging"])
def test_a_format_2_checkpoint_resumes_exactly(tmp_path, average):
    settings = [AVERAGE] if average else []
    straight = tmp_path / "straight"
    run(straight, *settings, epochs=3)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    source = resumed / "checkpoints" / "checkpoint_000002.pt"
    write_file(source, as_format_2(load_checkpoint(source)))
    (resumed / "checkpoints" / "checkpoint_000003.pt").unlink()
    run(resumed, *settings, f"resume={source}", epochs=3)
    assert without_timing(metrics(resumed)) == without_timing(metrics(straight))
    for name in ("policy_000003.pt", "checkpoint_000003.pt"):
        ours, theirs = (load_policy(folder / "checkpoints" / name)[0] for folder in (resumed, straight))
        assert_same(ours.state_dict(), theirs.state_dict(), name)
    continued = load_checkpoint(resumed / "checkpoints" / "checkpoint_000003.pt")
    assert continued["format"] == "machina.checkpoint/3" and continued["run_id"] == load_checkpoint(source)["run_id"]


def test_a_format_2_checkpoint_without_its_training_weights_is_refused(tmp_path):
    folder = tmp_path / "run"
    run(folder, AVERAGE, epochs=1)
    data = as_format_2(load_checkpoint(folder / "checkpoints" / "checkpoint_000001.pt"))
    del data["trainer"]["learner"]["average"]["training_weights"]
    path = tmp_path / "checkpoint_000001.pt"
    write_file(path, checksum.seal({key: value for key, value in data.items() if key != checksum.KEY}))
    with pytest.raises(ConfigError, match=r"trainer\.learner\.average has the entries \['updates'\]: missing"):
        load_checkpoint(path)
