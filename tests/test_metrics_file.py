"""metrics.jsonl as a hostile or damaged file: torn lines, invalid UTF-8, rows that are not JSON objects, a directory
or a FIFO in its place; and the sink that writes it, on a full disk and after a torn row."""

import errno
import hashlib
import json
import math
import os

import pytest

from machina.errors import ConfigError, TrainingStopped
from machina.files.bounded import read_regular
from machina.files.metrics_file import Line, read_lines, read_rows
from machina.logging.sinks import JsonlSink


def row(epoch: int) -> dict:
    return {"metric/epoch": epoch, "metric/agent_step": 1024 * epoch, "overview/sps": 2000.0 + epoch}


def write(path, *chunks: bytes):
    path.write_bytes(b"".join(chunks))
    return path


def line(epoch: int) -> bytes:
    return json.dumps(row(epoch)).encode() + b"\n"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_kind_of_bad_line_is_reported_and_the_rows_after_it_still_count(tmp_path):
    path = write(
        tmp_path / "metrics.jsonl",
        line(1),
        b'{"metric/epoch": 2, "overview/sps": \xff}\n',  # a flipped byte where a number was
        b"[1, 2, 3]\n",
        b"42\n",
        b"\n",
        b'{"metric/epoch": 3,\n',  # a row torn in the middle of the file (a kill, then a resume appended)
        line(4),
        b'{"note": "caf\xe9"}\n',  # Latin-1, not UTF-8, inside a string: replaced, the row still parses
        b'{"metric/epoch": 5, "metric/agent_st',  # torn last line: no newline
    )
    lines = read_lines(path)
    assert [(x.number, x.row is not None, x.problem) for x in lines] == [
        (1, True, None),
        (2, False, "invalid UTF-8"),
        (3, False, "not a JSON object"),
        (4, False, "not a JSON object"),
        (5, False, "empty line"),
        (6, False, "not JSON"),
        (7, True, None),
        (8, True, None),
        (9, False, "torn (a partial last line: the run stopped while writing it)"),
    ]
    assert lines[1].text == '{"metric/epoch": 2, "overview/sps": \ufffd}'
    assert lines[7].row == {"note": "caf\ufffd"}
    assert lines[8] == Line(9, '{"metric/epoch": 5, "metric/agent_st', None, lines[8].problem)

    rows, warnings = read_rows(path)
    assert rows == [row(1), row(4), {"note": "caf\ufffd"}]
    assert warnings[:2] == ["metrics.jsonl line 2: invalid UTF-8", "metrics.jsonl line 3: not a JSON object"]
    assert len(warnings) == 6


def test_a_whole_last_row_without_its_newline_is_kept_and_nesting_or_huge_numbers_do_not_crash(tmp_path):
    path = write(tmp_path / "metrics.jsonl", line(1), b"[" * 100_000 + b"\n", b"9" * 5000 + b"\n", line(2)[:-1])
    rows, warnings = read_rows(path)
    assert rows == [row(1), row(2)]
    assert warnings == ["metrics.jsonl line 2: not JSON", "metrics.jsonl line 3: not JSON"]


def test_a_missing_file_has_no_lines_and_an_empty_file_none_either(tmp_path):
    assert read_lines(tmp_path / "metrics.jsonl") == []
    assert read_lines(tmp_path / "no_folder" / "metrics.jsonl") == []
    assert read_rows(write(tmp_path / "metrics.jsonl")) == ([], [])


def test_a_file_under_a_regular_file_is_missing_not_an_error(tmp_path):
    """A run folder that is a regular file holds no metrics.jsonl: nothing is read and nothing is refused, as for a
    missing one; a game file or a stored config there is "no such file" (FileNotFoundError from the shared reader)."""
    (tmp_path / "run").write_text("not a folder")
    assert read_lines(tmp_path / "run" / "metrics.jsonl") == []
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "run" / "game.yaml", 1000, "env.game")


