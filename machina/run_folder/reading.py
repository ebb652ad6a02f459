"""Read finished, failed and interrupted runs back from their folders, with no W&B and no network.

A Hydra folder is any folder with a ``.hydra/`` inside: a single run (``outputs/DATE/TIME``), one job of a sweep
(``outputs/multirun/SWEEP/N_OVERRIDES``), or another program's output (``eval.py``'s ``outputs/eval/...``). It is a
training run when its ``.hydra/config.yaml`` has a ``trainer`` node. Everything comes from files the run writes as
it goes: ``metrics.jsonl`` (one row per finished epoch, read by ``machina.files.metrics_file``),
``.hydra/overrides.yaml``
(a list), ``.hydra/hydra.yaml`` (job number, single run or sweep), ``resolved_config.yaml`` (written once the objects
are built; a job that failed earlier only has ``.hydra/config.yaml``) and the log, ``train.log`` (its first line
dates the start).

Nothing in a folder is trusted: a file that cannot be read, is not YAML or holds the wrong kind of document counts as
absent, and the run is ``damaged`` with the reason; a metrics line that is not a row, or a row without a metric, is
left out with a warning. One damaged folder never stops the others from being read.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from machina.errors import ConfigError
from machina.files import metrics_file
from machina.files.metrics_file import number, read_file
from machina.files.stored_config import parse_yaml

# Hydra's job log format: "[time][logger][LEVEL] - message".
ERROR_LINE = re.compile(r"\]\[(?:ERROR|CRITICAL)\] - (.*)")
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# machina.cli logs a stop by a signal as "Interrupted: ...": the run can be resumed, it did not fail.
INTERRUPTED = "Interrupted:"
CONFIG = ".hydra/config.yaml"
HYDRA = ".hydra/hydra.yaml"
OVERRIDES = ".hydra/overrides.yaml"
RESOLVED = "resolved_config.yaml"
# A config file's bytes: a machina run's resolved_config.yaml holds about 10 KB. Read with this bound (counted by
# reading: a sparse file claims any size for free); the files that grow with the run (metrics.jsonl, train.log) cost
# what they hold, their holes counted as the zeros they read as.
MAX_DOCUMENT = 16 << 20
STEP, SPS, REWARD, EPOCH_TIME = "metric/agent_step", "overview/sps", "overview/reward", "timing/epoch"


@dataclass
class RunRecord:
    """One run as the comparison sees it.

    ``status``: ok (reached its agent steps), incomplete (stopped early by a signal or with no error logged: it can
    be resumed), failed (stopped early with an error) or damaged (a file of its folder could not be read: ``error``
    says which and why; the numbers come from what could be read). ``job`` is the sweep job's number, "-" for a
    single run. ``overrides`` is None when ``.hydra/overrides.yaml`` is damaged. ``sps_mean`` is agent steps /
    ``wall_time``, the sum of the epochs' wall times (start-up and periodic evaluation are not in it): the run's
    throughput, as ``summary/sps_mean`` in W&B. ``warnings``: what was left out (damaged files after the first,
    skipped metrics lines, rows without a metric).
    """

    path: Path
    job: str
    overrides: list[str] | None
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
    warnings: list[str] = field(default_factory=list)
    # Per epoch with an agent step: (agent step, SPS or None, mean return or None when no episode ended), for the plot.
    curve: list[tuple[int, float | None, float | None]] = field(default_factory=list)


def find_run_dirs(directory: Path) -> list[Path]:
    """The run folders at or under ``directory``, in job order (numbered sweep folders sort numerically)."""
    directory = Path(directory)
    found = {p.parent for p in directory.rglob(".hydra") if p.is_dir()}
    if (directory / ".hydra").is_dir():
        found.add(directory)
    return sorted(found, key=_natural_key)


def is_training_run(path: Path) -> bool:
    """Whether a Hydra folder was made by train.py: its composed config has a ``trainer`` node, or it holds what only
    training writes (metrics.jsonl, checkpoints/). A folder whose config cannot be read counts as one, so that it is
    listed as damaged rather than left out."""
    path = Path(path)
    config = read_document(path, CONFIG, {}, [])
    trained = (path / metrics_file.NAME).exists() or (path / "checkpoints").exists()
    return config is None or "trainer" in config or trained


def read_run(path: Path) -> RunRecord:
    """Summarise one run folder; one with no metrics, too few epochs or damaged files is reported, never skipped."""
    path = Path(path)
    damage: list[str] = []
    overrides = read_document(path, OVERRIDES, [], damage)
    hydra = mapping(mapping(read_document(path, HYDRA, {}, damage)).get("hydra"))
    job = mapping(hydra.get("job"))
    sweep = hydra.get("mode") == "MULTIRUN" or isinstance(job.get("num"), int)
    config = read_document(path, RESOLVED, {}, damage) or read_document(path, CONFIG, {}, damage) or {}
    expected = mapping(config.get("trainer")).get("total_timesteps")
    try:
        rows, warnings = metrics_file.read_metrics(path)
    except ConfigError as err:  # metrics.jsonl is there but cannot be read
        damage.append(str(err))
        rows, warnings = [], []
    log_text = read_log(path, damage)
    record = RunRecord(
        path=path,
        job=str(job["num"]) if sweep and job.get("num") is not None else "-",
        overrides=None if overrides is None else [str(o) for o in overrides],
        status="ok",
        sweep=sweep,
        started=started(path, log_text),
        expected_steps=expected if isinstance(expected, int) and not isinstance(expected, bool) else None,
        warnings=warnings,
    )
    summarize_rows(record, rows)
    if damage:
        # Without a file the status cannot be told (no expected steps, no rows): the first damage is the error, the
        # rest and the log's last error are warnings.
        log_error = last_error(log_text)
        record.status, record.error = "damaged", damage[0]
        record.warnings = damage[1:] + ([f"train.log: {log_error}"] if log_error else []) + record.warnings
        return record
    short = record.expected_steps is not None and record.agent_steps < record.expected_steps
    if not rows or short:
        record.error = last_error(log_text)
        interrupted = record.error is not None and record.error.startswith(INTERRUPTED)
        record.status = "incomplete" if interrupted or (rows and record.error is None) else "failed"
        if not rows and record.error is None:
            # Hydra prints an unexpected exception to the sweep's console, not to the job's log.
            record.error = f"no {metrics_file.NAME} rows and no error in train.log (see the sweep's console output)"
    return record


def summarize_rows(record: RunRecord, rows: list[dict]) -> None:
    """Fill ``record``'s epochs, steps, SPS, returns, wall time and curve from the metrics rows; a row without a
    metric (or with something else than a number there) is left out of what needs that metric, with a warning."""
    steps = [number(row, STEP) for row in rows]
    sps = [number(row, SPS) for row in rows]
    times = [number(row, EPOCH_TIME) for row in rows]
    rewards = [number(row, REWARD) for row in rows]  # None is common: no episode ended that epoch
    for key, values in ((STEP, steps), (SPS, sps), (EPOCH_TIME, times)):
        if None in values:
            record.warnings.append(f"{metrics_file.NAME}: {values.count(None)} of {len(rows)} rows without {key}")
    known_steps = [step for step in steps if step is not None]
    ended = [r for r in rewards if r is not None]
    record.epochs = len(rows)
    record.agent_steps = int(known_steps[-1]) if known_steps else 0
    # The sum of whole-epoch times: the training wall time, without start-up (imports, env and W&B init).
    record.wall_time = sum(t for t in times if t is not None)
    record.sps_mean = record.agent_steps / record.wall_time if record.wall_time > 0 else None
    record.sps_max = max((s for s in sps if s is not None), default=None)
    record.final_return = ended[-1] if ended else None
    record.best_return = max(ended) if ended else None
    record.curve = [(int(step), s, r) for step, s, r in zip(steps, sps, rewards, strict=True) if step is not None]


def read_log(path: Path, damage: list[str]) -> str:
    """The text of the run's ``train.log`` (invalid UTF-8 replaced); "" when there is none."""
    try:
        data = read_file(path / "train.log")
    except ConfigError as err:
        damage.append(str(err))
        return ""
    return "" if data is None else data.decode("utf-8", errors="replace")


