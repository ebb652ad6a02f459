"""emit_full_log_probs is derived from the enabled losses' classes; an explicit override wins; conflicts refused."""

import pytest
from omegaconf import OmegaConf

from machina import keys, resolvers
from machina.build import build_losses, check_policy_outputs
from machina.errors import ConfigError
from tests.conftest import compose_config

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
        return {keys.ACT_LOG_PROB, keys.VALUES} | ({keys.FULL_LOG_PROBS} if self.emit else set())


def test_forcing_emission_off_with_a_consumer_is_refused_with_the_override_named():
    cfg = compose_config([FAKE, "policy.action_probs.emit_full_log_probs=false"])
    losses = build_losses(cfg.losses)
    with pytest.raises(ConfigError, match=r"loss 'fake' consumes full_log_probs.*emit_full_log_probs=false"):
        check_policy_outputs(losses, _Policy(emit(cfg)))


def test_consistent_configuration_passes():
    cfg = compose_config([FAKE])
    check_policy_outputs(build_losses(cfg.losses), _Policy(emit(cfg)))
