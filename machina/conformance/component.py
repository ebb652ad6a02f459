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
from hydra.utils import get_class, instantiate
from tensordict import TensorDict

from machina import keys
from machina.conformance.failure import ConformanceError
from machina.env.spec import PAD_TOKEN, ObsSpec, VectorObsSpec
from machina.errors import ConfigError, one_line
from machina.policy.component import Component, ComponentPolicy
from machina.policy.io import load_policy, policy_payload

# Small observations of each kind a policy may read: tokens (the built-in env, MettaGrid) and vectors (Gymnasium).
EXAMPLES: tuple[ObsSpec | VectorObsSpec, ...] = (
    ObsSpec(max_tokens=12, window=5, feature_names=("wall", "agent", "hp", "clock"), feature_norms=(1, 1, 10, 255)),
    VectorObsSpec(size=6),
)
NUM_ACTIONS = 5
BATCH, STEPS = 3, 4
SLOTS = ("encoder", "core", "actor", "critic", "action_probs")
SLOT_OF = {keys.ENCODED: "encoder", keys.CORE: "core", keys.LOGITS: "actor", keys.VALUES: "critic"}
# machina's smallest part of each slot, around the one checked: a token or a vector encoder, no core, linear heads.
AROUND: dict[str, Any] = {
    "tokens": {
        "_target_": "machina.policy.bag_encoder.TokenBagEncoder",
        "_partial_": True,
        "embed_dim": 8,
        "hidden": 8,
    },
    "vector": {"_target_": "machina.policy.vector_encoder.VectorEncoder", "_partial_": True, "hidden": [8]},
    "core": None,
    "actor": {"_target_": "machina.policy.heads.ActorHead", "_partial_": True},
    "critic": {"_target_": "machina.policy.heads.CriticHead", "_partial_": True},
    "action_probs": {"_target_": "machina.policy.action_probs.ActionProbs"},
}
# Per-step outputs the trainer reads, by the shape it reads them with (N: agents x steps, A: actions).
FLAT = (keys.VALUES, keys.ACT_LOG_PROB, keys.ENTROPY, keys.ACTIONS)
PER_ACTION = (keys.LOGITS, keys.FULL_LOG_PROBS)
KEY_NAMES = {value: name for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)}


def check_component(
    component: type | partial | Mapping[str, Any],
    policy: Mapping[str, Any] | None = None,
    obs: ObsSpec | VectorObsSpec | None = None,
) -> None:
    """Raise ``ConformanceError`` (one sentence: what to implement) unless ``component`` meets the contract.

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
        cls = get_class(node["_target_"])
    except Exception as err:  # noqa: BLE001 - Hydra wraps the import's error in several types
        raise ConformanceError(
            f"_target_ {node['_target_']!r} names no class that can be imported ({one_line(err)}): name the "
            "component's class by its module path"
        ) from None
    name = cls.__name__
    if not (isinstance(cls, type) and issubclass(cls, Component)):
        raise ConformanceError(f"{name} is not a policy component: subclass machina.policy.component.Component")
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
    """The kinds of observations (``ObsSpec.kind``: "tokens", "vector") a policy config builds with: those of
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
    if not isinstance(cls.__dict__.get("out_keys", cls.out_keys), tuple):
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
    config["action_probs"] = {**config["action_probs"], "emit_full_log_probs": True}
    return config


def build(config: dict[str, Any], spec: ObsSpec | VectorObsSpec) -> ComponentPolicy:
    torch.manual_seed(0)
    return instantiate(config, obs_spec=spec, num_actions=NUM_ACTIONS)


def check_built(policy: ComponentPolicy, slot: str, name: str, spec: ObsSpec | VectorObsSpec, config: dict) -> None:
    component = getattr(policy, slot)
    check_declared(component, slot, name)
    inputs = example_inputs(policy, spec)
    written = check_training_forward(policy, component, name, inputs)
    written |= check_rollout_step(policy, component, name, inputs)
    for key in component.out_keys:
        if key not in written:
            raise ConformanceError(f"{name} lists {key} in out_keys but never writes it: write it or drop it")
    check_gradients(policy, component, slot, name, inputs)
    check_meta(config, spec, slot, name)
    check_policy_file(policy, config, spec, name, inputs)


