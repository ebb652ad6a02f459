"""The component policy: encoder -> core (optional) -> actor and critic heads -> ``ActionProbs``, each a TensorDict
component.

The policy is called on a TensorDict ``td`` with batch size ``[B]`` whose per-step keys carry a time dimension:

- reads ``OBS`` [B, T, *obs] (uint8 tokens [M, 3] or float32 vectors [D]), ``EPISODE_START`` float32 [B, T] (when
  the core is recurrent), ``HIDDEN`` / ``CELL`` float32 [B, H] (state at the start of the sequence) and, in training
  mode only, ``ACTIONS`` int64 [B, T];
- writes ``LOGITS``, ``VALUES``, ``ACT_LOG_PROB``, ``ACTIONS`` (rollout) or ``ENTROPY`` (training), ``FULL_LOG_PROBS``
  (only when emitted) with shape [B, T, ...], the intermediates ``ENCODED`` / ``CORE`` [B, T, width], and
  ``NEXT_HIDDEN`` / ``NEXT_CELL`` [B, H] (state after the last step). Without a core the policy is feed-forward:
  no state, and the encoder's ``ENCODED`` feeds the heads as ``CORE``.

(A TensorDict cannot hold [B, H] state under a [B, T] batch size, hence batch [B]; a [B, T] TensorDict becomes one
with ``td.batch_size = td.batch_size[:1]``.) The [B, T] -> [B*T] flattening happens once, here: every component
works on a flat ``step`` TensorDict (batch [B*T]) and, for recurrent state, on the per-sequence ``td`` (batch [B]).
"""

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import ObsSpec, VectorObsSpec
from machina.keys import ACTIONS, CORE, ENCODED, EPISODE_START, OBS, Spec


@dataclass(frozen=True)
class PolicyDims:
    """What a component needs to size itself: the env's shapes and the feature width of each key written so far."""

    obs: ObsSpec | VectorObsSpec
    num_actions: int
    widths: Mapping[str, int]


class Component(nn.Module):
    """One step of the policy graph.

    ``in_keys`` / ``out_keys`` name the keys it reads and writes (``ComponentPolicy`` checks at construction that
    every key a component reads is a policy input or written by a component before it); ``out_widths`` gives the
    feature width of each per-step output (read by later components to size themselves); ``input_spec`` lists the
    per-step inputs that must be stored in the experience buffer to re-run training, as ``key -> (shape per step,
    dtype)``; ``state_widths`` lists the recurrent state keys it reads from the sequence TensorDict, with their widths.
    """

    in_keys: tuple[str, ...] = ()
    out_keys: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.out_widths: dict[str, int] = {}
        self.input_spec: Spec = {}
        self.state_widths: dict[str, int] = {}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        """Read ``in_keys`` and write ``out_keys`` into ``step`` (batch [B*T]) or ``seq`` (batch [B]), in place."""
        raise NotImplementedError

    def keep_derived(self, keep: bool) -> None:
        """Start (``keep``) or stop keeping what the component computes from its weights alone, for the forwards
        inside ``ComponentPolicy.weights_fixed``. Most derive nothing."""


class Passthrough(Component):
    """The core of a feed-forward policy: ``CORE`` is ``ENCODED`` (no state, no parameters)."""

    in_keys = (ENCODED,)
    out_keys = (CORE,)

    def __init__(self, dims: PolicyDims) -> None:
        super().__init__()
        self.out_widths = {CORE: dims.widths[ENCODED]}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        step[CORE] = step[ENCODED]


