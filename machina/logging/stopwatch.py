"""Wall-clock time per named phase, accumulated on the host with perf_counter (no device syncs).

On a GPU, kernels run asynchronously, so the split between phases inside an epoch shows where the host waited;
the epoch total is exact because the epoch ends with one device read.
"""

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    def __init__(self):
        self.totals: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[phase] += time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """Return the seconds per phase since the last call and start again from zero."""
        totals = dict(self.totals)
        self.totals.clear()
        return totals
