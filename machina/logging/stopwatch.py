"""Wall-clock time per named phase, accumulated on the host with perf_counter (no device syncs).

On a GPU, kernels run asynchronously, so the split between phases inside an epoch shows where the host waited;
the epoch total is exact because the epoch ends with one device read.
"""

import time
from collections import defaultdict


class Stopwatch:
    """``with stopwatch.time("rollout.env"): ...`` adds the block's seconds to that phase's total (also when the
    block raises). The rollout times five phases per env step, so a phase's timer is one object made at its first
    use, not a generator-based context manager per block (a third of the host cost); a phase therefore does not nest
    inside itself."""

    def __init__(self):
        self.totals: defaultdict[str, float] = defaultdict(float)
        self._timers: dict[str, _PhaseTimer] = {}

    def time(self, phase: str) -> "_PhaseTimer":
        timer = self._timers.get(phase)
        if timer is None:
            timer = self._timers[phase] = _PhaseTimer(self.totals, phase)
        return timer

    def pop(self) -> dict[str, float]:
        """Return the seconds per phase since the last call and start again from zero."""
        totals = dict(self.totals)
        self.totals.clear()
        return totals


class _PhaseTimer:
    __slots__ = ("totals", "phase", "start")

    def __init__(self, totals: defaultdict[str, float], phase: str):
        self.totals, self.phase, self.start = totals, phase, 0.0

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc_info) -> None:
        self.totals[self.phase] += time.perf_counter() - self.start
