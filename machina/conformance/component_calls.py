"""The calls ``check_component`` makes: a component's declarations and what it reads and writes in a training forward
([B, T], flattened as ``ComponentPolicy.forward`` does) and in a rollout step (``act``), against the keys, shapes,
dtypes and device the trainer reads."""

from typing import Any

import torch
from tensordict import TensorDict

from machina import keys
from machina.conformance.failure import ConformanceError
from machina.env.spec import PAD_TOKEN, ObsSpec, VectorObsSpec
from machina.errors import one_line
from machina.policy.component import Component, ComponentPolicy

NUM_ACTIONS = 5
BATCH, STEPS = 3, 4
SLOT_OF = {keys.ENCODED: "encoder", keys.CORE: "core", keys.LOGITS: "actor", keys.VALUES: "critic"}
# Per-step outputs the trainer reads, by the shape it reads them with (N: agents x steps, A: actions).
FLAT = (keys.VALUES, keys.ACT_LOG_PROB, keys.ENTROPY, keys.ACTIONS)
PER_ACTION = (keys.LOGITS, keys.FULL_LOG_PROBS)
KEY_NAMES = {value: name for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)}


def check_declared(component: Component, name: str) -> None:
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
