"""Reading a file that may come from anyone, at a cost bounded by what a real one holds.

A name on disk can be anything: a FIFO (whose ``open`` blocks until a writer comes), a device (``/dev/zero`` never
ends, and reports size 0), a socket, a folder, or a link to any of them. ``read_regular`` opens the name without
blocking (``O_NONBLOCK``: a FIFO opens at once, with no writer), asks the open file what it is (``fstat`` of the
descriptor, after every link was followed, so a name swapped between a check and the open is still caught), and
reads only a regular file, at most ``limit`` bytes of it.
"""

import contextlib
import errno
import os
import stat
from pathlib import Path

from machina.errors import ConfigError

KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words."""
    return next((words for test, words in KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, limit: int | None, source: str, what: str = "such a file") -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``limit`` of them (what ``what``, "a game
    file", may hold; None: no bound, for a file that grows with its run). ConfigError naming ``source`` for a name
    that cannot be read, anything but a regular file (never read: no wait on a FIFO, no endless device), or a file
    longer than ``limit`` (found by reading, not by trusting its reported size). FileNotFoundError for a missing
    name, or one under a file rather than a folder (the caller knows what to suggest)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except NotADirectoryError:  # a name under a regular file: nothing is there either
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path)) from None
    except OSError as err:  # a socket cannot be opened (ENXIO): say what the name is, where it can be told
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(
                    f"{source}: is {kind(mode)}, not a regular file; only regular files are read"
                ) from None
        raise ConfigError(f"{source}: cannot be read ({err.strerror or err})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{source}: is {kind(mode)}, not a regular file; only regular files are read")
        chunks, size = [], 0
        while limit is None or size <= limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ConfigError(f"{source}: cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)
    if limit is not None and size > limit:
        raise ConfigError(f"{source}: more than {limit:,} bytes, more than {what} may hold")
    return b"".join(chunks)
