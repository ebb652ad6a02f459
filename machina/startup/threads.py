"""How many threads torch computes on: the decision, torch-free.

``machina.startup.system.System`` applies it (its docstring is the user's reference); this module holds the arithmetic
and the load reading, so that tests can check them without torch.

The wait policy is libgomp's own, or the user's. torch's CPU wheel runs its parallel regions on libgomp, whose threads
spin at each barrier (about 3 ms, ``GOMP_SPINCOUNT`` 300000 by default) before they sleep: on a machine where another
process is busy, a spinning thread keeps the core its descheduled partner needs, and every parallel region waits out
a scheduler slice. The thread count below removes the partner instead (one thread never waits for another); a shorter
spin, set before torch loads, cost a quiet run about 4% of its speed on a 2-core CPU, so machina sets none.
``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` in the environment are the user's choice (``wait_policy`` names them in the
start-up log).

The thread count (``system.threads: auto``). The cores this process may run on (``os.sched_getaffinity``) are divided
among the jobs that run at once on the machine (``jobs_at_once``: a Hydra joblib launcher's ``n_jobs``, torchrun's
local ranks); ``OMP_NUM_THREADS``, where set, is the most it takes. Then, before each epoch and each minibatch (at
most once a second), ``OthersLoad`` reads how much CPU time other processes took on those cores since the last
reading (``/proc/stat`` less this process and its descendants), and ``threads_for`` keeps torch off the cores they
were busy on.
"""

import math
import os
import time
from pathlib import Path

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_policy(environ: dict | None = None) -> str:
    """The wait policy in force, as the variables that set it (``libgomp's default`` when none is set)."""
    environ = os.environ if environ is None else environ
    return " ".join(f"{name}={environ[name]}" for name in WAIT_VARIABLES if name in environ) or "libgomp's default"


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def jobs_at_once(n_jobs: int | None, local_ranks: int, cores: int) -> int:
    """The processes of this command that compute at once on this machine: a joblib launcher's ``n_jobs`` (None
    when there is no such launcher; joblib's negative counts: -1 all cores, -2 all but one, ...) times torchrun's
    local ranks."""
    if n_jobs is None:
        launched = 1
    elif n_jobs < 0:
        launched = max(1, cores + 1 + n_jobs)
    else:
        launched = max(1, n_jobs)
    return launched * max(1, local_ranks)


def share(cores: int, jobs: int, omp_num_threads: str | None = None) -> int:
    """This job's part of ``cores`` when ``jobs`` share them (at least 1), at most ``OMP_NUM_THREADS`` where set."""
    threads = max(1, cores // max(1, jobs))
    if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
        threads = min(threads, int(omp_num_threads))
    return threads


def threads_for(cores: int, share: int, others_busy: float) -> int:
    """Threads for this job: its ``share`` of ``cores``, but none on a core other processes kept busy
    (``others_busy``: the cores' worth of CPU time they took, rounded half up), and at least 1."""
    return max(1, min(share, cores - math.floor(others_busy + 0.5)))


def compiled_threads(share: int, decided: int) -> int:
    """For a compiled run: the largest of ``share``, ``share // 2``, ``share // 4``, ... (at least 1) that is at
    most ``decided``. torch.compile specialises its code to the thread count and compiles it once per count, so a
    compiled run moves between at most log2(share) + 1 counts (two on 2 cores), each compiled once."""
    count = share
    while count > max(1, decided):
        count //= 2
    return count


class OthersLoad:
    """CPU time that other processes took on this process's cores, in cores, between two readings.

    ``/proc/stat`` counts each core's time in user, system, irq, softirq and steal (not nice: a process at a lower
    priority yields to this one); this process's own time (``/proc/self/stat``) and that of its descendants
    (MettaGrid workers, their forkserver, torch.compile's workers and their compilers) are taken off. Where
    ``/proc`` is missing ``read`` returns None.
    """

    def __init__(self, proc: Path = Path("/proc"), cpus: set[int] | None = None, min_seconds: float = 1.0):
        self.proc = proc
        self.cpus = cpus if cpus is not None else set(os.sched_getaffinity(0))
        self.min_seconds = min_seconds
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last = self._sample()

    def read(self, now: float | None = None) -> float | None:
        """The other processes' busy cores since the last reading; None when less than ``min_seconds`` passed (the
        reading is kept for later; only the clock is read, so a call per minibatch costs nothing) or ``/proc``
        cannot be read."""
        now = time.monotonic() if now is None else now
        if self.last is not None and now - self.last[0] < self.min_seconds:
            return None
        sample = self._sample(now)
        if sample is None or self.last is None:
            self.last = sample
            return None
        wall = sample[0] - self.last[0]
        busy, own = (sample[i] - self.last[i] for i in (1, 2))
        self.last = sample
        return max(0.0, (busy - own) / self.tick / wall)

    def _sample(self, now: float | None = None) -> tuple[float, int, int] | None:
        """(seconds, the cores' busy ticks, this process tree's ticks)."""
        try:
            busy = self._busy_ticks()
            own = self._tree_ticks(os.getpid())
        except OSError:
            return None
        return (time.monotonic() if now is None else now), busy, own

    def _busy_ticks(self) -> int:
        total = 0
        for line in (self.proc / "stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self.cpus:
                user, _nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
                total += user + system + irq + softirq + steal
        return total

    def _tree_ticks(self, pid: int) -> int:
        """utime + stime of ``pid`` and its live descendants, each with the time of the children it has waited for
        (cutime + cstime: torch.compile's workers run the C++ compiler as short-lived children). A process that
        ended meanwhile and was not waited for counts as 0."""
        try:
            fields = (self.proc / str(pid) / "stat").read_text().rpartition(")")[2].split()
            ticks = sum(int(field) for field in fields[11:15])
            children = [
                int(child)
                for task in (self.proc / str(pid) / "task").iterdir()
                for child in (task / "children").read_text().split()
            ]
        except (OSError, ValueError, IndexError):
            return 0
        return ticks + sum(self._tree_ticks(child) for child in children)
