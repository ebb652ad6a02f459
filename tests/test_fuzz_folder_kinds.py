"""Every part of a run folder that a start writes, planted as every kind of file-system object it is not (issue 49,
item 3), and every way of naming a config on the command line (``-cn``, ``-cp``, ``-cd`` and their long spellings).

A part of the wrong kind (a regular file, a folder, a FIFO, a link to a file outside the folder, a broken link, a link
to a folder) is refused before the start is accepted: exit 2, one line naming the part, and nothing on disk changes,
the file a link names included. A folder part may be a link to a folder (a disk elsewhere); a file part must be a
regular file, never a link (writing through it would change the user's own file). A command that names its config
is checked before Hydra makes a folder, as one without.
"""

import os
import stat
from pathlib import Path

import pytest

from tests.commands import run_script
from tests.conftest import CONF, sampled
from tests.test_checkpoint import TINY, run_reporting
from tests.test_history import one_error_line

FOLDER, FILE = "folder", "file"
# The parts a start writes, their kind, and the logger that writes the part (none: every start writes it).
PARTS = {
    "checkpoints": (FOLDER, None),
    "replays": (FOLDER, None),
    ".hydra": (FOLDER, None),
    "rewound": (FOLDER, None),
    "metrics.jsonl": (FILE, None),
    "resolved_config.yaml": (FILE, None),
    ".machina.lock": (FILE, None),
    "checkpoints/.write_test": (FILE, None),  # the checkpointer's write probe
    "checkpoints/.checkpoint_000001.pt.tmp": (FILE, None),  # a killed write's temp file, removed at the start
    "metrics.csv": (FILE, ["logger=[console,jsonl,csv]"]),
    "wandb": (FOLDER, ["logger=[console,jsonl,wandb]", "wandb=offline"]),
}
KINDS = ("regular file", "folder", "fifo", "link to a file", "broken link", "link to a folder")
RIGHT = {FOLDER: ("folder", "link to a folder"), FILE: ("regular file",)}


def plant(path: Path, kind: str, outside: Path) -> None:
    """Put a file-system object of ``kind`` at ``path``; links point into ``outside``."""
    if kind == "regular file":
        path.write_text("planted\n")
    elif kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a file":
        path.symlink_to(outside / "users_own_file.txt")
    elif kind == "broken link":
        path.symlink_to(outside / "nothing_here")
    else:
        path.symlink_to(outside / "a_folder", target_is_directory=True)


def state(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed, FIFOs not opened): its kind, and a file's bytes."""
    found = {}
    for folder, names, files in os.walk(root):
        for name in names + files:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            key = str(path.relative_to(root))
            if stat.S_ISLNK(mode):
                found[key] = f"link to {os.readlink(path)}"
            elif stat.S_ISREG(mode):
                found[key] = path.read_bytes().decode("utf-8", "replace")
            else:
                found[key] = "folder" if stat.S_ISDIR(mode) else "special"
    return found


CASES = [(part, kind) for part, (wanted, _) in PARTS.items() for kind in KINDS if kind not in RIGHT[wanted]]


@pytest.mark.parametrize(("part", "kind"), sampled(CASES))
def test_a_part_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, part, kind):
    outside = tmp_path / "outside"
    (outside / "a_folder").mkdir(parents=True)
    (outside / "users_own_file.txt").write_text("the user's own file\n")
    folder = tmp_path / "run"
    (folder / part).parent.mkdir(parents=True)
    plant(folder / part, kind, outside)
    before = state(tmp_path)
    code, message = run_reporting(folder, *(PARTS[part][1] or []), epochs=1)
    assert code == 2 and "\n" not in message and str(folder / part) in message, message
    assert state(tmp_path) == before


SPELLINGS = {
    "-cn": ["-cn", "config"],
    "--config-name": ["--config-name", "config"],
    "--config-name=": ["--config-name=config"],
    "-cp": ["-cp", str(CONF)],
    "--config-path (relative)": ["--config-path", "conf"],
    "-cd": ["-cd", "EXTRA"],
    "--config-dir=": ["--config-dir=EXTRA"],
}


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(
    "refusal",
    ["trainer.total_timestep=10", pytest.param("trainer.total_timesteps=abc", marks=pytest.mark.slow)],  # 1 s each
)
def test_a_command_naming_its_config_is_refused_as_one_without_and_leaves_no_folder(tmp_path, spelling, refusal):
    """An unknown key (machina's one line, not Hydra's) and a bad value (refused after Hydra made the folder, which
    is removed again) under every spelling of naming the config, run as ``python train.py`` runs in this process
    (``tests/test_folder_trust.py`` runs the real script with ``-cn``)."""
    extra = tmp_path / "extra"
    extra.mkdir()
    naming = [arg.replace("EXTRA", str(extra)) for arg in SPELLINGS[spelling]]
    folder = tmp_path / "new" / "run"
    line = one_error_line(run_script("train.py", *naming, *TINY, refusal, f"hydra.run.dir={folder}"))
    assert refusal.split("=")[0] in line, line
    assert not (tmp_path / "new").exists()
