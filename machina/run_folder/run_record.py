"""What a command writes about itself in its run folder (``.hydra/`` and its log), written only once the command has
been accepted, so a refused command leaves every folder as it was.

Hydra would write ``.hydra/{config,hydra,overrides}.yaml`` and open ``<job>.log`` before the task function runs,
that is before machina has checked anything: a refused second run on a busy folder would rewrite the first run's
record. So conf/config.yaml and conf/eval.yaml set ``hydra.output_subdir: null`` (Hydra writes no ``.hydra/``) and
``hydra.job_logging.handlers.file.delay: true`` (the log file is opened at its first record), and ``deferred()``
holds the log records in memory until ``accept(folder)``. Then the record is written and the log file receives
every record so far. Refused, the records go to the console only, and the folders Hydra made for the command (which
``note_missing_folders`` saw absent before Hydra started) are removed again (``machina.run_folder.run_lock`` undoes its
own
part: the lock file's line).

The record is append-only: the first accepted start of a folder writes ``.hydra/``; a later one (a resume) writes
its own ``.hydra/resume_<epoch>/`` and leaves the first start's files as they are. In a multirun a refused job's
folder keeps its record and log (the sweep's comparison lists the job as failed, with its error).
"""

import logging
import logging.handlers
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from machina.files.atomic import atomic_write, missing_folders, remove_empty

RECORD = ".hydra"
# Folders absent before Hydra started (set by ``note_missing_folders``, in the same process, before ``@hydra.main``).
_missing: list[Path] = []
_current: "Record | None" = None


def note_missing_folders(folder: Path) -> None:
    """Remember which of ``folder`` and its parents do not exist yet: Hydra is about to make them, and a refused
    command removes them again."""
    _missing[:] = missing_folders(folder)


class Record:
    """The log records of one command held until it is accepted; see the module docstring.

    Args:
        cfg: the task's config as Hydra hands it to the task function (saved as ``.hydra/config.yaml``).
    """

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.accepted = False
        self.writer = True  # False for a process that runs in the folder without writing it (``not_writing``)
        self.folder = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
        root = logging.getLogger()
        # Hydra's file handler (delay=True: not opened yet) receives the records once the command is accepted.
        self.files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
        for handler in self.files:
            root.removeHandler(handler)
        self.memory = logging.handlers.MemoryHandler(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
        root.addHandler(self.memory)

    def accept(self, resumed_epoch: int | None = None) -> None:
        """Write the record (``.hydra/``, or ``.hydra/resume_<epoch>/`` for a resume of a folder that has one) and
        send the held log records, and every later one, to the log file."""
        if self.accepted or not self.writer:
            return
        self.accepted = True
        if self.folder is not None:
            write_record(self.folder, self.cfg, resumed_epoch)
        root = logging.getLogger()
        root.removeHandler(self.memory)
        for handler in self.files:
            for held in self.memory.buffer:
                if held.levelno >= handler.level:
                    handler.handle(held)
            root.addHandler(handler)
        self.memory.buffer.clear()

    def close(self, refused: bool) -> None:
        """End the command: a refused single run leaves nothing behind; a multirun job keeps its record and log."""
        if refused and HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            self.accept()
        self.release()
        if refused and not self.accepted:
            self.discard()

    def release(self) -> None:
        """Stop holding log records and close the log file (opened only if the command was accepted)."""
        root = logging.getLogger()
        root.removeHandler(self.memory)
        self.memory.buffer.clear()
        for handler in self.files:
            root.removeHandler(handler)
            handler.close()
        self.files = []

    def discard(self) -> None:
        """Remove the folders Hydra made for a command that was not accepted (the lock undoes its own part)."""
        remove_empty(_missing)


def write_record(folder: Path, cfg: DictConfig, resumed_epoch: int | None) -> None:
    """Hydra's three record files for this command, in ``.hydra/`` or, when that exists, ``.hydra/resume_<epoch>``
    (``_2``, ``_3``, ... for further starts at the same epoch)."""
    target = folder / RECORD
    if target.exists():
        base = target / f"resume_{resumed_epoch or 0:06d}"
        target, n = base, 1
        while os.path.lexists(target):  # a broken link takes the name as much as a folder
            n += 1
            target = base.with_name(f"{base.name}_{n}")
    target.mkdir(parents=True)
    hydra_cfg = HydraConfig.get()
    files = {
        "config.yaml": cfg,
        "hydra.yaml": OmegaConf.create({"hydra": hydra_cfg}),
        "overrides.yaml": OmegaConf.create(list(hydra_cfg.overrides.task)),
    }
    for name, node in files.items():
        text = OmegaConf.to_yaml(node).encode("utf-8")
        atomic_write(target / name, lambda f, text=text: f.write(text))


@contextmanager
def deferred(cfg: DictConfig) -> Iterator[Record]:
    """Hold this command's record and log until ``accept()``; see the module docstring."""
    global _current
    record = _current = Record(cfg)
    refused = True
    try:
        yield record
        refused = False
    finally:
        _current = None
        record.close(refused)


def accept(resumed_epoch: int | None = None) -> None:
    """Accept the current command (``deferred``): from here on it may write its run folder. Outside ``deferred``
    (a test calling ``machina.run.train`` directly) nothing is held and this does nothing."""
    if _current is not None:
        _current.accept(resumed_epoch)


def log_files() -> list[Path]:
    """The log files the current command writes once it is accepted (Hydra's ``<job>.log``); none outside
    ``deferred``."""
    return [Path(handler.baseFilename) for handler in _current.files] if _current is not None else []


def not_writing(folder: Path) -> None:
    """This process runs in ``folder`` without writing it (a rank other than 0 under torchrun): stop holding its log
    records (it writes no log file), and remove the folder Hydra made for it alone when rank 0's is another."""
    if _current is None:
        return
    _current.writer = False
    _current.release()
    if _current.folder is not None and _current.folder.resolve() != Path(folder).resolve():
        _current.discard()
