"""The W&B sink (``conf/logger/wandb.yaml``; its settings are the ``wandb`` group's: ``wandb.mode``, ``wandb.project``,
...). The only module that calls W&B. A W&B failure is logged and W&B is switched off for the rest of the run; it
never stops training.
"""

import logging
import os
import signal
from pathlib import Path
from typing import Any

from machina.errors import ConfigError, Interrupted, TrainingStopped
from machina.logging.sink import Kind, RunInfo, Sink

log = logging.getLogger(__name__)


class WandbSink(Sink):
    """A W&B run: offline by default (no key, no network; ``wandb sync`` uploads later), online on request, nothing
    at all with ``mode="disabled"`` (``wandb=disabled``).

    ``metric/agent_step`` is the x axis of every metric. The logged config shows the group the run is in
    (``wandb.group`` is null in the config when the group is the run's own, its sweep's). A run that ends with an
    error is not marked finished (``close``). ``run_id`` continues that run (a resume): offline, the resumed part is
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
        except Exception as err:  # noqa: BLE001 - any W&B failure must leave training running
            log.warning("W&B init failed (%s); training continues without W&B", err)
            self.run = None

    @classmethod
    def for_run(
        cls,
        run: RunInfo,
        mode: str,
        project: str,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | tuple[str, ...] = (),
    ) -> "WandbSink":
        """The run's W&B run in ``run.dir/wandb``, continuing ``run.id``: W&B's name, group, tags and job type are
        the run's own (``RunInfo``), except that ``group`` (``wandb.group``) replaces the run's group and ``tags``
        (``wandb.tags``) are added to its tags."""
        return cls(
            mode=mode,
            project=project,
            entity=entity,
            directory=run.dir,
            config=run.config,
            group=run.group if group is None else group,
            name=run.name,
            job_type=run.job_type,
            tags=[*run.tags, *tags],
            run_id=run.id,
        )

    @classmethod
    def writes(cls, run: RunInfo, mode: str, **settings) -> dict[Path, Kind]:
        """W&B's folder ``run.dir/wandb``, unless ``mode`` is ``disabled`` (W&B writes nothing then)."""
        return {} if mode == "disabled" else {run.dir / "wandb": "folder"}

    def log(self, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B log failed (%s); W&B is off for the rest of this run", err)
            self.run = None

    def log_media(self, name: str, path: Path, step: int) -> None:
        """Log a GIF (a replay) as a W&B video at agent step ``step``."""
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({name: wandb.Video(str(path), format="gif"), "metric/agent_step": step})
        except Exception as err:  # noqa: BLE001
            log.warning("W&B media log failed (%s)", err)

    def summarize(self, summary: dict[str, float]) -> None:
        """Write the run summary into the W&B run's summary."""
        self._update_summary(summary)

    def close(self, error: BaseException | None = None) -> None:
        """Finish the W&B run; ``summary/status`` says how it ended. A run stopped by ``error`` is not marked
        finished: a stop by a signal (``Interrupted``: it can be resumed) is marked preempting and exits 128 + the
        signal number, as the process does; a clean stop (a NaN loss, a bad setting) exits 2 and anything else 1,
        and ``summary/status`` says interrupted, stopped or failed."""
        if self.run is None:
            return
        interrupted = isinstance(error, Interrupted | KeyboardInterrupt)
        stopped = isinstance(error, TrainingStopped | ConfigError)
        if error is None:
            status, exit_code = "finished", 0
        elif interrupted:
            status, exit_code = "interrupted", 128 + getattr(error, "signum", signal.SIGINT)
        else:
            status, exit_code = ("stopped", 2) if stopped else ("failed", 1)
        self._update_summary({"summary/status": status})
        try:
            if interrupted:
                self.run.mark_preempting()
            self.run.finish(exit_code=exit_code)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B finish failed (%s)", err)
        self.run = None

    def _update_summary(self, values: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(values)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B summary failed (%s)", err)
