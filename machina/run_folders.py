"""Read finished, failed and interrupted runs back from their folders, with no W&B and no network.

A Hydra folder is any folder with a ``.hydra/`` inside: a single run (``outputs/DATE/TIME``), one job of a sweep
(``outputs/multirun/SWEEP/N_OVERRIDES``), or another program's output (``eval.py``'s ``outputs/eval/...``). It is a
training run when its ``.hydra/config.yaml`` has a ``trainer`` node. Everything comes from files the run writes as
it goes: ``metrics.jsonl`` (one row per finished epoch), ``.hydra/overrides.yaml``, ``.hydra/hydra.yaml`` (job
number, single run or sweep), ``resolved_config.yaml`` (written once the objects are built; a job that failed
earlier only has ``.hydra/config.yaml``) and the log, ``train.log`` (its first line dates the start).
"""

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

# Hydra's job log format: "[time][logger][LEVEL] - message".
ERROR_LINE = re.compile(r"\]\[(?:ERROR|CRITICAL)\] - (.*)")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# machina.cli logs a stop by a signal as "Interrupted: ...": the run can be resumed, it did not fail.
INTERRUPTED = "Interrupted:"


@dataclass
class RunRecord:
    """One run as the comparison sees it.

    ``status``: ok (reached its agent steps), incomplete (stopped early by a signal or with no error logged: it can
    be resumed) or failed (stopped early with an error). ``job`` is the sweep job's number, "-" for a single run.
    ``sps_mean`` is agent steps / ``wall_time``, the sum of the epochs' wall times (start-up and periodic
    evaluation are not in it): the run's throughput, as ``summary/sps_mean`` in W&B.
    """

    path: Path
    job: str
    overrides: list[str]
    status: str
    sweep: bool = False
    started: datetime | None = None
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


def is_training_run(path: Path) -> bool:
    """Whether a Hydra folder was made by train.py: its composed config has a ``trainer`` node."""
    return "trainer" in (_load_yaml(Path(path) / ".hydra" / "config.yaml") or {})


def read_run(path: Path) -> RunRecord:
    """Summarise one run folder; a folder with no metrics or too few epochs is reported, never skipped."""
    path = Path(path)
    hydra_dir = path / ".hydra"
    overrides = _load_yaml(hydra_dir / "overrides.yaml") or []
    hydra = (_load_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra") or {}
    job = hydra.get("job") or {}
    sweep = hydra.get("mode") == "MULTIRUN" or isinstance(job.get("num"), int)
    config = _load_yaml(path / "resolved_config.yaml") or _load_yaml(hydra_dir / "config.yaml") or {}
    expected = (config.get("trainer") or {}).get("total_timesteps")
    rows = _read_metrics(path / "metrics.jsonl")
    record = RunRecord(
        path=path,
        job=str(job["num"]) if sweep and job.get("num") is not None else "-",
        overrides=[str(o) for o in overrides],
        status="ok",
        sweep=sweep,
        started=started(path),
        expected_steps=expected if isinstance(expected, int) else None,
    )
    if rows:
        sps = [row["overview/sps"] for row in rows]
        rewards = [_finite(row.get("overview/reward")) for row in rows]
        ended = [r for r in rewards if r is not None]
        record.epochs = len(rows)
        record.agent_steps = int(rows[-1]["metric/agent_step"])
        # The sum of whole-epoch times: the training wall time, without start-up (imports, env and W&B init).
        record.wall_time = sum(row.get("timing/epoch") or 0.0 for row in rows)
        record.sps_mean = record.agent_steps / record.wall_time if record.wall_time > 0 else None
        record.sps_max = max(sps)
        record.final_return = ended[-1] if ended else None
        record.best_return = max(ended) if ended else None
        record.curve = [
            (int(row["metric/agent_step"]), row["overview/sps"], r) for row, r in zip(rows, rewards, strict=True)
        ]
    short = record.expected_steps is not None and record.agent_steps < record.expected_steps
    if not rows or short:
        record.error = last_error(path / "train.log")
        interrupted = record.error is not None and record.error.startswith(INTERRUPTED)
        record.status = "incomplete" if interrupted or (rows and record.error is None) else "failed"
        if not rows and record.error is None:
            # Hydra prints an unexpected exception to the sweep's console, not to the job's log.
            record.error = "no metrics.jsonl rows and no error in train.log (see the sweep's console output)"
    return record


def started(path: Path) -> datetime | None:
    """When the run started: the time on the first line of its log, else when Hydra wrote its config."""
    log_path, config = path / "train.log", path / ".hydra" / "config.yaml"
    if log_path.is_file():
        with log_path.open(encoding="utf-8", errors="replace") as log:
            match = LOG_TIME.match(log.readline())
        if match:
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return datetime.fromtimestamp(config.stat().st_mtime).replace(microsecond=0) if config.is_file() else None


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
