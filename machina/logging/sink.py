"""What every sink implements (``Sink``), what it may know about its run (``RunInfo``), and the run's sinks together
(``Sinks``): the trainer, periodic evaluation and ``machina.run`` call these and nothing sink-specific.

A sink is one entry of the multi-select ``logger`` group (``conf/logger/<name>.yaml``, built by
``machina.startup.build.build_sinks``). Adding one is a class and a YAML file, or one override:
``+logger.mine._target_=my_module.MySink``.
"""

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """The run a sink logs: its folder, its id (kept across resumes, in every checkpoint), its resolved config, and
    how it presents itself (``machina.logging.identity.run_identity``): name (its overrides), group (its sweep), tags,
    job type."""

    dir: Path
    id: str
    config: dict[str, Any]
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    job_type: str | None = None


# What a sink writes in the run folder: a file it writes or appends to, or a folder it writes in.
Kind = Literal["file", "folder"]


class Sink:
    """Where per-epoch metrics go. ``log`` is the one method a sink must have (a ``logger`` entry whose class has
    none of its own, ``Sink`` itself included, is refused at start-up); the others do nothing by default.

    Built by ``for_run`` once the run is accepted (a sink may write when it is built); every call comes from rank 0
    only, in this order: ``log`` once per epoch (a replay's ``log_media`` comes just before its epoch's ``log``),
    then ``summarize`` once, then ``close`` once. What it will write in the run folder it declares in ``writes``:
    checked at start-up, before anything is written.
    """

    @classmethod
    def for_run(cls, run: RunInfo, **settings) -> "Sink":
        """The sink of ``run`` with the settings of its ``logger.<name>`` node. The default passes the settings to
        the constructor; a sink that writes into the run folder or names the run overrides this."""
        return cls(**settings)

    @classmethod
    def writes(cls, run: RunInfo, **settings) -> dict[Path, Kind]:
        """The paths the sink of ``run`` (with the settings of its ``logger.<name>`` node) will write, each a
        ``"file"`` or a ``"folder"``. Before the run is accepted each must be absent or of that kind and writable, and
        no two sinks may name one path (two ``metrics.jsonl`` sinks would write every row twice). The default: none."""
        return {}

    def log(self, metrics: dict[str, float]) -> None:
        """One epoch's metrics: a flat ``{name: number}`` with at least ``metric/agent_step`` and ``metric/epoch``
        (``machina.training.trainer.Trainer`` lists them); NaN is a metric without a value that epoch."""
        raise NotImplementedError

    def log_media(self, name: str, path: Path, step: int) -> None:
        """A file (a replay GIF) made at agent step ``step``, already saved in the run folder."""

    def summarize(self, summary: dict[str, float]) -> None:
        """The run summary (``machina.training.epoch_metrics.summarize``): of the whole run when it finished, of
        what it reached when it stopped."""

    def close(self, error: BaseException | None = None) -> None:
        """The run ended: finished (``error`` is None), or stopped by ``error`` (a signal, a clean stop or a crash)."""


class Sinks:
    """The run's sinks, handed to the trainer when it is built and opened once the run is accepted (``open``), so a
        refused start writes nothing. Iterating gives the open sinks (the trainer gives each its epoch's metrics and
    replays); ``summarize`` and ``close`` go to every one of them in order.

        Args:
            openers: one callable per sink, building it (``Sink.for_run`` with its settings bound).
    """

    def __init__(self, openers: list[Callable[[], Sink]] | None = None):
        self.openers = list(openers or [])
        self.opened: list[Sink] = []

    def __iter__(self) -> Iterator[Sink]:
        return iter(self.opened)

    def open(self) -> None:
        """Build every sink; if one fails, close those already built and raise its error."""
        try:
            for opener in self.openers:
                self.opened.append(opener())
        except BaseException as err:
            self.close(err)
            raise

    def summarize(self, summary: dict[str, float]) -> None:
        for sink in self.opened:
            sink.summarize(summary)

    def close(self, error: BaseException | None = None) -> None:
        """Close every sink, also when one of them fails to (that is logged)."""
        opened, self.opened = self.opened, []
        for sink in opened:
            try:
                sink.close(error)
            except Exception as err:  # noqa: BLE001 - the other sinks still close, and the run's own error wins
                log.warning("closing %s failed: %s", type(sink).__name__, err)
