"""``check_component``: a policy component against what ``ComponentPolicy`` and the trainer rely on.

A component fills one slot of a ``ComponentPolicy`` (``machina.policy.component``), found from the key it writes:
``ENCODED`` the encoder, ``CORE`` the core, ``LOGITS`` the actor, ``VALUES`` the critic (``ActionProbs``, which
writes the actions, the last). It is checked inside a policy: the one given, or machina's smallest parts around it,
on small example observations of each kind it builds with (``EXAMPLES``). One use, in a user's own tests::

    check_component({"_target_": "my_lab.encoder.MyEncoder", "_partial_": True, "hidden": 16})
"""

import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from machina import keys
from machina.conformance.component_calls import (
    KEY_NAMES,
    NUM_ACTIONS,
    SLOT_OF,
    check_declared,
    check_rollout_step,
    check_training_forward,
    example_inputs,
)
from machina.conformance.failure import ConformanceError
from machina.env.spec import ImageObsSpec, ObsSpec, VectorObsSpec
from machina.errors import ConfigError, one_line
from machina.files.trusted import in_force
from machina.policy.allowlist import build_policy
from machina.policy.component import Component, ComponentPolicy
from machina.policy.io import load_policy, policy_payload

# Small observations of each kind a policy may read: tokens (the built-in env, MettaGrid), vectors (Gymnasium) and
# images (PettingZoo's (H, W, C) Boxes).
EXAMPLES: tuple[ObsSpec | VectorObsSpec, ...] = (
    ObsSpec(max_tokens=12, window=5, feature_names=("wall", "agent", "hp", "clock"), feature_norms=(1, 1, 10, 255)),
    VectorObsSpec(size=6),
    ImageObsSpec(size=50, height=5, width=5, channels=2),
)
SLOTS = ("encoder", "core", "actor", "critic", "action_probs")
# machina's smallest part of each slot, around the one checked: a token or a vector encoder, no core, linear heads.
AROUND: dict[str, Any] = {
    "tokens": {
        "_target_": "machina.policy.bag_encoder.TokenBagEncoder",
        "_partial_": True,
        "embed_dim": 8,
        "hidden": 8,
    },
    "vector": {"_target_": "machina.policy.vector_encoder.VectorEncoder", "_partial_": True, "hidden": [8]},
    "image": {"_target_": "machina.policy.conv_encoder.ConvEncoder", "_partial_": True, "channels": [4], "hidden": 8},
    "core": None,
    "actor": {"_target_": "machina.policy.heads.ActorHead", "_partial_": True},
    "critic": {"_target_": "machina.policy.heads.CriticHead", "_partial_": True},
    "action_probs": {"_target_": "machina.policy.action_probs.ActionProbs"},
}


def check_component(
    component: type | partial | Mapping[str, Any],
    policy: Mapping[str, Any] | None = None,
    obs: ObsSpec | VectorObsSpec | None = None,
) -> None:
    """Raise ``ConformanceError`` (one sentence: what to implement) unless ``component`` meets the contract::

        check_component({"_target_": "my_lab.encoder.MyEncoder", "_partial_": True, "hidden": 16})

    Args:
        component: the component's class, a ``functools.partial`` of it with settings, or its slot's config
            (``{"_target_": ..., "_partial_": true, <settings>}``, as in ``conf/policy/*.yaml``).
        policy: a policy config (a ``conf/policy/*.yaml`` as a dict) to check it in, its slot replaced; by default
            machina's smallest parts around it.
        obs: the observations to check it with; by default every kind in ``EXAMPLES`` it builds with (one at least).

    Checked: it subclasses ``Component``; ``in_keys`` / ``out_keys`` / ``out_widths`` / ``input_spec`` /
    ``state_widths`` against what a training forward ([B, T]) and a rollout step (``act``) read and write (keys,
    shapes, dtypes, device); ``act`` gives ``forward``'s values at T = 1; every parameter gets a gradient; built on
    the meta device it allocates nothing; a policy file (``machina.policy.io``) holding it loads with identical
    outputs.
    """
    node = component_config(component)
    try:
        cls = in_force(node).resolve(node["_target_"], Component, "the component's _target_")
    except ConfigError as err:
        raise ConformanceError(
            f"{one_line(err)}: name a subclass of machina.policy.component.Component by its module path"
        ) from None
    name = cls.__name__
    slot = slot_of(cls)
    if slot == "action_probs":  # the component itself, not a factory
        node.pop("_partial_", None)
    built = []
    for spec in (obs,) if obs is not None else EXAMPLES:
        config = policy_config(node, slot, spec, policy)
        try:
            built.append((spec, config, build(config, spec)))
        except Exception as err:  # noqa: BLE001 - a component that does not take this kind of observation
            refusal = f"{type(err).__name__}: {one_line(err)}"
    if not built:
        raise ConformanceError(
            f"{name} cannot be built in policy.{slot} ({refusal}); its constructor must take a "
            "machina.policy.component.PolicyDims and build from its obs, num_actions and widths"
        )
    for spec, config, built_policy in built:
        check_built(built_policy, slot, name, spec, config)


