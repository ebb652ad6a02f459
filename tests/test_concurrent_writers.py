"""Two commands writing at once: two writers of one file each replace it whole, and two evaluations or two training
runs started in the same second get two folders."""

from datetime import datetime

import hydra.core.utils
import pytest
from hydra import compose, initialize_config_dir

from machina.files.atomic import atomic_write
from tests.conftest import CONF


def test_two_writers_of_one_file_both_finish_and_the_last_ones_bytes_stay(tmp_path):
    """The second write starts and ends while the first is still writing (what two processes started together do).
    With one shared temp name the second's replace moved the first's half-written temp file away, and the first
    failed with "No such file or directory"."""
    path = tmp_path / "eval.json"

    def first(f):
        f.write(b"first, ")
        atomic_write(path, lambda g: g.write(b"second"))
        f.write(b"written whole")

    atomic_write(path, first)
    assert path.read_bytes() == b"first, written whole"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temp file left behind


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "eval.json"
    path.write_bytes(b"old")

    def failing(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, failing)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]


@pytest.mark.parametrize(
    ("config", "overrides", "root"), [("eval", ["checkpoint=x.pt"], "outputs/eval/"), ("config", [], "outputs/")]
)
def test_two_commands_started_in_the_same_second_get_two_output_folders(monkeypatch, config, overrides, root):
    """Two train.py runs started together (a script's loop) shared one folder, and the run lock refused the second."""
    folders = []
    for microsecond in (1, 2):

        class Clock(datetime):
            tick = microsecond

            @classmethod
            def now(cls, tz=None):
                return datetime(2026, 12, 6, 13, 30, 5, cls.tick)

        monkeypatch.setattr(hydra.core.utils, "datetime", Clock)
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=config):
            cfg = compose(config_name=config, overrides=overrides, return_hydra_config=True)
        folders.append(cfg.hydra.run.dir)
    assert folders[0] != folders[1]
    assert all(folder.startswith(f"{root}2026-12-06/13-30-05") for folder in folders), folders
