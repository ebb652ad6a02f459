"""``python -m machina.speed.contention``: the main job's agent-steps/s on a quiet machine, beside one busy process and
as a two-job sweep, with torch's old thread settings ("before") and machina's ("after").

    python -m machina.speed.contention [--seconds 25] [--out contention.json] [HYDRA_OVERRIDE ...]
    ATEN_CPU_CAPABILITY=avx2 python -m machina.speed.contention system.bf16_matmuls=false   # an AVX2-only CPU's case

Every job is a fresh process (``job``) that builds the configuration as ``python -m machina.bench`` does
(``machina.speed.training.Setup``), trains one warm-up epoch, then measures whole epochs for about ``--seconds``.
Cases:

- quiet: one job alone;
- busy: one job beside a Python busy loop pinned to the last of this process's cores (started and killed here);
- sweep: two jobs at once, as a parallel launcher runs them (each keeps training until both have measured).

Settings: "before" is ``system.threads=0`` (torch's default, every core); "after" is machina's default
(``system.threads=auto``); both with libgomp's own wait (``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` unset;
``--wait NAME=VALUE`` tries another for "after" and "1 thread"); "1 thread" is ``system.threads=1`` per job, the
sweep's 2 jobs x 1 core. ``kept`` is a case's agent-steps/s (both jobs together in a sweep) over the quiet case of its
settings. Each of the 7 cases adds its jobs' start and warm-up epoch (about 10 s on a quiet 2-core machine) to
``--seconds``, so about 5 minutes in all there; on a busy machine "before" runs many times slower, and so does this.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from machina.speed import machine
from machina.speed.training import Setup
from machina.startup import threads

SETTINGS = {"before": ["system.threads=0"], "after": [], "1 thread": ["system.threads=1"]}
CASES = [("quiet", "before"), ("quiet", "after"), ("busy", "before"), ("busy", "after")]
CASES += [("sweep", "before"), ("sweep", "1 thread"), ("sweep", "after")]


def job(seconds: float, overrides: list[str], stop: str) -> None:
    """One job: print ``{"sps", "epochs", "threads"}`` (torch's threads after each measured epoch) as a JSON line,
    then keep training until ``stop`` exists (a sweep's other job is still measuring)."""
    setup = Setup(overrides)
    setup.epoch()  # warm-up: first-touch allocations, thread pools
    setup.epoch_seconds.clear()
    used = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(setup.epoch_seconds) < 2:
        setup.epoch()
        used.append(torch.get_num_threads())
    sps = setup.parts.experience.batch_size * len(used) / sum(setup.epoch_seconds)
    print(json.dumps({"sps": sps, "epochs": len(used), "threads": used}), flush=True)
    while not Path(stop).exists():
        setup.epoch()


def environment(settings: str, wait: str | None) -> dict[str, str]:
    """The jobs' environment: libgomp's own wait, or for the settings other than "before" ``wait`` where given."""
    env = {k: v for k, v in os.environ.items() if k not in threads.WAIT_VARIABLES}
    if wait and settings != "before":
        name, _, value = wait.partition("=")
        env[name] = value
    return env


def measure(case: str, settings: str, args: argparse.Namespace, folder: Path) -> dict:
    """Run ``case`` under ``settings``: one job (two for a sweep) and, for "busy", the busy loop beside it."""
    stop = folder / f"stop-{case}-{settings.replace(' ', '_')}"
    call = (args.seconds, [*args.overrides, *SETTINGS[settings]], str(stop))
    command = [sys.executable, "-c", f"from machina.speed.contention import job; job(*{call!r})"]
    env = environment(settings, args.wait)
    busy = None
    if case == "busy":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(busy.pid, {max(os.sched_getaffinity(0))})
    jobs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(1 + (case == "sweep"))]
    try:
        lines = [j.stdout.readline() for j in jobs]
    finally:
        stop.touch()
        for j in jobs:
            j.wait()
        if busy is not None:
            busy.kill()
            busy.wait()
    if not all(lines):
        raise SystemExit(f"contention: a job of case {case} ({settings}) failed (exit {[j.returncode for j in jobs]})")
    results = [json.loads(line) for line in lines]
    return {
        "case": case,
        "settings": settings,
        "jobs": len(results),
        "sps": sum(r["sps"] for r in results),
        "per_job": results,
    }


def table(rows: list[dict]) -> str:
    lines = [f"{'case':<8}{'settings':<10}{'jobs':>5}{'threads':>12}{'agent-steps/s':>15}{'kept':>7}"]
    quiet = {r["settings"]: r["sps"] for r in rows if r["case"] == "quiet"}
    for r in rows:
        used = "/".join(f"{min(j['threads'])}-{max(j['threads'])}" for j in r["per_job"])
        kept = f"{r['sps'] / quiet[r['settings']]:.0%}" if r["settings"] in quiet else "-"
        lines.append(f"{r['case']:<8}{r['settings']:<10}{r['jobs']:>5}{used:>12}{r['sps']:>15,.0f}{kept:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job, e.g. system.bf16_matmuls=false")
    parser.add_argument("--seconds", type=float, default=25.0, help="measured seconds per job (after 1 warm-up)")
    parser.add_argument("--wait", metavar="NAME=VALUE", help="the after wait policy, e.g. OMP_WAIT_POLICY=PASSIVE")
    parser.add_argument("--out", type=Path, help="write the machine and every case's results to this JSON file")
    args = parser.parse_args(argv)
    if args.wait and args.wait.partition("=")[0] not in threads.WAIT_VARIABLES:
        parser.error(f"--wait takes {' or '.join(threads.WAIT_VARIABLES)}=VALUE")
    described = machine.announce()
    rows = []
    print(table(rows), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for case, settings in CASES:
            rows.append(measure(case, settings, args, Path(folder)))
            print(table(rows).splitlines()[-1], flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": described, "overrides": args.overrides, "results": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
