"""Stopping cleanly on SIGINT / SIGTERM: finish the epoch, checkpoint it, then stop."""

import logging
import signal
import threading

log = logging.getLogger(__name__)


class StopSignals:
    """Within the ``with`` block, the first SIGINT or SIGTERM only records ``signum`` (the trainer checkpoints at
    the end of the epoch and stops); the previous handlers are back from then on, so a second signal acts at once.
    Only the main thread can install handlers; elsewhere signals keep their usual effect."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        self._restore()
        log.warning(
            "%s: finishing epoch, then checkpointing and stopping (Ctrl-C again abandons the epoch)",
            signal.Signals(signum).name,
        )

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
