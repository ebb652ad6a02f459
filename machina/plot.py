"""Plot a run's metrics.jsonl: ``python -m machina.plot RUN_DIR [--out PATH]`` (default ``RUN_DIR/plot.png``).

Three panels against ``metric/agent_step``: return (``overview/reward``, and ``eval/return`` when the run has
evaluation rows), SPS (``overview/sps``) and every loss term (``losses/<loss>/loss_*``). Null values (epochs in
which no episode ended) are gaps.

``python -m machina.plot RUN_DIR... --returns --out PATH``: one panel of the training return of several runs (seeds
of one recipe), each as a running mean over ``--window`` epochs that ended an episode (docs/gymnasium.md's curves).
``--metric eval/return`` draws the periodic evaluation instead (``trainer.eval_interval``), ``--x minutes``
against training wall time (the sum of ``timing/epoch``; evaluation is timed apart) instead of agent steps, and
``--line teacher=7.88`` adds a labelled horizontal reference (docs/learning.md's curves).
"""

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display, also on headless machines
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen before pyplot is imported

STEP = "metric/agent_step"
PANELS = (
    ("return", ("overview/reward", "eval/return")),
    ("agent steps / s", ("overview/sps",)),
    ("loss", ()),  # filled with the run's losses/<loss>/loss_* keys
)


def read_metrics(path: Path) -> list[dict[str, float]]:
    """One dict per line of a metrics.jsonl; nulls become NaN (a gap in the plot)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: math.nan if v is None else v for k, v in row.items()} for row in rows]


def loss_keys(rows: list[dict[str, float]]) -> list[str]:
    names = dict.fromkeys(k for row in rows for k in row)
    return [k for k in names if k.startswith("losses/") and k.rsplit("/", 1)[-1].startswith("loss_")]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``run_dir/metrics.jsonl`` to a PNG; return its path."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"no metrics.jsonl in {str(run_dir)!r}: pass a run folder written by train.py")
    rows = read_metrics(metrics)
    out = Path(out) if out else run_dir / "plot.png"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6), constrained_layout=True)
    for ax, (label, names) in zip(axes, PANELS, strict=True):
        for key in names or loss_keys(rows):
            points = [(row[STEP], row[key]) for row in rows if key in row]
            if points:
                ax.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None, label=key)
        ax.set_xlabel("agent steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    fig.suptitle(str(run_dir), fontsize="small")
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


X_AXES = {"steps": "agent steps", "minutes": "training wall time (minutes)"}


def curve(
    rows: list[dict[str, float]], metric: str = "overview/reward", x: str = "steps", window: int = 10
) -> tuple[list[float], list[float]]:
    """(x, y) of one run: ``metric`` in the epochs where it is finite, as a running mean over the last ``window`` of
    them, against agent steps or the minutes of training up to the end of that epoch."""
    minutes, points = 0.0, []
    for row in rows:
        minutes += row.get("timing/epoch", math.nan) / 60
        value = row.get(metric, math.nan)
        if math.isfinite(value):
            points.append((row[STEP] if x == "steps" else minutes, value))
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
) -> Path:
    """Draw each run's ``metric`` (``curve``), labelled with its folder's name, and each of ``lines`` as a dashed
    horizontal reference labelled with its name."""
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    for run_dir in map(Path, run_dirs):
        ax.plot(*curve(read_metrics(run_dir / "metrics.jsonl"), metric, x, window), label=run_dir.name)
    for name, value in (lines or {}).items():
        ax.axhline(value, linestyle="--", color="gray", linewidth=1)
        ax.annotate(f"{name} {value:g}", (0, value), xycoords=("axes fraction", "data"), fontsize="small")
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(f"{metric} (mean of {window})" if window > 1 else metric)
    ax.set_title(title, fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m machina.plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="a run folder holding metrics.jsonl (several with --returns)")
    parser.add_argument("--out", help="PNG to write (default RUN_DIR/plot.png)")
    parser.add_argument("--returns", action="store_true", help="one panel: the return of every run given")
    parser.add_argument("--window", type=int, default=10, help="epochs in the running mean of --returns")
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
    if args.returns:
        out = args.out or Path(args.run_dirs[0]) / "returns.png"
        print(plot_returns(args.run_dirs, out, args.window, args.title, args.metric, args.x, lines))
    elif len(args.run_dirs) > 1:
        parser.error("several run folders need --returns")
    else:
        print(plot_run(args.run_dirs[0], args.out))


if __name__ == "__main__":
    main()
