"""env.workers / env.overlap of the MettaGrid env: worker processes give the same numbers as stepping in-process, a
worker that dies or fails ends a step with EnvFailed (never a hang), no worker outlives close() or its parent, and
settings the env cannot run are refused in one line naming them."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from machina import keys
from machina.errors import ConfigError, EnvFailed

pytest.importorskip("mettagrid")

from machina.env.mettagrid import MettaGridEnv  # noqa: E402
from machina.env.mettagrid import sims as mettagrid_sims  # noqa: E402 (needs the extra)
from machina.env.mettagrid import workers as mettagrid_workers  # noqa: E402

STATS = {"hearts_made": "heart.made", "resources_gathered": "ore.mined"}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextmanager
def deadline(seconds: int):
    """Fail the test instead of hanging: SIGALRM raises in the main thread, even inside a blocking wait."""

    def expire(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def trajectory(env: MettaGridEnv, steps: int, actions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every output of ``steps`` steps with ``actions`` [steps, N], the final observation where truncated, and the
    episode stats, stacked. An env of two groups is stepped as the overlapped rollout does: both groups in flight,
    each received in turn and sent its next actions at once."""
    rows: dict[str, list] = {"first": [env.reset()[keys.OBS]]}
    size = env.num_agents // env.groups
    groups = [slice(g * size, (g + 1) * size) for g in range(env.groups)]
    if env.groups > 1:
        for g, agents in enumerate(groups):
            env.send(g, actions[0, agents])
    for t in range(steps):
        if env.groups == 1:
            parts = [env.step(actions[t])]
        else:
            parts = []
            for g, agents in enumerate(groups):
                parts.append(env.recv(g))
                if t + 1 < steps:
                    env.send(g, actions[t + 1, agents])
        for key in (keys.OBS, keys.REWARDS, keys.TERMINATED, keys.TRUNCATED):
            rows.setdefault(key, []).append(torch.cat([p[key] for p in parts]))
        rows.setdefault("final", []).append(torch.cat([p.get(keys.FINAL_OBS, p[keys.OBS]) for p in parts]))
    out = {key: torch.stack(values) for key, values in rows.items()}
    out.update({f"stat/{k}": v for k, v in env.episode_stats().items()})
    out.update({f"last/{k}": v for k, v in env.last_episodes().items()})
    return out


