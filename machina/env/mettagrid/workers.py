"""Where ``MettaGridEnv``'s envs step: in this process (``Local``) or in worker processes (``Workers``), behind one
interface: ``start(command, group)`` begins a command (``sims``: STEP, START_ALL, RESTART) on one group
of envs (or ``ALL_GROUPS``) and ``finish()`` waits until the oldest command started is done (workers run commands
in the order sent, so two groups can be in flight at once).

Workers share the batch arrays through one ``multiprocessing`` ``RawArray`` mapped by every process (nothing is
pickled per step: a command is two bytes through a ``Pipe``). Worker w steps a contiguous part of EACH group's
envs, so every worker is busy whichever group steps. Workers are started by forkserver (spawn where there is no
forkserver), never forked from a process whose torch threads may be running; the forkserver removes its
temporary folder when it exits, so a killed trainer leaves no ``pymp-*`` folder behind. A worker that dies or whose
engine raised makes ``finish`` raise ``EnvFailed`` (``multiprocessing.connection.wait`` on the pipes and the processes'
sentinels, in slices of ``POLL_S``); so does a worker alive but not answering: one stopped (SIGSTOP, a debugger:
its state in ``/proc``) within about ``STOPPED_S``, one that runs on without answering (a livelock) once a step
takes ``STEP_FLOOR_S`` plus ``STEP_FACTOR`` times the slowest step answered so far, or once any other command takes
``REPLY_TIMEOUT_S``. Workers ignore SIGINT, exit when the parent closes their pipe or dies, and ``close`` (also run
at garbage collection and interpreter exit) stops and joins them.
"""

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import shutil
import signal
import time
import weakref
from collections import deque
from multiprocessing import forkserver
from multiprocessing.connection import wait

from machina.env.mettagrid import sims
from machina.env.mettagrid.sims import ALL_GROUPS, QUIT, Sims
from machina.errors import EnvFailed, one_line

REPLY_TIMEOUT_S = 600.0  # a start or restart (new maps for every env) unanswered this long means a hung engine
STEP_FLOOR_S = 10.0  # a step unanswered this long, plus STEP_FACTOR x the slowest step so far, means a hung engine
STEP_FACTOR = 20.0  # (a loaded machine's scheduler may pause a worker a while; a livelock never answers)
STOPPED_S = 1.0  # a worker stopped (SIGSTOP, a debugger) this long is not coming back by itself
POLL_S = 0.25  # how often a wait looks at the workers' states


