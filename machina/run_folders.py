"""Read finished, failed and interrupted runs back from their folders, with no W&B and no network.

A run folder is any folder with a ``.hydra/`` inside: a single run (``outputs/DATE/TIME``) or one job of a sweep
(``outputs/multirun/SWEEP/N_OVERRIDES``). Everything comes from files the run writes as it goes: ``metrics.jsonl``
(one row per finished epoch), ``.hydra/overrides.yaml``, ``resolved_config.yaml`` (written once the objects are
built; a job that failed earlier only has ``.hydra/config.yaml``) and the log, ``train.log``.
"""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# Hydra's job log format: "[time][logger][LEVEL] - message".
ERROR_LINE = re.compile(r"\]\[(?:ERROR|CRITICAL)\] - (.*)")


@dataclass
class RunRecord:
    """One run as the comparison sees it. ``status`` is ok, incomplete (stopped early, no error logged) or failed."""

    path: Path
    job: str
    overrides: list[str]
    status: str
    epochs: int = 0
    agent_steps: int = 0
    expected_steps: int | None = None
    sps_mean: float | None = None
    sps_max: float | None = None
    final_return: float | None = None
    best_return: float | None = None
    wall_time: float = 0.0
    error: str | None = None
    # Per epoch: (agent step, SPS, mean return or None when no episode ended that epoch), for the plot.
    curve: list[tuple[int, float, float | None]] = field(default_factory=list)


def find_run_dirs(directory: Path) -> list[Path]:
    """The run folders at or under ``directory``, in job order (numbered sweep folders sort numerically)."""
    directory = Path(directory)
    found = {p.parent for p in directory.rglob(".hydra") if p.is_dir()}
    if (directory / ".hydra").is_dir():
        found.add(directory)
    return sorted(found, key=_natural_key)


def read_run(path: Path) -> RunRecord:
    """Summarise one run folder; a folder with no metrics or too few epochs is reported, never skipped."""
    path = Path(path)
    hydra_dir = path / ".hydra"
    overrides = _load_yaml(hydra_dir / "overrides.yaml") or []
    job = ((_load_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra") or {}).get("job") or {}
    config = _load_yaml(path / "resolved_config.yaml") or _load_yaml(hydra_dir / "config.yaml") or {}
    expected = (config.get("trainer") or {}).get("total_timesteps")
    rows = _read_metrics(path / "metrics.jsonl")
    record = RunRecord(
        path=path,
        job=str(job["num"]) if job.get("num") is not None else path.name,
        overrides=[str(o) for o in overrides],
        status="ok",
        expected_steps=expected if isinstance(expected, int) else None,
    )
    if rows:
        sps = [row["overview/sps"] for row in rows]
        rewards = [_finite(row.get("overview/reward")) for row in rows]
        ended = [r for r in rewards if r is not None]
        record.epochs = len(rows)
        record.agent_steps = int(rows[-1]["metric/agent_step"])
        record.sps_mean = sum(sps) / len(sps)
        record.sps_max = max(sps)
        record.final_return = ended[-1] if ended else None
        record.best_return = max(ended) if ended else None
        # The sum of whole-epoch times: the training wall time, without start-up (imports, env and W&B init).
        record.wall_time = sum(row.get("timing/epoch") or 0.0 for row in rows)
        record.curve = [
            (int(row["metric/agent_step"]), row["overview/sps"], r) for row, r in zip(rows, rewards, strict=True)
        ]
    short = record.expected_steps is not None and record.agent_steps < record.expected_steps
    if not rows or short:
        record.error = last_error(path / "train.log")
        record.status = "failed" if record.error or not rows else "incomplete"
        if not rows and record.error is None:
            # Hydra prints an unexpected exception to the sweep's console, not to the job's log.
            record.error = "no metrics.jsonl rows and no error in train.log (see the sweep's console output)"
    return record


def last_error(log_path: Path) -> str | None:
    """The last ERROR/CRITICAL message in a Hydra job log, or None."""
    if not log_path.is_file():
        return None
    messages = ERROR_LINE.findall(log_path.read_text(encoding="utf-8", errors="replace"))
    return messages[-1].strip() if messages else None


def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a run killed mid-write leaves a torn last line; the rows before it are whole
    return rows


def _load_yaml(path: Path):
    # safe_load reads Hydra's files as plain YAML: interpolations stay strings, no resolver is needed.
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None


def _finite(value) -> float | None:
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]
