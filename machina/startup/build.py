"""Build the parts of an experiment from a composed config: the only place that calls ``hydra.utils.instantiate``.

Order as in CleanRL's main: system -> losses -> env -> policy -> experience -> optimizer -> rollout and learner,
each injected into the next; ``build_trainer`` puts the two phases into the epoch loop. ``machina.run`` adds the run
folder, sinks, checkpoints and evaluation; benchmarks and tests build the same parts here.

A part does not know where it was configured: the same loss class can be enabled as ``losses.ppo`` and
``losses.ppo2``. So its constructor names its settings relative to its own node (``clip_coef=-1 must be ...``), and
the part is built here inside ``configured(path)`` (``machina.startup.refusals``), which puts the path in front of
its refusal (``losses.ppo2.clip_coef=-1 must be ...``).
"""

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from machina import keys
from machina.env.base import Env
from machina.env.factory import env_factory
from machina.env.spec import EnvSpec
from machina.errors import ConfigError
from machina.keys import Spec
from machina.logging.identity import run_identity
from machina.logging.sink import RunInfo, Sink, Sinks
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss
from machina.run_folder.history import check_parts
from machina.startup.refusals import allocating, configured
from machina.startup.system import System
from machina.training import distributed
from machina.training.execution import Execution
from machina.training.experience import Experience, trajectory_spec
from machina.training.learner import Learner
from machina.training.rollout import Rollout

log = logging.getLogger(__name__)


@dataclass
class Parts:
    system: System
    device: torch.device
    make_env: Callable[..., Env]  # machina.env.factory's make_env for this config: evaluation builds its envs with it
    env: Env
    policy: nn.Module
    losses: dict[str, Loss]
    experience: Experience
    optimizer: torch.optim.Optimizer
    rollout: Rollout
    learner: Learner


def build(cfg: DictConfig, rank: int = 0) -> Parts:
    """Instantiate every part of the experiment; the config is read, never mutated. A part whose sizes do not fit in
    memory is refused with a ConfigError naming its largest settings (``allocating``)."""
    with allocating(cfg, "env", "policy", "experience"):
        return build_parts(cfg, rank)


def build_parts(cfg: DictConfig, rank: int) -> Parts:
    with configured("system"):
        system = instantiate(cfg.system, rank=rank, total_timesteps=cfg.trainer.total_timesteps)
    if cfg.system.compile == "auto":
        log.info("system.compile=auto: %s", "compiling the policy and the update" if system.compile else "eager")
    device = distributed.rank_device(system.apply())
    losses = build_losses(cfg.losses)
    make_env = build_env_factory(cfg.env, device)
    env = make_env(seed=system.seed, outputs=keys.ALWAYS_ASKED.union(*(loss.env_outputs for loss in losses.values())))
    check_env_outputs(losses, env.spec, cfg.env._target_)
    policy = instantiate(cfg.policy, obs_spec=env.spec.obs, num_actions=env.spec.num_actions).to(device)
    check_policy_outputs(losses, policy)
    if system.compile:
        policy.compile()  # in place: parameter names (and so checkpoints) stay those of the eager module
    for name, loss in losses.items():
        with configured(f"losses.{name}"):
            loss.setup(env.spec, device, distributed.all_reduce_sum)
        loss.to(device)
    spec = merge_specs(
        {
            "policy": policy.experience_spec(),
            "trajectory": trajectory_spec(env.spec),
            **{name: loss.experience_spec(env.spec) for name, loss in losses.items()},
        }
    )
    state = policy.initial_state(1, device)
    state_spec = {key: (tuple(value.shape[1:]), value.dtype) for key, value in state.items()}
    with configured("experience"):
        experience = instantiate(
            cfg.experience, spec=spec, state_spec=state_spec, num_agents=env.spec.num_agents, device=device
        )
    optimizer = instantiate(cfg.optimizer)(policy.parameters())
    stopwatch = Stopwatch()
    execution = Execution.for_device(system.compile, system.cuda_graphs, device)
    rollout = Rollout(env, policy, losses, experience, stopwatch, execution)
    # Built apart, each under its own path, and passed in place of their nodes: the learner's own refusals name its
    # settings in full (learner.update_epochs) and the refusals it passes on name other nodes (system.cuda_graphs).
    with configured("learner.advantage"):
        advantage = instantiate(cfg.learner.advantage)
    with configured("learner.lr_schedule"):
        lr_schedule = instantiate(cfg.learner.lr_schedule)
    learner = instantiate(
        cfg.learner,
        advantage=advantage,
        lr_schedule=lr_schedule,
        policy=policy,
        losses=losses,
        experience=experience,
        optimizer=optimizer,
        stopwatch=stopwatch,
        execution=execution,
        between_minibatches=system.follow_load,
        agents_per_env=env.spec.agents_per_env,
        # The losses as the plain dict passed here: by default Hydra hands a dict argument over as a DictConfig,
        # whose reads in the minibatch loop cost omegaconf lookups and, compiled, put a guard on its lookup cache
        # (the update compiled again at the second minibatch).
        _convert_="all",
    )
    return Parts(system, device, make_env, env, policy, losses, experience, optimizer, rollout, learner)


def build_trainer(cfg: DictConfig, parts: Parts, **extra):
    """The epoch loop over ``parts``' rollout and learner; ``extra`` carries sinks, checkpointer and evaluator."""
    return instantiate(
        cfg.trainer, rollout=parts.rollout, learner=parts.learner, between_epochs=parts.system.adapt_threads, **extra
    )


