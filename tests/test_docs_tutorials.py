"""The tutorials work as written: each page of docs/tutorials/ is run block by block, in order, in a fresh working
folder holding an empty ``outputs/`` (as the repository does), as a reader would type it from the repository's root.

- A ``bash`` block runs line by line, stopping at the first that fails; ``python train.py``, ``python eval.py`` and
  ``torchrun ... train.py`` name the repository's scripts, and every training command gets ``SMALL`` (replacing the
  same keys) so that it trains one epoch. ``python train.py|eval.py ...`` and ``python -m machina.X ...`` run in
  this process as their scripts run them (``tests/commands.py``: no interpreter to start), every other line in bash
  (``set -euo pipefail``).
- A ``python`` block runs in this process, in the working folder; one whose first line is a comment naming a file
  (``# my_games.py``) is written to that file instead, as the page asks the reader to save it.
- ``shell`` and unmarked blocks are shown only: they need GPUs, a cluster, the network or many minutes.

``own_package.md`` is run by ``tests/test_own_package.py`` (its package trained, interrupted, resumed, evaluated,
swept and compared), not a second time here.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import Result, run_module, run_script

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
RUN_ELSEWHERE = {"own_package.md": ROOT / "tests" / "test_own_package.py"}
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# One epoch of whatever batch the command sets (a run stops at the first whole epoch at or past its total), no W&B.
SMALL = {"trainer.total_timesteps": "1", "wandb": "disabled", "system.threads": "1"}
NEEDS = {"mettagrid_game.md": "mettagrid"}
QUIET = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def runnable(page: Path) -> list[tuple[str, str]]:
    return [(kind, text) for kind, text in BLOCK.findall(page.read_text()) if kind in ("bash", "python")]


def command_line(line: str) -> str:
    """A tutorial's shell line as the test runs it: the repository's scripts, this interpreter, SMALL settings."""
    line = re.sub(r"^torchrun\b", f"{sys.executable} -m torch.distributed.run", line)
    line = re.sub(r"(?<![\w/])(train|eval)\.py\b", lambda m: str(ROOT / m[0]), line)
    line = re.sub(r"^python3? ", f"{sys.executable} ", line)
    if str(ROOT / "train.py") not in line:
        return line
    words = [w for w in shlex.split(line) if w.split("=", 1)[0] not in SMALL]
    return shlex.join([*words, *(f"{key}={value}" for key, value in SMALL.items())])


def in_process(line: str) -> Result | None:
    """Run a tutorial line here when it is one of the repository's commands with no shell syntax; else None."""
    if re.search(r"[|&;<>$`]", line):
        return None
    words = shlex.split(line)
    if words[:1] != [sys.executable] or len(words) < 2:
        return None
    if words[1] in (str(ROOT / "train.py"), str(ROOT / "eval.py")):
        return run_script(Path(words[1]).name, *words[2:], cwd=Path.cwd(), env=QUIET)
    if words[1] == "-m" and words[2].startswith("machina."):
        return run_module(words[2], *words[3:], cwd=Path.cwd())
    return None


def run_page(page: Path, work: Path) -> None:
    (work / "outputs").mkdir()  # as in the repository, which ships an empty outputs/
    env = {**os.environ, "PYTHONPATH": str(ROOT), **QUIET}
    for kind, text in runnable(page):
        first = text.splitlines()[0]
        if kind == "python" and re.fullmatch(r"# [\w/]+\.py", first):
            (work / first[2:]).write_text(text)
        elif kind == "python":
            exec(compile(text, f"{page.name}: python block", "exec"), {"__name__": "__tutorial__"})
        else:
            for line in map(command_line, text.splitlines()):
                done = in_process(line) or subprocess.run(
                    ["bash", "-c", f"set -euo pipefail\n{line}"], cwd=work, env=env, capture_output=True, text=True,
                    timeout=600,
                )  # fmt: skip
                assert done.returncode == 0, f"{page.name}:\n{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_every_tutorial_runs_here_or_in_the_test_named_for_it():
    """A new tutorial page cannot go unrun: it has blocks this test runs, or a test of its own that reads it."""
    for page in sorted(TUTORIALS.glob("*.md")):
        if page.name in RUN_ELSEWHERE:
            assert page.name in RUN_ELSEWHERE[page.name].read_text()
        else:
            assert any(kind == "bash" for kind, _ in runnable(page)), f"{page.name} has no bash block to run"


def test_a_training_line_gets_the_small_settings_and_the_repository_scripts():
    line = command_line("torchrun --nproc_per_node=2 train.py experiment=debug trainer.total_timesteps=16384")
    words = shlex.split(line)
    assert words[:3] == [sys.executable, "-m", "torch.distributed.run"] and str(ROOT / "train.py") in words
    assert "trainer.total_timesteps=16384" not in words and "trainer.total_timesteps=1" in words
    assert command_line("python -m machina.compare outputs/x") == f"{sys.executable} -m machina.compare outputs/x"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in TUTORIALS.glob("*.md") if p.name not in RUN_ELSEWHERE))
def test_the_tutorial_runs_as_written(name, tmp_path, monkeypatch):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the working folder first: the page's own modules
    try:
        run_page(TUTORIALS / name, tmp_path)
    finally:  # the page's modules (my_games) go with its folder: another test may write its own of that name
        for module in [m for m in sys.modules.values() if str(getattr(m, "__file__", "")).startswith(str(tmp_path))]:
            del sys.modules[module.__name__]
