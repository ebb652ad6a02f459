"""The recurrent core: an LSTM cell stepped over the T steps of each sequence, reset where an episode starts."""

import torch
from tensordict import TensorDict
from torch import nn

from machina.keys import CELL, CORE, ENCODED, EPISODE_START, HIDDEN, NEXT_CELL, NEXT_HIDDEN
from machina.policy.component import Component, PolicyDims


class LSTMCore(Component):
    """``ENCODED`` [B*T, D] -> ``CORE`` [B*T, H], carrying (``HIDDEN``, ``CELL``) [B, H] through the sequence.

    Reads ``EPISODE_START`` [B*T] from the flat step TensorDict: where it is 1 the state is zeroed before that step.
    Reads the start state from and writes ``NEXT_HIDDEN`` / ``NEXT_CELL`` [B, H] (the state after the last step) to the
    per-sequence TensorDict. A cell loop over T, not ``nn.LSTM``: resets inside a sequence need no data-dependent
    branch, and at rollout (T = 1) a single cell call is the fastest path.
    """

    in_keys = (ENCODED, EPISODE_START, HIDDEN, CELL)
    out_keys = (CORE, NEXT_HIDDEN, NEXT_CELL)

    def __init__(self, dims: PolicyDims, hidden_size: int = 128) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(dims.widths[ENCODED], hidden_size)
        for name, param in self.cell.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.out_widths = {CORE: hidden_size}
        self.input_spec = {EPISODE_START: ((), torch.float32)}
        self.state_widths = {HIDDEN: hidden_size, CELL: hidden_size}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        batch = seq.batch_size[0]
        steps = step.batch_size[0] // batch
        x = step[ENCODED].view(batch, steps, -1)
        keep = (1.0 - step[EPISODE_START]).view(batch, steps, 1)
        h, c = seq[HIDDEN], seq[CELL]
        outputs = []
        for t in range(steps):
            h, c = self.cell(x[:, t], (h * keep[:, t], c * keep[:, t]))
            outputs.append(h)
        step[CORE] = torch.stack(outputs, 1).flatten(0, 1)
        seq[NEXT_HIDDEN] = h
        seq[NEXT_CELL] = c
