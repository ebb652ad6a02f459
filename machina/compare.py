"""Compare runs side by side without the W&B UI: a table on the console and a PNG of SPS and return.

    python -m machina.compare outputs/multirun/2026-11-30_12-00-00_machina_1_sweep
    python -m machina.compare RUN_OR_SWEEP_DIR... --out compare.png --json

Each argument is a run folder or any folder above run folders (a sweep, or all of ``outputs/``). One row per run:
job number (sweeps), status, what it changed (the overrides that not all runs share), epochs, agent steps, sps
(agent steps / training wall time) and the fastest epoch's SPS, final and best return, training wall time (the sum
of the epochs), the start date and the folder (a sweep job's folder, named after its overrides, as ``N_*``).

Which folders are listed, decided from what they hold: only training runs (``.hydra/config.yaml`` has a ``trainer``
node; ``eval.py``'s folders have none); of those, every job of a sweep (a failed job is part of its sweep's result),
and every single run that logged at least one epoch. A single run with no epoch (it stopped at start-up: a bad
setting) is left out, unless its folder is an argument itself. A stop by Ctrl-C or SIGTERM is ``incomplete`` (it
resumes), a stop with another error ``failed``; the last error of its ``train.log`` is printed under its row. A
folder with a file that cannot be read (not YAML, a directory in a file's place) is listed as ``damaged`` with the
reason, never left out, and never stops the others; what was skipped (metrics lines that are not rows, rows without
a metric) is printed under its row as a warning.

Command-line errors (no such folder, a picture that cannot be written there) are one line on stderr and exit code 2.
"""

import json
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

from machina.errors import ConfigError
from machina.plot import Parser, check_folders, plt, save_figure
from machina.run_folder.reading import RunRecord, find_run_dirs, is_training_run, read_run

COLUMNS = (
    "job",
    "status",
    "changes",
    "epochs",
    "agent steps",
    "sps",
    "sps max",
    "final ret",
    "best ret",
    "wall",
    "started",
    "folder",
)
# Text columns align left, numbers right.
ALIGN = "<<<>>>>>>><<"


def shared_overrides(runs: list[RunRecord]) -> list[str]:
    """Overrides every run has, in the first run's order: printed once, not in every row. Runs whose overrides
    could not be read (damaged) do not count."""
    known = [run.overrides for run in runs if run.overrides is not None]
    if len(known) < 2:
        return []
    common = set.intersection(*map(set, known))
    return [o for o in known[0] if o in common]


def changes(run: RunRecord, shared: list[str]) -> str:
    if run.overrides is None:
        return "?"
    return " ".join(o for o in run.overrides if o not in shared) or "(defaults)"


def table(runs: list[RunRecord], folders: dict[Path, str] | None = None) -> str:
    """A plain-text table, one row per run; an error line under each failed, incomplete or damaged run, then its
    warnings. ``folders`` maps a run's path to the name shown in the folder column (default: the path)."""
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
            f"{run.started:%Y-%m-%d %H:%M}" if run.started else "-",
            (folders or {}).get(run.path, str(run.path)),
        )
        for run in runs
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]

    def line(cells) -> str:
        return "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(cells, ALIGN, widths, strict=True)).rstrip()

    lines = [f"shared overrides: {' '.join(shared)}"] if shared else []
    lines += [line(COLUMNS), line("-" * w for w in widths)]
    for run, row in zip(runs, rows, strict=True):
        lines.append(line(row))
        if run.error:
            lines.append(f"    {run.status}: {run.error}")
        lines += [f"    warning: {warning}" for warning in run.warnings]
    return "\n".join(lines)


