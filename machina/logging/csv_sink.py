"""``metrics.csv`` in the run folder (``conf/logger/csv.yaml``): the rows of ``metrics.jsonl`` as a table for a
spreadsheet or pandas, one row per epoch, one column per metric name.

The header is every name seen so far, in order of first appearance; a cell is empty where a row has no value (a name
that appeared later, an ``eval/*`` metric on an epoch without evaluation, NaN, which ``metrics.jsonl`` writes as
null). A row with names the header lacks (the first evaluation's ``eval/*``) rewrites the file with the wider header;
any other row is appended. The file is a view of ``metrics.jsonl``, not a second history: when the run starts it is
rebuilt from ``metrics.jsonl`` (a resume's rows up to its checkpoint), so it never holds rows the run rewound, and
an edit of it is lost at the next start (the log says so).

A spreadsheet reads a cell that starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return) as a formula,
and a metric name is anyone's text (a sink or loss of the user's, a damaged metrics.jsonl). So such a cell that is
not a number is written with a ``'`` in front (OWASP's advice against CSV injection): ``'=1+1`` shows as the text
``=1+1``. Numbers, negative ones included, are written as they are.
"""

import csv
import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from machina.errors import ConfigError, TrainingStopped
from machina.files import metrics_file
from machina.files.atomic import atomic_write
from machina.logging.sink import Kind, RunInfo, Sink

log = logging.getLogger(__name__)

NAME = "metrics.csv"  # in the run folder
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula


class CsvSink(Sink):
    """Writes ``path`` from ``rows`` (the rows logged before this process, oldest first), then appends one row per
    ``log``. A write that fails stops training cleanly, as ``metrics.jsonl``'s does: a refusal at the start, and
    ``TrainingStopped`` later (a full disk)."""

    def __init__(self, path: Path, rows: Sequence[dict] = ()):
        self.path = Path(path)
        self.rows = [dict(row) for row in rows]
        self.header: list[str] = []
        for row in self.rows:
            self._widen(row)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()
        except OSError as err:
            raise ConfigError(f"cannot write {self.path}: {err.strerror or err}") from None

    @classmethod
    def for_run(cls, run: RunInfo) -> "CsvSink":
        rows, _ = metrics_file.read_rows(run.dir / metrics_file.NAME)  # JsonlSink warns about skipped lines
        log.info(
            "%s: rebuilt from %s (%d rows); it is a view of it, rewritten at each start",
            NAME,
            metrics_file.NAME,
            len(rows),
        )
        return cls(run.dir / NAME, rows)

    @classmethod
    def writes(cls, run: RunInfo) -> dict[Path, Kind]:
        return {run.dir / NAME: "file"}

    def log(self, metrics: dict[str, float]) -> None:
        self.rows.append(dict(metrics))
        try:
            if self._widen(metrics):
                self._rewrite()
            else:
                with self.path.open("ab") as f:
                    f.write(self._encode([metrics]))
        except OSError as err:
            raise TrainingStopped(f"could not write {self.path} ({err.strerror or err}); training stopped") from None

    def _widen(self, row: dict) -> bool:
        """Add ``row``'s new names to the header; whether there were any."""
        new = [name for name in row if name not in self.header]
        self.header += new
        return bool(new)

    def _rewrite(self) -> None:
        """Replace the file with the header and every row, atomically (a kill leaves the old file or the new)."""
        data = self._encode(self.rows, header=True)
        atomic_write(self.path, lambda f: f.write(data))

    def _encode(self, rows: list[dict], header: bool = False) -> bytes:
        text = io.StringIO()
        writer = csv.DictWriter(text, self.header, restval="", lineterminator="\n")
        if header:
            writer.writerow({name: text_cell(name) for name in self.header})
        writer.writerows({name: cell(value) for name, value in row.items()} for row in rows)
        return text.getvalue().encode()


def cell(value) -> str:
    """A value as ``metrics.jsonl`` holds it: an empty cell for null or a non-finite float, a number's shortest
    round-trip text, anything else (a damaged row's text) as ``text_cell``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value) if isinstance(value, float) else str(value)
    return text_cell(str(value))


def text_cell(text: str) -> str:
    """``text`` as a spreadsheet shows it and never evaluates it: ``'`` in front when it starts like a formula."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text
