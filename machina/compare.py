"""Compare runs side by side without the W&B UI: a table on the console and a PNG of SPS and return.

    python -m machina.compare outputs/multirun/2026-11-30_12-00-00_machina_1_sweep
    python -m machina.compare RUN_OR_SWEEP_DIR... --out compare.png --json

Each argument is a run folder or any folder above run folders (a sweep, or all of ``outputs/``). One row per run:
what it changed (the overrides that not all runs share), status, epochs, agent steps, SPS mean/max, final and best
return, wall time. A failed or interrupted job gets a row too, with the last error from its ``train.log``.
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from machina.run_folders import RunRecord, find_run_dirs, read_run

COLUMNS = ("job", "status", "changes", "epochs", "agent steps", "sps mean", "sps max", "final ret", "best ret", "wall")


def shared_overrides(runs: list[RunRecord]) -> list[str]:
    """Overrides every run has, in the first run's order: printed once, not in every row."""
    if len(runs) < 2:
        return []
    common = set.intersection(*(set(run.overrides) for run in runs))
    return [o for o in runs[0].overrides if o in common]


def changes(run: RunRecord, shared: list[str]) -> str:
    return " ".join(o for o in run.overrides if o not in shared) or "(defaults)"


def table(runs: list[RunRecord]) -> str:
    """A plain-text table, one row per run; an error line under each failed or incomplete run."""
    shared = shared_overrides(runs)
    rows = [
        (
            run.job,
            run.status,
            changes(run, shared),
            str(run.epochs),
            str(run.agent_steps),
            number(run.sps_mean),
            number(run.sps_max),
            number(run.final_return, 3),
            number(run.best_return, 3),
            f"{run.wall_time:.1f}s",
        )
        for run in runs
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    # Text columns align left, numbers right.
    align = ["<", "<", "<"] + [">"] * (len(COLUMNS) - 3)

    def line(cells) -> str:
        return "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(cells, align, widths, strict=True)).rstrip()

    lines = [f"shared overrides: {' '.join(shared)}"] if shared else []
    lines += [line(COLUMNS), line("-" * w for w in widths)]
    for run, row in zip(runs, rows, strict=True):
        lines.append(line(row))
        if run.error:
            lines.append(f"    {run.status}: {run.error}")
    return "\n".join(lines)


def plot(runs: list[RunRecord], out: Path) -> Path:
    """SPS and mean return against agent steps, one line per run that logged at least one epoch."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    shared = shared_overrides(runs)
    fig, (ax_sps, ax_ret) = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    for run in runs:
        if not run.curve:
            continue
        label = f"{run.job}: {changes(run, shared)}"[:60]
        steps = [step for step, _, _ in run.curve]
        ax_sps.plot(steps, [sps for _, sps, _ in run.curve], marker=".", label=label)
        # Only epochs in which an episode ended have a return; the line joins those.
        ended = [(step, r) for step, _, r in run.curve if r is not None]
        ax_ret.plot([step for step, _ in ended], [r for _, r in ended], marker=".", label=label)
    ax_sps.set(title="SPS (agent steps / s)", xlabel="agent steps")
    ax_ret.set(title="mean episode return", xlabel="agent steps")
    for ax in (ax_sps, ax_ret):
        ax.grid(alpha=0.3)
    if any(run.curve for run in runs):
        ax_ret.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def collect(directories: list[Path]) -> list[RunRecord]:
    """Every run under the given folders, each once, in the order of the arguments, then job order."""
    seen, runs = set(), []
    for directory in directories:
        for run_dir in find_run_dirs(directory):
            if run_dir.resolve() not in seen:
                seen.add(run_dir.resolve())
                runs.append(read_run(run_dir))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m machina.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run folders, sweep folders, or folders above them")
    parser.add_argument("--out", type=Path, help="PNG to write (default: <first dir>/compare.png)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run instead of the table")
    args = parser.parse_args(argv)

    runs = collect(args.dirs)
    if not runs:
        print(f"no run folders (with a .hydra/ inside) under {' '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    out = plot(runs, args.out or args.dirs[0] / "compare.png")
    if args.json:
        for run in runs:
            row = {k: v for k, v in asdict(run).items() if k != "curve"}
            print(json.dumps({**row, "path": str(run.path)}))
    else:
        print(table(runs))
    print(f"plot: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
