"""A run folder's history, and the one decision of where a start in that folder continues from.

History is what a run leaves as it trains: ``checkpoints/checkpoint_<epoch>.pt``, ``checkpoints/policy_<epoch>.pt``,
the rows of ``metrics.jsonl`` and ``replays/replay_<epoch>.gif``. It is append-only:

- ``resume=null`` continues the folder's latest checkpoint (a rerun of a killed command), or starts over when the
  run was killed before its first checkpoint (its rows are moved aside, below). A folder with policy files and no
  checkpoint (someone deleted the checkpoints to save space) is not started over: that is refused, with the command
  that starts the same run in a new folder.
- ``resume=`` one of the folder's own checkpoints continues from it, older ones included (a rewind).
- ``resume=`` a checkpoint from elsewhere starts this folder from it, only when the folder has no history.
- Whatever the folder holds after the epoch a start continues from (the epochs of an abandoned future, rows of epochs
  trained after the last checkpoint, a torn last row) is moved, never deleted, to a new folder
  ``rewound/after_epoch_<E>_<time>[_<n>]/`` once the start is accepted, and the log says where (``rewind``).
"""

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from machina.errors import ConfigError
from machina.files import metrics_file
from machina.files.atomic import atomic_write
from machina.training.checkpoint import checkpoints, named_checkpoint, numbered

log = logging.getLogger(__name__)

POLICY = re.compile(r"policy_(\d+)\.pt")
REPLAY = re.compile(r"replay_(\d+)\.gif")
REWOUND = "rewound"


@dataclass
class History:
    """What ``run_dir`` holds: ``(epoch, path)`` per file kind, oldest first, and the lines of metrics.jsonl."""

    run_dir: Path
    checkpoints: list[tuple[int, Path]] = field(default_factory=list)
    policies: list[tuple[int, Path]] = field(default_factory=list)
    replays: list[tuple[int, Path]] = field(default_factory=list)
    lines: list[metrics_file.Line] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path) -> "History":
        run_dir = Path(run_dir)
        return cls(
            run_dir,
            checkpoints(run_dir / "checkpoints"),
            numbered(run_dir / "checkpoints", POLICY),
            numbered(run_dir / "replays", REPLAY),
            metrics_file.read_lines(run_dir / metrics_file.NAME),
        )

    def summary(self) -> list[str]:
        """What the history holds, in a few words per kind (empty when there is none)."""
        rows = sum(line.row is not None for line in self.lines)
        held = [f"{metrics_file.NAME} ({rows} rows)"] if self.lines else []
        held += [path.name for _, path in (self.checkpoints + self.policies)[-3:]]
        held += [f"{len(self.replays)} replays"] if self.replays else []
        return held


def decide(resume: str | None, run_dir: Path, new_folder_command: str) -> Path | None:
    """The checkpoint a start in ``run_dir`` continues from, or None for a fresh start (see the module docstring).

    ``resume``: the ``resume=`` setting (a checkpoint file, a run folder or its checkpoints/ folder, or None).
    ``new_folder_command``: the command that starts the same run in a new folder, for the refusal messages."""
    check_writable(Path(run_dir))
    history = History.read(run_dir)
    if resume is None:
        if history.checkpoints:
            return history.checkpoints[-1][1]
        # Policy files are written with every checkpoint: with them and no checkpoint, the checkpoints were deleted.
        # Rows alone are a run killed before its first checkpoint: it starts over, its rows moved aside (rewind).
        held = history.summary() if history.policies else []
        if held:
            raise ConfigError(
                f"the run folder {str(run_dir)!r} holds a run's history ({', '.join(held)}) but no checkpoint_*.pt "
                f"to continue it from, and a fresh start would overwrite it; to train anew and keep it, start in a new "
                f"folder: {new_folder_command}; to continue it, put its checkpoints/checkpoint_*.pt back and rerun "
                "this command"
            )
        return None
    source = named_checkpoint("resume", resume)
    own = (Path(run_dir) / "checkpoints").resolve()
    if source.resolve().parent != own and history.summary():
        raise ConfigError(
            f"resume={str(source)!r} is another run's checkpoint and the run folder {str(run_dir)!r} already holds a "
            f"run's history ({', '.join(history.summary())}); continuing there would mix the two runs: continue into "
            f"a new folder: {new_folder_command}; or drop resume= to continue this folder's own run"
        )
    return source


