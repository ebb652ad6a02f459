"""One run writes a run folder at a time: an exclusive lock on ``<run_dir>/.machina.lock``, held while it runs.

The lock is ``fcntl.flock`` on that file. The operating system releases it when the process ends, however it ends,
so a lock left by a run killed with ``kill -9`` never blocks the rerun that resumes it (the file stays; its content
is only information). The holder writes its PID and host into the file, so a second run names the process it waits
for. Under torchrun only rank 0 takes it (``machina.run``).

A refused start that made the file removes it again, while it still holds the lock. Another start may have opened
the file just before and lock it just after: it then holds the lock of a file no longer in the folder, while a
third start could make a new one. So a start checks, once it holds the lock, that the path still names the file it
locked, and opens the path anew when it does not.
"""

import fcntl
import os
import socket
import stat
from pathlib import Path

from machina.errors import ConfigError
from machina.files.atomic import missing_folders, remove_empty

NAME = ".machina.lock"


class RunLock:
    """``with RunLock(run_dir):`` holds the run folder's lock for the block, or raises ConfigError naming the process
    that holds it. Creates the run folder if it does not exist yet. Unless ``keep()`` was called (the run was
    accepted), leaving the block undoes what entering did: the lock file's line (or the file), the folders made."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / NAME
        self._fd: int | None = None
        self.kept = False

    def __enter__(self) -> "RunLock":
        self.made = missing_folders(self.run_dir)
        while True:
            existed, fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                raise ConfigError(
                    f"the run folder {str(self.run_dir)!r} is in use by {holder}; wait for that run to end or stop "
                    "it, or choose another folder with hydra.run.dir=PATH"
                ) from None
            if self._names(fd):
                break
            os.close(fd)  # a refused start removed the file between our open and our lock: lock the path's file
        # The line found, put back if the run is not accepted (``keep``); None: the file is ours to remove then.
        self.previous = os.pread(fd, 4096, 0) if existed else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def _open(self) -> tuple[bool, int]:
        """Whether the lock file was there, and a descriptor of it (made when it was not). Only a regular file is
        used: a link is not followed (the PID line would overwrite the file it names) and a FIFO is not waited on."""
        # No O_TRUNC: the line stays readable. O_NOFOLLOW: a link fails (ELOOP); O_NONBLOCK: a FIFO opens at once.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
        fd = None
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            existed = os.path.lexists(self.path)
            fd = os.open(self.path, flags, 0o644)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return existed, fd
            problem = f"{str(self.path)!r} is not a regular file"
        except OSError as err:
            if not (os.path.lexists(self.path) and not stat.S_ISREG(os.lstat(self.path).st_mode)):
                remove_empty(self.made)
                raise ConfigError(
                    f"cannot write to the run folder {str(self.run_dir)!r} ({err.strerror or err}); make it writable "
                    "or choose another with hydra.run.dir=PATH"
                ) from None
            problem = f"{str(self.path)!r} is {'a link' if os.path.islink(self.path) else 'not a regular file'}"
        if fd is not None:
            os.close(fd)
        remove_empty(self.made)
        raise ConfigError(
            f"{problem}, not the lock file a run makes; move it away or choose another run folder "
            "with hydra.run.dir=PATH"
        )

    def _names(self, fd: int) -> bool:
        """Whether the lock file's path still names the file open as ``fd``."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def keep(self) -> None:
        """The run was accepted: its line stays in the lock file after it ends (the file is only information)."""
        self.kept = True

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        if not self.kept:  # a refused run leaves the folder as it found it: the lock file, the folders it made
            if self.previous is None:
                self.path.unlink(missing_ok=True)
            else:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, self.previous, 0)
        os.close(self._fd)  # closing the only descriptor releases the lock
        self._fd = None
        if not self.kept:
            remove_empty(self.made)
