"""Checks of a saved optimizer state before a resume loads it (``Learner.load_state_dict``): a state the optimizer
could not step from is refused with the entry named, before the run folder changes."""

import torch

from machina.errors import ConfigError
from machina.files import saved_state
from machina.files.saved_state import within

# Optimizer state entries that are never negative (step counts, second moments): a negative one makes NaN weights.
NONNEGATIVE = ("step", "exp_avg_sq", "max_exp_avg_sq")


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Refuse saved optimizer state that ``optimizer`` could not step from, naming the entry (ConfigError): its groups
    must list as many parameter ids as this optimizer's, each id once; each parameter's state must be empty or hold
    exactly the entries a fresh step of this optimizer makes, floating point and finite, of the parameter's shape (or
    0-d where the fresh one is: a step count), and >= 0 for ``NONNEGATIVE`` entries."""
    groups, state = saved["param_groups"], saved["state"]
    counts, own = [len(g["params"]) for g in groups], [len(g["params"]) for g in optimizer.param_groups]
    if counts != own:
        raise ConfigError(f"optimizer.param_groups hold {counts} parameters, this policy's optimizer {own}")
    ids = [index for group in groups for index in group["params"]]
    if len(set(ids)) != len(ids) or not set(state) <= set(ids):
        raise ConfigError("optimizer.param_groups do not list each parameter of optimizer.state once")
    for saved_group, group in zip(groups, optimizer.param_groups, strict=True):
        fresh = fresh_state(optimizer, group)
        for index, param in zip(saved_group["params"], group["params"], strict=True):
            entries = state.get(index, {})
            if entries and set(entries) != set(fresh):
                raise ConfigError(f"optimizer.state.{index} holds {sorted(entries)}, expected {sorted(fresh)}")
            for key, value in entries.items():
                if not value.is_floating_point():
                    raise ConfigError(f"optimizer.state.{index}.{key} has dtype {value.dtype}, not a floating one")
                shape = tuple(param.shape) if fresh[key].dim() else ()
                with within(f"optimizer.state.{index}."):
                    saved_state.tensor(entries, key, shape, value.dtype, 0 if key in NONNEGATIVE else None)


def fresh_state(optimizer: torch.optim.Optimizer, group: dict) -> dict[str, torch.Tensor]:
    """The state one step of a throwaway ``type(optimizer)`` with ``group``'s settings makes for a parameter of shape
    [2]: which entries a parameter's state holds, and which of them are 0-d."""
    first = group["params"][0]
    probe = torch.zeros(2, dtype=first.dtype, device=first.device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    throwaway = type(optimizer)([{**group, "params": [probe]}])
    throwaway.step()
    return throwaway.state[probe]
