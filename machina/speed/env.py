"""Env-only throughput of Machina1Env: agent-steps per second for several num_envs, with and without the teacher; and
(``--ops``) the cost of one ``env.step`` in aten ops, host microseconds and host reads.

    python -m machina.bench env                       # human table, cpu, num_envs 64 256 1024 4096
    python -m machina.bench env --json --num-envs 1024 --steps 200
    python -m machina.bench env --device cuda
    python -m machina.bench env --ops                 # aten ops / host us / host reads per step at 4 envs

Actions are random ids drawn on the device before timing (a pool of batches reused round-robin), so drawing them
costs nothing in the timed loop. Each configuration runs ``--warmup`` steps, then ``--repeats`` rounds of
``--steps`` timed steps, each round starting with ``env.prepare_rollout()`` (the pool refill the trainer makes
before every rollout, counted in the round's time); ``agent_steps_per_s`` is the best round (the least disturbed by
other processes on a shared machine) and ``agent_steps_per_s_median`` the median round. On an accelerator each
round brackets a synchronize.

``--ops`` counts every aten op that ``torch.profiler`` records during ``--steps`` steps (nested ops included: on an
accelerator each one is at most a kernel launch and at least host work), the host time per step, single-threaded,
and Python-level host reads of tensors (``count_host_reads``). Op and read counts do not depend on machine load.
"""

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.speed import machine
from machina.speed.host_reads import count_host_reads

POOL = 16  # random action batches, cycled


def teacher_outputs(teacher: bool) -> frozenset[str]:
    """The optional env outputs to ask for: the teacher's actions, or none."""
    return frozenset({keys.TEACHER_ACTIONS}) if teacher else frozenset()


def measure(num_envs: int, teacher: bool, steps: int, repeats: int, warmup: int, device: str, seed: int) -> dict:
    """Time ``repeats`` rounds of ``steps`` env steps after ``warmup``; returns one result record."""
    env = Machina1Env(num_envs=num_envs, outputs=teacher_outputs(teacher), device=device, seed=seed)
    pool = action_pool(env, seed)
    for i in range(warmup):
        env.step(pool[i % POOL])
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    rounds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        env.prepare_rollout()
        for i in range(steps):
            env.step(pool[i % POOL])
        sync()
        rounds.append(time.perf_counter() - start)
    best = min(rounds)
    return {
        "num_envs": num_envs,
        "num_agents": env.num_agents,
        "teacher": teacher,
        "agent_steps_per_s": env.num_agents * steps / best,
        "agent_steps_per_s_median": env.num_agents * steps / statistics.median(rounds),
        "ms_per_step": 1e3 * best / steps,
        "steps_timed": steps * repeats,
        "device": str(env.device),
        "threads": torch.get_num_threads(),
    }


def op_counts(teacher: bool, num_envs: int = 4, steps: int = 20, device: str = "cpu", seed: int = 0) -> dict:
    """aten ops, host microseconds and host reads per ``env.step`` of the default env (after 10 warmup steps)."""
    env = Machina1Env(num_envs=num_envs, outputs=teacher_outputs(teacher), device=device, seed=seed)
    pool = action_pool(env, seed).unbind(0)  # indexing the pool inside the profile would count as ops too
    for i in range(10):
        env.step(pool[i % POOL])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            env.step(pool[i % POOL])
    ops = sum(1 for event in prof.events() if event.name.startswith("aten::"))
    reads: list[str] = []
    with count_host_reads(reads):
        for i in range(steps):
            env.step(pool[i % POOL])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        for i in range(10 * steps):
            env.step(pool[i % POOL])
        host_s = (time.perf_counter() - start) / (10 * steps)
    finally:
        torch.set_num_threads(threads)
    return {
        "num_envs": num_envs,
        "teacher": teacher,
        "aten_ops_per_step": ops / steps,
        "host_us_per_step": 1e6 * host_s,
        "host_reads_per_step": len(reads) / steps,
        "agent_steps_per_s": env.num_agents / host_s,
        "device": str(env.device),
    }


def action_pool(env: Machina1Env, seed: int) -> torch.Tensor:
    gen = torch.Generator(env.device).manual_seed(seed)
    return torch.randint(0, env.num_actions, (POOL, env.num_agents), generator=gen, device=env.device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=None, help="envs per run (--ops: 4)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per round (--ops: profiled steps)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per configuration (best is reported)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--teacher", choices=["both", "on", "off"], default="both", help="teacher_actions modes")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 keeps the default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", action="store_true", help="aten ops, host us and host reads per step")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration per line")
    args = parser.parse_args(argv)
    machine.announce()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.teacher]
    if args.ops:
        results = (
            op_counts(teacher, num_envs, min(args.steps, 20), args.device, args.seed)
            for num_envs in args.num_envs or [4]
            for teacher in modes
        )
        header = f"{'num_envs':>8} {'teacher':>7} {'aten ops/step':>14} {'host us/step':>13} {'host reads/step':>16}"
        row = "{num_envs:>8} {teacher!s:>7} {aten_ops_per_step:>14.1f} {host_us_per_step:>13.0f} "
        row += "{host_reads_per_step:>16.1f}  {device}"
    else:
        results = (
            measure(num_envs, teacher, args.steps, args.repeats, args.warmup, args.device, args.seed)
            for num_envs in args.num_envs or [64, 256, 1024, 4096]
            for teacher in modes
        )
        header = f"{'num_envs':>8} {'agents':>7} {'teacher':>7} {'agent-steps/s':>14} {'median':>10} {'ms/step':>8}"
        row = "{num_envs:>8} {num_agents:>7} {teacher!s:>7} {agent_steps_per_s:>14,.0f} "
        row += "{agent_steps_per_s_median:>10,.0f} {ms_per_step:>8.2f}  {device}"
    if not args.json:
        print(header + "  device")
    for r in results:
        print(json.dumps(r) if args.json else row.format(**r), flush=True)
