"""Plot a run's metrics.jsonl: ``python -m machina.plot RUN_DIR [--out PATH]`` (default ``RUN_DIR/plot.png``).

Three panels against ``metric/agent_step``: return (``overview/reward``, and ``eval/return`` when the run has
evaluation rows), SPS (``overview/sps``) and every loss term (``losses/<loss>/loss_*``). Null values (epochs in
which no episode ended) are gaps.

``python -m machina.plot RUN_DIR... --returns --out PATH``: one panel of the training return of several runs (seeds
of one recipe), each as a running mean over ``--window`` epochs that ended an episode
(docs/how-to/gymnasium.md's curves).
``--metric eval/return`` draws the periodic evaluation instead (``trainer.eval_interval``), ``--x minutes``
against training wall time (the sum of ``timing/epoch``; evaluation is timed apart) instead of agent steps, and
``--line teacher=7.88`` adds a labelled horizontal reference (docs/explanation/lab_notebook.md's curves).

A metrics line that is not a row (torn by a kill, not JSON) and a value that is not a number are left out, with a
warning on stderr for each skipped line; with ``--returns`` a folder whose metrics cannot be read is left out with a
warning. Command-line errors (no such folder, unreadable metrics, a picture that cannot be written) are one line on
stderr and exit code 2.
"""

import argparse
import math
import sys
from pathlib import Path
from typing import NoReturn

import matplotlib

from machina.errors import ConfigError
from machina.files import metrics_file
from machina.files.atomic import atomic_write

matplotlib.use("Agg")  # files only: no display, also on headless machines
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen before pyplot is imported

STEP = "metric/agent_step"
PANELS = (
    ("return", ("overview/reward", "eval/return")),
    ("agent steps / s", ("overview/sps",)),
    ("loss", ()),  # filled with the run's losses/<loss>/loss_* keys
)
DPI = 80


