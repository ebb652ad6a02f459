"""Policy files: weights plus the plain-data architecture needed to rebuild the policy, loaded safely.

A policy file is a dict of plain data and tensors only (``torch.load(weights_only=True)`` refuses anything else,
so a file from an untrusted source cannot run code):
    {"format": "machina.policy/1", "architecture": <resolved policy config>, "obs_spec": {...},
     "num_actions": int, "state_dict": {...}}
"""

from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from machina.env.spec import ObsSpec, VectorObsSpec, obs_spec_from_dict, obs_spec_to_dict
from machina.errors import ConfigError

FORMAT = "machina.policy/1"


def policy_payload(
    policy: nn.Module, architecture: dict[str, Any], obs_spec: ObsSpec | VectorObsSpec
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "architecture": architecture,
        "obs_spec": obs_spec_to_dict(obs_spec),
        "num_actions": int(policy.num_actions),
        "state_dict": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
    }


def read_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` with clear errors for a missing, truncated or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {str(path)!r} does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling errors come in many types; all mean "not loadable"
        raise ConfigError(
            f"checkpoint {str(path)!r} cannot be loaded safely ({type(err).__name__}: {str(err)[:200]}); it is "
            "truncated, not a machina checkpoint, or carries pickled objects, which are refused"
        ) from None
    if not isinstance(data, dict) or "format" not in data:
        raise ConfigError(f"checkpoint {str(path)!r} is not a machina checkpoint (no 'format' entry)")
    return data


def load_policy(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ObsSpec | VectorObsSpec]:
    """Rebuild a policy from a policy file (or the policy part of a training checkpoint); return it and its
    observation spec."""
    data = read_checkpoint_file(path)
    policy_data = data.get("policy", data)
    if policy_data.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {str(path)!r} has format {policy_data.get('format')!r}, expected {FORMAT!r}")
    try:
        obs_spec = obs_spec_from_dict(policy_data["obs_spec"])
        policy = instantiate(policy_data["architecture"], obs_spec=obs_spec, num_actions=policy_data["num_actions"])
        policy.load_state_dict(policy_data["state_dict"])
    except Exception as err:  # noqa: BLE001 - a stale or edited file fails in instantiate or load_state_dict
        raise ConfigError(
            f"checkpoint {str(path)!r}: its policy cannot be rebuilt from its own architecture "
            f"({type(err).__name__}: {str(err)[:200]}); it was written by another machina version or edited"
        ) from None
    return policy.to(device), obs_spec