# What a run writes in its folder: folders, and files it appends to or replaces.
FOLDERS = ("checkpoints", "replays", ".hydra", "wandb")
FILES = (metrics_file.NAME, "resolved_config.yaml", "train.log")


def check_writable(run_dir: Path) -> None:
    """Refuse, before anything is written, a run folder whose parts the run will write are not of the right kind or
    not writable (a file named checkpoints, a read-only metrics.jsonl): found later, the run would stop half set up."""
    for name in ("", *FOLDERS, *FILES):
        path = run_dir / name
        if not os.path.lexists(path):
            continue
        folder = name in ("", *FOLDERS)
        if path.is_dir() != folder:
            raise ConfigError(
                f"{str(path)!r} is not a {'folder' if folder else 'regular file'}, as a run writes it; move it away or "
                "choose another run folder with hydra.run.dir=PATH"
            )
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            raise ConfigError(
                f"{str(path)!r} is not writable; make it writable or choose another with hydra.run.dir=PATH"
            )


def rewind(run_dir: Path, epoch: int) -> Path | None:
    """Move everything ``run_dir`` holds after ``epoch`` (files of later epochs, metrics rows of later epochs and
    lines that are not rows) to ``rewound/after_epoch_<epoch>_<time>/``, keeping their names, and log what moved
    where. Returns that folder, or None when nothing was after ``epoch``. Called once a start from ``epoch`` has
    been accepted; writes the moved rows first, so a kill in between leaves them in both places, never in none."""
    history = History.read(run_dir)
    files = [p for e, p in history.checkpoints + history.policies + history.replays if e > epoch]
    later = [line for line in history.lines if line.row is None or row_epoch(line.row) > epoch]
    if not (files or later):
        return None
    archive = new_archive(Path(run_dir) / REWOUND, epoch)
    if later:
        moved = "".join(f"{line.text}\n" for line in later).encode("utf-8")
        atomic_write(archive / metrics_file.NAME, lambda f: f.write(moved))
        moved_numbers = {line.number for line in later}
        kept = "".join(f"{line.text}\n" for line in history.lines if line.number not in moved_numbers)
        kept = kept.encode("utf-8")
        atomic_write(Path(run_dir) / metrics_file.NAME, lambda f: f.write(kept))
    for path in files:
        target = archive / path.parent.name / path.name
        target.parent.mkdir(exist_ok=True)
        os.replace(path, target)
    torn = [line for line in later if line.row is None]
    log.warning(
        "starting from epoch %d: what the folder held after it (%s) is moved to %s; nothing was deleted",
        epoch,
        ", ".join(
            part
            for part in (
                f"{len(later) - len(torn)} {metrics_file.NAME} rows" if len(later) > len(torn) else "",
                f"{len(torn)} unreadable {metrics_file.NAME} lines ({torn[0].problem})" if torn else "",
                ", ".join(p.name for p in files[:4]) + (" ..." if len(files) > 4 else ""),
            )
            if part
        ),
        archive,
    )
    return archive


def new_archive(rewound: Path, epoch: int) -> Path:
    """A folder made here for one rewind: ``rewound/after_epoch_<E>_<time>``, or with ``_2``, ``_3``, ... after it
    when a rewind to the same epoch in the same second made that one. ``mkdir`` without ``exist_ok`` either makes
    the folder or fails, so no two rewinds share one and nothing in an archive is ever replaced."""
    rewound.mkdir(parents=True, exist_ok=True)
    stem = f"after_epoch_{epoch:06d}_{time.strftime('%Y%m%d-%H%M%S')}"
    number = 1
    while True:
        archive = rewound / (stem if number == 1 else f"{stem}_{number}")
        try:
            archive.mkdir()
            return archive
        except FileExistsError:
            number += 1


def row_epoch(row: dict) -> float:
    """A row's ``metric/epoch``; a row without a numeric one counts as after every epoch (it is moved)."""
    epoch = row.get("metric/epoch")
    return epoch if isinstance(epoch, int | float) and not isinstance(epoch, bool) else float("inf")
