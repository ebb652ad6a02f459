"""A time limit on a third-party env's constructor.

PettingZoo's SISL pursuit, for one, places its agents by drawing random free cells until each lands on one: with
more pursuers and evaders than its grid has free cells (``env.kwargs.x_size=4 env.kwargs.y_size=4``) its constructor
never returns, and a run would hang at start-up with nothing said. Under ``time_limit`` it is refused in one line.
"""

import contextlib
import signal
import threading
from collections.abc import Iterator

from machina.errors import ConfigError

# Far more than any env of the kind takes to build (milliseconds to a few seconds), far less than a user waits.
CONSTRUCTOR_SECONDS = 60.0


class _Expired(BaseException):
    """Raised by the alarm inside the limited block: a BaseException, so that an env's ``except Exception`` around
    its own loop does not swallow it."""


@contextlib.contextmanager
def time_limit(what: str, seconds: float | None = None) -> Iterator[None]:
    """Run the block; ConfigError naming ``what`` once it has run ``seconds`` (``CONSTRUCTOR_SECONDS``). An alarm
    signal (SIGALRM) stops it, so only Python code is stopped, and only in a process's main thread: elsewhere (or
    where the platform has no interval timer) the block runs without a limit."""
    seconds = CONSTRUCTOR_SECONDS if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired:
        raise ConfigError(
            f"{what} did not return within {seconds:g} s; its settings may ask for the impossible (more agents than "
            "its map has room for, for one): check env.kwargs"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
