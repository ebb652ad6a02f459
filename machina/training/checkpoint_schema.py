"""The structure of a training checkpoint (``checkpoint.py``), checked when it is loaded, before anything is built.

A matching checksum proves no author (``machina.files.checksum``): an edited file can be re-sealed. So ``check``
refuses, with a ConfigError naming the file and the entry, anything but what ``Checkpointer.save`` writes:

    format                  "machina.checkpoint/3" (checked by ``load_checkpoint``)
    policy                  a policy file's payload with finite weights (``machina.policy.io.check_policy_data``)
    trainer.epoch           an integer >= 0
    trainer.agent_step      an integer >= 0
    trainer.history         a list of mappings of names to numbers (one per epoch)
    trainer.policy          {name: tensor}: the policy's own (training) weights
    trainer.learner         {"optimizer": {"state": {int: {name: tensor}}, "param_groups": [{"params": [int], ...}]}},
                            every floating-point tensor finite; with a weight average also "average": {"updates":
                            int >= 0, "weights": {name: tensor}}
    ranks                   a non-empty list of {"env": {name: tensor}, "rollout": {"step": packed, "state": packed},
                            "losses": {name: mapping}, "rng": RNG states (``state.check_rng``)}
    run_id                  None or the run's id: 1 to 64 letters, digits, "-" or "_"
    config                  a mapping

"packed" is a TensorDict as ``state.pack`` writes it. Whether the state fits the built run (shapes, dtypes and value
ranges of the policy's, the env's, the rollout's, the losses' and the optimizer's state) is checked where each part
restores it (their ``load_state_dict``), also before the run folder changes.

A ``machina.checkpoint/2`` file (until this layout) is read through ``from_format_2``, which lays its entries out as
above: its ``policy`` was the produced policy (the average with ``learner.average_horizon``) and the training weights
were ``trainer.learner.average.training_weights`` when averaging, else the policy itself; ``run_id`` was
``wandb_run_id``.
"""

import re
from pathlib import Path
from typing import Any

import torch

from machina import checks
from machina.errors import ConfigError
from machina.files import saved_state
from machina.files.saved_state import INT64_MAX, within
from machina.files.snapshot import check_rng, nonfinite

FORMAT = "machina.checkpoint/3"
FORMAT_2 = "machina.checkpoint/2"
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
TRAINER_KEYS = ("epoch", "agent_step", "history", "policy", "learner")
RANK_KEYS = ("env", "rollout", "losses", "rng")


def check(data: dict[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint whose entries (but format and policy) are not what the module docstring says."""
    with within(f"checkpoint {str(path)!r}: "):
        trainer = saved_state.mapping(data.get("trainer"), "trainer", TRAINER_KEYS)
        with within("trainer."):
            _check_trainer(trainer)
        ranks = data.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise ConfigError(f"ranks is {saved_state.describe(ranks)}, not a non-empty list")
        for index, rank in enumerate(ranks):
            rank = saved_state.mapping(rank, f"ranks[{index}]", RANK_KEYS)
            with within(f"ranks[{index}]."):
                _check_rank(rank)
        run_id = data.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            raise ConfigError(f"run_id is {run_id!r}, not a run id (1 to 64 letters, digits, - or _)")
        saved_state.mapping(data.get("config"), "config")


def _check_trainer(trainer: dict[str, Any]) -> None:
    checks.integer("epoch", trainer["epoch"], 0, INT64_MAX)
    checks.integer("agent_step", trainer["agent_step"], 0, INT64_MAX)
    history = trainer["history"]
    if not isinstance(history, list):
        raise ConfigError(f"history is {saved_state.describe(history)}, not a list")
    for index, row in enumerate(history):
        numbers = isinstance(row, dict) and all(
            isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool)
            for key, value in row.items()
        )
        if not numbers:
            raise ConfigError(f"history[{index}] is {saved_state.describe(row)}, not a mapping of names to numbers")
    tensors(trainer["policy"], "policy")
    learner = saved_state.mapping(trainer["learner"], "learner", ("optimizer",), optional=("average",))
    with within("learner."):
        _check_optimizer(learner["optimizer"])
        if "average" in learner:
            average = saved_state.mapping(learner["average"], "average", ("updates", "weights"))
            saved_state.integer(average["updates"], "average.updates", 0)
            tensors(average["weights"], "average.weights")


def tensors(value: Any, name: str) -> dict[str, torch.Tensor]:
    """``value``, which must be a mapping of names to tensors."""
    for key, tensor in saved_state.mapping(value, name).items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"{name}.{key} is {saved_state.describe(tensor)}, not a tensor")
    return value


def _check_optimizer(optimizer: Any) -> None:
    """An optimizer's ``state_dict()``: per-parameter state as tensors (finite), and groups listing parameter ids."""
    optimizer = saved_state.mapping(optimizer, "optimizer", ("state", "param_groups"))
    state, groups = optimizer["state"], optimizer["param_groups"]
    if not isinstance(state, dict):
        raise ConfigError(f"optimizer.state is {saved_state.describe(state)}, not a mapping")
    for param, entries in state.items():
        checks.integer(f"optimizer.state key {param!r}", param, 0, INT64_MAX)
        entries = saved_state.mapping(entries, f"optimizer.state.{param}")
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor):
                raise ConfigError(f"optimizer.state.{param}.{key} is {saved_state.describe(value)}, not a tensor")
    bad = nonfinite({str(param): entries for param, entries in state.items()})
    if bad:
        raise ConfigError(f"optimizer.state.{bad[0]} holds NaN or infinite values")
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"optimizer.param_groups is {saved_state.describe(groups)}, not a non-empty list")
    for index, group in enumerate(groups):
        params = group.get("params") if isinstance(group, dict) else None
        if not isinstance(params, list) or not all(type(p) is int for p in params):
            raise ConfigError(f"optimizer.param_groups[{index}] is not a mapping with a list of parameter ids")


