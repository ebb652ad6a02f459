"""The component policy: an ordered list of TensorDict components followed by ``ActionProbs``.

The policy is called on a TensorDict ``td`` with batch size ``[B]`` whose per-step keys carry a time dimension:

- reads ``OBS`` uint8 [B, T, M, 3], ``DONES`` float32 [B, T], ``HIDDEN`` / ``CELL`` float32 [B, H] (state at the start
  of the sequence) and, in training mode only, ``ACTIONS`` int64 [B, T];
- writes ``LOGITS``, ``VALUES``, ``ACT_LOG_PROB``, ``ACTIONS`` (rollout) or ``ENTROPY`` (training), ``FULL_LOG_PROBS``
  (only when emitted) with shape [B, T, ...], the intermediates ``ENCODED`` / ``CORE`` [B, T, width], and
  ``NEXT_HIDDEN`` / ``NEXT_CELL`` [B, H] (state after the last step).

(A TensorDict cannot hold [B, H] state under a [B, T] batch size, hence batch [B]; a [B, T] TensorDict becomes one
with ``td.batch_size = td.batch_size[:1]``.) The [B, T] -> [B*T] flattening happens once, here: every component
works on a flat ``step`` TensorDict (batch [B*T]) and, for recurrent state, on the per-sequence ``td`` (batch [B]).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import ObsSpec
from machina.keys import HIDDEN, OBS

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class PolicyDims:
    """What a component needs to size itself: the env's shapes and the feature width of each key written so far."""

    obs: ObsSpec
    num_actions: int
    widths: Mapping[str, int]


class Component(nn.Module):
    """One step of the policy graph.

    ``in_keys`` / ``out_keys`` name the keys it reads and writes; ``out_widths`` gives the feature width of each
    per-step output (read by later components to size themselves); ``input_spec`` lists the per-step inputs that
    must be stored in the experience buffer to re-run training, as ``key -> (shape per step, dtype)``;
    ``state_widths`` lists the recurrent state keys it reads from the sequence TensorDict, with their widths.
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


class ComponentPolicy(nn.Module):
    """Runs ``components`` in order, then ``action_probs``; see the module docstring for the TensorDict contract.

    ``components`` are factories (``functools.partial`` from Hydra's ``_partial_: true``) called with a
    ``PolicyDims`` that holds the widths written by the components before them.
    """

    def __init__(
        self,
        obs_spec: ObsSpec,
        num_actions: int,
        components: Sequence[Callable[[PolicyDims], Component]],
        action_probs: Component,
    ) -> None:
        super().__init__()
        widths: dict[str, int] = {}
        built = []
        for factory in components:
            component = factory(PolicyDims(obs=obs_spec, num_actions=num_actions, widths=dict(widths)))
            widths.update(component.out_widths)
            built.append(component)
        self.components = nn.ModuleList(built)
        self.action_probs = action_probs
        self.num_actions = num_actions

        everything = [*self.components, self.action_probs]
        self.input_spec: Spec = {k: v for c in everything for k, v in c.input_spec.items()}
        self.state_widths: dict[str, int] = {k: v for c in everything for k, v in c.state_widths.items()}
        self.state_keys = tuple(self.state_widths)
        self.hidden_size = self.state_widths[HIDDEN]

    def output_keys(self) -> tuple[str, ...]:
        """Every key a forward may write, given the current ``action_probs.emit_full_log_probs``."""
        everything = [*self.components, self.action_probs]
        return tuple(dict.fromkeys(key for component in everything for key in component.out_keys))

    def experience_spec(self) -> Spec:
        """Per-step keys the experience buffer must store to re-run training: ``key -> (shape per step, dtype)``."""
        return dict(self.input_spec)

    def initial_state(self, num: int, device: torch.device | str) -> TensorDict:
        """Zero recurrent state for ``num`` agents: TensorDict batch [num] with each state key float32 [num, H]."""
        zeros = {key: torch.zeros(num, width, device=device) for key, width in self.state_widths.items()}
        return TensorDict(zeros, batch_size=[num], device=device)

    def forward(self, td: TensorDict) -> TensorDict:
        batch, steps = td[OBS].shape[:2]
        flat = {key: td[key].flatten(0, 1) for key in self.input_spec if key in td}
        step = TensorDict(flat, batch_size=[batch * steps], device=td.device)
        for component in self.components:
            component(step, td)
        self.action_probs(step, td)
        for key, value in step.items():
            if key not in flat:
                td[key] = value.unflatten(0, (batch, steps))
        return td
