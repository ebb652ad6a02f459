"""Train an experiment: check its settings, decide where it continues from, build its parts (``machina.startup.build``),
accept the checkpoint it resumes from (if any), and only then write the run folder, the sinks and checkpoints, and
run the trainer. Library code receives objects, never a DictConfig.

Every check comes before any write, so a refused command leaves the disk as it was: the settings (``validation``),
the folder's lock (``machina.run_folder.run_lock``), where the run continues from (``machina.run_folder.history``),
the checkpoint (its checksum, its structure, and the policy it holds: allow-listed plain data), the parts (each
constructor checks its own values, and a part too large for memory is refused; the sinks are built, not opened), and
the restore of the checkpoint into the built trainer.
Every part of the folder a start writes is of the right kind before then (``history.check_parts``, the sinks' own
paths in ``build_sinks``, the rewind's moves in ``history.plan_rewind``). Then the command is accepted: Hydra's
record (``.hydra/``) and the log are written (``machina.run_folder.run_record``), a rewound future is moved aside,
and resolved_config.yaml, the sinks of the ``logger`` group (``machina.logging.sink``: metrics.jsonl, W&B, ...)
and the checkpoints follow.

Under torchrun every rank runs this; rank 0 chooses the run folder, takes the lock and decides the checkpoint to
resume from, and every rank uses its decision (or stops with its refusal); rank 0 alone writes the run folder,
its sinks and checkpoints (docs/tutorials/distributed.md).
"""

