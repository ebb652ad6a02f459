"""What the machine offers a benchmark, so a number is read with its case: the CPU and its vector and matrix units,
the threads torch runs on, and whether another process is busy beside it.

``describe()`` returns one mapping (printed by ``python -m machina.bench`` before its results and stored with each
JSON result under ``"machine"``):

- ``cpu``: the model name (``/proc/cpuinfo``; the platform's processor string elsewhere);
- ``units``: which of ``amx_bf16``, ``avx512_bf16``, ``avx512f``, ``avx2`` the CPU reports;
- ``kernels``: the vector width torch's own kernels use (``AVX512``, ``AVX2``, ``DEFAULT``...; the
  ``ATEN_CPU_CAPABILITY`` variable lowers it);
- ``bf16_products``: whether ``system.bf16_matmuls=true`` can speed up float32 products here (AMX present and
  ``ONEDNN_MAX_CPU_ISA`` not limiting oneDNN below it). AVX512-BF16 alone does not count: on an AMD EPYC (Zen 4)
  with it and no AMX, torch 2.13 computes the flag's float32 products exactly, unrounded (tests/test_system.py);
- ``threads`` (torch's intra-op threads), ``cores`` (the cores this process may run on);
- ``load``: the 1-minute load average when the benchmark started (for the record: it still counts a benchmark that
  ended a minute ago);
- ``busy``: how many of the cores this process may run on other processes kept busy over the ``BUSY_WINDOW`` seconds
  before the benchmark started (``/proc/stat``'s non-idle time of those CPUs; this process sleeps meanwhile; 0.0
  where there is no ``/proc/stat``).

``busy`` of ``SHARED_BUSY`` or more means another process is at work now, taking at least about half a core: the
numbers are then lower and noisier than on a quiet machine, and ratios of two configurations measured side by side
are the only ones to trust. It is measured, not averaged over the last minute, so a benchmark run right after another
is not warned about the first one's load.
"""

import os
import platform
import sys
import time

import torch

UNITS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
BF16_UNITS = ("amx_bf16",)  # the units torch's bf16 float32 products run on (module docstring)
# oneDNN ISA limits below which those products are not used (ONEDNN_MAX_CPU_ISA, case-insensitive).
NO_BF16_ISAS = (
    "sse41",
    "avx",
    "avx2",
    "avx2_vnni",
    "avx2_vnni_2",
    "avx512_core",
    "avx512_core_vnni",
    "avx512_core_bf16",
    "avx512_core_fp16",
    "avx10_1_512",  # oneDNN's later name of avx512_core_fp16
)
SHARED_BUSY = 0.5  # cores
BUSY_WINDOW = 0.5  # seconds


def cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """The CPU's model name and flags from ``path`` (Linux's ``/proc/cpuinfo``); elsewhere the platform's name and
    no flags."""
    try:
        with open(path) as f:
            text = f.read(1 << 20)
    except OSError:
        return platform.processor() or platform.machine(), set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model or platform.machine(), flags


def bf16_products(flags: set[str]) -> bool:
    """Whether ``system.bf16_matmuls=true`` can speed up float32 products on a CPU with these ``cpuinfo`` flags:
    AMX present and ``ONEDNN_MAX_CPU_ISA`` not limiting oneDNN below it (module docstring)."""
    isa_limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
    return any(u in flags for u in BF16_UNITS) and isa_limit not in NO_BF16_ISAS


def describe(path: str = "/proc/cpuinfo") -> dict:
    """The machine as a benchmark sees it (module docstring); ``path`` is where the CPU describes itself."""
    model, flags = cpuinfo(path)
    units = [u for u in UNITS if u in flags]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "cpu": model,
        "units": units,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "bf16_products": bf16_products(flags),
        "threads": torch.get_num_threads(),
        "cores": cores,
        "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
        "busy": busy_cores(),
    }


def cpu_times(path: str = "/proc/stat", cpus: set[int] | None = None) -> tuple[int, int, int] | None:
    """(idle, total) jiffies summed over the CPUs ``cpus`` (all when None) and how many were read, from ``path``
    (Linux's ``/proc/stat``: one ``cpuN`` line per CPU, whose 4th and 5th counters are idle and iowait); None where it
    cannot be read. On a host shared with other containers only this process's CPUs say what slows it."""
    try:
        with open(path) as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    idle = total = read = 0
    for line in lines:
        name, *fields = line.split() or [""]
        if not (name.startswith("cpu") and name[3:].isdigit()) or (cpus is not None and int(name[3:]) not in cpus):
            continue
        counters = [int(x) for x in fields[:8]]
        idle, total, read = idle + counters[3] + counters[4], total + sum(counters), read + 1
    return (idle, total, read) if read else None


def busy_between(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> float:
    """Cores busy between two ``cpu_times`` readings: the non-idle share of the elapsed jiffies times the CPUs."""
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    idle, total = after[0] - before[0], after[1] - before[1]
    return (total - idle) / total * after[2]


def busy_cores(window: float = BUSY_WINDOW, path: str = "/proc/stat") -> float:
    """Cores other processes keep busy now, among those this process may run on: ``busy_between`` over ``window``
    seconds of this process sleeping."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    before = cpu_times(path, cpus)
    if before is None:
        return 0.0
    time.sleep(window)
    return busy_between(before, cpu_times(path, cpus))


def summary(machine: dict) -> str:
    """One line naming the case: CPU, units, torch's kernels, bf16 products, threads of cores, load."""
    units = " ".join(machine["units"]) or "none of " + " ".join(UNITS)
    bf16 = "on bf16 units" if machine["bf16_products"] else "no speed-up here (no bf16 units or oneDNN limited)"
    return (
        f"machine: {machine['cpu']}; units: {units}; torch kernels: {machine['kernels']}; "
        f"system.bf16_matmuls: {bf16}; {machine['threads']} threads of {machine['cores']} cores; "
        f"load {machine['load']:.2f}; {machine['busy']:.2f} cores busy"
    )


def announce() -> dict:
    """Print the machine's case (and the shared-machine warning) on stderr, once a benchmark has read its arguments;
    return the description."""
    described = describe()
    print(summary(described), file=sys.stderr)
    if warning := shared_warning(described):
        print(warning, file=sys.stderr)
    return described


def shared_warning(machine: dict) -> str | None:
    """A warning when other processes kept ``SHARED_BUSY`` cores or more busy as the benchmark started, else None."""
    if machine["busy"] < SHARED_BUSY:
        return None
    return (
        f"warning: other processes kept {machine['busy']:.2f} cores busy as the benchmark started: another process is "
        "busy on this machine, so the numbers are lower and noisier than on a quiet one; compare only configurations "
        "measured side by side (--compare)"
    )
