"""Shared fixtures: Hydra composition of the real conf/, and an environment that keeps W&B off the network."""

import os
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from machina import resolvers

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# No test may reach the network: W&B is offline unless a test disables it, and never has a key.
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)

resolvers.register()


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
