"""A run's history is append-only and a refused command leaves the disk as it was (issue 30, items 2-5, 10, 14):
the printed resume command continues the latest checkpoint, a rewind keeps the abandoned epochs and says where, a
folder whose checkpoints were deleted is not started over, a refused run leaves a running run's record alone, and a
bad value leaves no folder behind. Command-line behaviour is checked by running ``train.py`` in this process
(``tests.commands``), and with real subprocesses where the signals and the exit code of the script are the point."""

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from machina.run_folder.run_lock import RunLock
from tests.commands import one_error_line, run_script
from tests.conftest import interrupt_train, run_train
from tests.test_checkpoint import EPOCH, TINY, run, run_reporting

KEEP_ALL = ["trainer.keep_checkpoints=100"]
# A run that trains until it is signalled, eager: system.compile=auto would compile a run this long first (a minute).
UNTIL_STOPPED = ["trainer.total_timesteps=100000000", "system.compile=false"]


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative path -> digest), folders as "dir"."""
    found = {}
    for path in sorted(Path(folder).rglob("*")):
        key = str(path.relative_to(folder))
        found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def epochs(run_dir: Path) -> list[int]:
    return [json.loads(line)["metric/epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resuming_an_older_checkpoint_moves_the_later_epochs_aside_and_deletes_nothing(tmp_path, caplog):
    """Rewinding a run to its own epoch-2 checkpoint: epochs 3-4 (their checkpoints, policy files and metrics rows)
    move, byte for byte, to rewound/after_epoch_000002_*/, the log says where, and the run continues from epoch 2."""
    run(tmp_path, *KEEP_ALL, epochs=4)
    before = snapshot(tmp_path / "checkpoints")
    rows_before = (tmp_path / "metrics.jsonl").read_text().splitlines()
    run(tmp_path, *KEEP_ALL, f"resume={tmp_path / 'checkpoints' / 'checkpoint_000002.pt'}", epochs=3)

    (archive,) = (tmp_path / "rewound").iterdir()
    assert archive.name.startswith("after_epoch_000002_")
    moved = snapshot(archive / "checkpoints")
    names = [f"{kind}_{e:06d}.pt" for kind in ("checkpoint", "policy") for e in (3, 4)]
    assert sorted(moved) == sorted(names)
    assert all(moved[name] == before[name] for name in names)
    assert (archive / "metrics.jsonl").read_text().splitlines() == rows_before[2:]
    assert epochs(tmp_path) == [1, 2, 3]
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[:2] == rows_before[:2]
    assert str(archive) in caplog.text and "nothing was deleted" in caplog.text
    # The new timeline's epoch 3 is a new file; the first timeline's epoch 3 is the archived one.
    assert snapshot(tmp_path / "checkpoints")["checkpoint_000003.pt"] != before["checkpoint_000003.pt"]


def test_rows_trained_after_the_last_checkpoint_and_a_torn_row_are_kept_on_resume(tmp_path, caplog):
    """A kill after epoch 3 with the last checkpoint at epoch 2 (and a torn line): the resume trains epoch 3 again,
    and the killed run's row of epoch 3 and the torn line are moved aside with a warning, not dropped."""
    run(tmp_path, *KEEP_ALL, epochs=3)
    (tmp_path / "checkpoints" / "checkpoint_000003.pt").unlink()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"metric/epoch": 4, "overview/sp')
    killed_row = (tmp_path / "metrics.jsonl").read_text().splitlines()[2]
    run(tmp_path, *KEEP_ALL, epochs=3)
    (archive,) = (tmp_path / "rewound").iterdir()
    assert (archive / "metrics.jsonl").read_text().splitlines() == [killed_row, '{"metric/epoch": 4, "overview/sp']
    assert epochs(tmp_path) == [1, 2, 3]
    assert "unreadable metrics.jsonl lines" in caplog.text and str(archive) in caplog.text


