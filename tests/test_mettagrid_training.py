"""Training on MettaGrid with worker processes: a worker killed mid-epoch ends the run with one line and a checkpoint
of the last finished epoch, and the run resumes; Ctrl-C stops after the epoch and leaves no worker behind; the same
seed trains the same numbers with one worker or two."""

import json
import os
import signal

import pytest

from machina.run import train
from machina.training.checkpoint import load_checkpoint
from tests.commands import run_script
from tests.conftest import compose_config
from tests.test_checkpoint import reporting
from tests.test_eval import run_eval
from tests.test_mettagrid_workers import alive

pytest.importorskip("mettagrid")

from machina.env.mettagrid import MettaGridEnv  # noqa: E402 (needs the extra)
from machina.env.mettagrid.game import arena_config, write_game  # noqa: E402

EPOCH = 1024  # debug=tiny: 8 envs x 4 agents x 32 steps
STEPS = 32 * 2  # recv calls per epoch: 32 steps, two groups
TINY = [
    "env=mettagrid_arena",
    "debug=tiny",
    "env.num_envs=8",
    "env.overlap=true",
    "policy=fast",
    "system.torch_deterministic=true",
    "trainer.checkpoint_interval=0",
    "wandb=disabled",
]


def run(run_dir, *overrides, epochs=3):
    return train(compose_config([*TINY, f"trainer.total_timesteps={epochs * EPOCH}", *overrides]), run_dir)


def run_reporting(run_dir, *overrides, epochs=3) -> tuple[int, str]:
    return reporting(lambda: run(run_dir, *overrides, epochs=epochs))


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and "sps" not in k} for r in rows]


@pytest.fixture
def on_recv(monkeypatch):
    """``on_recv(n, act)``: call ``act(env)`` before the env's ``n``-th ``recv`` (counted over the whole test);
    returns the list of worker pids seen."""
    recv, calls, pids = MettaGridEnv.recv, [], []

    def install(n, act):
        def counting_recv(self, group):
            calls.append(group)
            pids.extend(p for p in self.worker_pids if p not in pids)
            if len(calls) == n:
                act(self)
            return recv(self, group)

        monkeypatch.setattr(MettaGridEnv, "recv", counting_recv)
        return pids

    return install


def test_a_killed_worker_ends_the_run_with_a_checkpoint_and_the_run_resumes(tmp_path, on_recv):
    pids = on_recv(STEPS + 9, lambda env: os.kill(env.worker_pids[0], signal.SIGKILL))  # in epoch 2
    code, message = run_reporting(tmp_path, "env.workers=1")
    assert code == 2
    assert "worker 1 of 1" in message and "died (signal SIGKILL)" in message and "stopped in epoch 2" in message
    assert "checkpoint_000001.pt" in message and "resumes" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == ["checkpoint_000001.pt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "checkpoint_000001.pt")["trainer"]["epoch"] == 1
    assert pids and not any(alive(p) for p in pids)

    run(tmp_path, "env.workers=1")  # the same folder: resumes at epoch 2 and finishes
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == [1, 2, 3]


def test_ctrl_c_stops_after_the_epoch_and_leaves_no_worker(tmp_path, on_recv):
    pids = on_recv(5, lambda env: signal.raise_signal(signal.SIGINT))  # in epoch 1
    code, message = run_reporting(tmp_path, "env.workers=2")
    assert code == 128 + signal.SIGINT and "stopped by SIGINT after epoch 1" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == ["checkpoint_000001.pt"]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_the_same_seed_trains_the_same_numbers_with_one_worker_or_two(tmp_path):
    run(tmp_path / "one", "env.workers=1", epochs=2)
    run(tmp_path / "two", "env.workers=2", epochs=2)
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(one) == 2 and one == two


@pytest.mark.slow  # a worker process and two evaluations
def test_a_run_on_a_game_file_is_evaluated_on_that_game_even_once_the_file_is_gone(tmp_path):
    game = write_game(arena_config(agents_per_env=2, mines=6), tmp_path / "my_arena.yaml")
    run_dir = tmp_path / "run"
    run(run_dir, f"env.game={game}", "env.workers=1", epochs=1)
    args = [f"checkpoint={run_dir}", "episodes=4", "replay=false"]  # MettaGrid does not draw
    done = run_eval([*args, f"hydra.run.dir={tmp_path / 'eval1'}"], cwd=tmp_path)
    table = done.stdout + done.stderr
    assert "hearts_made" in table and "resources_gathered" in table and "policy" in table and "random" in table
    assert "the game it kept (sha256" in table

    game.unlink()  # the run keeps its game: the same evaluation, the same numbers
    gone = run_eval([*args, f"hydra.run.dir={tmp_path / 'eval2'}"], cwd=tmp_path)
    first, second = (json.loads((tmp_path / name / "eval.json").read_text()) for name in ("eval1", "eval2"))
    assert gone.returncode == 0 and first["policy"] == second["policy"] and first["random"] == second["random"]


def test_a_refused_game_file_stops_train_py_before_anything_is_written(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("game:\n  map_builder: {type: os.system, command: touch pwned}\n")
    run_dir = tmp_path / "run"
    done = run_script(
        "train.py", "env=mettagrid", f"env.game={evil}", f"hydra.run.dir={run_dir}", "wandb=disabled", cwd=tmp_path
    )
    assert done.returncode == 2
    refusal = "game.map_builder.type='os.system' is not one of MettaGrid's map builders or scenes"
    assert refusal in done.stdout + done.stderr
    assert not run_dir.exists() and not (tmp_path / "pwned").exists()
