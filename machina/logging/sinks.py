"""Where per-epoch metrics go: the console, ``metrics.jsonl`` in the run folder, and W&B.

Every sink takes the same flat dict ``{name: float}`` once per epoch. A W&B failure is logged and W&B is switched
off for the rest of the run; it never stops training.
"""

import logging
import math
import os
import signal
import stat
from pathlib import Path
from typing import Any

from machina.errors import ConfigError, Interrupted, TrainingStopped
from machina.files.metrics_file import encode_row

log = logging.getLogger(__name__)


class JsonlSink:
    """Appends one row per finished epoch to ``path`` (the format: ``machina.files.metrics_file``), so a killed run
    keeps
    every finished epoch.

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

    def log(self, metrics: dict[str, float]) -> None:
        line = encode_row(metrics)
        self._write(b"\n" + line if self._mid_line else line)

    def _write(self, data: bytes) -> None:
        written = 0
        try:
            while written < len(data):  # a regular file takes it in one call unless the disk fills up
                written += os.write(self._fd, data[written:])
        except OSError as err:
            if written:  # part of the row is in the file: it ends inside a line unless the part was the newline
                self._mid_line = data[written - 1 : written] != b"\n"
            raise TrainingStopped(
                f"could not write {self.path} ({err.strerror or err}); training stopped and the last checkpoint is "
                "kept: rerunning the same command resumes from it"
            ) from None
        self._mid_line = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ConsoleSink:
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

    def close(self) -> None:
        pass


class WandbSink:
    """A W&B run: offline by default (no key, no network; ``wandb sync`` uploads later), online on request.

    ``metric/agent_step`` is the x axis of every metric. The logged config shows the group the run is in
    (``wandb.group`` is null in the config when the group comes from the sweep folder). A run that ends with an
    error is not marked finished (``stop``). ``run_id`` continues that run (a resume): offline, the resumed part is
    a second ``offline-run-*`` folder with the same id, and ``wandb sync`` uploads both into the one run. Failures
    at init or log time are logged and turn the sink off; training goes on.
    """

    def __init__(
        self,
        mode: str,
        project: str,
        directory: Path,
        config: dict[str, Any],
        entity: str | None = None,
        group: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
        tags: list[str] | None = None,
        run_id: str | None = None,
    ):
        self.run = None
        self.run_id = run_id
        if mode == "disabled":
            return
        if isinstance(config.get("wandb"), dict):
            config = {**config, "wandb": {**config["wandb"], "group": group}}
        try:
            import wandb

            Path(directory).mkdir(parents=True, exist_ok=True)
            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(
                mode=mode,
                project=project,
                entity=entity,
                group=group,
                name=name,
                job_type=job_type,
                tags=tags,
                config=config,
                dir=str(directory),
                id=run_id,
                resume="allow" if run_id else None,
                settings=wandb.Settings(init_timeout=60, x_disable_stats=True, console="off"),
            )
            self.run.define_metric("metric/agent_step")
            self.run.define_metric("*", step_metric="metric/agent_step")
            self.run_id = self.run.id
        except Exception as err:  # noqa: BLE001 - any W&B failure must leave training running
            log.warning("W&B init failed (%s); training continues without W&B", err)
            self.run = None

    def log(self, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B log failed (%s); W&B is off for the rest of this run", err)
            self.run = None

    def log_video(self, name: str, path: Path, agent_step: int) -> None:
        """Log a GIF (a replay) as W&B media at ``agent_step``."""
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({name: wandb.Video(str(path), format="gif"), "metric/agent_step": agent_step})
        except Exception as err:  # noqa: BLE001
            log.warning("W&B media log failed (%s)", err)

    def summarize(self, summary: dict[str, float], status: str = "finished") -> None:
        """Write the run summary (``machina.training.trainer.summarize``) and ``summary/status``."""
        if self.run is None:
            return
        try:
            self.run.summary.update({**summary, "summary/status": status})
        except Exception as err:  # noqa: BLE001
            log.warning("W&B summary failed (%s)", err)

    def stop(self, error: BaseException, summary: dict[str, float]) -> None:
        """End the run as stopped by ``error``, with the summary of what it reached. A stop by a signal
        (``Interrupted``: it can be resumed) is marked preempting and exits 128 + the signal number, as the process
        does; a clean stop (a NaN loss, a bad setting) exits 2 and anything else 1: W&B shows the run as not
        finished, and ``summary/status`` says interrupted, stopped or failed."""
        if self.run is None:
            return
        interrupted = isinstance(error, Interrupted | KeyboardInterrupt)
        stopped = isinstance(error, TrainingStopped | ConfigError)
        self.summarize(summary, "interrupted" if interrupted else "stopped" if stopped else "failed")
        try:
            if interrupted:
                self.run.mark_preempting()
            signum = getattr(error, "signum", signal.SIGINT)
            self.run.finish(exit_code=128 + signum if interrupted else 2 if stopped else 1)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B finish failed (%s)", err)
        self.run = None

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as err:  # noqa: BLE001
            log.warning("W&B finish failed (%s)", err)
        self.run = None


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
