"""Adding a loss: a class defined here, enabled from the command line only (``+losses.mine._target_=...``), that lists
``full_log_probs`` in ``consumes`` switches ``policy.action_probs.emit_full_log_probs`` on with no other edit, and
the distribution reaches it at rollout and in training; disabled, nothing emits it. It passes the conformance kit
(``machina.conformance.check_loss``), its state through a real checkpoint included."""

import pytest

from machina import keys
from machina.conformance import check_loss
from machina.errors import ConfigError
from machina.losses.base import Loss
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config

ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled"]
MINE = "+losses.mine._target_=tests.test_add_loss.MyLoss"
WATCHER = "+losses.watcher._target_=tests.test_add_loss.Watcher"


class MyLoss(Loss):
    """Consumes the policy's full distribution: -mean log pi over every action, a term with a gradient."""

    consumes = frozenset({keys.FULL_LOG_PROBS})
    seen: list[tuple[str, tuple[int, ...]]] = []  # ("rollout" or "train", shape of FULL_LOG_PROBS)

    def on_rollout_step(self, step, progress):
        MyLoss.seen.append(("rollout", tuple(step[keys.FULL_LOG_PROBS].shape)))

    def forward(self, minibatch, policy_out, progress):
        full = policy_out[keys.FULL_LOG_PROBS]
        MyLoss.seen.append(("train", tuple(full.shape)))
        return {"loss_mine": -0.01 * full.mean()}


class Watcher(Loss):
    """Consumes nothing; records whether the policy's outputs held FULL_LOG_PROBS at rollout and in training."""

    emitted: list[bool] = []

    def on_rollout_step(self, step, progress):
        Watcher.emitted.append(keys.FULL_LOG_PROBS in step.keys())

    def forward(self, minibatch, policy_out, progress):
        Watcher.emitted.append(keys.FULL_LOG_PROBS in policy_out.keys())
        return {}


@pytest.fixture(autouse=True)
def fresh_records():
    MyLoss.seen.clear()
    Watcher.emitted.clear()


def train_one_epoch(overrides):
    cfg = compose_config([*ONE_EPOCH, *overrides])
    parts = build(cfg)
    build_trainer(cfg, parts, sinks=[]).train()
    return cfg, parts


def test_a_new_loss_that_consumes_full_log_probs_switches_emission_on_and_receives_it():
    cfg, parts = train_one_epoch([MINE, WATCHER])
    assert cfg.policy.action_probs.emit_full_log_probs is True  # derived: no other setting names MyLoss
    assert parts.policy.action_probs.emit_full_log_probs is True
    num_actions = parts.env.spec.num_actions
    rollout = [shape for phase, shape in MyLoss.seen if phase == "rollout"]
    train = [shape for phase, shape in MyLoss.seen if phase == "train"]
    assert rollout and all(shape == (parts.env.spec.num_agents, num_actions) for shape in rollout)
    assert train and all(len(shape) == 3 and shape[-1] == num_actions for shape in train)  # [B, T, A]
    assert Watcher.emitted and all(Watcher.emitted)
    # Emission is a policy output, not a stored key: the buffer still holds no full distribution.
    assert keys.FULL_LOG_PROBS not in parts.experience.buffer.keys()


def test_the_new_loss_conforms_and_its_state_survives_a_checkpoint():
    check_loss("mine", [MINE])
    assert {phase for phase, _ in MyLoss.seen} == {"rollout", "train"}  # the kit ran its hook and trained with it


def test_the_same_loss_disabled_leaves_emission_off():
    cfg, parts = train_one_epoch([MINE, "+losses.mine.enabled=false", WATCHER])
    assert cfg.policy.action_probs.emit_full_log_probs is False
    assert "mine" not in parts.losses and MyLoss.seen == []
    assert Watcher.emitted and not any(Watcher.emitted)  # neither at rollout nor in training


def test_forcing_emission_off_under_the_new_loss_is_refused_in_one_line():
    cfg = compose_config([*ONE_EPOCH, MINE, "policy.action_probs.emit_full_log_probs=false"])
    with pytest.raises(ConfigError) as refused:
        build(cfg)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("loss 'mine' consumes full_log_probs")
    assert "drop the override policy.action_probs.emit_full_log_probs=false" in message
