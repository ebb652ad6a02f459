"""Policy throughput on synthetic token observations: rollout inference and training forward + backward.

    python -m machina.bench policy                 # table
    python -m machina.bench policy --json          # one JSON object per measured configuration
    python -m machina.bench policy --policies fast --agents 1024

Rollout: ``policy(td)`` under ``torch.inference_mode`` and ``weights_fixed`` (as a rollout steps it) on N agents, T = 1
(sampling included), in agents/s.
Training: forward with stored actions on [segments, bptt] plus backward of a loss on every output, in samples/s.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from machina.env.spec import PAD_TOKEN, ObsSpec
from machina.keys import ACT_LOG_PROB, ACTIONS, ENTROPY, EPISODE_START, OBS, VALUES
from machina.speed import machine

CONF = Path(__file__).resolve().parents[2] / "conf" / "policy"


def synthetic_spec(max_tokens: int, num_features: int) -> ObsSpec:
    return ObsSpec(
        max_tokens=max_tokens,
        window=11,
        feature_names=tuple(f"feature_{i}" for i in range(num_features)),
        feature_norms=tuple(float(1 + i % 10) for i in range(num_features)),
    )


def synthetic_obs(spec: ObsSpec, batch: int, steps: int, real_fraction: float) -> torch.Tensor:
    """uint8 [batch, steps, M, 3]: about ``real_fraction`` of the slots hold real tokens, the rest padding."""
    shape = (batch, steps, spec.max_tokens)
    dy, dx = torch.randint(0, spec.window, (2, *shape))
    feature = torch.randint(0, spec.num_features, shape)
    obs = torch.stack((dy << 4 | dx, feature, torch.randint(0, 256, shape)), -1).to(torch.uint8)
    count = torch.randint(0, int(2 * real_fraction * spec.max_tokens) + 1, (batch, steps, 1))
    obs[torch.arange(spec.max_tokens) >= count] = PAD_TOKEN
    return obs


def build(name: str, spec: ObsSpec, num_actions: int) -> torch.nn.Module:
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    cfg.action_probs.emit_full_log_probs = False  # the default run (ppo only) does not emit them
    return hydra.utils.instantiate(cfg, obs_spec=spec, num_actions=num_actions)


def seconds_per_call(fn: Callable[[], None], warmup: int, min_seconds: float) -> float:
    """Median wall time of ``fn`` over enough calls to fill ``min_seconds`` (at least 3), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < 3 or sum(times) < min_seconds:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_rollout(policy: torch.nn.Module, spec: ObsSpec, args: argparse.Namespace) -> dict:
    n = args.agents
    td = TensorDict(
        {OBS: synthetic_obs(spec, n, 1, args.real_fraction), EPISODE_START: torch.zeros(n, 1)}, batch_size=[n]
    )
    td.update(policy.initial_state(n, "cpu"))

    def step() -> None:
        policy(td.copy())

    with torch.inference_mode(), policy.weights_fixed():  # as a rollout runs its steps
        seconds = seconds_per_call(step, args.warmup, args.min_seconds)
    return {"mode": "rollout", "batch": n, "bptt": 1, "ms_per_call": 1e3 * seconds, "per_s": n / seconds}


def bench_training(policy: torch.nn.Module, spec: ObsSpec, args: argparse.Namespace, num_actions: int) -> dict:
    b, t = args.segments, args.bptt
    td = TensorDict(
        {
            OBS: synthetic_obs(spec, b, t, args.real_fraction),
            EPISODE_START: (torch.rand(b, t) < 0.01).float(),
            ACTIONS: torch.randint(0, num_actions, (b, t)),
        },
        batch_size=[b],
    )
    td.update(policy.initial_state(b, "cpu"))

    def step() -> None:
        out = policy(td.copy())
        (out[ACT_LOG_PROB].mean() + out[ENTROPY].mean() + out[VALUES].square().mean()).backward()
        policy.zero_grad(set_to_none=True)

    seconds = seconds_per_call(step, args.warmup, args.min_seconds)
    return {"mode": "train", "batch": b * t, "bptt": t, "ms_per_call": 1e3 * seconds, "per_s": b * t / seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["fast", "vit"])
    parser.add_argument("--agents", type=int, default=4096, help="rollout batch N (T = 1)")
    parser.add_argument("--segments", type=int, default=64, help="training minibatch segments B")
    parser.add_argument("--bptt", type=int, default=64, help="training segment length T")
    parser.add_argument("--tokens", type=int, default=128, help="max tokens per observation M")
    parser.add_argument("--real-fraction", type=float, default=0.5, help="mean fraction of non-padding tokens")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--actions", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = parser.parse_args(argv)
    machine.announce()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    spec = synthetic_spec(args.tokens, args.features)
    if not args.json:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, M={args.tokens}, A={args.actions}")
        print(f"{'policy':<8}{'mode':<9}{'batch':>8}{'bptt':>6}{'ms/call':>10}{'per s':>12}  unit")
    for name in args.policies:
        policy = build(name, spec, args.actions)
        common = {"policy": name, "params": sum(p.numel() for p in policy.parameters()), "tokens": args.tokens}
        common["threads"] = torch.get_num_threads()
        for measured in (bench_rollout(policy, spec, args), bench_training(policy, spec, args, args.actions)):
            result = common | measured
            unit = "agents/s" if result["mode"] == "rollout" else "samples/s (fwd+bwd)"
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print(
                    f"{name:<8}{result['mode']:<9}{result['batch']:>8}{result['bptt']:>6}"
                    f"{result['ms_per_call']:>10.1f}{result['per_s']:>12,.0f}  {unit}",
                    flush=True,
                )
