"""Rebuild a policy from the architecture stored in a file, through trusted classes only.

A file from elsewhere is data. ``hydra.utils.instantiate`` would import and call whatever a ``_target_`` names, nested
ones included (``_target_: builtins.open`` inside an argument runs before the policy is built), so a file's
architecture never goes through it. Here the architecture may name only policy components that the configuration in
force names (``machina.files.trusted``: a ``_target_`` of a YAML file on the config search path, or of the composed
config), and give them plain values; a name no trusted config holds is refused before anything is imported. Its
shape is that of a resolved ``policy`` config (conf/policy/*.yaml):

    _target_: machina.policy.component.ComponentPolicy     (optionally _convert_, as Hydra spells it)
    encoder / core / actor / critic: {_target_: <component>, _partial_: true, <argument>: <plain value>, ...}
    action_probs: {_target_: machina.policy.action_probs.ActionProbs}

``core`` may be None or "none" (a feed-forward policy). A plain value is a number, string, bool or None, or a list
of those. ``action_probs.emit_full_log_probs`` is not architecture: the run derives it from its enabled losses
(machina/startup/resolvers.py), so a file stores the policy config without it (``architecture``), refuses it, and
whoever builds the policy passes it (``build_policy``).
"""

from functools import partial
from typing import Any

import torch

from machina import checks
from machina.env.spec import ObsSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.files.stored_config import PLAIN
from machina.files.trusted import Trusted, in_force
from machina.policy.component import Component, ComponentPolicy

POLICY = "machina.policy.component.ComponentPolicy"
# Slots that ComponentPolicy calls as factories (``_partial_: true``); action_probs is the component itself.
FACTORY_SLOTS = ("encoder", "core", "actor", "critic")
SLOTS = (*FACTORY_SLOTS, "action_probs")
CONVERT_MODES = ("none", "partial", "object", "all")  # Hydra's ConvertMode values
MAX_LIST = 64  # items of a list argument (a policy's hidden widths, the Perceiver's frequencies)
MAX_INT = 2**31  # no width or count of a policy comes near it
# (slot, argument): the one setting of a policy config that is not architecture but a run-time flag.
RUN_TIME = ("action_probs", "emit_full_log_probs")


def architecture(policy_config: dict[str, Any]) -> dict[str, Any]:
    """``policy_config`` (a resolved ``policy`` node) as a policy file or checkpoint stores it: without its run-time
    flag ``action_probs.emit_full_log_probs``."""
    slot, flag = RUN_TIME
    node = policy_config.get(slot)
    if not isinstance(node, dict):
        return policy_config
    return {**policy_config, slot: {k: v for k, v in node.items() if k != flag}}


def check_architecture(architecture: Any, source: str, trusted: Trusted | None = None) -> None:
    """Refuse, with a one-line ConfigError naming ``source`` and the entry (``architecture.encoder.embed_dim``),
    anything that is not a trusted policy component with plain values. ``trusted``: the classes the configuration in
    force names (None: ``machina.files.trusted.in_force``)."""
    trusted = trusted or in_force()

    def refuse(entry: str, why: str) -> ConfigError:
        return ConfigError(
            f"{source}: architecture{entry} {why}; a policy file is data and may name only policy components that the "
            "configuration in force names, with plain values"
        )

    if not isinstance(architecture, dict):
        raise refuse("", f"is a {type(architecture).__name__}, not a mapping")
    if architecture.get("_target_") != POLICY:
        raise refuse("._target_", f"is {architecture.get('_target_')!r}, not {POLICY!r}")
    for key in architecture:
        if key not in ("_target_", "_convert_", *SLOTS):
            raise refuse(f".{key}", "is not an entry of a policy")
    check_convert(architecture, "", refuse)
    for slot in SLOTS:
        node, entry = architecture.get(slot), f".{slot}"
        if slot == "core" and is_none(node):
            continue
        if not isinstance(node, dict):
            raise refuse(entry, f"is {node!r}, not a component")
        trusted.resolve(node.get("_target_"), Component, f"{source}: architecture{entry}._target_")
        if node.get("_partial_", False) is not (slot in FACTORY_SLOTS):
            needed = slot in FACTORY_SLOTS
            raise refuse(f"{entry}._partial_", f"is {node.get('_partial_')!r}; the {slot} slot needs {needed}")
        check_convert(node, entry, refuse)
        for key, value in node.items():
            if key in ("_target_", "_partial_", "_convert_"):
                continue
            if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
                raise refuse(f"{entry}.{key}", "is not an argument name")
            if (slot, key) == RUN_TIME:  # files written before it left architecture hold it; the loader decides
                if not isinstance(value, bool):
                    raise refuse(f"{entry}.{key}", f"is {value!r}, not a boolean")
                continue
            check_argument(value, f"{entry}.{key}", refuse)


