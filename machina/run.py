"""Train an experiment: build its parts (``machina.build``), set up the run folder, sinks and checkpoints, resume
if a checkpoint exists, and run the trainer. Library code receives objects, never a DictConfig.

Under torchrun every rank runs this and resumes from the same checkpoint; rank 0 alone writes the run folder,
metrics.jsonl, W&B and checkpoints (docs/distributed.md).
"""

import logging
import secrets
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina import distributed
from machina.build import build, build_trainer
from machina.env.factory import env_factory
from machina.errors import ConfigError
from machina.evaluation.evaluator import Evaluator
from machina.logging.identity import wandb_identity
from machina.logging.sinks import ConsoleSink, JsonlSink, WandbSink
from machina.training.checkpoint import Checkpointer, find_checkpoint, load_checkpoint, trim_metrics
from machina.training.periodic_eval import PeriodicEval
from machina.validation import check_types

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: Path | None = None) -> float:
    """Train the experiment ``cfg`` describes; return the summary metric ``cfg.objective`` (a sweeper's objective).

    Resumes from ``cfg.resume`` (a checkpoint file or run folder) or, when that is null, from the latest checkpoint
    in ``run_dir``, so rerunning a killed command with the same ``hydra.run.dir`` continues it.
    """
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    check_types(resolved)
    resume_from = find_checkpoint(cfg.get("resume"), run_dir)
    checkpoint = load_checkpoint(resume_from) if resume_from else None
    parts = build(cfg, distributed.rank())
    env, policy = parts.env, parts.policy
    main = distributed.rank() == 0

    if main:
        prepare_run_dir(run_dir, resolved, checkpoint["epoch"] if checkpoint else 0)
    # A resume logs into the checkpoint's W&B run; a new run gets its id here, so its first checkpoint records it.
    run_id = checkpoint["wandb_run_id"] if checkpoint else secrets.token_hex(4)
    checkpointer = Checkpointer(run_dir / "checkpoints", resolved["policy"], env.spec.obs, resolved, run_id)
    wandb = WandbSink(directory=run_dir, config=resolved, run_id=run_id, **wandb_identity(cfg)) if main else None
    sinks = [ConsoleSink(cfg.trainer.total_timesteps), JsonlSink(run_dir / "metrics.jsonl"), wandb] if main else []
    evaluator = periodic_eval(cfg, resolved, parts, run_dir, wandb) if main else None
    trainer = build_trainer(cfg, parts, sinks=sinks, checkpointer=checkpointer, evaluator=evaluator)
    if checkpoint:
        checkpointer.restore(trainer, checkpoint, resume_from)
        log.info("resumed from %s: epoch %d, agent step %d", resume_from, trainer.epoch, trainer.agent_step)
    log.info(
        "run %s | %s agents x %d ranks | losses %s | emit_full_log_probs=%s | device %s",
        run_dir,
        env.spec.num_agents,
        distributed.world_size(),
        list(parts.losses),
        policy.action_probs.emit_full_log_probs,
        parts.device,
    )
    try:
        summary = trainer.train()
        if distributed.world_size() > 1:
            digest = distributed.check_in_sync(policy)
            log.info("policy parameters identical on all %d ranks (digest %s)", distributed.world_size(), digest)
        if wandb:
            wandb.summarize(summary)
    finally:
        for sink in sinks:
            sink.close()
    log.info("done: %s", ", ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    return summary[cfg.objective]


def periodic_eval(cfg: DictConfig, resolved: dict, parts, run_dir: Path, wandb) -> PeriodicEval | None:
    """The evaluator of ``trainer.eval_interval`` / ``trainer.replay_interval``, or None when both are 0. It builds
    its envs from the run's env settings, as the builder does."""
    if not (cfg.trainer.eval_interval or cfg.trainer.replay_interval):
        return None
    settings = cfg.evaluation
    evaluator = Evaluator(
        env_factory(resolved["env"], parts.device),
        episodes=settings.episodes,
        greedy=settings.greedy,
        seed=parts.system.seed + settings.seed_offset,
    )
    if cfg.trainer.replay_interval:
        try:
            evaluator.env(num_envs=1).render(0)
        except NotImplementedError as err:
            raise ConfigError(f"{err}; set trainer.replay_interval=0") from None
    return PeriodicEval(evaluator, run_dir / "replays", wandb)


def prepare_run_dir(run_dir: Path, resolved: dict, epoch: int) -> None:
    """Create the run folder, save the resolved config, and drop the metrics rows after ``epoch`` (the resumed run
    writes those epochs again; a fresh start keeps none)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(resolved), run_dir / "resolved_config.yaml")
        trim_metrics(run_dir / "metrics.jsonl", epoch)
    except OSError as err:
        raise ConfigError(
            f"cannot write to the run folder {str(run_dir)!r} ({err.strerror or err}); choose a writable one with "
            "hydra.run.dir=PATH"
        ) from None