def group_parts(num_envs: int, groups: int, workers: int) -> list[list[range]]:
    """Per worker, its contiguous part of each group's envs (group g holds envs [g * E / G, (g + 1) * E / G))."""
    size = num_envs // groups
    return [
        [range(g * size + w * size // workers, g * size + (w + 1) * size // workers) for g in range(groups)]
        for w in range(workers)
    ]


class Local:
    """The envs stepped in this process (one ``Sims`` over all of them; one group), with ``teacher``'s actions."""

    pids: tuple[int, ...] = ()

    def __init__(self, cfg, num_envs: int, seed: int, stagger: bool, stats: tuple[str, ...], arrays, teacher=None):
        self.sims = Sims(cfg, range(num_envs), num_envs, seed, stagger, stats, arrays, teacher)

    def start(self, command: bytes, group: int) -> None:
        try:
            self.sims.run(command)
        except Exception as err:  # as a worker reports it: the run stops with a checkpoint, in one line
            raise EnvFailed(f"MettaGrid's engine raised {one_line(f'{type(err).__name__}: {err}')}") from None

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class Workers:
    """``workers`` processes stepping the envs of ``groups`` groups in the shared ``buffer`` (``batch_layout``); with
    ``teacher`` (an ``ArenaTeacher``), each also writes the teacher's actions for the envs it steps."""

    def __init__(self, workers: int, groups: int, buffer, layout: dict, cfg, num_envs: int, seed: int,
                 stagger: bool, stats: tuple[str, ...], teacher=None):  # fmt: skip
        ctx = context()
        self.conns, self.procs = [], []
        for parts in group_parts(num_envs, groups, workers):
            parent, child = ctx.Pipe()
            args = (child, buffer, layout, cfg, parts, num_envs, seed, stagger, stats, teacher)
            proc = ctx.Process(target=sims.serve, args=args, daemon=True, name="machina-env-worker")
            proc.start()
            child.close()  # the worker holds the only other end: its end closing is our EOF, and ours is its
            self.conns.append(parent)
            self.procs.append(proc)
        self.pids = tuple(proc.pid for proc in self.procs)
        self.messages = {
            (command, group): bytes((command[0], group))
            for command in (sims.STEP, sims.START_ALL, sims.RESTART)
            for group in (*range(groups), ALL_GROUPS)
        }
        self.failed: str | None = None
        self.pending = 0  # commands sent and not yet answered
        self.sent: deque[bytes] = deque()  # those commands, oldest first
        self.slowest_step = 0.0  # seconds: the slowest step answered so far (what a step may be expected to take)
        self._finalizer = weakref.finalize(self, shutdown, self.procs, self.conns)

    def start(self, command: bytes, group: int) -> None:
        """Send ``command`` for ``group`` to every worker."""
        if self.failed:
            raise EnvFailed(self.failed)
        message = self.messages[command, group]
        for w, conn in enumerate(self.conns):
            try:
                conn.send_bytes(message)
            except OSError:  # its end is closed: the worker died
                self.procs[w].join(1.0)
                self._fail(w, "")
        self.pending += 1
        self.sent.append(command)

    def finish(self) -> None:
        """Wait for every worker's answer to the oldest command sent; EnvFailed if one died, its engine raised, it
        is stopped or it does not answer in time (see the module docstring)."""
        if not self.pending:
            return
        self.pending -= 1
        command = self.sent.popleft()
        started = time.monotonic()
        limit = STEP_FLOOR_S + STEP_FACTOR * self.slowest_step if command == sims.STEP else REPLY_TIMEOUT_S
        waiting = dict(enumerate(self.conns))
        sentinels = {proc.sentinel: w for w, proc in enumerate(self.procs)}
        stopped_since: dict[int, float] = {}
        while waiting:
            ready = wait([*waiting.values(), *(s for s, w in sentinels.items() if w in waiting)], POLL_S)
            for w, conn in list(waiting.items()):
                if conn in ready:  # an answer (or the EOF of a worker that died) comes before its sentinel
                    try:
                        error = conn.recv_bytes()
                    except (EOFError, OSError):
                        self.procs[w].join(1.0)
                        self._fail(w, "")
                    if error:
                        self._fail(w, f"its engine raised {error.decode(errors='replace')}")
                    del waiting[w]
            for sentinel in ready:
                if sentinel in sentinels and sentinels[sentinel] in waiting:
                    self._fail(sentinels[sentinel], "")
            if waiting and not ready:
                self._check_answering(waiting, started, limit, stopped_since)
        if command == sims.STEP:
            self.slowest_step = max(self.slowest_step, time.monotonic() - started)

    def _check_answering(self, waiting: dict, started: float, limit: float, stopped_since: dict[int, float]) -> None:
        """EnvFailed naming the first worker of ``waiting`` that has been stopped for ``STOPPED_S``, or the first one
        when the command has waited ``limit`` seconds."""
        now = time.monotonic()
        for w in waiting:
            if not stopped(self.procs[w].pid):
                stopped_since.pop(w, None)
            elif now - stopped_since.setdefault(w, now) >= STOPPED_S:
                self._fail(w, "is stopped (SIGSTOP or a debugger) and does not answer; SIGCONT resumes it")
        if now - started > limit:
            w = next(iter(waiting))
            self._fail(
                w, f"did not answer within {limit:.0f} s (the slowest step so far took {self.slowest_step:.2f} s)"
            )

    def _fail(self, w: int, why: str) -> None:
        proc = self.procs[w]
        if not why:
            code = proc.exitcode
            died = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            why = f"died ({died})"
        self.failed = f"MettaGrid env worker {w + 1} of {len(self.procs)} (pid {proc.pid}) {why}"
        raise EnvFailed(self.failed)

    def close(self) -> None:
        """Stop and join every worker (idempotent)."""
        self._finalizer()


def shutdown(procs: list, conns: list) -> None:
    """Ask each worker to quit, close the pipes, and join (terminating, then killing, a worker that lingers)."""
    for conn in conns:
        with contextlib.suppress(OSError):  # a worker that died has closed its end
            conn.send_bytes(bytes((QUIT[0], 0)))
        conn.close()
    for proc in procs:
        proc.join(2.0)
        if proc.exitcode is None:
            proc.terminate()
            proc.join(1.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal or a tracer (its state in ``/proc``, T or t); False where
    there is no ``/proc`` (the reply timeout still applies there)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def worker_count(workers: int | str, envs_per_group: int, cores: int) -> int:
    """Processes for the ``workers`` setting: at most one per env of a group; ``auto``: one per core but one, at
    least one."""
    wanted = max(cores - 1, 1) if workers == "auto" else int(workers)
    return min(wanted, envs_per_group)


def remove_listener_folder() -> None:
    """At the exit of the forkserver (which imports this module first, ``context``): remove the temporary folder
    (``pymp-*``) that holds its listening socket. The trainer's process removes it when it exits normally; when it is
    killed, the forkserver, which exits as soon as the trainer is gone, is the one left to do it. Nothing is done in
    any other process: the trainer (which knows the server's pid) or a worker forked from the server."""
    server = forkserver._forkserver
    address = getattr(server, "_forkserver_address", None)
    if (
        os.getpid() != IMPORTED_BY
        or getattr(server, "_forkserver_pid", None) is not None
        or not isinstance(address, str)
    ):
        return
    if os.path.basename(os.path.dirname(address)).startswith("pymp-"):
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


IMPORTED_BY = os.getpid()  # a worker forked from the server inherits the exit handler, not this pid
atexit.register(remove_listener_folder)


def context():
    """The multiprocessing context workers start from: forkserver where there is one (a server process imports this
    module and the stepping core once, then forks each worker from itself, never from the trainer; it removes its
    temporary folder when it exits: ``remove_listener_folder``), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # "__main__" (the default) has the server import the main module once; Pythons without the fix of CPython issue
    # 126631 (3.13.8 and later have it) ignore it, so each worker imports the main module itself (train.py: torch).
    ctx.set_forkserver_preload(["__main__", "machina.env.mettagrid.workers"])
    return ctx


def shared_buffer(size: int):
    """``size`` bytes of shared memory (zeroed) that workers started from ``context()`` map too."""
    return context().RawArray(ctypes.c_uint8, size)
