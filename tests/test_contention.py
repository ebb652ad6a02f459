"""torch's threads on a shared machine (machina.startup.threads, System): the thread count from the cores, the jobs
running at once and the other processes' load; the OpenMP wait policy set before torch loads; the user's own
settings winning over both."""

import os
import subprocess
import sys
import time

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

from machina.startup import resolvers, threads
from machina.startup.system import System
from tests.conftest import ROOT, run_train


@pytest.fixture(autouse=True)
def threads_kept():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_threads_are_the_share_less_the_cores_others_keep_busy():
    assert threads.threads_for(cores=2, share=2, others_busy=0.0) == 2  # quiet: every core
    assert threads.threads_for(cores=2, share=2, others_busy=0.3) == 2  # a light background load keeps both
    assert threads.threads_for(cores=2, share=2, others_busy=0.5) == 1  # half a core busy or more costs one
    assert threads.threads_for(cores=2, share=2, others_busy=1.0) == 1  # one busy process
    assert threads.threads_for(cores=2, share=2, others_busy=2.0) == 1  # never below one
    assert threads.threads_for(cores=8, share=4, others_busy=3.0) == 4  # 5 free cores: the share is the most
    assert threads.threads_for(cores=8, share=4, others_busy=6.0) == 2


def test_parallel_jobs_divide_the_cores():
    assert threads.jobs_at_once(n_jobs=None, local_ranks=1, cores=2) == 1  # a single run
    assert threads.jobs_at_once(n_jobs=2, local_ranks=1, cores=2) == 2
    assert threads.jobs_at_once(n_jobs=-1, local_ranks=1, cores=16) == 16  # joblib's -1: as many jobs as cores
    assert threads.jobs_at_once(n_jobs=-2, local_ranks=1, cores=16) == 15  # -2: all cores but one
    assert threads.jobs_at_once(n_jobs=None, local_ranks=2, cores=8) == 2  # torchrun's local ranks
    assert threads.share(cores=2, jobs=2) == 1
    assert threads.share(cores=16, jobs=3) == 5
    assert threads.share(cores=2, jobs=4) == 1  # more jobs than cores: still one thread each
    assert threads.share(cores=8, jobs=1, omp_num_threads="3") == 3  # the user's OMP_NUM_THREADS is the most
    assert threads.share(cores=8, jobs=4, omp_num_threads="3") == 2
    assert threads.share(cores=8, jobs=1, omp_num_threads="many") == 8  # not a count: ignored, as OpenMP does


def fake_proc(root, pid, cpus: dict[int, tuple[int, ...]], own: int, child: int, waited: int = 0) -> None:
    """A /proc holding per-core times (user, nice, system, idle, iowait, irq, softirq, steal), this process's CPU
    ticks (utime + stime) and one live child's, whose ended children it waited for took ``waited`` ticks (cutime +
    cstime, as torch.compile's worker after running the C++ compiler)."""
    lines = ["cpu 0 0 0 0 0 0 0 0 0 0"] + [f"cpu{n} {' '.join(map(str, t))} 0 0" for n, t in cpus.items()]
    (root / "stat").write_text("\n".join(lines) + "\n")
    for p, ticks, ended, children in ((pid, own, 0, "4242"), (4242, child, waited, "")):
        (root / str(p) / "task" / str(p)).mkdir(parents=True, exist_ok=True)
        times = f"{ticks - 1} 1 {ended // 2} {ended - ended // 2}"
        (root / str(p) / "stat").write_text(f"{p} (py thon) S 1 " + "0 " * 9 + f"{times} 20 0\n")
        (root / str(p) / "task" / str(p) / "children").write_text(children)


