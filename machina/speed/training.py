"""Training benchmark: where the time goes, and how close end-to-end SPS gets to what the parts allow.

    python -m machina.bench [--epochs N] [--json] [HYDRA_OVERRIDE ...]
    python -m machina.bench --compare policy.action_probs.emit_full_log_probs=false,true [HYDRA_OVERRIDE ...]

For one configuration it measures, after a warm-up epoch:
- ``sps``: end-to-end agent steps/s over whole epochs (rollout + update + the epoch's metric read);
- ``env_sps``: the env alone stepping random actions; ``inference_sps``: the policy's rollout forward alone;
- ``learner_sps``: agent steps of a full buffer trained per second (all update epochs);
- ``ceiling_sps = 1 / (1/env_sps + 1/inference_sps + 1/learner_sps)``: what the parts allow run back to back, and
  ``ceiling_ratio = sps / ceiling_sps`` (what the loop's own overhead leaves);
- ``syncs_per_step``: host reads of tensors per rollout step (``machina.speed.host_reads``), the per-phase time
  split, and peak memory.
``--compare KEY=A,B`` builds both configurations in one process and alternates their epochs, so both see the same
machine state; it prints each one's numbers and the SPS ratio B/A.
"""

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from machina import keys
from machina.policy.inputs import next_state, rollout_input
from machina.progress import Progress
from machina.speed import machine
from machina.speed.host_reads import count_host_reads
from machina.startup import resolvers
from machina.startup.build import Parts, build, build_trainer
from machina.startup.renamed import renamed

CONF = Path(__file__).resolve().parents[2] / "conf"


def rollout(trainer) -> None:
    """One rollout as the trainer runs it: the policy in eval mode, the buffer filled."""
    trainer.learner.policy.eval()
    trainer.rollout.run(Progress(0, 1))


def update(trainer) -> None:
    """One update on the filled buffer as the trainer runs it (every update epoch), its metrics read and dropped."""
    trainer.learner.policy.train()
    trainer.learner.run(Progress(0, 1))
    trainer.learner.pop_metrics()


def compose_config(overrides: list[str]):
    resolvers.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench"):
        return compose(config_name="config", overrides=["wandb=disabled", *renamed(overrides)])


