"""The repository's commands run in the test's own process, as their scripts run them: ``python train.py ARGS`` and
``python eval.py ARGS`` execute the script as ``__main__`` (its preflight check, then its ``@hydra.main``
function), ``python -m machina.compare ARGS`` (and the other ``-m`` commands) call the module's ``main(argv)``; so a
test pays for the command and not for a new interpreter importing torch (2-4 s each on a 2-core CPU).

A subprocess stays where the process boundary is what a test checks: signals, the real script's exit code and the
folders Hydra makes before a command is refused, torchrun, worker processes. What a command changes for the whole
process (argv, cwd, environment, signal handlers, logging handlers, torch's threads and matrix-product precision,
Hydra's global state) is put back when it ends."""

import contextlib
import importlib
import io
import logging
import os
import runpy
import signal
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from machina.precision import set_matmul_precision

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """What a command run here did, as a subprocess's ``CompletedProcess`` tells it: the exit code (0 when the
    command returned) and what it wrote to stdout (Hydra's log lines) and to stderr (preflight's refusals)."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back everything a command sets for the whole process, whatever it raised."""
    argv, cwd, environ = sys.argv[:], os.getcwd(), dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        sys.argv[:] = argv
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for handler in root.handlers[:]:
            if handler not in root_handlers:
                root.removeHandler(handler)
                handler.close()
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        torch.set_num_threads(threads)
        set_matmul_precision(bf16=False, tf32=False)
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None


def run_script(script: str, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> Result:
    """``python SCRIPT ARGS`` (a script of the repository: ``train.py``, ``eval.py``, ``benchmarks/carry.py``) run
    from ``cwd`` with ``env`` added to the environment, in this process."""
    return _run([str(ROOT / script), *args], lambda: runpy.run_path(str(ROOT / script), run_name="__main__"), cwd, env)


def run_module(name: str, *args: str, cwd: Path = ROOT) -> Result:
    """``python -m NAME ARGS`` run from ``cwd`` in this process: the module's ``main(argv)``, whose return value is
    the exit code."""
    module = importlib.import_module(name)
    return _run([name, *args], lambda: sys.exit(module.main(list(args))), cwd, None)


def _run(argv: list[str], command, cwd: Path, env: dict[str, str] | None) -> Result:
    stdout, stderr = io.StringIO(), io.StringIO()
    with process_state_kept(), warnings.catch_warnings():
        # torchrun's @record (train.py) points the fault handler at stderr, which is a buffer here: it warns.
        warnings.filterwarnings("ignore", "Unable to enable fault handler", UserWarning)
        os.chdir(cwd)
        os.environ.update(env or {})
        sys.argv[:] = argv
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                command()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return Result(code, stdout.getvalue(), stderr.getvalue())


def one_error_line(result) -> str:
    """The one error line of a refused command (exit code 2, no traceback); ``result`` is a ``Result`` or a
    subprocess's ``CompletedProcess``."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "Error:" in line or "[ERROR]" in line]
    assert len(errors) == 1, output[-3000:]
    return errors[0]
