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
- An archived future goes on in a new folder: ``resume=`` one of its checkpoints with another ``hydra.run.dir``
  (the refusal of ``resume=`` it in its own folder prints that command). Its rows up to the rewind stay in the old
  folder's metrics.jsonl, the later ones in the archive's.
"""

import logging
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from machina.errors import ConfigError
from machina.files import metrics_file
from machina.files.atomic import atomic_write, replace, sync_folder
from machina.logging.sink import Kind
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
    archived = archive_of(source, Path(run_dir))
    if archived and history.summary():
        raise ConfigError(
            f"resume={str(source)!r} is a checkpoint of a future this run folder abandoned, archived in "
            f"{str(archived)!r} by a rewind; the folder goes on from the run's present, and continuing the archived "
            f"future here would mix the two: continue it in a new folder: {new_folder_command} (its rows up to the "
            f"rewind are this folder's {metrics_file.NAME}, the later ones the archive's)"
        )
    if source.resolve().parent != own and history.summary():
        raise ConfigError(
            f"resume={str(source)!r} is another run's checkpoint and the run folder {str(run_dir)!r} already holds a "
            f"run's history ({', '.join(history.summary())}); continuing there would mix the two runs: continue into "
            f"a new folder: {new_folder_command}; or drop resume= to continue this folder's own run"
        )
    return source


def archive_of(path: Path, run_dir: Path) -> Path | None:
    """The archive of ``run_dir``'s ``rewound/`` that holds ``path``, or None when it is not in one."""
    rewound = (run_dir / REWOUND).resolve()
    inside = path.resolve().relative_to(rewound).parts if path.resolve().is_relative_to(rewound) else ()
    return run_dir / REWOUND / inside[0] if len(inside) > 1 else None


# What every start writes in its run folder, besides what its sinks declare (``Sink.writes``: metrics.csv, W&B's
# folder) and its log file: the folder itself and the folders it writes in, the files it writes or appends to. The
# lock file is checked by ``machina.run_folder.run_lock`` as it opens it.
PARTS: dict[str, Kind] = {
    "": "folder",
    "checkpoints": "folder",
    "replays": "folder",
    ".hydra": "folder",
    REWOUND: "folder",
    metrics_file.NAME: "file",
    "resolved_config.yaml": "file",
}


def parts(run_dir: Path) -> dict[Path, Kind]:
    """``PARTS`` as paths in ``run_dir``, with the files the checkpointer writes or removes as it starts
    (``Checkpointer.prepare``): its write probe, and the temp files a killed write left (``.<name>.<pid>-<n>.tmp``)."""
    found = {Path(run_dir) / name: kind for name, kind in PARTS.items()}
    checkpoints = Path(run_dir) / "checkpoints"
    found[checkpoints / ".write_test"] = "file"
    if checkpoints.is_dir():
        found.update(dict.fromkeys(checkpoints.glob(".*.tmp"), "file"))
    return found


def check_parts(paths: Mapping[Path, Kind]) -> None:
    """Refuse, before anything is written, a path a start will write that is there but not of its ``Kind`` or not
    writable: found later, the run would stop half set up. A folder may be a link to a folder (a disk elsewhere); a
    file must be a regular file and not a link, since writing through a link would change a file outside the run
    folder (a run folder from elsewhere naming the user's own files)."""
    for path, kind in paths.items():
        if not os.path.lexists(path):
            continue
        fits = path.is_dir() if kind == "folder" else path.is_file() and not path.is_symlink()
        if not fits:
            raise ConfigError(
                f"{str(path)!r} is not a {'folder' if kind == 'folder' else 'regular file'}, as a run writes it (it is "
                f"{what(path)}); move it away or choose another run folder with hydra.run.dir=PATH"
            )
        if not os.access(path, os.W_OK | (os.X_OK if kind == "folder" else 0)):
            raise ConfigError(
                f"{str(path)!r} is not writable; make it writable or choose another with hydra.run.dir=PATH"
            )


def what(path: Path) -> str:
    """What is at ``path``, in words."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "a link" if path.exists() else "a broken link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a regular file" if stat.S_ISREG(mode) else "a special file (a FIFO, socket or device)"


@dataclass
class Rewind:
    """What a start from ``epoch`` moves aside (``rewind``): ``files`` of later epochs, and the ``later`` lines of
    metrics.jsonl, from a ``history`` read once the folder was locked."""

    run_dir: Path
    epoch: int
    history: History
    files: list[Path]
    later: list[metrics_file.Line]

    def apply(self) -> Path | None:
        """Move it to a new ``rewound/after_epoch_<epoch>_<time>/``, keeping the names, and log what moved where.
        Returns that folder, or None when nothing was after ``epoch``. Writes the moved rows first, so a kill in
        between leaves them in both places, never in none; every rename is synced (``machina.files.atomic``)."""
        files, later, run_dir = self.files, self.later, Path(self.run_dir)
        if not (files or later):
            return None
        archive = new_archive(run_dir / REWOUND, self.epoch)
        if later:
            moved = "".join(f"{line.text}\n" for line in later).encode("utf-8")
            atomic_write(archive / metrics_file.NAME, lambda f: f.write(moved))
            moved_numbers = {line.number for line in later}
            kept = "".join(f"{line.text}\n" for line in self.history.lines if line.number not in moved_numbers)
            kept = kept.encode("utf-8")
            atomic_write(run_dir / metrics_file.NAME, lambda f: f.write(kept))
        for path in files:
            target = archive / path.parent.name / path.name
            target.parent.mkdir(exist_ok=True)
            replace(path, target)
        sync_folder(archive)
        torn = [line for line in later if line.row is None]
        log.warning(
            "starting from epoch %d: what the folder held after it (%s) is moved to %s; nothing was deleted",
            self.epoch,
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


def plan_rewind(run_dir: Path, epoch: int) -> Rewind:
    """What a start from ``epoch`` will move aside once it is accepted, checked now: the files move by renaming, so
    ``rewound/`` must be on the file system of the folders they leave (a link to another disk cannot take them)."""
    history = History.read(run_dir)
    files = [p for e, p in history.checkpoints + history.policies + history.replays if e > epoch]
    later = [line for line in history.lines if line.row is None or row_epoch(line.row) > epoch]
    rewound = Path(run_dir) / REWOUND
    device = os.stat(rewound if rewound.exists() else run_dir).st_dev
    for folder in sorted({path.parent for path in files}):
        if os.stat(folder).st_dev != device:
            raise ConfigError(
                f"starting from epoch {epoch} moves the later epochs of {str(folder)!r} to {str(rewound)!r}, which "
                "is on another file system (a rename cannot move them); make rewound/ a folder of the run folder's "
                "file system, or start in a new folder with hydra.run.dir=PATH"
            )
    return Rewind(Path(run_dir), epoch, history, files, later)


def rewind(run_dir: Path, epoch: int) -> Path | None:
    """Move everything ``run_dir`` holds after ``epoch`` (files of later epochs, metrics rows of later epochs and
    lines that are not rows) to ``rewound/after_epoch_<epoch>_<time>/`` (``plan_rewind``, then ``Rewind.apply``)."""
    return plan_rewind(run_dir, epoch).apply()


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
        except FileExistsError:
            number += 1
            continue
        for folder in (rewound, rewound.parent):  # the new names, so the moves into them survive a power loss
            sync_folder(folder)
        return archive


def row_epoch(row: dict) -> float:
    """A row's ``metric/epoch``; a row without a numeric one counts as after every epoch (it is moved)."""
    epoch = row.get("metric/epoch")
    return epoch if isinstance(epoch, int | float) and not isinstance(epoch, bool) else float("inf")
