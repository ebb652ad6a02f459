"""A lab's own parts in its own package, used by machina with no edit to machina: an env with an optional output of
its own, a policy component, a loss that consumes ``full_log_probs`` and reads that output, and a logger sink, each
one Python class plus one YAML in the package's ``conf/``, put on Hydra's search path by the command line
(``hydra.searchpath=[pkg://my_lab.conf]``). The package is written into a temporary folder and trained with
``train.py``, interrupted, resumed, evaluated with ``eval.py``, compared and swept, as a user would.

What a file may name follows the same search path (``machina.files.trusted``): without it, ``eval.py`` of the same
run folder is refused in one line naming the class."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machina import compare

ROOT = Path(__file__).resolve().parents[1]
SEARCH_PATH = "hydra.searchpath=[pkg://my_lab.conf]"

TUTORIAL = ROOT / "docs" / "tutorials" / "own_package.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
SMALL = [
    "debug=tiny",
    "wandb=disabled",
    "system.threads=1",
    "trainer.checkpoint_interval=1",
    "trainer.eval_interval=0",
    "experience.batch_size=512",
    "experience.minibatch_size=256",
]


def blocks(kind: str) -> list[str]:
    return [text for lang, text in BLOCK.findall(TUTORIAL.read_text()) if lang == kind]


def write_package(root: Path) -> list[str]:
    """Every python / yaml block of the tutorial whose first line names its file (``# my_lab/...``) written under
    ``root``, with the two empty package files the tutorial lists; returns the files written."""
    written = []
    for text in blocks("python") + blocks("yaml"):
        first = text.splitlines()[0]
        if first.startswith("# my_lab/"):
            path = root / first.removeprefix("# ")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(first.removeprefix("# "))
    for empty in ("my_lab/__init__.py", "my_lab/conf/__init__.py", "my_lab/tests/__init__.py"):
        (root / empty).write_text("")
    return written


def doc_command(start: str, **replace: str) -> list[str]:
    """The tutorial's command line that starts with ``start``, its settings named in ``replace`` given the test's
    values (smaller sizes, the test's folders)."""
    lines = [line for text in blocks("bash") for line in text.splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"the tutorial has {len(lines)} commands starting with {start!r}"
    words = shlex.split(lines[0])[2:]  # without "python <script>"
    kept = [w for w in words if w.split("=", 1)[0] not in replace]
    return [*kept, *(f"{key}={value}" for key, value in replace.items())]


def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / script), *args]


def run(args: list[str], env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=env["WORK"], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def lab(tmp_path):
    """A user's working folder with my_lab importable (PYTHONPATH) and machina's own files untouched."""
    assert len(write_package(tmp_path / "src")) == 9  # four parts, a .py and a .yaml each, and their tests
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), str(ROOT)]),
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "WORK": str(work),
    }
    return work, env


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_tutorial_s_package_trains_resumes_evaluates_sweeps_and_compares(lab):
    work, env = lab
    print("\n[own package] train, interrupt, resume, eval, sweep, compare: about 40 s", flush=True)
    folder = work / "run"
    sizes = {word.split("=", 1)[0]: word.split("=", 1)[1] for word in SMALL}
    train = command(
        "train.py",
        *doc_command("python train.py hydra", **sizes, **{"trainer.total_timesteps": "40960", "hydra.run.dir": folder}),
    )
    machina_files = {p: p.stat().st_mtime_ns for p in (ROOT / "conf").rglob("*")} | {
        p: p.stat().st_mtime_ns for p in (ROOT / "machina").rglob("*.py")
    }

    # Trained, then interrupted (Ctrl-C) once its second checkpoint is written.
    process = subprocess.Popen(train, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (folder / "checkpoints" / "checkpoint_000002.pt").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "no second checkpoint within 120 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    stopped = rows(folder)
    assert 2 <= len(stopped) < 80
    assert stopped[-1]["losses/follow_hint/hint_prob"] > 0  # the loss read the env's own output and the distribution
    tsv = (folder / "metrics.tsv").read_text().splitlines()
    assert len(tsv) == len(stopped)  # the lab's sink got every epoch

    # The same command continues it to the end.
    resumed = run(train, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr + resumed.stdout
    epochs = [row["metric/epoch"] for row in rows(folder)]
    assert epochs == list(range(1, 81))  # 40960 / 512 epochs, none lost or repeated
    assert len((folder / "metrics.tsv").read_text().splitlines()) == 80
    policy = (folder / "resolved_config.yaml").read_text()
    assert "my_lab.critic.ScaledCritic" in policy and "emit_full_log_probs: true" in policy

    # eval.py rebuilds the lab's env and component from the run folder's files on the same search path...
    out = work / "eval"
    evaluate = doc_command("python eval.py", checkpoint=folder, episodes="4", **{"hydra.run.dir": out})
    evaluated = run(command("eval.py", *evaluate), env)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["policy"]["episodes"] == 4 and report["policy"]["return"] >= 0
    # ... and without it, the files name classes no trusted config names: refused in one line, nothing written;
    # a search path written into the run's own files does not count (only the command's configuration does).
    with open(folder / "resolved_config.yaml", "a") as f:
        f.write("hydra:\n  searchpath: [pkg://my_lab.conf]\n")
    untrusted = [w for w in evaluate if not w.startswith(("hydra.searchpath", "hydra.run.dir"))]
    refused = run(command("eval.py", *untrusted, f"hydra.run.dir={work / 'eval2'}"), env)
    assert refused.returncode == 2
    last = (refused.stdout + refused.stderr).strip().splitlines()[-1]
    assert "which no config on the search path names" in last and "my_lab." in last
    assert not (work / "eval2").exists()

    # The tutorial's sweep over the lab's own setting, compared with machina.compare.
    sweep_dir = work / "sweep"
    sweep = doc_command(
        "python train.py -m", **sizes, **{"trainer.total_timesteps": "1024", "hydra.sweep.dir": sweep_dir}
    )
    swept = run(command("train.py", *sweep), env)
    assert swept.returncode == 0, swept.stderr[-3000:]
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.jsonl").is_file())
    assert len(jobs) == 2
    assert [rows(job)[-1]["metric/agent_step"] for job in jobs] == [1024, 1024]
    assert doc_command("python -m machina.compare") == ["machina.compare", "outputs/walk_sweep"]
    assert compare.main([str(sweep_dir), "--json"]) == 0

    # The lab's own tests: the conformance kit over its four parts and a round trip of a run made of them.
    lab_tests = [sys.executable, "-m", *doc_command("python -m pytest"), "-p", "no:cacheprovider"]
    checked = subprocess.run(lab_tests, cwd=work.parent / "src", env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "5 passed" in checked.stdout

    # Nothing of machina's changed.
    assert machina_files == {p: p.stat().st_mtime_ns for p in machina_files}


def test_the_lab_s_group_options_pass_the_command_line_check_only_on_its_search_path(lab, tmp_path):
    """train.py's check of the command line (machina.startup.preflight) lists group options on the search path in
    force: the lab's options are found with it and refused, with the options there are, without it."""
    from machina.errors import ConfigError
    from machina.startup import preflight

    work, env = lab
    sys.path.insert(0, str(tmp_path / "src"))
    try:
        folder = f"hydra.run.dir={work / 'checked'}"
        options = doc_command("python train.py hydra", **{"hydra.run.dir": work / "checked"})
        argv = preflight.check([*options, "losses.follow_hint.coef=0.3"], ROOT / "conf")
        assert SEARCH_PATH in argv
        with pytest.raises(ConfigError, match="'walk' is not an option of group env"):
            preflight.check(["env=walk", folder], ROOT / "conf")
        with pytest.raises(ConfigError, match="no key 'losses.follow_hint.coeff'"):
            preflight.check([*options, "losses.follow_hint.coeff=0.3"], ROOT / "conf")
    finally:
        sys.path.remove(str(tmp_path / "src"))
        sys.modules.pop("my_lab", None)
        sys.modules.pop("my_lab.conf", None)
