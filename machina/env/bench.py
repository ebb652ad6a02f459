"""Env-only throughput of Machina1Env: agent-steps per second for several num_envs, with and without the teacher.

    python -m machina.env.bench                       # human table, cpu, num_envs 64 256 1024 4096
    python -m machina.env.bench --json --num-envs 1024 --steps 200
    python -m machina.env.bench --device cuda

Actions are random ids drawn on the device before timing (a pool of batches reused round-robin), so drawing them
costs nothing in the timed loop. Each configuration runs ``--warmup`` steps, then ``--repeats`` rounds of
``--steps`` timed steps; ``agent_steps_per_s`` is the best round (the least disturbed by other processes on a shared
machine) and ``agent_steps_per_s_median`` the median round. On an accelerator each round brackets a synchronize.
"""

import argparse
import json
import statistics
import time

import torch

from machina.env.machina_1 import Machina1Env

POOL = 16  # random action batches, cycled


def measure(num_envs: int, teacher: bool, steps: int, repeats: int, warmup: int, device: str, seed: int) -> dict:
    """Time ``repeats`` rounds of ``steps`` env steps after ``warmup``; returns one result record."""
    env = Machina1Env(num_envs=num_envs, teacher=teacher, device=device, seed=seed)
    gen = torch.Generator(env.device).manual_seed(seed)
    pool = torch.randint(0, env.num_actions, (POOL, env.num_agents), generator=gen, device=env.device)
    env.reset()
    for i in range(warmup):
        env.step(pool[i % POOL])
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    rounds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024, 4096], help="envs per run")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per round")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per configuration (best is reported)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--teacher", choices=["both", "on", "off"], default="both", help="teacher_actions modes")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 keeps the default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration per line")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.teacher]
    if not args.json:
        header = f"{'num_envs':>8} {'agents':>7} {'teacher':>7} {'agent-steps/s':>14} {'median':>10} {'ms/step':>8}"
        print(header + "  device")
    for num_envs in args.num_envs:
        for teacher in modes:
            r = measure(num_envs, teacher, args.steps, args.repeats, args.warmup, args.device, args.seed)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(
                    f"{r['num_envs']:>8} {r['num_agents']:>7} {str(r['teacher']):>7} {r['agent_steps_per_s']:>14,.0f} "
                    f"{r['agent_steps_per_s_median']:>10,.0f} {r['ms_per_step']:>8.2f}  {r['device']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
