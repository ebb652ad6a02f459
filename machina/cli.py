"""How entry points report a bad setting or a clean stop: a message and an exit code, not a deep traceback."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode

from machina.errors import ConfigError, Interrupted, TrainingStopped

log = logging.getLogger("machina")


@contextmanager
def report_errors() -> Iterator[None]:
    """Turn ConfigError / TrainingStopped into one logged line.

    A constructor's ValueError raised while Hydra instantiates a config node is a bad setting too: Hydra wraps it,
    and the wrapper is unwrapped here. A single run exits with code 2. In a multirun the error is re-raised without
    its traceback, so Hydra reports the failed job and goes on with the others (exiting would end the whole sweep).
    A stop by SIGINT / SIGTERM (``Interrupted``, after its checkpoint) exits with 128 + the signal number, in a
    multirun too: Ctrl-C or a preemption means the whole sweep.
    """
    try:
        yield
    except (ConfigError, TrainingStopped) as err:
        _report(err)
    except InstantiationException as err:
        if not isinstance(err.__cause__, ValueError):
            raise
        _report(ConfigError(f"{err.__cause__} ({str(err).splitlines()[0]})"))


def _report(err: Exception) -> None:
    log.error("%s: %s", type(err).__name__, err)
    if isinstance(err, Interrupted):
        raise SystemExit(128 + err.signum) from None
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise err.with_traceback(None) from None
    raise SystemExit(2) from None
