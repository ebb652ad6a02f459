"""Turn a composed config into objects and train. The only module that calls ``hydra.utils.instantiate``.

Reads like CleanRL's main: system -> losses -> env -> policy -> experience -> optimizer -> sinks -> trainer.
Library code below receives objects and plain values, never a DictConfig; the config is never mutated.
"""

import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from machina import keys
from machina.errors import ConfigError
from machina.logging.identity import wandb_identity
from machina.logging.sinks import ConsoleSink, JsonlSink, WandbSink
from machina.losses.base import Loss, Spec

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: Path | None = None) -> float:
    """Train the experiment ``cfg`` describes; return the final mean episode return (the sweep objective)."""
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
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

    resolved = OmegaConf.to_container(cfg, resolve=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(resolved), run_dir / "resolved_config.yaml")
    wandb = WandbSink(directory=run_dir, config=resolved, **wandb_identity(cfg))
    sinks = [ConsoleSink(cfg.trainer.total_timesteps), JsonlSink(run_dir / "metrics.jsonl"), wandb]
    trainer = instantiate(
        cfg.trainer, env=env, policy=policy, losses=losses, experience=experience, optimizer=optimizer, sinks=sinks
    )
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
    return summary["summary/final_reward"]


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
