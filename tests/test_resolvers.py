"""emit_full_log_probs is derived from the enabled losses' classes; an explicit override wins; conflicts refused."""

import itertools

import pytest
from omegaconf import OmegaConf

from machina import keys
from machina.errors import ConfigError
from machina.startup import resolvers
from machina.startup.build import build, build_losses, check_policy_outputs
from tests.conftest import CONF, compose_config

FAKE = "+losses.fake._target_=tests.fake_losses.ConsumesFullLogProbs"


def emit(cfg) -> bool:
    return cfg.policy.action_probs.emit_full_log_probs


def test_ppo_alone_does_not_emit():
    assert emit(compose_config(["losses=ppo"])) is False
    assert emit(compose_config()) is False


def test_a_loss_that_consumes_full_log_probs_turns_emission_on():
    assert emit(compose_config([FAKE])) is True


def test_disabled_consumer_does_not_count():
    assert emit(compose_config([FAKE, "+losses.fake.enabled=false"])) is False


def test_no_losses_gives_false():
    assert emit(compose_config(["losses=[]"])) is False


def test_explicit_override_wins_both_ways():
    assert emit(compose_config(["policy.action_probs.emit_full_log_probs=true"])) is True
    assert emit(compose_config([FAKE, "policy.action_probs.emit_full_log_probs=false"])) is False


def test_resolver_reads_the_live_losses_node():
    resolvers.register()
    cfg = OmegaConf.create({"losses": {}, "flag": "${consumes:full_log_probs,${losses}}"})
    assert cfg.flag is False
    cfg.losses.fake = {"_target_": "tests.fake_losses.ConsumesFullLogProbs"}
    assert cfg.flag is True  # not cached


def test_register_is_idempotent():
    resolvers.register()
    resolvers.register()
    assert OmegaConf.has_resolver("consumes")


class _Policy:
    def __init__(self, emit: bool):
        self.emit = emit

    def output_keys(self):
        return {keys.ACT_LOG_PROB, keys.ENTROPY, keys.VALUES} | ({keys.FULL_LOG_PROBS} if self.emit else set())


def test_forcing_emission_off_with_a_consumer_is_refused_with_the_override_named():
    cfg = compose_config([FAKE, "policy.action_probs.emit_full_log_probs=false"])
    losses = build_losses(cfg.losses)
    with pytest.raises(ConfigError, match=r"loss 'fake' consumes full_log_probs.*emit_full_log_probs=false"):
        check_policy_outputs(losses, _Policy(emit(cfg)))


def test_consistent_configuration_passes():
    cfg = compose_config([FAKE])
    check_policy_outputs(build_losses(cfg.losses), _Policy(emit(cfg)))


def test_a_loss_that_consumes_what_the_policy_does_not_write_is_refused_naming_the_key():
    cfg = compose_config(["losses=[ppo]"])
    losses = build_losses(cfg.losses)

    class NoEntropy(_Policy):
        def output_keys(self):
            return super().output_keys() - {keys.ENTROPY}

    with pytest.raises(ConfigError, match=r"loss 'ppo' consumes entropy, which the policy does not write \(it writes"):
        check_policy_outputs(losses, NoEntropy(False))


LOSS_OPTIONS = sorted(p.stem for p in (CONF / "losses").glob("*.yaml"))
PAIRS = [[a] for a in LOSS_OPTIONS] + [list(p) for p in itertools.combinations(LOSS_OPTIONS, 2)]


@pytest.mark.parametrize("selection", PAIRS, ids=lambda s: "+".join(s))
def test_emission_for_every_one_or_two_losses(selection):
    cfg = compose_config([f"losses=[{','.join(selection)}]"])
    consumers = {"supervisor", "sliced_scripted_cloner", "eer_kickstarter", "eer_cloner"}
    assert emit(cfg) is bool(consumers & set(selection))


@pytest.mark.parametrize(
    ("losses", "stored", "absent"),
    [
        ("[ppo]", {keys.ACT_LOG_PROB, keys.VALUES, keys.REWARDS}, {keys.FULL_LOG_PROBS, keys.TEACHER_ACTIONS}),
        ("[ppo,supervisor]", {keys.TEACHER_ACTIONS}, {keys.FULL_LOG_PROBS, keys.PPO_MASK}),
        ("[sliced_scripted_cloner,ppo]", {keys.TEACHER_ACTIONS, keys.PPO_MASK, keys.TEACHER_MASK}, set()),
        ("[supervisor]", {keys.TEACHER_ACTIONS, keys.OBS, keys.VALUES}, {keys.FULL_LOG_PROBS, keys.PPO_MASK}),
    ],
)
def test_buffer_stores_only_what_the_enabled_losses_ask_for(losses, stored, absent):
    parts = build(compose_config(["debug=tiny", f"losses={losses}"]))
    columns = set(parts.experience.buffer.keys())
    assert stored <= columns
    assert not (absent & columns)
    assert keys.FULL_LOG_PROBS not in columns  # no loss stores the policy's full distribution
    assert parts.env.teacher is (keys.TEACHER_ACTIONS in columns)