def test_a_run_killed_before_its_first_checkpoint_starts_over_and_keeps_its_rows(tmp_path, caplog):
    """Rows but no checkpoint and no policy file (killed before trainer.checkpoint_interval epochs): rerunning the
    command starts over, as the README promises, and the killed run's rows move aside instead of vanishing."""
    run(tmp_path, "trainer.checkpoint_interval=0", epochs=2)
    for path in (tmp_path / "checkpoints").iterdir():
        path.unlink()
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    run(tmp_path, "trainer.checkpoint_interval=0", epochs=1)
    (archive,) = (tmp_path / "rewound").iterdir()
    assert archive.name.startswith("after_epoch_000000_")
    assert (archive / "metrics.jsonl").read_text().splitlines() == rows
    assert epochs(tmp_path) == [1]
    assert "starting from epoch 0" in caplog.text


@pytest.mark.slow
def test_the_printed_resume_command_of_a_resumed_run_continues_its_latest_checkpoint(tmp_path):
    """The README's resume example, then Ctrl-C: the printed command has no resume=, and following it continues from
    the newest checkpoint: no checkpoint is lost and metrics.jsonl keeps every row (issue 30 item 2)."""
    run_dir = tmp_path / "run"
    first = run_script("train.py", *TINY, *KEEP_ALL, f"trainer.total_timesteps={4 * EPOCH}", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.output[-3000:]
    resume = f"resume={run_dir / 'checkpoints' / 'checkpoint_000002.pt'}"
    args = [*TINY, *KEEP_ALL, *UNTIL_STOPPED, resume, f"hydra.run.dir={run_dir}"]
    code, output, command = interrupt_train(
        args,
        lambda: len(list((run_dir / "checkpoints").glob("checkpoint_*.pt"))) >= 5,
        tmp_path,  # 1, 2 and 3+
    )
    assert code == 130, output[-3000:]
    assert "resume=" not in command and command.endswith(f"hydra.run.dir={run_dir}")
    stopped_at = epochs(run_dir)[-1]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert checkpoints[-1] == f"checkpoint_{stopped_at:06d}.pt"

    _, *args = shlex.split(command)
    resumed = run_script("train.py", *args[1:], f"trainer.total_timesteps={EPOCH * (stopped_at + 1)}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert epochs(run_dir) == list(range(1, stopped_at + 2))
    after = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert set(checkpoints) <= set(after)


def test_a_rerun_in_a_folder_whose_checkpoints_were_deleted_is_refused_and_changes_nothing(finished, tmp_path):
    """History without checkpoints (a user deleted them to save space): another start there, even with another
    seed, is refused with the command that starts in a new folder; nothing in the folder changes (item 3)."""
    run_dir = shutil.copytree(finished["run"], tmp_path / "run")
    for path in (run_dir / "checkpoints").glob("checkpoint_*.pt"):
        path.unlink()
    before = snapshot(run_dir)
    again = run_script(
        "train.py", *TINY, f"trainer.total_timesteps={2 * EPOCH}", "system.seed=7", f"hydra.run.dir={run_dir}"
    )
    line = one_error_line(again)
    assert "holds a run's history" in line and "no checkpoint_*.pt" in line
    assert f"hydra.run.dir={run_dir}-2" in line and "system.seed=7" in line
    assert snapshot(run_dir) == before
    assert not Path(f"{run_dir}-2").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    """Two finished runs of train.py (2 epochs of the tiny run, a checkpoint each), "run" and "other", with their
    .hydra/ records; tests copy them before they change anything."""
    root = tmp_path_factory.mktemp("finished")
    for name in ("run", "other"):
        done = run_script("train.py", *TINY, f"trainer.total_timesteps={2 * EPOCH}", f"hydra.run.dir={root / name}")
        assert done.returncode == 0, done.output[-3000:]
    return {name: root / name for name in ("run", "other")}


@pytest.mark.parametrize(
    "refusal",
    ["lock held", "bad value", "another run's checkpoint"],
)
def test_a_refused_run_leaves_the_folder_and_its_record_as_they_were(finished, tmp_path, refusal):
    """A second command on a finished (or running) run's folder that is refused (its lock is held, a bad value, a
    resume from another run) leaves every file of the folder byte for byte, its .hydra/ record included, so
    machina.compare still shows the first run's settings (item 4)."""
    run_dir = shutil.copytree(finished["run"], tmp_path / "run")
    args = [*TINY, f"trainer.total_timesteps={3 * EPOCH}", "optimizer.lr=0.01", f"hydra.run.dir={run_dir}"]
    if refusal == "lock held":
        with RunLock(run_dir):
            before = snapshot(run_dir)
            line = one_error_line(run_script("train.py", *args))
            assert "in use by PID" in line and snapshot(run_dir) == before
    else:
        before = snapshot(run_dir)
        if refusal == "bad value":
            line = one_error_line(run_script("train.py", *args, "experience.minibatch_size=3000"))
            assert "experience.minibatch_size" in line
        else:
            line = one_error_line(run_script("train.py", *args, f"resume={finished['other']}"))
            assert "another run's checkpoint" in line
        assert snapshot(run_dir) == before
    assert "optimizer.lr=0.01" not in (run_dir / ".hydra" / "overrides.yaml").read_text()


# Bad values, each with the key its one-line refusal must name (items 5, 10 and 15).
BAD_VALUES = {
    "experience.batch_size=1000": "experience.batch_size",
    "system.seed=4294967296": "system.seed",
    "objective=summary/nope": "objective",
    "evaluation.episodes=0": "evaluation.episodes",
    "evaluation.greedy=maybe": "evaluation.greedy",
    "~trainer.total_timesteps": "trainer.total_timesteps",
    "policy.encoder.embed_dim=0": "policy.encoder",
    "policy.actor.hidden=[0]": "policy.actor",
    "policy.core.hidden_size=-4": "policy.core",
    "env.num_envs=1000000000": "env.num_envs",
    "experience.batch_size=2000000000": "experience.batch_size",
    "trainer.curriculum=foo": "trainer.curriculum must be a list",
    "env.extractors_per_resource=1000": "env.extractors_per_resource",
    "optimizer.lr=-1": "optimizer.lr",
}


@pytest.mark.slow
@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_a_bad_value_is_one_line_and_creates_no_folder(tmp_path, bad):
    """``python train.py <bad value>`` with Hydra's default timestamped folder: exit 2, one line naming the key, no
    traceback, and the working directory is left empty (no outputs/ folder)."""
    result = run_script("train.py", "debug=tiny", "wandb=disabled", bad, cwd=tmp_path)
    assert BAD_VALUES[bad] in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_unknown_gymnasium_module_is_one_line_and_creates_no_folder(tmp_path):
    """The real script's process (the bad values above run in this one): exit code 2, one line, no folder."""
    pytest.importorskip("gymnasium")
    result = run_train(["experiment=cartpole", "wandb=disabled", "env.id=missing.mod:Env-v0"], cwd=tmp_path)
    assert "env.id=missing.mod:Env-v0" in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_second_ctrl_c_stops_a_run_that_inherited_sigint_ignored(tmp_path):
    """A run started as a background job of a script inherits SIGINT ignored: the first SIGINT still checkpoints at
    the epoch's end, and a second one stops at once (item 14)."""
    run_dir = tmp_path / "run"
    # metrics.jsonl is the last sink, so the first signal lands after epoch 1's stop check, early in epoch 2 (about
    # 2 s long), and the second 0.3 s later in the same epoch: with W&B after it, a signal could land between the
    # row and that check and stop the run after epoch 1, before the second signal came.
    args = [*TINY, "logger=[console,jsonl]", "env.num_envs=64", "experience.batch_size=131072", *UNTIL_STOPPED]
    metrics_file = run_dir / "metrics.jsonl"
    code, output, _ = interrupt_train(
        [*args, f"hydra.run.dir={run_dir}"],
        lambda: metrics_file.is_file() and metrics_file.read_text(),
        tmp_path,
        signals=2,
        inherit_ignored=True,
    )
    assert code == 130, output[-3000:]
    assert "interrupted twice" in output


def test_an_unusable_run_folder_with_an_interpolation_is_refused_before_hydra_starts(tmp_path):
    """``hydra.run.dir`` with ``${now:...}`` under a path that cannot hold a folder (a file, as a folder root cannot
    write into is not testable as root): the folder is resolved once, checked and refused in one line (item 10)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run_script("train.py", "debug=tiny", "wandb=disabled", f"hydra.run.dir={blocker}/${{now:%H-%M-%S}}")
    assert "is not a folder" in one_error_line(result) and "hydra.run.dir" in one_error_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("blocker", ["checkpoints", "replays", "metrics.jsonl", "resolved_config.yaml", ".hydra"])
def test_a_folder_part_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, blocker):
    """A file where the run writes a folder (or a folder where it writes a file) would stop the run half set up:
    it is refused at the start, naming the path, and the folder is left as it was."""
    path = tmp_path / blocker
    if blocker in ("checkpoints", "replays", ".hydra"):
        path.write_text("not a folder")
    else:
        path.mkdir()
    before = snapshot(tmp_path)
    code, message = run_reporting(tmp_path, epochs=1)
    assert code == 2 and str(path) in message and "is not a" in message, message
    assert snapshot(tmp_path) == before


def test_two_rewinds_to_the_same_epoch_in_the_same_second_keep_both_archives(tmp_path, monkeypatch):
    """A real folder rewound to epoch 2 twice within one printed second (the clock's text is held still): each
    rewind gets its own archive, and the second replaces nothing of the first's."""
    import time

    from machina.run_folder.history import rewind

    monkeypatch.setattr(time, "strftime", lambda fmt, *when: "20261206-000000")
    (tmp_path / "checkpoints").mkdir()

    def train_epochs_3_and_4(timeline: str) -> None:
        rows = [json.dumps({"metric/epoch": e, "timeline": timeline}) for e in (1, 2, 3, 4)]
        (tmp_path / "metrics.jsonl").write_text("".join(f"{row}\n" for row in rows))
        for e in (3, 4):
            (tmp_path / "checkpoints" / f"checkpoint_{e:06d}.pt").write_text(f"{timeline} {e}")

    train_epochs_3_and_4("first")
    first = rewind(tmp_path, 2)
    train_epochs_3_and_4("second")
    second = rewind(tmp_path, 2)
    assert first != second and sorted((tmp_path / "rewound").iterdir()) == sorted([first, second])
    for archive, timeline in ((first, "first"), (second, "second")):
        assert (archive / "checkpoints" / "checkpoint_000003.pt").read_text() == f"{timeline} 3"
        assert [json.loads(line)["timeline"] for line in (archive / "metrics.jsonl").read_text().splitlines()] == [
            timeline,
            timeline,
        ]
    assert epochs(tmp_path) == [1, 2]


def test_a_start_that_locks_a_lock_file_a_refused_start_removed_holds_the_folders_lock(tmp_path, monkeypatch):
    """Start A makes the lock file and is refused; start B opened that file just before A removed it and locks it
    just after. B must then hold the lock of the file the folder names: a third start C is refused, not given a new
    lock file of its own (two runs writing one folder)."""
    import fcntl

    from machina.errors import ConfigError
    from machina.run_folder import run_lock

    a = RunLock(tmp_path)
    a.__enter__()
    real_flock, interleaved = fcntl.flock, []

    def flock_after_a_is_refused(fd, operation):
        if not interleaved:  # B has opened the file; A is refused (not kept) and leaves before B's lock
            interleaved.append(fd)
            a.__exit__(None, None, None)
        return real_flock(fd, operation)

    monkeypatch.setattr(run_lock.fcntl, "flock", flock_after_a_is_refused)
    with RunLock(tmp_path) as b:
        assert interleaved  # the interleaving happened
        assert f"PID {os.getpid()}" in (tmp_path / ".machina.lock").read_text()
        with pytest.raises(ConfigError, match="is in use by PID"):
            RunLock(tmp_path).__enter__()
        b.keep()