class Setup:
    """One configuration, built once: its parts, a trainer without sinks, and its measured epochs."""

    def __init__(self, overrides: list[str]):
        self.overrides = overrides
        self.cfg = compose_config(overrides)
        self.parts: Parts = build(self.cfg)
        self.trainer = build_trainer(self.cfg, self.parts, sinks=[])
        self.epoch_seconds: list[float] = []
        self.phases: dict[str, float] = {}

    def epoch(self) -> None:
        """One training epoch exactly as the trainer runs it (rollout, update, the epoch's metric read), timed end
        to end."""
        self.parts.system.apply_flags()
        trainer = self.trainer
        sync(self.parts.device)
        start = time.perf_counter()
        metrics = trainer.epoch_metrics(trainer.run_epoch(), seconds=1.0, sps_cumulative=0.0)
        self.epoch_seconds.append(time.perf_counter() - start)
        for key, seconds in metrics.items():
            phase = key.removeprefix("timing/")
            if phase != key and not phase.endswith("_frac") and phase != "epoch":
                self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def parts_rates(self, steps: int) -> dict[str, float]:
        """env-only, inference-only and learner-only agent steps/s, under this configuration's torch flags (the other
        configuration of a ``--compare`` ran last)."""
        parts, device = self.parts, self.parts.device
        parts.system.apply_flags()
        env, policy = parts.env, parts.policy
        n = env.spec.num_agents
        actions = torch.randint(0, env.spec.num_actions, (steps, n), device=device)
        sync(device)
        start = time.perf_counter()
        for t in range(steps):
            step = env.step(actions[t])
        sync(device)
        env_sps = steps * n / (time.perf_counter() - start)

        step[keys.EPISODE_START] = torch.zeros(n, device=device)
        state = policy.initial_state(n, device)
        act = self.trainer.rollout.act  # the policy's rollout step (compiled under system.compile), eager
        with torch.inference_mode(), policy.weights_fixed():  # as ``Rollout.run`` steps it
            policy.eval()
            start = time.perf_counter()
            for _ in range(steps):
                state = next_state(act(rollout_input(step, state)), state)
            sync(device)
            inference_sps = steps * n / (time.perf_counter() - start)

        trainer = self.trainer
        rollout(trainer)
        trainer.learner.policy.train()
        sync(device)
        start = time.perf_counter()
        trainer.learner.run(Progress(0, 1))
        sync(device)
        learner_sps = parts.experience.batch_size / (time.perf_counter() - start)
        trainer.learner.pop_metrics()
        trainer.learner.stopwatch.pop()
        return {"env_sps": env_sps, "inference_sps": inference_sps, "learner_sps": learner_sps}

    def syncs_per_step(self) -> float:
        self.parts.system.apply_flags()
        trainer = self.trainer
        reads: list[str] = []
        with count_host_reads(reads):
            trainer.rollout.run(Progress(0, 1))
        steps = self.parts.experience.batch_size // self.parts.env.spec.num_agents
        trainer.learner.stopwatch.pop()
        return len(reads) / steps

    def result(self, rates: dict[str, float], syncs: float) -> dict:
        sps = self.parts.experience.batch_size * len(self.epoch_seconds) / sum(self.epoch_seconds)
        ceiling = 1.0 / sum(1.0 / rates[k] for k in ("env_sps", "inference_sps", "learner_sps"))
        total = sum(self.phases.values()) or 1.0
        return {
            "overrides": self.overrides,
            "device": str(self.parts.device),
            "agents": self.parts.env.spec.num_agents,
            "sps": sps,
            **rates,
            "ceiling_sps": ceiling,
            "ceiling_ratio": sps / ceiling,
            "syncs_per_step": syncs,
            "peak_memory_mb": peak_memory_mb(self.parts.device),
            "phases": {k: v / total for k, v in sorted(self.phases.items())},
        }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(results: list[dict]) -> str:
    cols = ["sps", "env_sps", "inference_sps", "learner_sps", "ceiling_sps", "ceiling_ratio", "syncs_per_step"]
    lines = [f"{'configuration':<48}" + "".join(f"{c:>15}" for c in cols)]
    for r in results:
        name = " ".join(r["overrides"]) or "(defaults)"
        cells = [f"{r[c]:>15.3f}" if c in ("ceiling_ratio", "syncs_per_step") else f"{r[c]:>15,.0f}" for c in cols]
        lines.append(f"{name[:48]:<48}" + "".join(cells))
    for r in results:
        split = ", ".join(f"{k} {v:.0%}" for k, v in r["phases"].items() if v >= 0.005)
        lines.append(f"time split [{' '.join(r['overrides']) or 'defaults'}]: {split}")
        lines.append(f"peak memory: {r['peak_memory_mb']:.0f} MB on {r['device']}, {r['agents']} agents")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. policy=vit env.num_envs=1024")
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs per configuration (after 1 warm-up)")
    parser.add_argument("--steps", type=int, default=64, help="steps for the env-only and inference-only rates")
    parser.add_argument("--compare", metavar="KEY=A,B", help="two values of one setting, measured alternately")
    parser.add_argument("--json", action="store_true", help="print one JSON object per configuration")
    args = parser.parse_args(argv)

    if args.compare:
        key, _, values = args.compare.partition("=")
        variants = [[*args.overrides, f"{key}={v}"] for v in values.split(",")]
        if len(variants) != 2 or not key:
            parser.error("--compare takes KEY=A,B with exactly two values")
    else:
        variants = [args.overrides]
    described = machine.announce()  # before the first epoch, so the busy cores are others', not ours
    setups = [Setup(v) for v in variants]
    for setup in setups:
        setup.epoch()  # warm-up: first-touch allocations, thread pools, lazy init
        setup.epoch_seconds.clear()
        setup.phases.clear()
    for _ in range(args.epochs):
        for setup in setups:  # alternate, so a slow spell of the machine hits both configurations
            setup.epoch()
    results = [s.result(s.parts_rates(args.steps), s.syncs_per_step()) for s in setups]
    for r in results:  # the threads as the run's system.threads left them
        r["machine"] = {**described, "threads": torch.get_num_threads()}
    if args.json:
        for r in results:
            print(json.dumps(r))
    else:
        print(table(results))
        if len(results) == 2:
            print(f"sps ratio {variants[1][-1]} / {variants[0][-1]}: {results[1]['sps'] / results[0]['sps']:.3f}")
    return results