def test_a_directory_or_a_fifo_in_place_of_the_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(ConfigError, match=f"{tmp_path / 'metrics.jsonl'}: is a folder, not a regular file"):
        read_lines(tmp_path / "metrics.jsonl")
    fifo = tmp_path / "fifo" / "metrics.jsonl"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=f"{fifo}: is a FIFO \\(named pipe\\), not a regular file"):
        read_rows(fifo)  # refused at once: a FIFO with no writer would otherwise block forever


def test_the_sink_appends_and_never_rewrites_what_is_there(tmp_path):
    """A resumed run's rows beyond its checkpoint are archived elsewhere: the sink itself keeps every byte."""
    path = write(tmp_path / "metrics.jsonl", *(line(epoch) for epoch in range(1, 6)))
    before = path.read_bytes()
    sink = JsonlSink(path)
    assert path.read_bytes() == before
    sink.log({**row(3), "overview/reward": math.nan, "eval/return": math.inf})
    sink.close()
    assert path.read_bytes().startswith(before)
    rows, warnings = read_rows(path)
    assert len(rows) == 6 and warnings == []
    assert rows[-1]["overview/reward"] is None and rows[-1]["eval/return"] is None  # JSON has no NaN


def test_a_row_after_a_torn_last_line_starts_on_a_line_of_its_own(tmp_path):
    path = write(tmp_path / "metrics.jsonl", line(1), line(2)[:20])  # killed while writing epoch 2
    sink = JsonlSink(path)
    sink.log(row(2))
    sink.close()
    rows, warnings = read_rows(path)
    assert rows == [row(1), row(2)]
    assert warnings == ["metrics.jsonl line 2: not JSON"]


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(path, room)``: writes to ``path`` store ``room`` more bytes, then fail with ENOSPC, as the kernel
    does when a disk fills up mid-write. Only the OS call is faked; other files are written for real."""
    real_write = os.write

    def install(path, room: int):
        inode = path.stat().st_ino
        left = [room]

        def write(fd, data):
            if os.fstat(fd).st_ino != inode:
                return real_write(fd, data)
            if left[0] == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written = real_write(fd, bytes(data[: left[0]]))
            left[0] -= written
            return written

        monkeypatch.setattr(os, "write", write)

    return install


def test_a_full_disk_stops_training_cleanly_and_the_rows_written_after_it_are_whole(tmp_path, full_disk, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(row(1))
    full_disk(path, room=15)  # the next row gets 15 bytes in, then the disk is full
    with pytest.raises(TrainingStopped) as stopped:
        sink.log(row(2))
    message = str(stopped.value)
    assert str(path) in message and "No space left on device" in message
    assert "training stopped" in message and "checkpoint" not in message  # the trainer adds what the stop leaves
    with pytest.raises(TrainingStopped):
        sink.log(row(3))  # still full: nothing more is written
    assert path.read_bytes() == line(1) + line(2)[:15]

    monkeypatch.undo()  # space again
    sink.log(row(3))
    sink.close()
    resumed = JsonlSink(path)  # and a resume opening the file after that
    resumed.log(row(4))
    resumed.close()
    rows, warnings = read_rows(path)
    assert rows == [row(1), row(3), row(4)]
    assert warnings == ["metrics.jsonl line 2: not JSON"]


def test_a_write_refused_before_any_byte_leaves_no_empty_line(tmp_path, full_disk, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(row(1))
    full_disk(path, room=0)
    with pytest.raises(TrainingStopped, match="No space left on device"):
        sink.log(row(2))
    monkeypatch.undo()
    sink.log(row(2))
    sink.close()
    assert path.read_bytes() == line(1) + line(2)


def test_the_sink_refuses_a_directory_or_a_fifo_in_place_of_the_file(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(ConfigError, match=f"cannot write {tmp_path / 'metrics.jsonl'}: Is a directory"):
        JsonlSink(tmp_path / "metrics.jsonl")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=f"cannot write {fifo}"):
        JsonlSink(fifo)  # refused at once, not blocked waiting for a reader
    occupied = tmp_path / "file"
    occupied.write_text("x")
    before = sha256(occupied)
    with pytest.raises(ConfigError, match=f"cannot write {occupied / 'metrics.jsonl'}"):
        JsonlSink(occupied / "metrics.jsonl")  # a file where the run folder should be
    assert sha256(occupied) == before
