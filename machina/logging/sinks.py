"""Where per-epoch metrics go: the console, ``metrics.jsonl`` in the run folder, and W&B.

Every sink takes the same flat dict ``{name: float}`` once per epoch. A W&B failure is logged and W&B is switched
off for the rest of the run; it never stops training.
"""

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class JsonlSink:
    """Appends one JSON object per epoch to ``path`` and flushes it, so a killed run keeps every finished epoch."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float]) -> None:
        # JSON has no NaN; a metric without a value this epoch is written as null.
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleSink:
    """One compact progress line per epoch: epoch, agent steps, SPS, reward and ETA."""

    def __init__(self, total_timesteps: int):
        self.total_timesteps = total_timesteps

    def log(self, metrics: dict[str, float]) -> None:
        step = metrics["metric/agent_step"]
        sps = metrics["overview/sps"]
        cumulative = metrics["overview/sps_cumulative"]
        eta = max(self.total_timesteps - step, 0) / cumulative if cumulative > 0 else float("inf")
        reward = metrics.get("overview/reward")
        reward_text = f"{reward:8.3f}" if reward is not None and math.isfinite(reward) else "       -"
        log.info(
            "epoch %5d | steps %s/%s | sps %s | reward %s | eta %s",
            metrics["metric/epoch"],
            human(step),
            human(self.total_timesteps),
            human(sps),
            reward_text,
            duration(eta),
        )

    def close(self) -> None:
        pass


class WandbSink:
    """A W&B run: offline by default (no key, no network; ``wandb sync`` uploads later), online on request.

    ``metric/agent_step`` is the x axis of every metric. Failures at init or log time are logged and turn the
    sink off; training goes on.
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

    def summarize(self, summary: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(summary)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B summary failed (%s)", err)

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
