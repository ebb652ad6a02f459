"""The two sinks every training run has (``conf/logger/console.yaml``, ``conf/logger/jsonl.yaml``): a progress line
on the console, and ``metrics.jsonl`` in the run folder (the file resume, compare and plot read). The others:
``csv_sink``, ``wandb_sink``; what a sink is: ``machina.logging.sink``.
"""

import logging
import math
import os
import stat
from pathlib import Path

from machina.errors import ConfigError, TrainingStopped
from machina.files import metrics_file
from machina.logging.sink import Kind, RunInfo, Sink

log = logging.getLogger(__name__)


class JsonlSink(Sink):
    """Appends one row per finished epoch to ``path`` (the format: ``machina.files.metrics_file``), so a killed run
    keeps every finished epoch.

    Append-only: it never rewrites the file (a resumed run's rows beyond its checkpoint are archived before the sink
    opens). Each row is one ``os.write`` of the whole line; when the file ends inside a line (a kill or a failed
    write tore its last row), the next row starts on a new line, so the torn text stays a line of its own that
    readers skip. A write that fails (a full disk) stops training cleanly: ``TrainingStopped``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Read-write to look at the last byte; O_NONBLOCK: a FIFO in the file's place is refused, not waited on.
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o666)
            info = os.fstat(self._fd)
            regular = stat.S_ISREG(info.st_mode)
            self._mid_line = regular and info.st_size > 0 and os.pread(self._fd, 1, info.st_size - 1) != b"\n"
        except OSError as err:
            self.close()
            raise ConfigError(f"cannot write {self.path}: {err.strerror or err}") from None
        if not regular:
            self.close()
            raise ConfigError(f"cannot write {self.path}: it is not a regular file")

    @classmethod
    def for_run(cls, run: RunInfo) -> "JsonlSink":
        return cls(run.dir / metrics_file.NAME)

    @classmethod
    def writes(cls, run: RunInfo) -> dict[Path, Kind]:
        return {run.dir / metrics_file.NAME: "file"}

    def log(self, metrics: dict[str, float]) -> None:
        line = metrics_file.encode_row(metrics)
        self._write(b"\n" + line if self._mid_line else line)

    def _write(self, data: bytes) -> None:
        written = 0
        try:
            while written < len(data):  # a regular file takes it in one call unless the disk fills up
                written += os.write(self._fd, data[written:])
        except OSError as err:
            if written:  # part of the row is in the file: it ends inside a line unless the part was the newline
                self._mid_line = data[written - 1 : written] != b"\n"
            raise TrainingStopped(f"could not write {self.path} ({err.strerror or err}); training stopped") from None
        self._mid_line = False

    def close(self, error: BaseException | None = None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ConsoleSink(Sink):
    """One compact progress line per epoch: epoch, agent steps of the run's end, SPS, reward and ETA.

    A run stops at the end of an epoch, so it ends at ``total_timesteps`` rounded up to whole epochs; the progress
    line counts towards that end, and the first line says so when the rounding changes it.
    """

    def __init__(self, total_timesteps: int):
        self.total_timesteps = total_timesteps
        self.end: int | None = None

    def log(self, metrics: dict[str, float]) -> None:
        step, epoch = metrics["metric/agent_step"], metrics["metric/epoch"]
        if self.end is None:
            self.end = self._whole_epochs(int(step), int(epoch))
        sps = metrics["overview/sps"]
        cumulative = metrics["overview/sps_cumulative"]
        eta = max(self.end - step, 0) / cumulative if cumulative > 0 else float("inf")
        reward = metrics.get("overview/reward")
        reward_text = f"{reward:8.3f}" if reward is not None and math.isfinite(reward) else "       -"
        log.info(
            "epoch %5d | steps %s/%s | sps %s | reward %s | eta %s",
            epoch,
            human(step),
            human(self.end),
            human(sps),
            reward_text,
            duration(eta),
        )

    def _whole_epochs(self, step: int, epoch: int) -> int:
        """The agent step at which the run stops: the first whole epoch at or past ``total_timesteps``."""
        per_epoch = step // epoch
        end = -(-self.total_timesteps // per_epoch) * per_epoch
        if end != self.total_timesteps:
            log.info(
                "runs stop at whole epochs of %s agent steps: this one stops at %s (trainer.total_timesteps=%s)",
                f"{per_epoch:,}",
                f"{end:,}",
                f"{self.total_timesteps:,}",
            )
        return end


def human(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
