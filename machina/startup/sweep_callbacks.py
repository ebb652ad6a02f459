"""Hydra callbacks for sweeps (``hydra.callbacks`` in a sweep preset)."""

import logging
import math
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class NanObjectiveFailsJob(Callback):
    """Turn a job that returned a NaN objective into a failed job, so an Optuna study records a failed trial.

    The final return is NaN when no episode ended during the run. optuna 2.10 refuses a NaN value, and
    hydra-optuna-sweeper 1.3 then re-tells the trial as failed *with* that value, which raises and ends the whole
    study. A failed job is what the sweeper handles: the trial is marked failed and counts against
    ``hydra.sweeper.max_failure_rate``; the run folder keeps its metrics.
    """

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        value = job_return._return_value  # the property would re-raise a failed job's error here
        if job_return.status == JobStatus.COMPLETED and isinstance(value, float) and math.isnan(value):
            message = f"objective {config.get('objective')} is NaN (no episode ended?); the trial counts as failed"
            log.error(message)
            job_return.status = JobStatus.FAILED
            job_return.return_value = ValueError(message)
