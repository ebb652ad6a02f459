"""SIGINT and SIGTERM outside training: one line and exit 128 + the signal, not a traceback or a silent kill.

``train.py`` and ``eval.py`` call ``install`` first thing, before they import torch and Hydra (seconds on a busy
machine), so that a Ctrl-C or a scheduler's SIGTERM at any moment of start-up (the imports, the composition, a
MettaGrid worker starting) raises ``StoppedAtStartUp`` where the process is. The blocks it is in clean up as for any
error: a start not yet accepted removes the folder Hydra made for it (``machina.run_folder.run_record``), workers
are stopped, nothing is left behind, ``.machina.lock`` included. The command (its body run in ``reported``) then
ends with one line naming the signal; ``sys.excepthook`` reports a signal during the imports, before any ``try``.
The trainer takes the signals over while it trains (``machina.training.stop_signals``) and gives them back after.
As there, a SIGINT the process inherited as ignored (a background job of a non-interactive shell) is taken too: a
Ctrl-C or ``kill -INT`` meant for the command must stop it.

This module imports nothing heavy: it must be importable in milliseconds.
"""

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class StoppedAtStartUp(KeyboardInterrupt):
    """SIGINT or SIGTERM while no trainer held the signals."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum, frame) -> None:
    raise StoppedAtStartUp(signum)


_after = ""


def install(after: str = "") -> None:
    """Turn SIGINT / SIGTERM into ``StoppedAtStartUp``; one that escapes the module's imports (no ``try`` yet) is
    reported by ``sys.excepthook``, one during the command by ``reported``, as ``<program>: stopped by
    SIGINT<after>``."""
    global _after
    _after = after
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise)
    previous = sys.excepthook

    def during_imports(kind, error, traceback) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, error, traceback)
            return
        signum = _report(error)
        os._exit(128 + signum)  # the exit code a signal gives; nothing was started yet that needs cleaning up

    sys.excepthook = during_imports


@contextmanager
def reported() -> Iterator[None]:
    """The command's body: a KeyboardInterrupt or ``StoppedAtStartUp`` ends it with one line and exit 128 + the
    signal number, after the blocks it was raised in cleaned up and with the interpreter's own exit handlers run."""
    try:
        yield
    except KeyboardInterrupt as err:
        raise SystemExit(128 + _report(err)) from None


def _report(error: BaseException) -> int:
    signum = error.signum if isinstance(error, StoppedAtStartUp) else signal.SIGINT
    print(f"{Path(sys.argv[0]).name}: stopped by {signal.Signals(signum).name}{_after}", file=sys.stderr)
    sys.stderr.flush()
    return signum
