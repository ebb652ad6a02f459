"""Writing files so that a kill never leaves half of one."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write through a temp file in the same folder, fsync, then ``os.replace``: a reader (or a resume after a kill)
    sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
