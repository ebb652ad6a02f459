"""Stopping cleanly on SIGINT / SIGTERM: finish the epoch, checkpoint it, then stop."""

import logging
import signal
import threading

log = logging.getLogger(__name__)


class StopSignals:
    """Within the ``with`` block, the first SIGINT or SIGTERM only records ``signum`` (the trainer checkpoints at
    the end of the epoch and stops); from then on a second signal acts at once: SIGINT raises KeyboardInterrupt and
    SIGTERM terminates, whatever the process inherited (a background job of a non-interactive shell starts with
    SIGINT ignored, and restoring that would make the second Ctrl-C do nothing). The previous handlers are back
    after the block. Only the main thread can install handlers; elsewhere signals keep their usual effect."""

    # What a second signal does.
    AT_ONCE = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

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
        for sig, handler in self.AT_ONCE.items():
            signal.signal(sig, handler)
        log.warning(
            "%s: finishing epoch, then checkpointing and stopping (Ctrl-C again abandons the epoch)",
            signal.Signals(signum).name,
        )

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
