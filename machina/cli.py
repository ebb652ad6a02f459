"""How entry points report a bad setting or a clean stop: a message and an exit code, not a deep traceback."""

import logging
import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode

from machina.errors import ConfigError, Interrupted, TrainingStopped

log = logging.getLogger("machina")

# The folder overrides a resume command replaces with this run's folder.
FOLDER_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=")


@contextmanager
def report_errors() -> Iterator[None]:
    """Turn ConfigError / TrainingStopped into one logged line.

    A constructor's ValueError raised while Hydra instantiates a config node is a bad setting too: Hydra wraps it,
    and the wrapper is unwrapped here. A single run exits with code 2. In a multirun the error is re-raised without
    its traceback, so Hydra reports the failed job and goes on with the others (exiting would end the whole sweep).
    A stop by SIGINT / SIGTERM (``Interrupted``, after its checkpoint) logs the command that resumes the run and
    exits with 128 + the signal number, in a multirun too: Ctrl-C or a preemption means the whole sweep.
    """
    try:
        yield
    except (ConfigError, TrainingStopped) as err:
        _report(err)
    except InstantiationException as err:
        if not isinstance(err.__cause__, ValueError):
            raise
        _report(ConfigError(unwrap(err)))


def unwrap(err: InstantiationException) -> str:
    """The constructor's own message, plus the config node Hydra was building when the message does not name it."""
    message = str(err.__cause__)
    node = re.search(r"^full_key: (\S+)$", str(err), re.M)
    if node and node.group(1) not in message:
        message += f" (building {node.group(1)})"
    return message


def _report(err: Exception) -> None:
    log.error("%s: %s", type(err).__name__, err)
    if isinstance(err, Interrupted):
        if HydraConfig.initialized():
            log.warning("to resume: %s", resume_command(sys.argv))
        raise SystemExit(128 + err.signum) from None
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise err.with_traceback(None) from None
    raise SystemExit(2) from None


def resume_command(argv: list[str]) -> str:
    """The command line that continues this run: the original one with this run's folder (a multirun's sweep
    folder) fixed, since Hydra's default folder is a new timestamped one on every start. Under torchrun the
    launcher's own arguments are not known here, so they are shown as ``torchrun ...``."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    folder = os.path.abspath(hydra_cfg.sweep.dir if multirun else hydra_cfg.runtime.output_dir)
    folder = f"hydra.{'sweep' if multirun else 'run'}.dir={folder}"
    args = [arg for arg in argv[1:] if not arg.startswith(FOLDER_KEYS)]
    launcher = "torchrun ..." if "LOCAL_RANK" in os.environ else "python"
    return shlex.join([*launcher.split(" "), argv[0], *args, folder])
