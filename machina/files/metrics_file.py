"""The run folder's ``metrics.jsonl``: its format, written by ``JsonlSink`` and read only through this module (by
compare, plot and the run's history on resume).

Format: one row per finished epoch, each row one JSON object on one line ending in ``\\n`` (ASCII: ``json.dumps``
escapes everything else). Keys are metric names (``metric/agent_step``, ``overview/sps``, ...), values numbers or
null (a metric without a value that epoch; JSON has no NaN). Rows are only ever appended.

Reading never trusts the file: a kill or a full disk can tear the last line, and a file can be damaged by hand or by
a disk. Every line is reported with why it is not a row (torn, invalid UTF-8, not JSON, not a JSON object, empty),
and readers skip such lines with a warning instead of stopping, so the rows after a bad line still count.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from machina.files.bounded import read_regular

NAME = "metrics.jsonl"  # in the run folder
TORN = "torn (a partial last line: the run stopped while writing it)"


@dataclass(frozen=True)
class Line:
    """One line of the file. ``row`` is None exactly when ``problem`` says why it is not a row."""

    number: int  # 1-based
    text: str  # the raw line, decoded with errors="replace", without its newline
    row: dict | None
    problem: str | None


def encode_row(metrics: dict) -> bytes:
    """One epoch's row as written: a JSON object on one ASCII line with its newline; a non-finite float (a metric
    without a value this epoch) becomes null."""
    row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    return (json.dumps(row) + "\n").encode("ascii")


def read_lines(path: Path) -> list[Line]:
    """Every line of ``path``, parsed; [] when it does not exist. ConfigError naming the path when something else
    is there (a directory, a FIFO) or it cannot be read (no permission, an I/O error)."""
    raws = (read_file(path) or b"").split(b"\n")
    # After the last newline: nothing when the file ends with a whole line, else a last line that may be torn.
    ended = raws[-1] == b""
    if ended:
        raws.pop()
    return [_parse(i, raw, whole=ended or i < len(raws)) for i, raw in enumerate(raws, 1)]


def read_rows(path: Path) -> tuple[list[dict], list[str]]:
    """The rows of ``path`` (its lines that are JSON objects), and one warning per skipped line, such as
    ``metrics.jsonl line 7: not a JSON object``. Errors as ``read_lines``."""
    lines = read_lines(path)
    rows = [line.row for line in lines if line.row is not None]
    warnings = [f"{Path(path).name} line {line.number}: {line.problem}" for line in lines if line.problem]
    return rows, warnings


def read_metrics(run_dir: Path, limit: int = 5) -> tuple[list[dict], list[str]]:
    """The rows of ``run_dir``'s metrics file and the warnings about its skipped lines: the first of them, and one
    line counting the rest when there are more than ``limit`` (a garbled file has a warning per line). Errors as
    ``read_lines``; a run folder without the file has no rows."""
    rows, warnings = read_rows(Path(run_dir) / NAME)
    if len(warnings) > limit:
        warnings = [*warnings[: limit - 1], f"... and {len(warnings) - limit + 1} more skipped lines"]
    return rows, warnings


def number(row: dict, key: str) -> float | None:
    """``row[key]`` when it is a finite number; None when the row lacks it, it is null (no value that epoch) or it
    is anything else (a damaged row: text, a list, true/false)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def read_file(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of the regular file ``path``, None when nothing is there; ConfigError naming the path when something
    else is there (a folder, a FIFO, never waited on), it cannot be read (no permission, an I/O error), or it holds
    more than ``limit`` bytes (``bounded.read_regular``). Also how the other files of a run folder are read
    (``machina.run_folder.reading``)."""
    try:
        return read_regular(path, limit, str(path))
    except FileNotFoundError:
        return None


def _parse(line_number: int, raw: bytes, whole: bool) -> Line:
    """``raw`` (without its newline) as a Line; ``whole``: it ended with a newline (else it is the file's end)."""
    try:
        text, utf8 = raw.decode("utf-8"), True
    except UnicodeDecodeError:
        text, utf8 = raw.decode("utf-8", errors="replace"), False
    if not text.strip():
        return Line(line_number, text, None, "empty line")
    try:
        row = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long to convert
        problem = TORN if not whole else "invalid UTF-8" if not utf8 else "not JSON"
        return Line(line_number, text, None, problem)
    if not isinstance(row, dict):
        return Line(line_number, text, None, "not a JSON object")
    return Line(line_number, text, row, None)
