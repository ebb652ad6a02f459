"""What a recurrent core passes to the heads besides its state: the step's own input, past the state.

A core's output ``h`` mixes the current step with what its state remembers, so what the agent sees now (the heart it
holds, the chest beside it) reaches the actor and the critic only as far as the gates let it through. ``skip``:

- ``none``: ``CORE = h`` [N, H];
- ``highway``: ``CORE = h + (1 - o) * x`` [N, H], the highway of the Simple Recurrent Unit (Lei et al. 2018,
  "Simple Recurrent Units for Highly Parallelizable Recurrence") with the core's output gate ``o`` as its gate: where
  the gate closes on the state, the input passes. Where the input's width D is not H, ``x`` is first projected to H
  by a learned matrix without bias (``highway_projection``), as the SRU does;
- ``concat``: ``CORE = [h, x]`` [N, H + D].

On the main job (``python train.py``, PPO alone, 43.3M agent steps) ``highway`` returned more in the middle of the
run and at its end (docs/explanation/lab_notebook.md), at the same agent-steps/s.
"""

import torch
from torch import nn

from machina.errors import ConfigError

SKIPS = ("none", "highway", "concat")


def skip_width(skip: str, input_width: int, hidden_size: int) -> int:
    """The width of ``CORE`` with ``skip``; a ConfigError for a skip that does not exist."""
    if skip not in SKIPS:
        raise ConfigError(f"policy.core.skip={skip!r} must be one of {', '.join(SKIPS)}")
    return hidden_size + input_width if skip == "concat" else hidden_size


def highway_projection(skip: str, input_width: int, hidden_size: int) -> nn.Linear | None:
    """The highway's [D -> H] projection of the input (no bias, orthogonal at the start) where D != H; else None."""
    if skip != "highway" or input_width == hidden_size:
        return None
    projection = nn.Linear(input_width, hidden_size, bias=False)
    nn.init.orthogonal_(projection.weight, 1.0)
    return projection


def with_skip(skip: str, h: torch.Tensor, x: torch.Tensor, output_gate: torch.Tensor | None) -> torch.Tensor:
    """``CORE`` from the core's output ``h`` [N, H], its input ``x`` [N, D] (for ``highway``: [N, H], projected where
    D != H) and (for ``highway``) its output gate ``output_gate`` [N, H] after the sigmoid."""
    if skip == "highway":
        return torch.addcmul(h + x, output_gate, x, value=-1.0)
    if skip == "concat":
        return torch.cat([h, x], -1)
    return h
