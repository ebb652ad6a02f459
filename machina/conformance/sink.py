"""``check_sink``: a logger sink (``machina.logging.sink.Sink``) against the calls the trainer and ``machina.run``
make, in their order, in a run folder of its own. One use, in a user's own tests::

    check_sink(MySink, tmp_path, {"every": 2})
"""

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from machina.conformance.failure import ConformanceError
from machina.errors import one_line
from machina.evaluation.gif import save_gif
from machina.logging.sink import RunInfo, Sink

# Three epochs as the trainer logs them: the counters, a metric with a value whose text is in no other row's (so that
# each row can be found in a file a sink writes), a metric without a value (NaN), and a new name in the last row (an
# evaluation).
ROWS: tuple[dict[str, float], ...] = (
    {"metric/agent_step": 1024, "metric/epoch": 1, "overview/reward": 1.6875, "losses/ppo/entropy": float("nan")},
    {"metric/agent_step": 2048, "metric/epoch": 2, "overview/reward": 2.4375, "losses/ppo/entropy": 1.5},
    {"metric/agent_step": 3072, "metric/epoch": 3, "overview/reward": 3.5625, "losses/ppo/entropy": 1.25},
)
TRAINER_METRICS = {"overview/sps": 1000.0, "overview/sps_cumulative": 1000.0}  # what the console line reads
LAST_ROW_EVAL = {"eval/return": 4.0625}
MARKER = "overview/reward"  # the value each row is found by
SUMMARY = {"final_reward": 3.5625, "best_reward": 3.5625}


def check_sink(
    sink: type,
    folder: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    grace_s: float = 10.0,
) -> None:
    """Raise ``ConformanceError`` (one sentence: what to implement) unless ``sink`` (a ``Sink`` subclass), built with
    ``settings`` (its ``logger.<name>`` node) for a run in ``folder`` (a temporary folder by default), takes a run's
    calls: ``for_run(RunInfo, **settings)``, ``log`` of three flat rows (a NaN, a name new in the last row),
    ``log_media`` of a file, ``summarize``, ``close(None)``; and, once closed, every file it wrote in the run folder
    holds every row (each row's ``overview/reward`` is found in it, written in full) within ``grace_s`` seconds:
    W&B's files are written by its own service process, which may finish after ``close``::

        check_sink(MySink, tmp_path, {"every": 2})
    """
    if folder is None:
        with tempfile.TemporaryDirectory() as temporary:
            return check_sink(sink, temporary, settings, grace_s)
    cls = sink
    name = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise ConformanceError(f"{name} is not a sink: subclass machina.logging.sink.Sink")
    run_dir = Path(folder)
    run_dir.mkdir(parents=True, exist_ok=True)
    media = run_dir / "replays" / "replay_000003.gif"
    media.parent.mkdir(exist_ok=True)
    save_gif([np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)], media)
    before = files(run_dir)
    run = RunInfo(run_dir, "conformance", {"trainer": {"total_timesteps": 3072}}, name="conformance")
    opened = call(name, "for_run", lambda: cls.for_run(run, **dict(settings or {})))
    if not isinstance(opened, Sink):
        raise ConformanceError(f"{name}.for_run returns {type(opened).__name__}: return the sink built for the run")
    for i, row in enumerate(ROWS):
        metrics = {**row, **TRAINER_METRICS, **(LAST_ROW_EVAL if i == len(ROWS) - 1 else {})}
        if i == len(ROWS) - 1:  # a replay comes just before its epoch's row
            step = row["metric/agent_step"]
            call(name, "log_media", lambda step=step: opened.log_media("eval/replay", media, step))
        call(name, "log", lambda metrics=metrics: opened.log(metrics))
    call(name, "summarize", lambda: opened.summarize(dict(SUMMARY)))
    call(name, "close", lambda: opened.close(None))
    deadline = time.monotonic() + grace_s
    while True:
        try:
            return check_files(name, run_dir, before)
        except ConformanceError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def check_files(name: str, run_dir: Path, before: list[Path]) -> None:
    """Every file the sink wrote is complete: those with rows hold every row, and one of them at least does."""
    written = sorted(set(files(run_dir)) - set(before))
    holding = [path for path in written if holds_rows(name, path, run_dir)]
    if written and not holding:
        shown = ", ".join(str(path.relative_to(run_dir)) for path in written[:3])
        raise ConformanceError(
            f"{name} writes {shown} but no logged row in any of them: write each row before close returns"
        )


def call(name: str, method: str, action) -> Any:
    """``action()``, its failure as the sentence that names the sink's method."""
    try:
        return action()
    except Exception as err:  # noqa: BLE001 - any failure is the sink's, reported as what to fix
        raise ConformanceError(
            f"{name}.{method} fails on a run's call ({type(err).__name__}: {one_line(err)}): take what "
            f"machina.logging.sink.Sink.{method} documents"
        ) from None


def files(folder: Path) -> list[Path]:
    return [Path(root) / file for root, _, names in os.walk(folder) for file in names]


def holds_rows(name: str, path: Path, run_dir: Path) -> bool:
    """Whether a file the sink wrote holds the rows, which it then holds all of; no temporary file is left."""
    relative = path.relative_to(run_dir)
    if path.name.startswith(".") and path.name.endswith(".tmp"):
        raise ConformanceError(f"{name} leaves the temporary file {relative} after close: replace or remove it")
    data = path.read_bytes()
    found = [str(row[MARKER]).encode() in data for row in ROWS]
    if any(found) and not all(found):
        lost = ROWS[found.index(False)]["metric/epoch"]
        raise ConformanceError(
            f"{name} loses the row of epoch {lost} in {relative}: write every logged row, with its values in full, "
            "before close returns"
        )
    return all(found)
