"""Where the update's time goes: ``torch.profiler`` over one epoch's update, its ops grouped by name and input shapes.

    python -m machina.bench profile [--rows N] [--json] [HYDRA_OVERRIDE ...]

Builds the configuration (the main job by default), runs a warm-up epoch (rollout and update), fills the buffer
with one more rollout, and profiles the update that trains on it: every update epoch and minibatch, the losses'
forward, the backward and the optimizer step. It prints the update's wall seconds (timed again without the
profiler, which adds its own cost per op) and the ``--rows`` ops with the most self time, each with its shapes, its
calls and its share of the profiled self time. The bench's time split (``python -m machina.bench``) says how the
epoch divides between the rollout and the update; this says which ops inside the update to make cheaper.
"""

import argparse
import json
import time

from torch.profiler import ProfilerActivity, profile

from machina.speed import machine
from machina.speed.training import Setup, rollout, update


def update_ops(trainer, rows: int) -> dict:
    """The update's seconds without the profiler and its ``rows`` ops with the most self time under it."""
    learner = trainer.learner
    rollout(trainer)
    update(trainer)  # warm-up: lazy initialisation, the optimizer's state
    rollout(trainer)
    start = time.perf_counter()
    update(trainer)
    seconds = time.perf_counter() - start
    rollout(trainer)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        update(trainer)
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(event.self_cpu_time_total for event in events) or 1.0
    top = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:rows]
    return {
        "update_seconds": seconds,
        "minibatches": learner.experience.num_minibatches * learner.update_epochs,
        "ops": [
            {
                "name": event.key,
                "shapes": str(event.input_shapes),
                "calls": event.count,
                "self_ms": event.self_cpu_time_total / 1e3,
                "share": event.self_cpu_time_total / total,
            }
            for event in top
        ],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. policy.core.hidden_size=192")
    parser.add_argument("--rows", type=int, default=15, help="ops to list, the most self time first")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    machine.announce()
    result = {"overrides": args.overrides, **update_ops(Setup(args.overrides).trainer, args.rows)}
    if args.json:
        print(json.dumps(result))
        return result
    print(f"update: {result['update_seconds']:.3f} s for {result['minibatches']} minibatches (without the profiler)")
    print(f"{'op':<40}{'self ms':>10}{'share':>8}{'calls':>8}   input shapes")
    for op in result["ops"]:
        print(f"{op['name'][:39]:<40}{op['self_ms']:>10.1f}{op['share']:>8.1%}{op['calls']:>8}   {op['shapes']}")
    return result