class Parser(argparse.ArgumentParser):
    """argparse whose command-line errors are one line on stderr and exit code 2, with no usage block above it
    (compare and plot)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check_folders(parser: Parser, folders: list[Path]) -> None:
    """A command-line error for an argument that is not an existing folder."""
    for folder in map(Path, folders):
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder" if folder.exists() else f"no such folder: {folder}")


def save_figure(fig, out: Path) -> Path:
    """Write ``fig`` to ``out`` in the format its suffix names (its folder made if needed) through a temp file, so a
    failure leaves no half picture; close the figure. ConfigError naming the path and ``--out`` when it cannot be
    written there (a read-only folder, a full disk, a folder in its place) or the suffix names no picture format."""
    out = Path(out)
    kind = out.suffix[1:].lower()
    try:
        if kind not in fig.canvas.get_supported_filetypes():
            raise ConfigError(f"--out {out}: name the picture with a .png suffix (or .svg, .pdf, .jpg)")
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda file: fig.savefig(file, format=kind, dpi=DPI))
    except OSError as err:
        raise ConfigError(
            f"cannot write {out} ({err.strerror or err}): pass --out PATH to write the picture elsewhere"
        ) from None
    finally:
        plt.close(fig)
    return out


def float_rows(run_dir: Path) -> tuple[list[dict[str, float]], list[str]]:
    """The rows of ``run_dir``'s metrics.jsonl (``metrics_file.read_metrics``) with every value a float: NaN (a gap in
    the plot) for null or anything that is not a number; and the warnings about skipped lines, each naming the run
    folder. ConfigError when the file is missing or cannot be read."""
    run_dir = Path(run_dir)
    if not (run_dir / metrics_file.NAME).exists():
        raise ConfigError(f"no {metrics_file.NAME} in {str(run_dir)!r}: pass a run folder written by train.py")
    rows, warnings = metrics_file.read_metrics(run_dir)
    rows = [{k: math.nan if (v := metrics_file.number(row, k)) is None else v for k in row} for row in rows]
    return rows, [f"{run_dir}: {warning}" for warning in warnings]


def loss_keys(rows: list[dict[str, float]]) -> list[str]:
    names = dict.fromkeys(k for row in rows for k in row)
    return [k for k in names if k.startswith("losses/") and k.rsplit("/", 1)[-1].startswith("loss_")]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, list[str]]:
    """Draw ``run_dir``'s metrics.jsonl to a PNG; return its path and the warnings about what was skipped. A row
    without an agent step is a gap."""
    run_dir = Path(run_dir)
    rows, warnings = float_rows(run_dir)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6), constrained_layout=True)
    for ax, (label, names) in zip(axes, PANELS, strict=True):
        for key in names or loss_keys(rows):
            points = [(row.get(STEP, math.nan), row[key]) for row in rows if key in row]
            if points:
                ax.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None, label=key)
        ax.set_xlabel("agent steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    fig.suptitle(str(run_dir), fontsize="small")
    return save_figure(fig, Path(out) if out else run_dir / "plot.png"), warnings


X_AXES = {"steps": "agent steps", "minutes": "training wall time (minutes)"}


def curve(
    rows: list[dict[str, float]], metric: str = "overview/reward", x: str = "steps", window: int = 10
) -> tuple[list[float], list[float]]:
    """(x, y) of one run: ``metric`` in the epochs where it is finite, as a running mean over the last ``window`` of
    them, against agent steps or the minutes of training up to the end of that epoch. A row without its x (no agent
    step; no epoch time, which then adds nothing to the minutes) is left out."""
    minutes, points = 0.0, []
    for row in rows:
        seconds = row.get("timing/epoch", math.nan)
        minutes += seconds / 60 if math.isfinite(seconds) else 0.0
        position = row.get(STEP, math.nan) if x == "steps" else minutes if math.isfinite(seconds) else math.nan
        value = row.get(metric, math.nan)
        if math.isfinite(position) and math.isfinite(value):
            points.append((position, value))
    values = [value for _, value in points]
    means = [sum(values[max(0, i - window + 1) : i + 1]) / min(i + 1, window) for i in range(len(values))]
    return [position for position, _ in points], means


def plot_returns(
    run_dirs: list[str | Path],
    out: str | Path,
    window: int = 10,
    title: str = "",
    metric: str = "overview/reward",
    x: str = "steps",
    lines: dict[str, float] | None = None,
) -> tuple[Path, list[str]]:
    """Draw each run's ``metric`` (``curve``), labelled with its folder's name, and each of ``lines`` as a dashed
    horizontal reference labelled with its name; return the picture's path and the warnings. A folder whose metrics
    cannot be read is left out with a warning, so it does not hide the others; ConfigError when none can be read."""
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    warnings, left_out = [], []
    for run_dir in map(Path, run_dirs):
        try:
            rows, skipped = float_rows(run_dir)
        except ConfigError as err:
            left_out.append(f"left out {run_dir}: {err}")
            continue
        ax.plot(*curve(rows, metric, x, window), label=run_dir.name)
        warnings += skipped
    if len(left_out) == len(run_dirs):
        plt.close(fig)
        raise ConfigError(f"none of the run folders has a readable metrics.jsonl ({left_out[0]})")
    for name, value in (lines or {}).items():
        ax.axhline(value, linestyle="--", color="gray", linewidth=1)
        ax.annotate(f"{name} {value:g}", (0, value), xycoords=("axes fraction", "data"), fontsize="small")
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(f"{metric} (mean of {window})" if window > 1 else metric)
    ax.set_title(title, fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, out), left_out + warnings


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code: 0 (the picture's path on stdout, warnings on stderr), or 2 with one
    line on stderr (a bad argument, a folder without readable metrics, a picture that cannot be written)."""
    parser = Parser(prog="python -m machina.plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="a run folder holding metrics.jsonl (several with --returns)")
    parser.add_argument("--out", help="PNG to write (default RUN_DIR/plot.png)")
    parser.add_argument("--returns", action="store_true", help="one panel: the return of every run given")
    parser.add_argument("--window", type=positive, default=10, help="epochs in the running mean of --returns")
    parser.add_argument("--title", default="", help="title of the --returns panel")
    parser.add_argument("--metric", default="overview/reward", help="the metric of --returns (e.g. eval/return)")
    parser.add_argument("--x", choices=sorted(X_AXES), default="steps", help="--returns against steps or minutes")
    parser.add_argument("--line", action="append", default=[], metavar="NAME=VALUE", help="a reference line")
    args = parser.parse_args(argv)
    lines = {}
    for line in args.line:
        name, _, value = line.partition("=")
        try:
            lines[name] = float(value)
        except ValueError:
            parser.error(f"--line takes NAME=VALUE with a number, got {line!r}")
    if len(args.run_dirs) > 1 and not args.returns:
        parser.error("several run folders need --returns")
    check_folders(parser, args.run_dirs)
    try:
        if args.returns:
            out = args.out or Path(args.run_dirs[0]) / "returns.png"
            out, warnings = plot_returns(args.run_dirs, out, args.window, args.title, args.metric, args.x, lines)
        else:
            out, warnings = plot_run(args.run_dirs[0], args.out)
    except ConfigError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(warning, file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
