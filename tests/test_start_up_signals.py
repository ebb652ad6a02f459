"""A signal outside training (issue: no stray files): Ctrl-C or SIGTERM while ``train.py`` imports torch or starts
its MettaGrid workers ends it with one line and exit 128 + the signal, and leaves no run folder (no
``.machina.lock``), where it used to print a KeyboardInterrupt traceback or die silently with the lock file left."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def has_loaded(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


def start(run_dir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "train.py", "experiment=debug", f"hydra.run.dir={run_dir}", *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def signal_when(process: subprocess.Popen, ready, signum: int) -> tuple[int, str]:
    deadline = time.monotonic() + 120
    while not ready(process.pid):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the moment to signal never came"
        time.sleep(0.01)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    return process.returncode, out + err


def test_ctrl_c_while_torch_loads_is_one_line_not_a_traceback(tmp_path):
    run_dir = tmp_path / "run"
    code, output = signal_when(start(run_dir), lambda pid: has_loaded(pid, "libtorch"), signal.SIGINT)
    assert code == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert output.strip().splitlines()[-1].startswith("train.py: stopped by SIGINT outside training")
    assert not run_dir.exists()


@pytest.mark.slow
def test_sigterm_while_mettagrid_workers_start_leaves_no_folder_and_says_so(tmp_path):
    pytest.importorskip("mettagrid")
    run_dir = tmp_path / "run"
    process = start(run_dir, "env=mettagrid_arena", "env.workers=2")
    code, output = signal_when(process, lambda pid: bool(children(pid)), signal.SIGTERM)
    assert code == 143, output
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1].startswith("train.py: stopped by SIGTERM outside training")
    assert not run_dir.exists()  # Hydra's folder of a start not accepted is removed, its lock file with it
