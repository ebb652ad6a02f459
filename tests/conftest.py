"""Shared fixtures: Hydra composition of the real conf/, and an environment that keeps W&B off the network; and a
line for each slow test as it starts and ends, so a long quiet stretch of the progress dots shows what runs."""

import os
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from machina.precision import set_matmul_precision
from machina.startup import resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# No test may reach the network: W&B is offline unless a test disables it, and never has a key.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)

resolvers.register()


@pytest.fixture(autouse=True)
def float32_products_between_tests():
    """A test (or a module's fixture) that builds a run applies its system.* flags to the whole process: the main
    job's bf16 products would then carry over into another test's comparisons with a definition. Every test starts
    and ends with torch's own setting, full float32; one that builds a run gets the run's setting until it ends."""
    set_matmul_precision(bf16=False, tf32=False)
    yield
    set_matmul_precision(bf16=False, tf32=False)


def compose_config(overrides=(), return_hydra_config: bool = False):
    """Compose conf/config.yaml with command-line style overrides, as train.py would."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="test"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)


@pytest.fixture
def wandb_dirs(tmp_path, monkeypatch):
    """Point every W&B directory at the test's tmp folder."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    return tmp_path


def sampled(cases, every: int = 3) -> list:
    """A long list of fuzz cases for ``pytest.mark.parametrize``: the fast tier (``-m "not slow"``) runs every
    ``every``-th of them, spread over the list; the full suite runs them all. A case is one value or a tuple of the
    argument values."""
    return [
        case
        if i % every == 0
        else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
        for i, case in enumerate(cases)
    ]


def run_train(args, cwd=ROOT, timeout=600, env_extra=None):
    """Run ``python train.py ARGS`` in a subprocess; return the CompletedProcess."""
    import subprocess

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def interrupt_train(args, ready, cwd=ROOT, signals=1, inherit_ignored=False, timeout=300):
    """Start ``python train.py ARGS``, wait until ``ready()`` is true, send it SIGINT ``signals`` times (0.3 s
    apart), and return ``(exit code, output, the printed resume command or None)``. ``inherit_ignored`` starts it
    with SIGINT ignored, as a background job of a non-interactive shell is."""
    import re
    import signal
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if inherit_ignored else None,
    )
    deadline = time.time() + timeout
    try:
        while not ready():
            assert proc.poll() is None and time.time() < deadline, "the run ended or took too long before it was ready"
            time.sleep(0.05)
        for i in range(signals):
            time.sleep(0.3 if i else 0)
            proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=timeout)
    finally:  # a failed wait leaves no run behind (with SIGINT ignored, nothing else would stop it)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    command = re.search(r"to resume: (.*)", output)
    return proc.returncode, output, command.group(1) if command else None


class SlowTestLines:
    """A line when a test marked slow starts, and one with its outcome and duration when it ends: the slow tests
    (trainings in subprocesses, sweeps, torchrun) take minutes on a busy machine, in which the dots stand still."""

    def __init__(self, terminal):
        self.terminal = terminal
        self.outcome: dict[str, str] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if not item.get_closest_marker("slow"):
            yield
            return
        self._line(f"[slow] {item.nodeid} ...")
        start = time.perf_counter()
        yield
        outcome = self.outcome.pop(item.nodeid, "passed")
        self._line(f"[slow] {item.nodeid} {outcome} in {time.perf_counter() - start:.0f}s")

    def pytest_runtest_logreport(self, report):
        if report.failed or (report.skipped and report.when != "teardown"):
            self.outcome.setdefault(report.nodeid, report.outcome)

    def _line(self, text: str) -> None:
        if self.terminal._tw.width_of_current_line:  # after progress dots (-q), start a line of our own
            self.terminal.write("\n")
        self.terminal.write_line(text)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        config.pluginmanager.register(SlowTestLines(terminal), "slow-test-lines")
