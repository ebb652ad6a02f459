"""The conformance kit: check a part against what the trainer relies on, in one line of a test (in the spirit of
Gymnasium's ``check_env`` and TorchRL's ``check_env_specs``). Each check raises ``ConformanceError`` whose message
says, in one sentence, what to implement.

    check_env(cls, settings)       an env (its class and settings, or a make_env): spec, steps, capabilities, state
    check_component(spec)          a policy component (its class, a partial of it, or its slot's config)
    check_loss(name, overrides)    the loss ``losses.<name>`` of a composed config, through a real checkpoint
    check_sink(cls, folder)        a logger sink, through a run's calls, its files complete once closed
    check_round_trip(overrides, folder)    train, interrupt, resume (bit-exact), evaluate a config of your parts
"""

from machina.conformance.component import check_component
from machina.conformance.env import check_env
from machina.conformance.failure import ConformanceError
from machina.conformance.loss import check_loss
from machina.conformance.round_trip import check_round_trip
from machina.conformance.sink import check_sink

__all__ = ["ConformanceError", "check_component", "check_env", "check_loss", "check_round_trip", "check_sink"]
