"""Nothing hangs, nothing stays, and every seed works: a MettaGrid worker alive but not answering (stopped by
SIGSTOP, as a debugger stops it) ends the step with EnvFailed naming it, long before the 600 s reply timeout of a
start; a killed training process leaves no ``pymp-*`` folder; engine seeds fit MettaGrid's range for every seed, env
and episode machina accepts, and depend only on those three."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from machina import keys
from machina.errors import EnvFailed
from tests.conftest import ROOT
from tests.test_mettagrid_workers import deadline

pytest.importorskip("mettagrid")

from machina.env.mettagrid import MettaGridEnv  # noqa: E402 (needs the extra)
from machina.env.mettagrid.sims import SEED_RANGE, episode_seed  # noqa: E402

MAX_SEED = 2**32 - 1  # system.seed's bound


def test_a_stopped_worker_ends_the_step_with_one_line_naming_it():
    env = MettaGridEnv(game="arena", num_envs=4, workers=2, max_steps=20, seed=3)
    try:
        env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        stuck = env.worker_pids[1]
        os.kill(stuck, signal.SIGSTOP)
        with deadline(60), pytest.raises(EnvFailed) as err:  # 60 s: a hang guard, far below the old 600 s
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        message = str(err.value)
        assert message.startswith(f"MettaGrid env worker 2 of 2 (pid {stuck}) is stopped") and "\n" not in message
        with pytest.raises(EnvFailed, match="is stopped"):  # the env stays failed
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
    finally:
        for pid in env.worker_pids:
            os.kill(pid, signal.SIGCONT)
        env.close()
    assert all(not os.path.exists(f"/proc/{pid}") or _zombie(pid) for pid in env.worker_pids)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("seed", [0, 1, 33, 5000, MAX_SEED])
@pytest.mark.parametrize("env", [0, 63, 64, 10**6])
@pytest.mark.parametrize("episode", [0, 1, 10**6, 2**62 - 1])
def test_engine_seeds_fit_mettagrid_for_every_seed_env_and_episode(seed, env, episode):
    assert 0 <= episode_seed(seed, env, episode) < SEED_RANGE <= 2**31 - 1


def test_engine_seeds_differ_between_neighbouring_runs_envs_and_episodes():
    seeds = {episode_seed(s, e, k) for s in range(8) for e in range(64) for k in range(8)}
    assert len(seeds) == 8 * 64 * 8  # 4,096 draws from 2**31 values: a collision would be a bug, not chance


def test_the_largest_seed_trains_on_64_envs_and_an_env_plays_the_same_whatever_the_env_count():
    many = MettaGridEnv(game="arena", num_envs=64, workers=0, max_steps=5, seed=MAX_SEED, stagger=False)
    few = MettaGridEnv(game="arena", num_envs=2, workers=0, max_steps=5, seed=MAX_SEED, stagger=False)
    try:
        a = few.agents_per_env
        first_many, first_few = many.reset()[keys.OBS], few.reset()[keys.OBS]
        assert torch.equal(first_many[: 2 * a], first_few)
        for _ in range(12):  # past two episode ends: the seeds of episodes 1 and 2
            out_many = many.step(torch.ones(many.num_agents, dtype=torch.int64))
            out_few = few.step(torch.ones(few.num_agents, dtype=torch.int64))
            assert torch.equal(out_many[keys.OBS][: 2 * a], out_few[keys.OBS])
        assert many.state_dict()["episode"].min() >= 3
    finally:
        many.close()
        few.close()


def test_seed_5000_builds_the_env_that_overflowed_before():
    env = MettaGridEnv(game="arena", num_envs=2, workers=0, max_steps=5, seed=5000)
    try:
        assert env.step(torch.zeros(env.num_agents, dtype=torch.int64))[keys.OBS].shape[0] == env.num_agents
    finally:
        env.close()


@pytest.mark.slow  # a train.py subprocess
def test_a_killed_training_process_leaves_no_multiprocessing_folder(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = [sys.executable, str(ROOT / "train.py"), "env=mettagrid_arena", "debug=tiny", "env.num_envs=4",
               "env.workers=1", "policy=fast", "system.compile=false", "wandb=disabled",
               "trainer.total_timesteps=100000000", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    environment = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    with deadline(300):
        for line in proc.stdout:  # the workers step once the first epoch is logged
            if "epoch     1" in line:
                break
        assert [p.name for p in temp.iterdir() if p.name.startswith("pymp-")], "the forkserver's folder is made"
        proc.kill()
        proc.wait()
        while any(p.name.startswith("pymp-") for p in temp.iterdir()):  # the forkserver exits once the trainer is gone
            time.sleep(0.1)
    assert not [p.name for p in temp.iterdir() if p.name.startswith("pymp-")]