def test_others_load_is_the_cores_busy_time_less_this_process_tree(tmp_path):
    tick, pid = os.sysconf("SC_CLK_TCK"), os.getpid()
    fake_proc(tmp_path, pid, {0: (0,) * 8, 1: (0,) * 8, 2: (0,) * 8}, own=0, child=0)
    load = threads.OthersLoad(proc=tmp_path, cpus={0, 1}, min_seconds=1.0)
    load.last = (load.last[0] - 2.0, *load.last[1:])  # the first reading, 2 s ago
    # In 2 s: core 0 was busy 2 s (user 1.5 s, system 0.5 s), core 1 0.5 s in irq/softirq/steal and 1 s at nice;
    # core 2 (not ours) 2 s; this process took 1 s and its child 0.5 s. Others: (2 + 0.5 - 1.5) / 2 s = 0.5 core.
    t = tick // 2
    fake_proc(
        tmp_path,
        pid,
        {0: (3 * t, 0, t, 0, 0, 0, 0, 0), 1: (0, 2 * t, 0, 0, 0, t // 2, t // 4, t // 4), 2: (4 * t,) + (0,) * 7},
        own=2 * t,
        child=t,
    )
    assert load.read(now=load.last[0] + 2.0) == pytest.approx(0.5, abs=0.02)
    assert load.read(now=load.last[0] + 0.5) is None  # too soon: the reading is kept for later
    kept = load.last
    (tmp_path / "stat").unlink()  # a call between two readings reads the clock only, never /proc
    assert load.read(now=load.last[0] + 0.5) is None and load.last == kept


def test_system_follows_the_others_load_down_and_back_up(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    system = System(device="cpu", threads="auto")
    system.apply_flags()
    assert torch.get_num_threads() == system.share == threads.cores()  # a single run: every core
    pid, quiet = os.getpid(), (0,) * 8
    fake_proc(tmp_path, pid, dict.fromkeys(range(system.cores), quiet), own=0, child=0)
    system.others = threads.OthersLoad(proc=tmp_path, cpus=set(range(system.cores)), min_seconds=0.0)
    # Every core fully busy with another process's work since the last reading: one thread.
    time.sleep(0.05)
    busy = (10**6,) + (0,) * 7  # far more than the time that passed: as busy as a reading can say
    fake_proc(tmp_path, pid, dict.fromkeys(range(system.cores), busy), own=0, child=0)
    system.adapt_threads()
    assert torch.get_num_threads() == 1
    time.sleep(0.05)  # nothing more: the machine is quiet again
    system.adapt_threads()
    assert torch.get_num_threads() == system.share


def test_between_epochs_a_count_set_by_a_benchmark_stays_while_the_load_does(tmp_path, monkeypatch):
    """``python -m machina.bench overhead`` measures a learner pass at one thread: the governor asked before each
    minibatch sets torch's threads only when its decision changes, not back to its share every time; the next
    epoch's call does set them back."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    system = System(device="cpu", threads="auto")
    system.apply_flags()
    pid, quiet = os.getpid(), (0,) * 8
    fake_proc(tmp_path, pid, dict.fromkeys(range(system.cores), quiet), own=0, child=0)
    system.others = threads.OthersLoad(proc=tmp_path, cpus=set(range(system.cores)), min_seconds=0.0)
    torch.set_num_threads(1)
    try:
        time.sleep(0.01)
        system.follow_load()  # a reading, the same decision (the machine is still quiet): the benchmark's count stays
        assert torch.get_num_threads() == 1 and system.decided == system.share
        system.adapt_threads()
        assert torch.get_num_threads() == system.share
    finally:
        torch.set_num_threads(system.share)


@pytest.mark.slow  # a real busy process for a second or more
def test_a_busy_process_beside_the_run_takes_a_thread_away():
    """A real busy loop, not a child of this process (a shell starts it and exits), pinned to one of our cores."""
    system = System(device="cpu", threads="auto")
    system.apply_flags()
    core = max(os.sched_getaffinity(0))
    started = subprocess.run(
        ["sh", "-c", f"taskset -c {core} {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    busy = int(started.stdout)
    try:
        time.sleep(1.5)  # OthersLoad reads over at least a second
        system.adapt_threads()
    finally:
        os.kill(busy, 9)
    assert torch.get_num_threads() <= max(1, system.share - 1)


def test_processes_of_this_tree_that_ended_are_not_counted_as_others(tmp_path):
    """A live child that ran processes to their end (torch.compile's worker runs the C++ compiler): their CPU time is
    this tree's own work, not another process's."""
    tick, pid = os.sysconf("SC_CLK_TCK"), os.getpid()
    fake_proc(tmp_path, pid, {0: (0,) * 8, 1: (0,) * 8}, own=0, child=0)
    load = threads.OthersLoad(proc=tmp_path, cpus={0, 1}, min_seconds=1.0)
    load.last = (load.last[0] - 2.0, *load.last[1:])
    # In 2 s both cores were busy; this process took 1 s, the child 0.5 s and the compilers it waited for 2.5 s.
    fake_proc(tmp_path, pid, {0: (2 * tick,) + (0,) * 7, 1: (2 * tick,) + (0,) * 7}, own=tick, child=tick // 2,
              waited=5 * tick // 2)  # fmt: skip
    assert load.read(now=load.last[0] + 2.0) == pytest.approx(0.0, abs=0.02)


def test_fixed_thread_counts_and_determinism_are_never_adapted():
    for system in (System(device="cpu", threads=1), System(device="cpu", threads=0)):
        assert system.others is None
    deterministic = System(device="cpu", threads="auto", torch_deterministic=True)
    assert deterministic.others is None  # a thread count can change a sum's order: exact reruns keep theirs


def test_a_compiled_run_moves_between_its_share_halved_so_that_each_count_compiles_once():
    """torch.compile guards its code on the thread count and compiles it again for each new count: a compiled run's
    counts are its share, half of it, a quarter, ... (at most log2(share) + 1 compilations)."""
    assert [threads.compiled_threads(16, decided) for decided in (16, 15, 8, 7, 4, 3, 1, 0)] == [
        16,
        8,
        8,
        4,
        4,
        2,
        1,
        1,
    ]
    assert [threads.compiled_threads(2, decided) for decided in (2, 1)] == [2, 1]  # 2 cores: what eager runs use
    assert threads.compiled_threads(6, 5) == 3 and threads.compiled_threads(6, 2) == 1


@pytest.mark.parametrize("compile", [False, True])
def test_with_5_of_16_cores_busy_an_eager_run_takes_11_threads_and_a_compiled_one_8(tmp_path, compile):
    system = System(device="cpu", threads="auto", compile=compile)
    system.cores = system.share = system.decided = 16  # a 16-core machine's decision, whatever this one has
    pid, cpus = os.getpid(), range(16)
    fake_proc(tmp_path, pid, dict.fromkeys(cpus, (0,) * 8), own=0, child=0)
    system.others = load = threads.OthersLoad(proc=tmp_path, cpus=set(cpus), min_seconds=1.0)
    load.last = (load.last[0] - 2.0, *load.last[1:])  # the first reading, 2 s ago
    busy = (2 * os.sysconf("SC_CLK_TCK"),) + (0,) * 7  # cores 0-4 busy for those 2 s
    fake_proc(tmp_path, pid, {n: busy if n < 5 else (0,) * 8 for n in cpus}, own=0, child=0)
    before = torch.get_num_threads()
    try:
        system.adapt_threads()
        assert system.decided == torch.get_num_threads() == (8 if compile else 11)
    finally:
        torch.set_num_threads(before)


def test_a_joblib_multirun_of_two_jobs_gives_each_its_half(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    resolvers.register()
    overrides = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.mode=MULTIRUN", "debug=tiny"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        system = instantiate(cfg.system, total_timesteps=1)
    finally:
        HydraConfig.instance().cfg = None
    assert system.share == max(1, threads.cores() // 2)


@pytest.mark.slow
def test_a_real_joblib_multirun_runs_each_job_on_its_share(tmp_path):
    """Two jobs at once on this machine's cores, though the user exported OMP_NUM_THREADS for more (joblib passes
    it on to its workers as it is)."""
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "debug=tiny", "trainer.total_timesteps=1024"]
    args += ["system.seed=1,2", "wandb=disabled", f"hydra.sweep.dir={tmp_path}"]
    result = run_train(args, env_extra={"OMP_NUM_THREADS": str(threads.cores()), "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    share = max(1, threads.cores() // 2)
    logs = [path.read_text() for path in sorted(tmp_path.glob("*/train.log"))]
    assert len(logs) == 2
    assert all(f"{share} torch threads (auto, {share} of {threads.cores()} cores)" in log for log in logs)


def libgomp_settings(script: str, env: dict[str, str]) -> str:
    """What libgomp read when torch loaded in ``python SCRIPT --cfg job`` (it prints its settings when asked)."""
    env = {k: v for k, v in os.environ.items() if k not in threads.WAIT_VARIABLES} | env
    result = subprocess.run(
        [sys.executable, str(ROOT / script), "--cfg", "job"],
        env={**env, "OMP_DISPLAY_ENV": "VERBOSE", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stderr


@pytest.mark.slow  # a train.py process
def test_the_users_wait_policy_reaches_libgomp():
    """machina leaves libgomp's wait to the user (a shorter spin cost about 4% of a quiet run's speed): what the
    environment says is what torch's OpenMP threads do."""
    read = libgomp_settings("train.py", {"OMP_WAIT_POLICY": "ACTIVE"})
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in read and "GOMP_SPINCOUNT = '30000000000'" in read  # libgomp's active


def test_the_contention_script_measures_libgomps_wait_unless_told_another(monkeypatch):
    from machina.speed import contention

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the measuring user's own: neither side inherits it
    for settings in ("before", "after"):
        assert not set(threads.WAIT_VARIABLES) & set(contention.environment(settings, None))
    assert not set(threads.WAIT_VARIABLES) & set(contention.environment("before", "OMP_WAIT_POLICY=PASSIVE"))
    tried = contention.environment("after", "OMP_WAIT_POLICY=PASSIVE")
    assert tried["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in tried
    with pytest.raises(SystemExit) as refused:
        contention.main(["--wait", "OMP_NUM_THREADS=1"])
    assert refused.value.code == 2