def observation_kinds(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of observations (``ObsSpec.kind``: "tokens", "vector", "image") a policy config builds with: those of
    ``EXAMPLES`` its encoder takes. What tells which envs a policy can play."""
    kinds = []
    for spec in EXAMPLES:
        try:
            build(policy_config(dict(policy["encoder"]), "encoder", spec, policy), spec)
        except Exception:  # noqa: BLE001 - an encoder refuses another kind of observation in its own way
            continue
        kinds.append(spec.kind)
    return tuple(kinds)


def component_config(component: type | partial | Mapping[str, Any]) -> dict[str, Any]:
    """The slot's config of a class, a ``functools.partial`` of one, or a config mapping (returned as a dict)."""
    if isinstance(component, Mapping):
        return dict(component)
    settings = {}
    if isinstance(component, partial):
        component, settings = component.func, dict(component.keywords)
    return {"_target_": f"{component.__module__}.{component.__qualname__}", "_partial_": True, **settings}


def slot_of(cls: type) -> str:
    """The slot a component class fills, from the key it writes (``ActionProbs``-like: ``action_probs``)."""
    if not isinstance(cls.out_keys, tuple):
        return "action_probs"  # its out_keys depend on the instance (whether it emits full log-probabilities)
    slots = [SLOT_OF[key] for key in cls.out_keys if key in SLOT_OF]
    if len(slots) != 1:
        wanted = ", ".join(f"{KEY_NAMES[key]} ({slot})" for key, slot in SLOT_OF.items())
        raise ConformanceError(
            f"{cls.__name__} lists {list(cls.out_keys)} in out_keys: a component fills one slot, so list exactly one "
            f"of {wanted}"
        )
    return slots[0]


def policy_config(
    node: dict[str, Any], slot: str, spec: ObsSpec | VectorObsSpec, policy: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A policy config with ``node`` in ``slot``: ``policy`` (or machina's smallest parts for ``spec``'s kind)."""
    if policy is None:
        policy = {
            "_target_": "machina.policy.component.ComponentPolicy",
            "_convert_": "object",
            "encoder": AROUND[spec.kind],
            **{other: AROUND[other] for other in SLOTS[1:]},
        }
    config = {key: dict(value) if isinstance(value, Mapping) else value for key, value in policy.items()}
    config[slot] = dict(node)
    return config


def build(config: dict[str, Any], spec: ObsSpec | VectorObsSpec) -> ComponentPolicy:
    """The policy ``config`` describes, emitting ``FULL_LOG_PROBS``: built as a policy file is, from the classes
    the config names (which the caller chose to run)."""
    torch.manual_seed(0)
    return build_policy(config, spec, NUM_ACTIONS, emit_full_log_probs=True, trusted=in_force(config))


def check_built(policy: ComponentPolicy, slot: str, name: str, spec: ObsSpec | VectorObsSpec, config: dict) -> None:
    component = getattr(policy, slot)
    check_declared(component, name)
    inputs = example_inputs(policy, spec)
    written = check_training_forward(policy, component, name, inputs)
    written |= check_rollout_step(policy, component, name, inputs)
    for key in component.out_keys:
        if key not in written:
            raise ConformanceError(f"{name} lists {key} in out_keys but never writes it: write it or drop it")
    check_gradients(policy, component, name, inputs)
    check_meta(config, spec, slot, name)
    check_policy_file(policy, config, spec, name, inputs)


def check_gradients(policy: ComponentPolicy, component: Component, name: str, inputs: TensorDict) -> None:
    out = policy.train()(inputs.clone())
    total = out[keys.ACT_LOG_PROB].sum() + out[keys.ENTROPY].sum() + out[keys.VALUES].sum()
    total.backward()
    for parameter_name, parameter in component.named_parameters():
        if parameter.grad is None:
            raise ConformanceError(
                f"{name}'s parameter {parameter_name} gets no gradient from the policy's outputs: compute its outputs "
                "from it with differentiable ops"
            )
        if not parameter.grad.isfinite().all():
            raise ConformanceError(f"{name}'s parameter {parameter_name} gets a non-finite gradient: keep it finite")
    policy.zero_grad(set_to_none=True)


def check_meta(config: dict, spec: ObsSpec | VectorObsSpec, slot: str, name: str) -> None:
    """Built under ``torch.device("meta")`` (how a file's sizes are checked before anything is allocated), a
    component allocates nothing: every parameter and buffer is on the meta device."""
    with torch.device("meta"):
        try:
            policy = build(config, spec)
        except Exception as err:  # noqa: BLE001 - reading a value of a meta tensor fails in many ways
            raise ConformanceError(
                f"{name} cannot be built on the meta device ({type(err).__name__}: {one_line(err)}): size it from "
                "PolicyDims' plain numbers, reading no tensor value in its constructor"
            ) from None
    for tensor_name, tensor in [*getattr(policy, slot).named_parameters(), *getattr(policy, slot).named_buffers()]:
        if tensor.device.type != "meta":
            raise ConformanceError(
                f"{name} allocates {tensor_name} on {tensor.device} when built on the meta device: create its tensors "
                "without an explicit device"
            )


def check_policy_file(
    policy: ComponentPolicy, config: dict, spec: ObsSpec | VectorObsSpec, name: str, inputs: TensorDict
) -> None:
    """A policy file of the policy (``machina.policy.io``) loads into a policy with identical outputs."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "policy.pt"
        torch.save(policy_payload(policy, config, spec), path)
        try:
            loaded, _ = load_policy(path, emit_full_log_probs=True, trusted=in_force(config))
        except ConfigError as err:
            raise ConformanceError(
                f"a policy file holding {name} cannot be loaded ({one_line(err)}): its settings must be plain values "
                "and its class one the trusted configuration names"
            ) from None
    with torch.no_grad():
        want, got = policy.eval()(inputs.clone()), loaded.eval()(inputs.clone())
    for key in (keys.LOGITS, keys.VALUES, keys.ACT_LOG_PROB, *policy.state_widths):
        key = keys.NEXT_STATE.get(key, key)
        if not torch.equal(want[key], got[key]):
            raise ConformanceError(
                f"a policy loaded from a file holding {name} gives other {key}: keep every weight in its state_dict "
                "and derive the rest from its settings"
            )