def check_declared(component: Component, slot: str, name: str) -> None:
    """The declarations other parts read before any forward: widths, stored inputs, recurrent state."""
    for key, width in component.out_widths.items():
        if key not in component.out_keys:
            raise ConformanceError(f"{name} gives out_widths[{key!r}] for a key it does not list in out_keys: list it")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConformanceError(f"{name} gives out_widths[{key!r}] = {width!r}: give a positive integer width")
    own = {key for key in component.out_keys if key in SLOT_OF}
    for key in own - set(component.out_widths):
        raise ConformanceError(
            f"{name} writes {key} without its width: set out_widths[{KEY_NAMES[key]}] in its constructor, later "
            "components size themselves from it"
        )
    for key, value in component.input_spec.items():
        ok = isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], torch.dtype)
        if not ok or not all(isinstance(size, int) for size in value[0]):
            raise ConformanceError(
                f"{name} declares input_spec[{key!r}] = {value!r}: declare each stored input as (shape per step, dtype)"
            )
    for key, width in component.state_widths.items():
        if key not in keys.NEXT_STATE:
            raise ConformanceError(
                f"{name} declares the recurrent state {key!r}, which has no entry in machina.keys.NEXT_STATE: use "
                "HIDDEN / CELL, or add the key and its NEXT_ key there"
            )
        if keys.NEXT_STATE[key] not in component.out_keys:
            raise ConformanceError(f"{name} reads the state {key} but does not list {keys.NEXT_STATE[key]} in out_keys")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConformanceError(f"{name} gives state_widths[{key!r}] = {width!r}: give a positive integer width")