import logging
import math
import secrets
import sys
from contextlib import ExitStack, closing
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from machina import checks
from machina.cli import new_folder_command
from machina.errors import ConfigError
from machina.evaluation.evaluator import Evaluator
from machina.files.atomic import atomic_write
from machina.files.trusted import in_force
from machina.logging.sink import Sinks
from machina.run_folder import history, run_record
from machina.run_folder.run_lock import RunLock
from machina.startup.build import build, build_sinks, build_trainer
from machina.startup.validation import check_run
from machina.training import distributed
from machina.training.checkpoint import Checkpointer, load_checkpoint
from machina.training.epoch_metrics import summarize
from machina.training.periodic_eval import PeriodicEval

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: Path | None = None) -> float:
    """Train the experiment ``cfg`` describes; return the summary metric ``cfg.objective`` (a sweeper's objective).

    Continues from ``cfg.resume`` (a checkpoint file or run folder) or, when that is null, from the latest checkpoint
    in ``run_dir``, so rerunning a killed command with the same ``hydra.run.dir`` continues it
    (``machina.run_folder.history``
    decides, and refuses what would lose or mix a run's history).
    """
    # Under torchrun rank 0 decides the folder: with the default timestamped folder, ranks that started in different
    # seconds would each resolve their own (Hydra made one for each; the others' are removed again).
    run_dir = Path(distributed.from_main(str(run_dir or HydraConfig.get().runtime.output_dir)))
    if distributed.rank() != 0:
        run_record.not_writing(run_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    check_run(resolved)
    check_run_settings(resolved)
    main = distributed.rank() == 0
    lock = RunLock(run_dir)
    with ExitStack() as held:

        def start() -> Path | None:  # rank 0: hold the folder, then decide where the run continues from
            held.enter_context(lock)
            # Every part of the folder a start writes (its log file included) is of the right kind, or nothing is.
            written = {**history.parts(run_dir), **dict.fromkeys(run_record.log_files(), "file")}
            history.check_parts(written)
            return history.decide(cfg.get("resume"), run_dir, new_folder_command(sys.argv, run_dir))

        resume_from = distributed.decided_by_main(start)
        return run_locked(cfg, resolved, run_dir, main, resume_from, lock)


def run_locked(
    cfg: DictConfig, resolved: dict, run_dir: Path, main: bool, resume_from: Path | None, lock: RunLock
) -> float:
    """``train`` with the run folder locked: acceptance first, then the folder, the sinks and the epochs."""
    # The checkpoint may name only classes this command's configuration names (its search path, its own settings);
    # restore then compares its architecture with the composed one.
    checkpoint = load_checkpoint(resume_from, in_force(cfg)) if resume_from else None
    parts = build(cfg, distributed.rank())
    with closing(parts.env):  # an env stepped in worker processes stops them, whatever ends the run
        env, policy = parts.env, parts.policy
        # The run's own id (the sinks' RunInfo.id): a resume keeps the checkpoint's, so W&B continues that run; a
        # new run gets its id here, so its first checkpoint records it.
        run_id = checkpoint["run_id"] if checkpoint else secrets.token_hex(4)
        checkpointer = Checkpointer(run_dir / "checkpoints", resolved["policy"], env.spec, resolved, run_id)
        evaluator = periodic_eval(cfg, parts, run_dir)  # on every rank: each plays a share
        # Rank 0 logs; its sinks open below, once the resume is accepted.
        sinks = build_sinks(cfg, run_dir, run_id, resolved) if main else Sinks()
        trainer = build_trainer(cfg, parts, sinks=sinks, checkpointer=checkpointer, evaluator=evaluator)
        if checkpoint:
            checkpointer.restore(trainer, checkpoint, resume_from)
        if main:  # accepted: from here on the run folder changes
            rewinding = history.plan_rewind(run_dir, trainer.epoch)  # checked now, moved once accepted
            run_record.accept(trainer.epoch if checkpoint else None)
            lock.keep()
            if checkpoint:
                log.info("resumed from %s: epoch %d, agent step %d", resume_from, trainer.epoch, trainer.agent_step)
            rewinding.apply()  # what the folder holds after this start's epoch moves aside
            # What a stop before this start's first checkpoint leaves to resume from: the folder's own checkpoint, or
            # none when the run started from another folder's (a start in this folder would not resume that one).
            own = checkpoint and resume_from.parent.resolve() == checkpointer.directory.resolve()
            checkpointer.latest = resume_from if own and resume_from.exists() else None
            checkpointer.prepare()
            prepare_run_dir(run_dir, resolved)
            sinks.open()
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
            sinks.summarize(summary)
        except BaseException as err:  # an interrupted or failed run must not look finished: the sinks hear why
            sinks.summarize(summarize(trainer.history))
            sinks.close(err)
            raise
        sinks.close()
        log.info("done: %s", ", ".join(f"{k}={v:.4g}" for k, v in summary.items()))
        return summary[cfg.objective]


def periodic_eval(cfg: DictConfig, parts, run_dir: Path) -> PeriodicEval | None:
    """The evaluator of ``trainer.eval_interval`` / ``trainer.replay_interval`` playing as the ``evaluation`` node
    says, or None when both intervals are 0. It builds its envs with the builder's env factory (``parts.make_env``):
    the run's env settings, the same checks."""
    settings = cfg.evaluation
    if not (cfg.trainer.eval_interval or cfg.trainer.replay_interval):
        return None
    # Every rank plays its share of the episodes; its seed (system.seed + rank) gives it its own layouts.
    evaluator = Evaluator(
        parts.make_env,
        episodes=math.ceil(settings.episodes / distributed.world_size()),
        greedy=settings.greedy,
        seed=parts.system.seed + settings.seed_offset,
    )
    if cfg.trainer.replay_interval:
        evaluator.check_replays("trainer.replay_interval=0")
    return PeriodicEval(evaluator, run_dir / "replays")


def check_run_settings(resolved: dict) -> None:
    """The settings this module reads itself, checked before anything is written: ``logger`` keeps jsonl (resume,
    compare and plot read metrics.jsonl), and ``evaluation`` holds episodes, greedy and seed_offset."""
    if "jsonl" not in (resolved.get("logger") or {}):
        raise ConfigError(
            "logger has no jsonl: every training run writes metrics.jsonl (resume, compare and plot read it); keep "
            "it in the list, e.g. logger=[console,jsonl,csv]"
        )
    evaluation = resolved.get("evaluation")
    if not isinstance(evaluation, dict):
        raise ConfigError(f"evaluation must be a mapping of episodes, greedy, seed_offset; got {evaluation!r}")
    unknown = sorted(set(evaluation) - {"episodes", "greedy", "seed_offset"})
    if unknown:
        raise ConfigError(f"evaluation has unknown keys {unknown}; it takes episodes, greedy, seed_offset")
    checks.integer("evaluation.episodes", evaluation.get("episodes"), low=1)
    checks.flag("evaluation.greedy", evaluation.get("greedy"))
    checks.integer("evaluation.seed_offset", evaluation.get("seed_offset"), low=0)


def prepare_run_dir(run_dir: Path, resolved: dict) -> None:
    """Create the run folder and save the resolved config (once a resume is accepted)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        text = OmegaConf.to_yaml(OmegaConf.create(resolved)).encode("utf-8")
        atomic_write(run_dir / "resolved_config.yaml", lambda f: f.write(text))
    except OSError as err:
        raise ConfigError(
            f"cannot write to the run folder {str(run_dir)!r} ({err.strerror or err}); choose a writable one with "
            "hydra.run.dir=PATH"
        ) from None