def plot(runs: list[RunRecord], out: Path, folders: dict[Path, str] | None = None) -> Path:
    """SPS and mean return against agent steps, one line per run that logged at least one epoch, and a legend
    beside them: each run's job (or folder) and what it changed, wrapped between overrides, never inside one.
    ConfigError naming the path when it cannot be written (``save_figure``)."""
    shared = shared_overrides(runs)
    fig, (ax_sps, ax_ret, ax_legend) = plt.subplots(
        1, 3, figsize=(10, 4), dpi=80, gridspec_kw={"width_ratios": [1, 1, 0.9]}
    )
    for run in runs:
        if not run.curve:
            continue
        name = run.job if run.sweep else (folders or {}).get(run.path, run.path.name)
        label = legend_label(f"{name}: {changes(run, shared)}")
        measured = [(step, sps) for step, sps, _ in run.curve if sps is not None]
        ax_sps.plot([step for step, _ in measured], [sps for _, sps in measured], marker=".", label=label)
        # Only epochs in which an episode ended have a return; the line joins those.
        ended = [(step, r) for step, _, r in run.curve if r is not None]
        ax_ret.plot([step for step, _ in ended], [r for _, r in ended], marker=".")
    ax_sps.set(title="SPS (agent steps / s)", xlabel="agent steps")
    ax_ret.set(title="mean episode return", xlabel="agent steps")
    for ax in (ax_sps, ax_ret):
        ax.grid(alpha=0.3)
    ax_legend.axis("off")
    if any(run.curve for run in runs):
        ax_legend.legend(*ax_sps.get_legend_handles_labels(), loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, out)


def legend_label(text: str, width: int = 40) -> str:
    """``text`` on lines of about ``width`` characters, broken only at spaces (between overrides)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def collect(directories: list[Path]) -> tuple[list[RunRecord], dict[Path, str], int]:
    """Every training run under the given folders, each once, in the order of the arguments, then job order (the
    rule is in the module docstring; a damaged run is always listed); the name of each run's folder relative to its
    argument; how many Hydra folders were left out."""
    seen, runs, folders, skipped = set(), [], {}, 0
    for directory in directories:
        for run_dir in find_run_dirs(directory):
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            run = read_run(run_dir) if is_training_run(run_dir) else None
            named = run_dir.resolve() == Path(directory).resolve()
            if run is None or not (run.sweep or run.epochs or named or run.status == "damaged"):
                skipped += 1
                continue
            runs.append(run)
            folders[run.path] = folder_name(run, directory)
    return runs, folders, skipped


def folder_name(run: RunRecord, directory: Path) -> str:
    """The run's folder relative to the argument it was found under (the argument itself when it is the run); a
    sweep job's folder (``N_OVERRIDES``, the overrides are in the changes column) as the glob ``N_*``."""
    relative = run.path.relative_to(directory)
    if relative == Path():
        return str(directory)
    if run.sweep and relative.name.startswith(f"{run.job}_"):
        relative = relative.with_name(f"{run.job}_*")
    return str(relative)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code: 0, or 2 with one line on stderr for a command-line error (no such
    folder, no training run in it, a picture that cannot be written)."""
    parser = Parser(prog="python -m machina.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run folders, sweep folders, or folders above them")
    parser.add_argument("--out", type=Path, help="PNG to write (default: <first dir>/compare.png)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run instead of the table")
    args = parser.parse_args(argv)
    check_folders(parser, args.dirs)

    runs, folders, skipped = collect(args.dirs)
    if runs:
        try:
            out = plot(runs, args.out or args.dirs[0] / "compare.png", folders)
        except ConfigError as err:  # only this line on stderr: the command did nothing
            print(f"{parser.prog}: error: {err}", file=sys.stderr)
            return 2
    left_out = (
        f"left out {skipped} folder(s) that are not training runs (eval.py output) or stopped before their first "
        "epoch (start-up errors); name a folder to see it"
    )
    if not runs:
        where = " ".join(map(str, args.dirs))
        print(f"{parser.prog}: error: no training runs (folders with a .hydra/ inside) under {where}", file=sys.stderr)
        return 2
    if skipped:
        print(left_out, file=sys.stderr)
    if args.json:
        for run in runs:
            row = {k: v for k, v in asdict(run).items() if k != "curve"}
            started = run.started.isoformat(" ") if run.started else None
            print(json.dumps({**row, "path": str(run.path), "folder": folders[run.path], "started": started}))
    else:
        print(table(runs, folders))
    print(f"plot: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
