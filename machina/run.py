"""Turn a composed config into objects and train. The only module that calls ``hydra.utils.instantiate``.

Reads like CleanRL's main: system -> losses -> env -> policy -> experience -> optimizer -> sinks -> trainer.
Library code below receives objects and plain values, never a DictConfig; the config is never mutated.
"""

import logging
import secrets
import types
import typing
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from machina import keys
from machina.errors import ConfigError
from machina.logging.identity import wandb_identity
from machina.logging.sinks import ConsoleSink, JsonlSink, WandbSink
from machina.losses.base import Loss, Spec
from machina.training.checkpoint import Checkpointer, find_checkpoint, load_checkpoint, trim_metrics

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
    system = instantiate(cfg.system)
    device = system.apply()
    losses = build_losses(cfg.losses)
    needs_teacher = any(keys.TEACHER_ACTIONS in loss.env_keys for loss in losses.values())
    env = instantiate(cfg.env, device=str(device), seed=system.seed, teacher=needs_teacher)
    policy = instantiate(cfg.policy, obs_spec=env.spec.obs, num_actions=env.spec.num_actions).to(device)
    check_policy_outputs(losses, policy)
    for loss in losses.values():
        loss.setup(env.spec, policy, device)
        loss.to(device)
    spec = merge_specs(
        {"policy": policy.experience_spec(), **{name: loss.experience_spec(env.spec) for name, loss in losses.items()}}
    )
    state = policy.initial_state(1, device)
    state_spec = {key: (tuple(value.shape[1:]), value.dtype) for key, value in state.items()}
    experience = instantiate(
        cfg.experience, spec=spec, state_spec=state_spec, num_agents=env.spec.num_agents, device=device
    )
    optimizer = instantiate(cfg.optimizer)(policy.parameters())

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(resolved), run_dir / "resolved_config.yaml")
        # Epochs after the checkpoint are run again, so their rows go (a fresh start keeps none).
        trim_metrics(run_dir / "metrics.jsonl", checkpoint["epoch"] if checkpoint else 0)
    except OSError as err:
        raise ConfigError(
            f"cannot write to the run folder {str(run_dir)!r} ({err.strerror or err}); choose a writable one with "
            "hydra.run.dir=PATH"
        ) from None
    # A resume logs into the checkpoint's W&B run; a new run gets its id here, so its first checkpoint records it.
    run_id = checkpoint["wandb_run_id"] if checkpoint else secrets.token_hex(4)
    checkpointer = Checkpointer(run_dir / "checkpoints", resolved["policy"], env.spec.obs, resolved, run_id)
    wandb = WandbSink(directory=run_dir, config=resolved, run_id=run_id, **wandb_identity(cfg))
    sinks = [ConsoleSink(cfg.trainer.total_timesteps), JsonlSink(run_dir / "metrics.jsonl"), wandb]
    trainer = instantiate(
        cfg.trainer,
        env=env,
        policy=policy,
        losses=losses,
        experience=experience,
        optimizer=optimizer,
        sinks=sinks,
        checkpointer=checkpointer,
    )
    if checkpoint:
        checkpointer.restore(trainer, checkpoint, resume_from)
        log.info("resumed from %s: epoch %d, agent step %d", resume_from, trainer.epoch, trainer.agent_step)
    log.info(
        "run %s | %s agents | losses %s | emit_full_log_probs=%s | device %s",
        run_dir,
        env.spec.num_agents,
        list(losses),
        policy.action_probs.emit_full_log_probs,
        device,
    )
    try:
        summary = trainer.train()
        wandb.summarize(summary)
    finally:
        for sink in sinks:
            sink.close()
    log.info("done: %s", ", ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    return summary[cfg.objective]


def build_losses(losses_cfg: DictConfig) -> dict[str, Loss]:
    """Instantiate the enabled losses in config order (the order in which they run)."""
    losses = {}
    for name, node in losses_cfg.items():
        if "_target_" not in node:
            raise ConfigError(f"losses.{name} has no _target_; every loss config names its class")
        kwargs = {k: v for k, v in node.items() if k != "enabled"}
        if node.get("enabled", True):
            losses[name] = instantiate(kwargs, _convert_="all")
    return losses


def check_policy_outputs(losses: dict[str, Loss], policy) -> None:
    """Refuse at start-up a policy that does not emit what an enabled loss consumes."""
    if keys.FULL_LOG_PROBS in policy.output_keys():
        return
    for name, loss in losses.items():
        if keys.FULL_LOG_PROBS in type(loss).consumes:
            raise ConfigError(
                f"loss '{name}' consumes {keys.FULL_LOG_PROBS}, but policy.action_probs.emit_full_log_probs=false "
                f"was forced; drop the override policy.action_probs.emit_full_log_probs=false (it is derived from "
                f"the enabled losses) or disable the loss with losses.{name}.enabled=false"
            )


def merge_specs(specs: dict[str, Spec]) -> Spec:
    """Union of per-step buffer specs; the same key with another shape or dtype is refused."""
    merged: Spec = {}
    owner: dict[str, str] = {}
    for who, spec in specs.items():
        for key, value in spec.items():
            if key in merged and merged[key] != value:
                raise ConfigError(
                    f"experience key '{key}' is declared as {merged[key]} by {owner[key]} and as {value} by {who}"
                )
            merged.setdefault(key, value)
            owner.setdefault(key, who)
    return merged


SIMPLE_TYPES = (bool, int, float, str, type(None))


def check_types(node: Any, path: str = "") -> None:
    """Check every plain value of a ``_target_`` node against the constructor's annotation, so a command-line typo
    (``trainer.total_timesteps=abc``) is refused at start-up with the key's name, not deep inside a step.

    Only annotations made of bool/int/float/str/None are checked (a ``float | Linear`` value given as a plain value
    must be a float); values that are nodes or lists, and unannotated parameters, are left to the constructors.
    """
    if isinstance(node, list):
        for i, item in enumerate(node):
            check_types(item, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    hints = constructor_hints(node["_target_"]) if isinstance(node.get("_target_"), str) else {}
    for key, value in node.items():
        where = f"{path}.{key}" if path else str(key)
        if key in hints and isinstance(value, SIMPLE_TYPES) and not fits(value, hints[key]):
            raise ConfigError(
                f"{where}={value!r} has the wrong type: {node['_target_']} takes {key}: "
                f"{getattr(hints[key], '__name__', hints[key])}; fix the value of {where}"
            )
        check_types(value, where)


def constructor_hints(target: str) -> dict[str, Any]:
    try:
        obj = get_object(target)
        return typing.get_type_hints(obj.__init__ if isinstance(obj, type) else obj)
    except Exception:  # noqa: BLE001 - an unlocatable target or odd annotations: instantiate reports or accepts it
        return {}


def fits(value: Any, annotation: Any) -> bool:
    """Whether a plain config value can be ``annotation``; annotations with no plain member are not checked."""
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if is_union else (annotation,)
    plain = [m for m in members if m in SIMPLE_TYPES]
    if not plain:
        return True
    for member in plain:
        if member is float and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if member is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if member in (bool, str, type(None)) and isinstance(value, member):
            return True
    return False