@pytest.mark.parametrize("workers, overlap", [(1, False), (2, False), (1, True), (2, True)])
def test_workers_and_overlap_step_exactly_as_this_process_does(workers, overlap):
    settings = {"num_envs": 6, "seed": 7, "stats": STATS, "max_steps": 12}
    steps = 40  # three and more episodes per env, staggered first ones included
    local = MettaGridEnv(**settings)
    actions = torch.randint(
        0, local.spec.num_actions, (steps, local.num_agents), generator=torch.Generator().manual_seed(3)
    )
    expected = trajectory(local, steps, actions)
    assert (
        expected["stat/episodes"] >= 18 and expected[keys.TRUNCATED].any() and expected["stat/resources_gathered"] > 0
    )
    env = MettaGridEnv(**settings, workers=workers, overlap=overlap)
    try:
        assert len(env.worker_pids) == workers and env.groups == (2 if overlap else 1)
        with deadline(60):
            got = trajectory(env, steps, actions)
    finally:
        env.close()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_groups_are_received_in_the_order_sent_and_a_step_waits_for_none():
    env = MettaGridEnv(num_envs=4, workers=1, overlap=True, seed=0)
    try:
        noop = torch.zeros(env.num_agents // 2, dtype=torch.int64)
        env.send(1, noop)
        env.send(0, noop)
        with pytest.raises(ValueError, match=r"send\(0\): group 0 is in flight"):
            env.send(0, noop)
        with pytest.raises(ValueError, match=r"the groups in flight, oldest first, are \[1, 0\]"):
            env.recv(0)
        with pytest.raises(ValueError, match=r"step while groups \[1, 0\] are sent"):
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        with deadline(30):
            assert env.recv(1).batch_size == (env.num_agents // 2,) and env.recv(0).batch_size == (env.num_agents // 2,)
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
    finally:
        env.close()


def test_a_restored_env_restarts_the_same_episodes_with_workers_as_without():
    settings = {"num_envs": 4, "seed": 2, "stats": STATS, "max_steps": 8}
    local, env = MettaGridEnv(**settings), MettaGridEnv(**settings, workers=2, overlap=True)
    try:
        actions = torch.randint(
            0, local.spec.num_actions, (20, local.num_agents), generator=torch.Generator().manual_seed(0)
        )
        trajectory(local, 20, actions)
        state = local.state_dict()
        env.load_state_dict(state)
        local.load_state_dict(state)
        assert torch.equal(env.observe()[keys.OBS], local.observe()[keys.OBS])
        assert torch.equal(env.state_dict()["episode"], local.state_dict()["episode"])
    finally:
        env.close()


def test_a_worker_killed_mid_run_ends_the_step_with_env_failed():
    env = MettaGridEnv(num_envs=4, workers=2, overlap=True, seed=0)
    try:
        n = env.num_agents // 2
        noop = torch.zeros(n, dtype=torch.int64)
        for _ in range(3):
            env.send(0, noop)
            env.recv(0)
        os.kill(env.worker_pids[1], signal.SIGSTOP)  # so that it cannot answer the step before it dies
        env.send(0, noop)  # group 0 in flight: both workers step their part of it
        os.kill(env.worker_pids[1], signal.SIGKILL)
        start = time.monotonic()
        with deadline(10), pytest.raises(EnvFailed) as failed:
            env.recv(0)
        assert time.monotonic() - start < 3
        message = str(failed.value)
        assert f"worker 2 of 2 (pid {env.worker_pids[1]})" in message and "signal SIGKILL" in message
        assert "\n" not in message
        with deadline(10), pytest.raises(EnvFailed, match="worker 2 of 2"):  # the env stays failed
            env.step(torch.zeros(2 * n, dtype=torch.int64))
    finally:
        env.close()
    assert not any(alive(pid) for pid in env.worker_pids)


def test_a_step_sent_to_a_worker_that_died_between_steps_raises_env_failed():
    env = MettaGridEnv(num_envs=2, workers=1, seed=0)
    try:
        os.kill(env.worker_pids[0], signal.SIGKILL)
        time.sleep(0.2)
        with deadline(10), pytest.raises(EnvFailed, match=r"worker 1 of 1 .* died \(signal SIGKILL\)"):
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
    finally:
        env.close()


def test_an_engine_that_raises_in_a_worker_is_reported_in_one_line():
    layout = mettagrid_sims.batch_layout(4, 8, 1, 0)
    buffer = mettagrid_workers.shared_buffer(mettagrid_sims.buffer_size(layout))
    workers = mettagrid_workers.Workers(1, 1, buffer, layout, None, 1, 0, True, ())  # no game: building fails
    try:
        workers.start(mettagrid_sims.START_ALL, mettagrid_sims.ALL_GROUPS)
        with deadline(30), pytest.raises(EnvFailed, match="worker 1 of 1 .* its engine raised AttributeError: ") as err:
            workers.finish()
        assert "\n" not in str(err.value)
    finally:
        workers.close()


def test_workers_ignore_ctrl_c_and_close_leaves_no_process():
    env = MettaGridEnv(num_envs=4, workers=2, seed=0)
    pids = env.worker_pids
    os.kill(pids[0], signal.SIGINT)  # the trainer, not the worker, decides what a Ctrl-C stops
    with deadline(30):
        env.step(torch.zeros(env.num_agents, dtype=torch.int64))
    env.close()
    env.close()  # idempotent
    assert not any(alive(pid) for pid in pids)
    collected = MettaGridEnv(num_envs=2, workers=1, seed=0)
    pid = collected.worker_pids[0]
    del collected
    gc.collect()  # an env dropped without close() (an exception path) stops its workers too
    assert not alive(pid)


# A new interpreter and two workers each (about 7 s on 2 cores); the fast tier stops workers through close() above.
@pytest.mark.slow
@pytest.mark.parametrize("ending", ["returns", "is killed"])
def test_no_worker_outlives_its_parent(ending):
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from machina.env.mettagrid import MettaGridEnv
        if __name__ == "__main__":
            env = MettaGridEnv(num_envs=4, workers=2, seed=0)
            env.step(torch.zeros(env.num_agents, dtype=torch.int64))
            print(*env.worker_pids, flush=True)
            if {ending == "is killed"}:
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2, result.stderr[-2000:]
    give_up = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < give_up:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"workers": -1}, "env.workers=-1"),
        ({"workers": "many"}, "env.workers='many'"),
        ({"workers": True}, "env.workers=True"),
        ({"overlap": True}, "env.overlap=true needs env.workers"),
        ({"overlap": "yes", "workers": 1}, "env.overlap='yes'"),
        ({"stats": {"return": "heart.made"}}, "env.stats.return="),
        ({"max_steps": 0}, "env.max_steps=0"),
    ],
)
def test_settings_the_env_cannot_run_are_refused_in_one_line(settings, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("(", r"\(")) as err:
        MettaGridEnv(**{"num_envs": 4, **settings})
    assert "\n" not in str(err.value)


def test_an_odd_number_of_envs_steps_as_one_group_with_overlap():
    """Evaluation builds one env for a replay from the run's settings: overlap cannot split it, so it steps whole."""
    env = MettaGridEnv(num_envs=3, workers=1, overlap=True)
    try:
        assert env.groups == 1
        out = env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        assert out[keys.OBS].shape == (env.num_agents, env.spec.obs.max_tokens, 3)
    finally:
        env.close()


def test_auto_and_more_workers_than_envs_are_capped():
    assert mettagrid_workers.worker_count("auto", 64, cores=16) == 15
    assert mettagrid_workers.worker_count("auto", 64, cores=1) == 1
    assert mettagrid_workers.worker_count("auto", 4, cores=16) == 4
    assert mettagrid_workers.worker_count(8, 3, cores=2) == 3  # at most one worker per env of a group
    # Each worker holds a contiguous part of each group, so every worker steps whichever group is sent.
    parts = mettagrid_workers.group_parts(10, 2, 2)
    assert parts == [[range(0, 2), range(5, 7)], [range(2, 5), range(7, 10)]]
