"""Plot a run's metrics.jsonl: ``python -m machina.plot RUN_DIR [--out PATH]`` (default ``RUN_DIR/plot.png``).

Three panels against ``metric/agent_step``: return (``overview/reward``, and ``eval/return`` when the run has
evaluation rows), SPS (``overview/sps``) and every loss term (``losses/<loss>/loss_*``). Null values (epochs in
which no episode ended) are gaps.
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m machina.plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run folder holding metrics.jsonl")
    parser.add_argument("--out", help="PNG to write (default RUN_DIR/plot.png)")
    args = parser.parse_args(argv)
    print(plot_run(args.run_dir, args.out))


if __name__ == "__main__":
    main()
