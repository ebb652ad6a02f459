"""Trust in the run folder, third pass (issue 49: items 3, 8 and 10's run-folder parts, syncs and sparse files).

Every check comes before any write, also for a rewind into a ``rewound`` that is a file and for a command that names
its config; no two sinks write one file and ``Sink`` itself is no sink; a resume of the folder's own archived future
says what it is and prints the command that continues it; a stop says what it leaves; a rename is synced with its
folder; and a sparse file costs what is read from it, not what its size claims on disk. Command-line behaviour is
checked with ``train.py`` run as its script runs (in this process; one real subprocess) and real folders.
"""

import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from machina.errors import ConfigError
from machina.files import atomic, torch_file
from machina.run_folder.reading import MAX_DOCUMENT, read_run
from tests.commands import run_script
from tests.conftest import ROOT, run_train
from tests.test_checkpoint import EPOCH, TINY, metrics, run, run_reporting
from tests.test_history import KEEP_ALL, one_error_line, snapshot


def test_a_rewind_into_a_rewound_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
    """Found only once the run was accepted, the record and the log were written and the move failed with a
    traceback; now nothing in the folder changes."""
    run(tmp_path, epochs=2)
    (tmp_path / "rewound").write_text("not a folder")
    before = snapshot(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "checkpoint_000001.pt"
    result = run_script(
        "train.py", *TINY, f"trainer.total_timesteps={2 * EPOCH}", f"hydra.run.dir={tmp_path}", f"resume={checkpoint}"
    )
    line = one_error_line(result)
    assert str(tmp_path / "rewound") in line and "is not a folder" in line, line
    assert snapshot(tmp_path) == before


def test_a_refused_value_in_a_command_naming_its_config_leaves_no_folder(tmp_path):
    """``-cn`` (as a sweep launcher passes it) used to skip the pre-flight: Hydra's folder stayed after a refusal.
    The real script's process, its exit code (the other spellings run in this process:
    ``tests/test_fuzz_folder_kinds.py``)."""
    folder = tmp_path / "new" / "run"
    line = one_error_line(run_train(["-cn", "config", *TINY, "trainer.total_timesteps=abc", f"hydra.run.dir={folder}"]))
    assert "trainer.total_timesteps" in line, line
    assert not (tmp_path / "new").exists()


def test_an_unknown_key_in_a_command_naming_its_config_gets_machinas_one_line(tmp_path):
    folder = tmp_path / "run"
    line = one_error_line(
        run_script("train.py", "--config-name", "config", *TINY, "trainer.total_timestep=5", f"hydra.run.dir={folder}")
    )
    assert "no key 'trainer.total_timestep'" in line and "did you mean 'trainer.total_timesteps'" in line, line
    assert not folder.exists()


@pytest.mark.parametrize(
    ("entry", "refusal"),
    [
        # Two metrics.jsonl sinks wrote every row twice.
        ("+logger.again._target_=machina.logging.sinks.JsonlSink", "logger.jsonl and logger.again both write"),
        # Sink itself passed start-up and failed after the first epoch with a traceback.
        (
            "+logger.base._target_=machina.logging.sink.Sink",
            "logger.base._target_=machina.logging.sink.Sink has no log",
        ),
    ],
)
def test_a_logger_entry_that_would_double_or_fail_is_refused_before_anything_is_written(tmp_path, entry, refusal):
    folder = tmp_path / "run"
    code, message = run_reporting(folder, entry, epochs=1)
    assert code == 2 and "\n" not in message and refusal in message, message
    assert not folder.exists()


def fill_the_disk_at(monkeypatch, metrics_path: Path, epoch: int) -> None:
    """The disk is full when ``metrics_path`` takes epoch ``epoch``'s row (epochs are checkpointed after they are
    logged, so that epoch is never checkpointed)."""
    real_write = os.write

    def write(fd, data):
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(metrics_path) and b'"metric/epoch": %d,' % epoch in data:
            raise OSError(28, os.strerror(28))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("full_at_epoch", [1, 2])
def test_a_stop_says_what_it_leaves_and_a_rerun_does_it(tmp_path, monkeypatch, full_at_epoch):
    """Before the first checkpoint there is nothing to resume from: the stop says so, and a rerun starts the run
    anew; after it, the stop names the checkpoint, and a rerun resumes from it."""
    fill_the_disk_at(monkeypatch, tmp_path / "metrics.jsonl", full_at_epoch)
    code, message = run_reporting(tmp_path, epochs=2)
    monkeypatch.undo()
    assert code == 2 and "No space left on device" in message, message
    if full_at_epoch == 1:
        assert "no checkpoint was written" in message and "starts the run anew" in message, message
        assert "kept" not in message and "resumes" not in message, message
        assert not list((tmp_path / "checkpoints").glob("checkpoint_*"))
    else:
        kept = tmp_path / "checkpoints" / "checkpoint_000001.pt"
        assert f"the last good checkpoint {str(kept)!r} is kept" in message and "resumes from it" in message, message
    run(tmp_path, epochs=2)  # the same folder again: as the message said
    assert [row["metric/epoch"] for row in metrics(tmp_path)] == [1, 2]


def test_a_stop_before_the_first_checkpoint_of_a_run_from_another_folder_names_none(tmp_path, monkeypatch):
    """Started from another folder's checkpoint, the run has none of its own until its first: a start in its folder
    would not resume the other folder's, so that one is not named as kept."""
    run(tmp_path / "other", epochs=1)
    folder = tmp_path / "run"
    fill_the_disk_at(monkeypatch, folder / "metrics.jsonl", 2)
    code, message = run_reporting(folder, f"resume={tmp_path}/other/checkpoints/checkpoint_000001.pt", epochs=2)
    assert code == 2 and "no checkpoint was written" in message and "kept" not in message, message


@pytest.mark.slow
def test_a_resume_of_the_folders_own_archived_future_says_what_it_is_and_how_to_continue_it(tmp_path):
    """The folder's own ``rewound/.../checkpoint_*.pt`` was called "another run's checkpoint". The refusal now says
    it is an abandoned future of this folder, changes nothing, and its printed command continues that future."""
    folder = tmp_path / "run"
    run(folder, *KEEP_ALL, epochs=3)
    run(folder, *KEEP_ALL, f"resume={folder}/checkpoints/checkpoint_000001.pt", epochs=2)  # 2 and 3 are archived
    (archive,) = (folder / "rewound").iterdir()
    archived = archive / "checkpoints" / "checkpoint_000003.pt"
    before = snapshot(folder)
    common = [*TINY, *KEEP_ALL, f"trainer.total_timesteps={4 * EPOCH}"]
    line = one_error_line(run_train([*common, f"hydra.run.dir={folder}", f"resume={archived}"]))
    assert "abandoned" in line and str(archive) in line and "another run" not in line, line
    assert snapshot(folder) == before
    command = shlex.split(line.split("continue it in a new folder: ", 1)[1].split(" (its rows", 1)[0])
    result = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    new = Path(next(arg.split("=", 1)[1] for arg in command if arg.startswith("hydra.run.dir=")))
    assert [row["metric/epoch"] for row in metrics(new)] == [4]


def test_a_rename_is_followed_by_a_sync_of_its_folder(tmp_path, monkeypatch):
    """A rename is an entry of its folder: until the folder is synced a power loss may undo it, after the file's own
    bytes were synced. Every atomic write (checkpoints, policy files, metrics.csv, the record) syncs the folder."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(source, target):
        events.append(("replace", str(target)))
        return real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic.atomic_write(tmp_path / "checkpoint_000001.pt", lambda f: f.write(b"data"))
    renamed = events.index(("replace", str(tmp_path / "checkpoint_000001.pt")))
    assert ("fsync", str(tmp_path)) in events[renamed + 1 :], events


def write_sparse(path: Path, data: bytes, block: int = 1 << 16) -> None:
    """``data`` written to ``path`` with a hole for every all-zero block, as ``cp --sparse=always`` does."""
    with path.open("wb") as f:
        for start in range(0, len(data), block):
            chunk = data[start : start + block]
            if chunk.count(0) == len(chunk):
                f.seek(len(chunk), io.SEEK_CUR)
            else:
                f.write(chunk)
        f.truncate(len(data))


def test_a_sparse_checkpoint_buys_no_walk_beyond_the_bytes_of_its_pickle(tmp_path):
    """A hole of 64 MiB costs nothing on disk but raised the bound on values walked to 64 million: a pickle whose
    memo shares one list 10,000 times was walked 10 million values deep and accepted. The bound is now the pickle's
    own bytes, which are read whole."""
    inner = [0] * 1000
    middle = [inner] * 100
    buffer = io.BytesIO()
    torch.save({"shared": [middle] * 100, "hole": torch.zeros(64 << 20, dtype=torch.uint8)}, buffer)
    path = tmp_path / "checkpoint_000001.pt"
    write_sparse(path, buffer.getvalue())
    assert path.stat().st_size > 64 << 20 and path.stat().st_blocks * 512 < 16 << 20  # a real hole
    with pytest.raises(ConfigError, match="more values than its pickle has bytes"):
        torch_file.load(path)


def test_a_sparse_config_in_a_run_folder_is_read_only_up_to_its_bound(tmp_path):
    """A ``.hydra/config.yaml`` claiming 256 MiB through a hole was read whole (and parsed) by compare; it is read
    up to ``MAX_DOCUMENT`` bytes and the run counts as damaged, naming the file."""
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    with (folder / ".hydra" / "config.yaml").open("wb") as f:
        f.write(b"trainer: {total_timesteps: 10}\n")
        f.truncate(256 << 20)
    (folder / "metrics.jsonl").write_text(json.dumps({"metric/epoch": 1, "metric/agent_step": 8}) + "\n")
    record = read_run(folder)
    assert record.status == "damaged" and "config.yaml" in record.error, record
    assert f"more than {MAX_DOCUMENT:,} bytes" in record.error, record
