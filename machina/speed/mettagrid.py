"""Env-only throughput of MettaGridEnv (the mettagrid extra): agent-steps per second per worker count, with and
without overlap, random actions from a fixed seed.

    python -m machina.bench mettagrid                                  # workers 0 1 2, 64 envs, arena
    python -m machina.bench mettagrid --workers 1 2 4 8 16 --overlap --envs 512 --json
    python -m machina.bench mettagrid --game path/to/game.yaml --steps 100

``--overlap`` measures each worker count >= 1 a second time with ``env.overlap=true``: both groups in flight, each
received and sent its next actions in turn with no policy between (what the overlapped rollout does, minus the
policy), so it shows the cost of stepping in two halves; the gain comes end to end, where the policy acts on one
group while the workers step the other (``python -m machina.bench env=mettagrid_arena env.workers=N
env.overlap=true``). Each configuration runs ``--warmup`` steps, then ``--repeats`` rounds of ``--steps`` timed
steps; ``agent_steps_per_s`` is the best round, ``agent_steps_per_s_median`` the median one; ``start_s`` is the
time to build the env (workers started, every env's first map built).
"""

import argparse
import json
import statistics
import time

import torch

from machina.speed import machine

POOL = 16  # random action batches, cycled


def measure(game: str, num_envs: int, workers: int, overlap: bool, steps: int, repeats: int, warmup: int, seed: int):
    """Time ``repeats`` rounds of ``steps`` env steps after ``warmup``; returns one result record."""
    from machina.env.mettagrid import MettaGridEnv

    start = time.perf_counter()
    env = MettaGridEnv(game=game, num_envs=num_envs, workers=workers, overlap=overlap, seed=seed)
    start_s = time.perf_counter() - start
    try:
        gen = torch.Generator().manual_seed(seed)
        pool = torch.randint(0, env.spec.num_actions, (POOL, env.num_agents), generator=gen)
        step = overlapped(env, pool) if overlap else (lambda i: env.step(pool[i % POOL]))
        for i in range(warmup):
            step(i)
        rounds = []
        for _ in range(repeats):
            begin = time.perf_counter()
            for i in range(steps):
                step(i)
            rounds.append(time.perf_counter() - begin)
        if overlap:
            step(None)  # receive what is still in flight
    finally:
        env.close()
    best = min(rounds)
    return {
        "game": game,
        "num_envs": num_envs,
        "num_agents": env.num_agents,
        "teacher": False,
        "workers": workers,
        "processes": len(env.worker_pids),
        "overlap": overlap,
        "agent_steps_per_s": env.num_agents * steps / best,
        "agent_steps_per_s_median": env.num_agents * steps / statistics.median(rounds),
        "ms_per_step": 1e3 * best / steps,
        "steps_timed": steps * repeats,
        "start_s": start_s,
    }


def overlapped(env, pool: torch.Tensor):
    """``step(i)``: receive each group's step and send its next actions at once (both groups stay in flight);
    ``step(None)`` receives the last ones."""
    size = env.num_agents // env.groups
    groups = [slice(g * size, (g + 1) * size) for g in range(env.groups)]
    for g, agents in enumerate(groups):
        env.send(g, pool[0, agents])

    def step(i: int | None) -> None:
        for g, agents in enumerate(groups):
            env.recv(g)
            if i is not None:
                env.send(g, pool[(i + 1) % POOL, agents])

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="worker counts (0: in-process)")
    parser.add_argument("--overlap", action="store_true", help="also measure each worker count >= 1 with overlap")
    parser.add_argument("--envs", type=int, default=64, help="num_envs")
    parser.add_argument("--game", default="arena", help="a shipped game's name or a game file (env.game)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per round")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per configuration (best is reported)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration per line")
    args = parser.parse_args(argv)
    machine.announce()
    configs = [(w, False) for w in args.workers]
    configs += [(w, True) for w in args.workers if args.overlap and w >= 1]
    header = f"{'workers':>7} {'processes':>9} {'overlap':>7} {'agents':>7} {'agent-steps/s':>14} {'median':>10} "
    header += f"{'ms/step':>8} {'start s':>8}"
    row = "{workers:>7} {processes:>9} {overlap!s:>7} {num_agents:>7} {agent_steps_per_s:>14,.0f} "
    row += "{agent_steps_per_s_median:>10,.0f} {ms_per_step:>8.2f} {start_s:>8.2f}"
    if not args.json:
        print(header)
    for workers, overlap in configs:
        r = measure(args.game, args.envs, workers, overlap, args.steps, args.repeats, args.warmup, args.seed)
        print(json.dumps(r) if args.json else row.format(**r), flush=True)
