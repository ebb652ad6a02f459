"""How entry points report a bad setting or a clean stop: a message and an exit code, not a deep traceback."""

import logging
import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException

from machina.errors import ConfigError, Interrupted, TrainingStopped

log = logging.getLogger("machina")

# What a constructor raises for a bad setting (a wrong value, a missing or misspelt argument, a class that cannot be
# imported); Hydra wraps them while it builds a config node.
SETTING_ERRORS = (ValueError, TypeError, ImportError)
# The folder overrides a resume command replaces with this run's folder.
FOLDER_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=")
# Left out of the printed resume command: it continues the folder's latest checkpoint.
RESUME_KEYS = ("resume=",)


@contextmanager
def report_errors() -> Iterator[None]:
    """Turn ConfigError / TrainingStopped into one logged line.

    A constructor's ValueError / TypeError / ImportError raised while Hydra instantiates a config node is a bad
    setting too: Hydra wraps it, and the wrapper is unwrapped here; so is an OmegaConf error (a deleted key, an
    interpolation that cannot be resolved). A single run exits with code 2. In a multirun the error is re-raised without
    its traceback, so Hydra reports the failed job and goes on with the others (exiting would end the whole sweep).
    A stop by SIGINT / SIGTERM (``Interrupted``, after its checkpoint) logs the command that resumes the run and
    exits with 128 + the signal number, in a multirun too: Ctrl-C or a preemption means the whole sweep.
    """
    try:
        yield
    except (ConfigError, TrainingStopped) as err:
        _report(err)
    except OmegaConfBaseException as err:  # a key deleted (~key) or an interpolation that cannot be resolved
        key = getattr(err, "full_key", None) or "the config"
        program = Path(sys.argv[0]).name
        _report(ConfigError(f"{key}: {str(err).splitlines()[0]}; fix or set {key} (python {program} --cfg job)"))
    except InstantiationException as err:
        if not isinstance(err.__cause__, SETTING_ERRORS):
            raise
        _report(ConfigError(unwrap(err)))


def unwrap(err: InstantiationException) -> str:
    """The constructor's own message, plus the config node Hydra was building when the message does not name it."""
    message = " ".join(str(err.__cause__).split())  # one line: a log line per error
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
    """The command line that continues this run: the original one without ``resume=`` (a resume continues the
    folder's latest checkpoint; an explicit older one would rewind the run) and with this run's folder (a multirun's
    sweep folder) fixed, since Hydra's default folder is a new timestamped one on every start. Under torchrun the
    launcher's own arguments are not known here, so they are shown as ``torchrun ...``."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    folder = os.path.abspath(hydra_cfg.sweep.dir if multirun else hydra_cfg.runtime.output_dir)
    return command(argv, f"hydra.{'sweep' if multirun else 'run'}.dir={folder}", drop=RESUME_KEYS)


def new_folder_command(argv: list[str], run_dir: Path) -> str:
    """The command line that starts this command in a new folder (``<run_dir>-2``, ``-3``, ... whichever does not
    exist yet; ``NEW_FOLDER`` in a multirun, whose jobs' folders Hydra names)."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun:
        return command(argv, "hydra.sweep.dir=NEW_FOLDER")
    n, new = 2, Path(f"{run_dir}-2")
    while new.exists():
        n += 1
        new = Path(f"{run_dir}-{n}")
    return command(argv, f"hydra.run.dir={new}")


def command(argv: list[str], folder: str, drop: tuple[str, ...] = ()) -> str:
    """``argv`` as a shell command with its run-folder override replaced by ``folder`` and ``drop``'s keys left
    out."""
    args = [arg for arg in argv[1:] if not arg.lstrip("+~").startswith((*FOLDER_KEYS, *drop))]
    launcher = "torchrun ..." if "LOCAL_RANK" in os.environ else "python"
    return shlex.join([*launcher.split(" "), argv[0], *args, folder])