def build_sinks(cfg: DictConfig, run_dir: Path, run_id: str, resolved: dict) -> Sinks:
    """The sinks of the ``logger`` group (``logger.<name>``: a ``_target_``, a ``machina.logging.sink.Sink``
    subclass, and its settings), built by ``Sink.for_run`` when ``Sinks.open`` runs (once the run is accepted). Refused
    here, before anything is written: a target that is not a sink or is abstract (``Sink`` itself), a setting it does
    not take, a path it writes (``Sink.writes``) that is of the wrong kind, and two sinks that write one path (every
    row would be written twice)."""
    run = RunInfo(run_dir, run_id, resolved, **run_identity(cfg))
    openers, writers = [], {}
    for name, node in (cfg.get("logger") or {}).items():
        settings = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else {}
        target = settings.pop("_target_", None)
        sink_class = named_class(f"logger.{name}._target_", target, Sink, "a sink")
        if sink_class.log is Sink.log:
            raise ConfigError(
                f"logger.{name}._target_={target} has no log method of its own (it would fail at the first epoch); "
                "name a sink class that implements log"
            )
        try:  # the settings go to for_run, or to the constructor when the class keeps Sink's for_run
            if sink_class.for_run.__func__ is Sink.for_run.__func__:
                inspect.signature(sink_class).bind(**settings)
            else:
                inspect.signature(sink_class.for_run).bind(run, **settings)
        except TypeError as err:
            raise ConfigError(f"logger.{name} ({target}): {err}") from None
        written = sink_class.writes(run, **settings)
        for path in written:
            if path in writers:
                raise ConfigError(
                    f"logger.{writers[path]} and logger.{name} both write {path}: every row would be written twice; "
                    "keep one of them in the logger list"
                )
            writers[path] = name
        check_parts(written)
        openers.append(partial(sink_class.for_run, run, **settings))
    return Sinks(openers)


def build_losses(losses_cfg: DictConfig) -> dict[str, Loss]:
    """Instantiate the enabled losses in config order (the order in which they run)."""
    losses = {}
    for name, node in losses_cfg.items():
        if "_target_" not in node:
            # Settings of a loss that is not selected: a preset tuning it (machina_1_dagger's supervisor schedule)
            # combined with a losses= choice that leaves it out.
            selected = [key for key, other in losses_cfg.items() if "_target_" in other]
            raise ConfigError(
                f"losses.{name} has settings but no _target_: '{name}' is not among the selected losses "
                f"{selected}; select it (losses=[{','.join([*selected, name])}]), turn it off with "
                f"losses.{name}.enabled=false, or name its class with +losses.{name}._target_=..."
            )
        kwargs = {k: v for k, v in node.items() if k != "enabled"}
        if node.get("enabled", True):
            with configured(f"losses.{name}"):
                losses[name] = instantiate(kwargs, _convert_="all")
    return losses


def build_env_factory(env_cfg: DictConfig, device: torch.device) -> Callable[..., Env]:
    """The env factory (``machina.env.factory``) of the composed ``env`` node: the one way training and its
    evaluation build envs. The node comes from conf/ and the command line, not from a file, so its ``_target_`` may
    name any ``Env`` subclass; the class is looked up here."""
    settings = OmegaConf.to_container(env_cfg, resolve=True)
    env_class = named_class("env._target_", settings.get("_target_"), Env, "an env")
    return env_factory(settings, device, env_class)


def named_class(key: str, target: object, base: type, kind: str) -> type:
    """The class a composed config's ``key`` (``env._target_``) names, a subclass of ``base`` (``kind`` in words,
    for messages). The composed config is the user's choice, so any class may be imported here; what a file names
    goes through ``machina.files.trusted`` instead."""
    if not isinstance(target, str):
        raise ConfigError(f"{key} is {target!r}, not the name of a class; name {kind} class: {key}=module.Class")
    try:
        cls = get_class(target)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the import's error in several types
        raise ConfigError(f"{key}={target} names no class that can be imported ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{key}={target} is not {kind} (a {base.__module__}.{base.__qualname__} subclass)")
    return cls


def check_env_outputs(losses: dict[str, Loss], env_spec: EnvSpec, env_target: str) -> None:
    """Refuse at start-up, before the env's first step, a loss that reads an env output the env does not declare
    (``Loss.env_outputs`` against ``EnvSpec.outputs``)."""
    declared = ", ".join(sorted(env_spec.outputs)) or "none"
    for name, loss in losses.items():
        for key in sorted(type(loss).env_outputs - env_spec.outputs):
            raise ConfigError(
                f"loss '{name}' reads the env output {key}, which env {env_target} does not declare (its optional "
                f"outputs: {declared}); choose an env that declares it or disable the loss with "
                f"losses.{name}.enabled=false"
            )


def check_policy_outputs(losses: dict[str, Loss], policy) -> None:
    """Refuse at start-up a policy that does not write what an enabled loss consumes."""
    written = set(policy.output_keys())
    for name, loss in losses.items():
        missing = sorted(type(loss).consumes - written)
        if not missing:
            continue
        if keys.FULL_LOG_PROBS in missing:
            raise ConfigError(
                f"loss '{name}' consumes {keys.FULL_LOG_PROBS}, but policy.action_probs.emit_full_log_probs=false "
                f"was forced; drop the override policy.action_probs.emit_full_log_probs=false (it is derived from "
                f"the enabled losses) or disable the loss with losses.{name}.enabled=false"
            )
        fix = (
            "add +policy.critic.horizons=<number of the loss's gammas>"
            if missing[0] == keys.HORIZON_VALUES
            else "choose a policy that writes it"
        )
        raise ConfigError(
            f"loss '{name}' consumes {missing[0]}, which the policy does not write (it writes {sorted(written)}); "
            f"{fix}, or disable the loss with losses.{name}.enabled=false"
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