def example_inputs(policy: ComponentPolicy, spec: ObsSpec | VectorObsSpec) -> TensorDict:
    """A [B, T] training input: observations (random tokens then padding, or random vectors), an episode start at
    the second step, random recurrent state and actions; batch [B]."""
    generator = torch.Generator().manual_seed(1)
    if isinstance(spec, ObsSpec):
        size = (BATCH, STEPS, spec.max_tokens)
        location = torch.randint(0, spec.window, size, generator=generator) * 17  # dy << 4 | dx with dy == dx
        feature = torch.randint(0, spec.num_features, size, generator=generator)
        value = torch.randint(0, 256, size, generator=generator)
        obs = torch.stack((location, feature, value), -1).to(torch.uint8)
        obs[:, :, spec.max_tokens // 2 :] = PAD_TOKEN
    else:
        obs = torch.randn(BATCH, STEPS, spec.size, generator=generator)
    start = torch.zeros(BATCH, STEPS)
    start[:, 1] = 1.0
    td = TensorDict({keys.OBS: obs, keys.EPISODE_START: start}, batch_size=[BATCH])
    for key, width in policy.state_widths.items():
        td[key] = torch.randn(BATCH, width, generator=generator)
    td[keys.ACTIONS] = torch.randint(0, NUM_ACTIONS, (BATCH, STEPS), generator=generator)
    return td


def run_parts(
    policy: ComponentPolicy, component: Component, name: str, step: Any, seq: Any
) -> tuple[set[str], set[str]]:
    """Run the policy's parts on ``step`` / ``seq`` as its forward does; the keys ``component`` writes into each."""
    written_step, written_seq = set(), set()
    for part in policy.parts():
        before_step, before_seq = dict(step.items()), dict(seq.items())
        if part is component:
            missing = [key for key in component.in_keys if key not in before_step and key not in before_seq]
            if missing:
                raise ConformanceError(
                    f"{name} reads {missing[0]!r}, which no part before it writes and no input_spec declares: declare "
                    "the per-step inputs it reads in input_spec (key -> (shape per step, dtype))"
                )
        try:
            part(step, seq)
        except KeyError as err:
            if part is not component:
                raise
            raise ConformanceError(
                f"{name} reads a key it does not list in in_keys ({one_line(err)}): add it to in_keys"
            ) from None
        if part is component:
            written_step = {k for k, v in step.items() if before_step.get(k) is not v}
            written_seq = {k for k, v in seq.items() if before_seq.get(k) is not v} - written_step
            check_slot_written(component, name, written_step)
    return written_step, written_seq


def check_slot_written(component: Component, name: str, written: set[str]) -> None:
    """The key of the component's slot, which the parts after it read, is written by every call."""
    for key in component.out_keys:
        if key in SLOT_OF and key not in written:
            raise ConformanceError(f"{name} lists {key} in out_keys but never writes it: write it or drop it")


def check_training_forward(policy: ComponentPolicy, component: Component, name: str, inputs: TensorDict) -> set[str]:
    """A [B, T] forward, flattened as ``ComponentPolicy.forward`` does: what the component writes, checked."""
    td = inputs.clone()
    flat = {key: td[key].flatten(0, 1) for key in policy.input_spec if key in td.keys()}
    step = TensorDict(flat, batch_size=[BATCH * STEPS])
    with torch.no_grad():
        written_step, written_seq = run_parts(policy.eval(), component, name, step, td)
    check_outputs(component, name, step, written_step, BATCH * STEPS, inputs[keys.OBS].device)
    check_state(component, name, td, written_seq)
    return written_step | written_seq


def check_rollout_step(policy: ComponentPolicy, component: Component, name: str, inputs: TensorDict) -> set[str]:
    """One rollout step (``act``: no time axis, one plain dict for step and sequence): its reads are in ``in_keys``,
    its outputs are the same as a forward's at T = 1."""
    state = {key: inputs[key] for key in policy.state_widths}
    one = TensorDict({key: inputs[key][:, :1] for key in (keys.OBS, keys.EPISODE_START)}, batch_size=[BATCH])
    one.update(state)
    td = Reads({keys.OBS: inputs[keys.OBS][:, 0], keys.EPISODE_START: inputs[keys.EPISODE_START][:, 0], **state})
    with torch.no_grad():
        torch.manual_seed(2)
        for part in policy.parts():
            td.reading = part is component
            before = dict(td)
            part(td, td)
            if part is component:
                written = {k for k, v in td.items() if before.get(k) is not v}
                check_slot_written(component, name, written)
        torch.manual_seed(2)
        whole = policy(one)
    unlisted = sorted(td.read - set(component.in_keys))
    if unlisted:
        raise ConformanceError(f"{name} reads {unlisted[0]!r} without listing it in in_keys: add it to in_keys")
    check_outputs(component, name, td, written - set(keys.NEXT_STATE.values()), BATCH, inputs[keys.OBS].device)
    for key in written:
        expected = whole[key][:, 0] if key not in keys.NEXT_STATE.values() else whole[key]
        if key != keys.ACTIONS and not torch.allclose(td[key], expected, rtol=1e-4, atol=1e-5):
            raise ConformanceError(
                f"{name} writes other {key} in a rollout step (act, no time axis) than in a forward at T = 1: read "
                "the batch size from the tensors and treat a step of one sequence like a sequence of one step"
            )
    return written


class Reads(dict):
    """A plain dict (what ``act`` may be given) that records the keys read while ``reading``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()
        self.reading = False

    def __getitem__(self, key):
        if self.reading:
            self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if self.reading:
            self.read.add(key)
        return super().get(key, default)


def check_outputs(component: Component, name: str, step: Any, written: set[str], rows: int, device) -> None:
    """Each per-step output ``written`` as the trainer reads it: [N] or [N, A] or [N, width], on the input's device,
    float32 (``ACTIONS`` int64)."""
    for key in sorted(written):
        if key not in component.out_keys:
            raise ConformanceError(f"{name} writes {key!r} without listing it in out_keys: add it to out_keys")
        value = step[key]
        if key in FLAT:
            expected, how = (rows,), "a 1-d tensor"
        elif key in PER_ACTION:
            expected, how = (rows, NUM_ACTIONS), "[N, num_actions]"
        else:
            expected, how = (rows, component.out_widths.get(key, -1)), f"[N, out_widths[{KEY_NAMES.get(key, key)}]]"
        if tuple(value.shape) != expected:
            shown = "[N]" if key in FLAT else f"{list(expected)}"
            raise ConformanceError(
                f"{name} writes {key} of shape {list(value.shape)} but the trainer reads {shown}: write "
                f"step[{KEY_NAMES.get(key, repr(key))}] as {how}"
            )
        dtype = torch.int64 if key == keys.ACTIONS else torch.float32
        if value.dtype != dtype:
            raise ConformanceError(f"{name} writes {key} as {value.dtype}: write it as {dtype}")
        if value.device != torch.device(device):
            raise ConformanceError(f"{name} writes {key} on {value.device}, not on its input's {device}: stay there")


def check_state(component: Component, name: str, seq: TensorDict, written: set[str]) -> None:
    """The recurrent state after the sequence: ``NEXT_<key>`` float32 [B, state_widths[key]] for each state key."""
    for key, width in component.state_widths.items():
        following = keys.NEXT_STATE[key]
        if following not in written:
            raise ConformanceError(f"{name} reads the state {key} but writes no {following}: write seq[NEXT_...]")
        value = seq[following]
        if tuple(value.shape) != (BATCH, width) or value.dtype != torch.float32:
            raise ConformanceError(
                f"{name} writes {following} as {value.dtype} {list(value.shape)}, but state_widths says "
                f"[B, {width}]: write the state after the last step as float32 [B, {width}]"
            )


def check_gradients(policy: ComponentPolicy, component: Component, slot: str, name: str, inputs: TensorDict) -> None:
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
            loaded, _ = load_policy(path, emit_full_log_probs=True)
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
