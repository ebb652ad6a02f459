"""Policy files: weights plus the plain-data architecture needed to rebuild the policy, loaded safely.

A policy file is a dict of plain data and tensors only:
    {"format": "machina.policy/1", "architecture": <resolved policy config without its run-time flag
     action_probs.emit_full_log_probs (machina.policy.allowlist.architecture)>, "obs_spec": {...},
     "num_actions": int, "state_dict": {...}, "checksum": <sha256 of the rest, machina.files.checksum>}
A file from an untrusted source cannot run code or allocate more than it holds: it is read as bounded plain data
(``machina.files.torch_file``: ``torch.load(weights_only=True)`` after its archive and pickle are checked), and the
policy is rebuilt from the architecture through trusted classes only (``machina.policy.allowlist``: those the
configuration in force names), never by ``hydra.utils.instantiate``. A damaged file (its checksum does not match) or
one without a checksum is refused, and so are weights that are not all finite.
"""

from pathlib import Path
from typing import Any

import torch
from torch import nn

from machina.env.spec import ObsSpec, VectorObsSpec, obs_spec_from_dict, obs_spec_to_dict
from machina.errors import ConfigError
from machina.files import checksum, torch_file
from machina.files.snapshot import nonfinite
from machina.files.trusted import Trusted
from machina.policy.allowlist import architecture, build_policy, check_architecture, check_sizes

FORMAT = "machina.policy/1"


def policy_payload(
    policy: nn.Module, policy_config: dict[str, Any], obs_spec: ObsSpec | VectorObsSpec
) -> dict[str, Any]:
    """What a policy file holds (sealed with its checksum): ``torch.save`` it as it is. ``policy_config``: the
    resolved ``policy`` node; the file stores its ``architecture``."""
    return checksum.seal(
        {
            "format": FORMAT,
            "architecture": architecture(policy_config),
            "obs_spec": obs_spec_to_dict(obs_spec),
            "num_actions": int(policy.num_actions),
            # Copies: on the CPU .cpu() would alias the live weights, which may change before the payload is saved.
            "state_dict": {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()},
        }
    )


def read_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """A machina file's data with clear errors for a missing, truncated, damaged or foreign file: bounded plain data
    (``machina.files.torch_file``), a dict with a ``format``, and a checksum that matches."""
    data = torch_file.load(Path(path))
    if not isinstance(data, dict) or "format" not in data:
        raise ConfigError(f"checkpoint {str(path)!r} is not a machina checkpoint (no 'format' entry)")
    why = checksum.problem(data)
    if why:
        raise ConfigError(f"checkpoint {str(path)!r} is refused: {why}")
    return data


def check_policy_data(policy_data: Any, path: str | Path, trusted: Trusted | None = None) -> None:
    """Refuse a policy part (of a policy file or a checkpoint) that is not plain data naming ``trusted`` classes
    (None: machina's own ``conf/``), or whose weights are not all finite (a NaN teacher or resumed policy would only
    stop training later)."""
    where = f"checkpoint {str(path)!r}"
    if not isinstance(policy_data, dict) or policy_data.get("format") != FORMAT:
        found = policy_data.get("format") if isinstance(policy_data, dict) else type(policy_data).__name__
        raise ConfigError(f"{where} has a policy of format {found!r}, expected {FORMAT!r}")
    check_architecture(policy_data.get("architecture"), where, trusted)
    num_actions = policy_data.get("num_actions")
    if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
        raise ConfigError(f"{where}: num_actions is {num_actions!r}, not a positive integer")
    weights = policy_data.get("state_dict")
    if not isinstance(weights, dict) or not all(isinstance(w, torch.Tensor) for w in weights.values()):
        raise ConfigError(f"{where}: the policy's state_dict is not a mapping of names to tensors")
    bad = nonfinite(weights)
    if bad:
        raise ConfigError(
            f"{where}: the policy's weights hold NaN or infinite values (state_dict.{', state_dict.'.join(bad[:3])}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            + "); it cannot be resumed, evaluated or taught from"
        )


def load_policy(
    path: str | Path,
    device: torch.device | str = "cpu",
    emit_full_log_probs: bool = False,
    trusted: Trusted | None = None,
) -> tuple[nn.Module, ObsSpec | VectorObsSpec]:
    """Rebuild a policy from a policy file (or the policy part of a training checkpoint); return it and its
    observation spec. ``emit_full_log_probs`` is the caller's choice (off by default), not the file's; ``trusted``:
    the classes the file may name (the command's search path, ``machina.startup.trust``; None: machina's own)."""
    data = read_checkpoint_file(path)
    policy_data = data.get("policy", data)
    check_policy_data(policy_data, path, trusted)
    where = f"{'policy file' if data.get('format') == FORMAT else 'checkpoint'} {str(path)!r}"
    try:
        obs_spec = obs_spec_from_dict(policy_data["obs_spec"])
        architecture, num_actions = policy_data["architecture"], policy_data["num_actions"]
        check_sizes(architecture, obs_spec, num_actions, policy_data["state_dict"], where, trusted)
        policy = build_policy(architecture, obs_spec, num_actions, emit_full_log_probs, trusted)
        policy.load_state_dict(policy_data["state_dict"])
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a stale or edited file fails in the constructors or load_state_dict
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:240]
        raise ConfigError(
            f"{where}: its policy cannot be rebuilt from its own architecture ({reason}); it was written by another "
            "machina version or edited"
        ) from None
    return policy.to(device), obs_spec


def load_teacher(path: str | None, trusted: Trusted | None = None) -> nn.Module:
    """A frozen teacher network from a policy file (``path``: a loss's ``teacher.path``), in eval mode and emitting
    ``FULL_LOG_PROBS``; its observation spec is ``teacher.obs_spec``. Built by ``machina.startup.build`` (the one
    place that reads files for the experiment) and handed to the loss. A refusal names ``path`` relative to the
    teacher's node, and the builder puts the node's path in front (``losses.eer_kickstarter.teacher.path=...``)."""
    if not path:
        raise ConfigError(
            f"path={path!r} names no teacher: set it to a machina policy file (outputs/<run>/checkpoints/policy_*.pt)"
        )
    try:
        teacher, _ = load_policy(path, emit_full_log_probs=True, trusted=trusted)
    except ConfigError as err:
        raise ConfigError(f"path={path!r}: {err}") from None
    return teacher.requires_grad_(False).eval()
