"""``python -m machina.env.pettingzoo.bench``: agent steps per second of a PettingZoo env alone (its own
``parallel_env`` stepped with random action dicts, one copy, reset when its agents are done) and of E copies
stepped by ``PettingZooEnv`` (random int64 actions, machina's batched TensorDict steps), side by side in one
process, so that the ratio is the adapter's cost.

    python -m machina.env.pettingzoo.bench [--id mpe2.simple_spread_v3] [--num-envs 1 16 64] [--seconds 3] [--json]

Prints a table and, with ``--json``, one JSON object per measured configuration (``num_envs``, ``agent_steps_per_s``,
``what``: ``env alone`` or ``adapter``).
"""

import argparse
import json
import platform
import time

import numpy as np
import torch

from machina.env.pettingzoo.env import PettingZooEnv
from machina.env.pettingzoo.ids import constructor, parallel


def alone(env_id: str, kwargs: dict, seconds: float) -> float:
    """Agent steps per second of one copy of the env, stepped with random actions through its own API."""
    env = parallel(env_id, constructor(env_id)(**kwargs))
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
        env.step(actions)
        steps += len(actions)
        if not env.agents:
            env.reset()
    return steps / (time.perf_counter() - start)


def adapter(env_id: str, kwargs: dict, num_envs: int, seconds: float) -> float:
    """Agent steps per second of ``num_envs`` copies stepped by ``PettingZooEnv``."""
    env = PettingZooEnv(id=env_id, kwargs=kwargs, num_envs=num_envs)
    generator = torch.Generator().manual_seed(0)
    n, a = env.spec.num_agents, env.spec.num_actions
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(torch.randint(0, a, (n,), generator=generator))
        steps += n
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--id", default="mpe2.simple_spread_v3")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [{"what": "env alone", "num_envs": 1, "agent_steps_per_s": alone(args.id, {}, args.seconds)}]
    rows += [
        {"what": "adapter", "num_envs": e, "agent_steps_per_s": adapter(args.id, {}, e, args.seconds)}
        for e in args.num_envs
    ]
    base = rows[0]["agent_steps_per_s"]
    print(f"{args.id} on {platform.processor() or platform.machine()}, 1 torch thread")
    print(f"{'what':<10} {'num_envs':>8} {'agent steps/s':>14} {'vs alone':>9}")
    for row in rows:
        rate = row["agent_steps_per_s"]
        print(f"{row['what']:<10} {row['num_envs']:>8} {rate:>14,.0f} {rate / base:>8.2f}x")
        if args.json:
            print(json.dumps({"id": args.id, **row}))


if __name__ == "__main__":
    main()
