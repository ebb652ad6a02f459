"""Launch overhead: host microseconds and aten ops per rollout step and per minibatch, at a tiny batch.

    python -m machina.bench overhead [--json] [HYDRA_OVERRIDE ...]

At the batch sizes where a GPU is fastest, a step's time is bounded by Python work and kernel launches, not
arithmetic; on a GPU every aten op is at least one kernel launch. Both can be measured on a CPU with a tiny batch
(one env), where the arithmetic is negligible:

- ``ops_per_step`` / ``ops_per_minibatch``: aten operators recorded by ``torch.profiler`` (every ``aten::`` event,
  nested ones included; machine load does not change it);
- ``host_us_per_step`` / ``host_us_per_minibatch``: the main thread's CPU time (``time.thread_time``) with one
  torch thread, best of several rounds (less sensitive to other jobs than wall time, not immune to them);
- ``*_narrow`` (on a CPU): the same for the policy with every width shrunk to 8 (``NARROW``): the same ops (checked:
  ``ops_per_step_narrow``), so the same dispatch and Python work, without the arithmetic. At one env most of a
  ``policy=fast`` step is overhead, but a third of a ``policy=vit`` step is its 64- to 512-wide matrix products,
  which a GPU does in microseconds; the narrow host time is the part a GPU would still pay per op.

A rollout step is the policy forward, the losses' hooks, the env step and the buffer write (the rollout's final
bootstrap forward is spread over its steps); a minibatch is one learner pass's share of its update (advantages,
sampling, forward, losses, backward, clip, optimizer step).
"""

import argparse
import json
import time
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile

from machina.speed import machine, training

TINY = ["env.num_envs=1", "experience.batch_size=64", "experience.bptt_horizon=16", "experience.minibatch_size=64"]
# Every width of the policy shrunk to 8: the same graph of ops with almost no arithmetic.
NARROW = {
    "policy=fast": ["policy.encoder.embed_dim=8", "policy.encoder.hidden=8", "policy.core.hidden_size=8"],
    "policy=vit": [
        "policy.encoder.latent_dim=8",
        "policy.encoder.num_latents=2",
        "policy.encoder.num_heads=2",
        "policy.encoder.feature_dim=2",
        "policy.encoder.frequencies=[1.0]",
        "policy.core.hidden_size=8",
        "policy.actor.hidden=[8]",
        "policy.critic.hidden=[8]",
    ],
}


def aten_ops(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def host_seconds(fn, rounds: int = 7) -> float:
    """Best main-thread CPU seconds of ``fn`` over ``rounds`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def measure(trainer) -> dict[str, float]:
    """Per rollout step and per minibatch: aten ops and host microseconds of ``trainer``'s own rollout and learner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        steps = trainer.learner.experience.batch_size // trainer.rollout.env.spec.num_agents
        minibatches = trainer.learner.experience.num_minibatches * trainer.learner.update_epochs

        rollout, learn = partial(training.rollout, trainer), partial(training.update, trainer)
        rollout()
        learn()  # warm-up: lazy initialisation, optimizer state
        return {
            "ops_per_step": aten_ops(rollout) / steps,
            "host_us_per_step": 1e6 * host_seconds(rollout) / steps,
            "ops_per_minibatch": aten_ops(learn) / minibatches,
            "host_us_per_minibatch": 1e6 * host_seconds(learn) / minibatches,
        }
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> list[dict]:
    """``measure`` for policy=fast and policy=vit (or the policy the overrides name), on one env; again with the
    policy's widths shrunk (``NARROW``) for the policies it knows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. losses=[ppo,supervisor]")
    parser.add_argument("--json", action="store_true", help="print one JSON object per configuration")
    args = parser.parse_args(argv)
    machine.announce()
    named = any(o.startswith("policy=") for o in args.overrides)
    policies = [[]] if named else [["policy=fast"], ["policy=vit"]]
    cols = ("ops_per_step", "host_us_per_step", "host_us_per_step_narrow", "ops_per_minibatch", "host_us_per_minibatch")
    if not args.json:
        print(f"{'configuration':<40}" + "".join(f"{c:>24}" for c in cols))
    results = []
    for policy in policies:
        chosen = [*TINY, *policy, *args.overrides]
        setup = training.Setup(chosen)
        result = {"overrides": chosen, **measure(setup.trainer)}
        shrink = next((NARROW[o] for o in chosen[::-1] if o in NARROW), None)
        if shrink is not None and setup.parts.device.type == "cpu":  # an accelerator's arithmetic is not host time
            narrow = measure(training.Setup([*chosen, *shrink]).trainer)
            result.update({f"{key}_narrow": value for key, value in narrow.items()})
        results.append(result)
        if args.json:
            print(json.dumps(result))
        else:
            name = " ".join([*policy, *args.overrides]) or "(defaults)"
            print(f"{name:<40}" + "".join(f"{result.get(c, float('nan')):>24,.1f}" for c in cols))
    return results