def check_convert(node: dict, entry: str, refuse) -> None:
    if "_convert_" in node and node["_convert_"] not in CONVERT_MODES:
        raise refuse(f"{entry}._convert_", f"is {node['_convert_']!r}, not one of {', '.join(CONVERT_MODES)}")


def check_argument(value: Any, entry: str, refuse) -> None:
    """A component's argument: a plain value (``machina.files.stored_config.PLAIN``) or a list of at most
    ``MAX_LIST`` of them, no integer beyond ``MAX_INT``."""
    if isinstance(value, list) and len(value) > MAX_LIST:
        raise refuse(entry, f"has {len(value)} items; a policy argument has at most {MAX_LIST}")
    for i, item in enumerate(value if isinstance(value, list) else [value]):
        at = f"{entry}[{i}]" if isinstance(value, list) else entry
        if not isinstance(item, PLAIN):
            raise refuse(at, f"is a {type(item).__name__}, not a plain value")
        if checks.is_integer(item) and abs(item) >= MAX_INT:
            raise refuse(at, f"is {item}, beyond any size a policy takes ({MAX_INT:,})")


def check_sizes(
    architecture: dict[str, Any],
    obs_spec: ObsSpec | VectorObsSpec,
    num_actions: int,
    state_dict: dict[str, Any],
    source: str,
    trusted: Trusted | None = None,
) -> None:
    """Refuse an architecture whose parameters are not those of ``state_dict`` (the weights the same file holds,
    bounded by its size) before anything is allocated: the policy is built on the meta device, which allocates
    nothing, and the names and shapes are compared. An architecture claiming a billion-wide layer next to small
    weights is refused here instead of being allocated."""
    with torch.device("meta"):
        policy = build_policy(architecture, obs_spec, num_actions, trusted=trusted)
    expected = {name: tuple(t.shape) for name, t in policy.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in state_dict.items() if isinstance(t, torch.Tensor)}
    for name in sorted(set(expected) | set(found)):
        if expected.get(name) != found.get(name):
            raise ConfigError(
                f"{source}: its architecture makes {name} of shape {expected.get(name)} but its weights hold "
                f"{found.get(name)}; the file was edited or damaged"
            )


def is_none(node: Any) -> bool:
    return node is None or (isinstance(node, str) and node.lower() == "none")


def build_policy(
    architecture: dict[str, Any],
    obs_spec: ObsSpec | VectorObsSpec,
    num_actions: int,
    emit_full_log_probs: bool = False,
    trusted: Trusted | None = None,
) -> ComponentPolicy:
    """The policy an architecture describes (checked first with ``check_architecture`` against the same
    ``trusted``), emitting ``FULL_LOG_PROBS`` when the caller says so (``emit_full_log_probs``: a run-time flag, not
    architecture)."""
    trusted = trusted or in_force()
    slots: dict[str, Any] = {}
    for slot in SLOTS:
        node = architecture[slot]
        if slot == "core" and is_none(node):
            slots[slot] = None
            continue
        kwargs = {k: v for k, v in node.items() if k not in ("_target_", "_partial_", "_convert_")}
        cls = trusted.resolve(node["_target_"], Component, f"architecture.{slot}._target_")
        if slot == RUN_TIME[0]:
            kwargs[RUN_TIME[1]] = emit_full_log_probs
        slots[slot] = partial(cls, **kwargs) if slot in FACTORY_SLOTS else cls(**kwargs)
    return ComponentPolicy(obs_spec, num_actions, **slots)