def started(path: Path, log_text: str) -> datetime | None:
    """When the run started: the time on the first line of its log, else when Hydra wrote its config."""
    match = LOG_TIME.match(log_text)
    try:
        return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S") if match else config_time(path)
    except ValueError:  # a damaged first line with an impossible date
        return config_time(path)


def config_time(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp((path / CONFIG).stat().st_mtime).replace(microsecond=0)
    except OSError:
        return None


def last_error(log_text: str) -> str | None:
    """The last ERROR/CRITICAL message in a Hydra job log, or None."""
    messages = ERROR_LINE.findall(log_text)
    return messages[-1].strip() if messages else None


def read_document(path: Path, name: str, default: dict | list, damage: list[str]) -> dict | list | None:
    """The document of ``path/name`` when it is of ``default``'s type (a mapping; overrides.yaml: a list);
    ``default`` when the file is absent; None, with a line in ``damage`` naming the file, when it cannot be read, is
    not YAML or holds something else. ``stored_config.parse_yaml`` reads Hydra's files as plain YAML:
    interpolations stay strings, no resolver is needed, and no tag in a hostile file builds an object."""
    try:
        data = read_file(path / name, MAX_DOCUMENT)
        document = default if data is None else parse_yaml(data, name)
    except ConfigError as err:
        damage.append(str(err))
        return None
    if not isinstance(document, type(default)):
        damage.append(f"{name}: holds {kind(document)}, not {kind(default)}")
        return None
    return document


def kind(document) -> str:
    """What a YAML document is, in words."""
    if document is None:
        return "nothing (an empty file)"
    return {dict: "a mapping", list: "a list"}.get(type(document), f"a {type(document).__name__}")


def mapping(value) -> dict:
    """``value`` when it is a mapping, else {} (a damaged node reads as absent)."""
    return value if isinstance(value, dict) else {}


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]