class ComponentPolicy(nn.Module):
    """Runs ``encoder``, ``core``, ``actor``, ``critic``, then ``action_probs``; see the module docstring for the
    TensorDict contract.

    The four slots are factories (``functools.partial`` from Hydra's ``_partial_: true``) called in that order with a
    ``PolicyDims`` that holds the widths written by the components before them. ``core`` may be None (or ``"none"``,
    as typed on the command line: ``policy.core=none``) for a feed-forward policy.
    """

    def __init__(
        self,
        obs_spec: ObsSpec | VectorObsSpec,
        num_actions: int,
        encoder: Callable[[PolicyDims], Component],
        core: Callable[[PolicyDims], Component] | str | None,
        actor: Callable[[PolicyDims], Component],
        critic: Callable[[PolicyDims], Component],
        action_probs: Component,
    ) -> None:
        super().__init__()
        if isinstance(core, str):
            if core.lower() != "none":
                raise ValueError(f"policy.core must be a component or none, got {core!r}")
            core = None
        widths: dict[str, int] = {}

        def make(slot: str, factory: Callable[[PolicyDims], Component]) -> Component:
            try:
                component = factory(PolicyDims(obs=obs_spec, num_actions=num_actions, widths=dict(widths)))
            except KeyError as err:  # a width looked up in PolicyDims.widths
                raise ValueError(
                    f"policy.{slot} reads [{err.args[0]!r}], which no component before it writes"
                ) from None
            except RuntimeError as err:  # torch refuses a negative size: "Trying to create tensor with negative ..."
                reason = " ".join(str(err).split())[:200]
                raise ValueError(f"policy.{slot}: {reason}; every width must be >= 1") from None
            # A width of 0 builds (empty layers) and trains a policy that ignores its input: refuse it.
            empty = [name for name, p in component.named_parameters() if p.numel() == 0]
            if empty or any(width < 1 for width in component.out_widths.values()):
                what = f"parameter {empty[0]}" if empty else f"output widths {component.out_widths}"
                raise ValueError(f"policy.{slot} has a size of 0 ({what}); every width and size must be >= 1")
            widths.update(component.out_widths)
            return component

        self.encoder = make("encoder", encoder)
        self.core = make("core", core or Passthrough)
        self.actor = make("actor", actor)
        self.critic = make("critic", critic)
        self.action_probs = action_probs
        self.obs_spec, self.num_actions = obs_spec, num_actions

        everything = self.parts()
        self.input_spec: Spec = {k: v for c in everything for k, v in c.input_spec.items()}
        self.state_widths: dict[str, int] = {k: v for c in everything for k, v in c.state_widths.items()}
        self.state_keys = tuple(self.state_widths)
        check_graph(everything, inputs={OBS, EPISODE_START, ACTIONS, *self.state_keys})

    def parts(self) -> tuple[Component, ...]:
        """The components in the order they run."""
        return (self.encoder, self.core, self.actor, self.critic, self.action_probs)

    def output_keys(self) -> tuple[str, ...]:
        """Every key a forward may write, given the current ``action_probs.emit_full_log_probs``."""
        return tuple(dict.fromkeys(key for component in self.parts() for key in component.out_keys))

    def experience_spec(self) -> Spec:
        """Per-step keys the experience buffer must store to re-run training: ``key -> (shape per step, dtype)``."""
        return dict(self.input_spec)

    def initial_state(self, num: int, device: torch.device | str) -> TensorDict:
        """Zero recurrent state for ``num`` agents: TensorDict batch [num] with each state key float32 [num, H]
        (no keys for a feed-forward policy)."""
        zeros = {key: torch.zeros(num, width, device=device) for key, width in self.state_widths.items()}
        return TensorDict(zeros, batch_size=[num], device=device)

    @contextmanager
    def weights_fixed(self) -> Iterator[None]:
        """Inside it the caller does not change the weights (a rollout, an evaluation: loops that only read them),
        so a component may compute what depends on its weights alone once instead of on every step: the encoder's
        embedding table (the main job's rollout forward 1.28x as fast on the 2-core CPU,
        docs/reference/benchmarks.md). Whoever
        writes the weights (the learner, a checkpoint restore, a weight average's swap) does it outside, so nothing
        kept outlives a change. Only forwards without gradients read what is kept, and compiled ones compute it
        themselves, so no traced graph depends on a tensor that each block replaces."""
        for part in self.parts():
            part.keep_derived(True)
        try:
            yield
        finally:
            for part in self.parts():
                part.keep_derived(False)

    def act(self, td: MutableMapping[str, torch.Tensor]) -> MutableMapping[str, torch.Tensor]:
        """One step of N sequences (the rollout's T = 1), with no time axis: ``td`` holds the per-step inputs
        [N, ...] (``OBS``, ``EPISODE_START``) and the state [N, H]; the components write the per-step outputs
        [N, ...] and ``NEXT_*`` [N, H] into it. The same values as ``forward`` at T = 1, without its reshapes: with
        one step per sequence the flat step and the sequence TensorDict are the same TensorDict.

        ``td`` may be a TensorDict (batch [N]) or a plain dict of the same tensors: components only get and set
        keys, and a dict's are a tenth of the cost, which is most of the host time of a step at a small batch."""
        for component in self.parts():
            component(td, td)
        return td

    def forward(self, td: TensorDict) -> TensorDict:
        batch, steps = td[OBS].shape[:2]
        flat = {key: td[key].flatten(0, 1) for key in self.input_spec if key in td}
        step = TensorDict(flat, batch_size=[batch * steps], device=td.device)
        for component in self.parts():
            component(step, td)
        for key, value in step.items():
            if key not in flat:
                td[key] = value.unflatten(0, (batch, steps))
        return td


def check_graph(components: Sequence[Component], inputs: set[str]) -> None:
    """Refuse a component that reads a key no earlier component writes and the policy is not given."""
    available = set(inputs)
    for component in components:
        missing = [key for key in component.in_keys if key not in available]
        if missing:
            raise ValueError(
                f"policy component {type(component).__name__} reads {missing}, which no component before it writes"
            )
        available.update(component.out_keys)