def _check_rank(rank: dict[str, Any]) -> None:
    tensors(rank["env"], "env")
    rollout = saved_state.mapping(rank["rollout"], "rollout", ("step", "state"))
    for part in ("step", "state"):
        check_packed(rollout[part], f"rollout.{part}")
    losses = saved_state.mapping(rank["losses"], "losses")
    for name, loss in losses.items():
        saved_state.mapping(loss, f"losses.{name}")
    check_rng(rank["rng"])


def check_packed(packed: Any, name: str) -> None:
    """A TensorDict as ``state.pack`` writes it: ``{"tensors": {name: tensor or mapping}, "batch_size": [int]}``."""
    packed = saved_state.mapping(packed, name, ("tensors", "batch_size"))
    batch = packed["batch_size"]
    if not isinstance(batch, list) or not all(type(size) is int and size >= 0 for size in batch):
        raise ConfigError(f"{name}.batch_size is {batch!r}, not a list of sizes")
    pending = [(packed["tensors"], f"{name}.tensors")]
    while pending:
        tensors, entry = pending.pop()
        for key, value in saved_state.mapping(tensors, entry).items():
            if isinstance(value, dict):
                pending.append((value, f"{entry}.{key}"))
            elif not isinstance(value, torch.Tensor):
                raise ConfigError(f"{entry}.{key} is {saved_state.describe(value)}, not a tensor")


def from_format_2(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A ``machina.checkpoint/2`` file's data laid out as this format's (see the module docstring), its policy
    payload already checked (``check_policy_data``). What it does not take apart is left for ``check`` to refuse."""
    produced = data["policy"]["state_dict"]
    with within(f"checkpoint {str(path)!r}: "):
        trainer = saved_state.mapping(data.get("trainer"), "trainer")
        learner = dict(saved_state.mapping(trainer.get("learner"), "trainer.learner"))
        average = learner.pop("average", None)
        if average is None:
            policy = dict(produced)
        else:
            average = saved_state.mapping(average, "trainer.learner.average", ("updates", "training_weights"))
            training = tensors(average["training_weights"], "trainer.learner.average.training_weights")
            policy = {**produced, **training}
            averaged = {name: produced.get(name) for name in training}
            learner["average"] = {"updates": average["updates"], "weights": averaged}
    rest = {key: value for key, value in data.items() if key not in ("format", "trainer", "wandb_run_id")}
    return {
        **rest,
        "format": FORMAT,
        "trainer": {**trainer, "policy": policy, "learner": learner},
        "run_id": data.get("wandb_run_id"),
    }
