"""What a recurrent core passes to the heads besides its state: the step's own input, past the state.

A core's output ``h`` mixes the current step with what its state remembers, so what the agent sees now (the heart it
holds, the chest beside it) reaches the actor and the critic only as far as the gates let it through. ``skip``:

- ``none``: ``CORE = h`` [N, H];
- ``highway``: ``CORE = h + (1 - o) * x`` [N, H], the highway of the Simple Recurrent Unit (Lei et al. 2018,
  "Simple Recurrent Units for Highly Parallelizable Recurrence") with the core's output gate ``o`` as its gate: where
  the gate closes on the state, the input passes. Where the input's width D is not H, ``x`` is first projected to H
  by a learned matrix without bias (``CoreSkip.projection``), as the SRU does;
- ``concat``: ``CORE = [h, x]`` [N, H + D].

On the main job (``python train.py``, PPO alone, 43.3M agent steps) ``highway`` returned more in the middle of the
run and at its end (docs/explanation/lab_notebook.md), at the same agent-steps/s.
"""

import torch
from torch import nn

from machina.errors import ConfigError

SKIPS = ("none", "highway", "concat")


class CoreSkip(nn.Module):
    """``CORE`` from a core's output ``h`` [N, H], its input ``x`` [N, D] and its output gate ``o`` [N, H] (after the
    sigmoid; read by ``highway`` only). ``width``: the width of ``CORE``; ``gated``: whether ``forward`` reads ``o``;
    ``projection``: the highway's [D -> H] matrix (no bias, orthogonal at the start) where D != H, else None."""

    def __init__(self, kind: str, input_width: int, hidden_size: int) -> None:
        super().__init__()
        if kind not in SKIPS:
            raise ConfigError(f"policy.core.skip={kind!r} must be one of {', '.join(SKIPS)}")
        self.kind, self.gated = kind, kind == "highway"
        self.width = hidden_size + input_width if kind == "concat" else hidden_size
        self.projection = None
        if self.gated and input_width != hidden_size:
            self.projection = nn.Linear(input_width, hidden_size, bias=False)
            nn.init.orthogonal_(self.projection.weight, 1.0)

    def forward(self, h: torch.Tensor, x: torch.Tensor, output_gate: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "concat":
            return torch.cat([h, x], -1)
        if not self.gated:
            return h
        if self.projection is not None:
            x = self.projection(x)
        return torch.addcmul(h + x, output_gate, x, value=-1.0)
