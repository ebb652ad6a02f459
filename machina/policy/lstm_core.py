"""The recurrent core: an LSTM stepped over the T steps of each sequence, reset where an episode starts."""

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from machina.keys import CELL, CORE, ENCODED, EPISODE_START, HIDDEN, NEXT_CELL, NEXT_HIDDEN
from machina.policy.component import Component, PolicyDims
from machina.policy.core_skip import CoreSkip


class LSTMCore(Component):
    """``ENCODED`` [B*T, D] -> ``CORE`` [B*T, H] (H + D with ``skip=concat``), carrying (``HIDDEN``, ``CELL``) [B, H]
    through the sequence.

    Reads ``EPISODE_START`` [B*T] from the flat step TensorDict: where it is 1 the state is zeroed before that step.
    Reads the start state from and writes ``NEXT_HIDDEN`` / ``NEXT_CELL`` [B, H] (the state after the last step) to
    the per-sequence TensorDict. The parameters are an ``nn.LSTMCell``'s (gate order i, f, g, o).

    Why a loop and not ``nn.LSTM``: resets inside a sequence need the state zeroed between steps, which the fused
    kernel cannot do. At rollout (T = 1) one ``torch.lstm_cell`` call is the whole step. In training the input
    projection ``x W_ih^T + b`` of all B*T steps is one matrix product before the loop, so each of the T steps only
    multiplies the [B, H] state by ``W_hh``: half the per-step matrix products, and one large one instead of T small
    ones.

    Args:
        hidden_size: H, the width of the state.
        skip: none | highway | concat: the step's input passed to the heads past the state (``core_skip.py``);
            ``highway``'s gate is the LSTM's output gate.
    """

    in_keys = (ENCODED, EPISODE_START, HIDDEN, CELL)
    out_keys = (CORE, NEXT_HIDDEN, NEXT_CELL)

    def __init__(self, dims: PolicyDims, hidden_size: int = 128, skip: str = "none") -> None:
        super().__init__()
        self.cell = nn.LSTMCell(dims.widths[ENCODED], hidden_size)
        for name, param in self.cell.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.skip = CoreSkip(skip, dims.widths[ENCODED], hidden_size)
        self.out_widths = {CORE: self.skip.width}
        self.input_spec = {EPISODE_START: ((), torch.float32)}
        self.state_widths = {HIDDEN: hidden_size, CELL: hidden_size}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        h, c = seq[HIDDEN], seq[CELL]
        batch = h.shape[0]  # from the tensors, not batch_size: at rollout both may be one plain dict
        steps = step[ENCODED].shape[0] // batch
        start, cell = step[EPISODE_START], self.cell
        if steps == 1:
            # h - h * start is h * (1 - start) in one op with no scalar operand (a conversion op of its own); the
            # cell's function, not the module, which checks its arguments' shapes on every call.
            start = start.view(-1, 1)
            h, c = torch.addcmul(h, h, start, value=-1), torch.addcmul(c, c, start, value=-1)
            x, gate = step[ENCODED], None
            if self.skip.gated:  # the step written out, since torch.lstm_cell does not return its output gate
                projected = F.linear(x, cell.weight_ih, cell.bias_ih + cell.bias_hh)
                h, c, gate = lstm_step(projected, h, c, cell.weight_hh)
            else:
                h, c = torch.lstm_cell(x, (h, c), cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
            step[CORE] = self.skip(h, x, gate)
        else:
            keep = (1.0 - start).view(batch, steps, 1)
            projected = F.linear(step[ENCODED], cell.weight_ih, cell.bias_ih + cell.bias_hh).view(batch, steps, -1)
            # unbind, not projected[:, t]: the backward of T selects would fill a zero [B, T, 4H] gradient per step.
            outputs, gates = [], []
            for x, keep_t in zip(projected.unbind(1), keep.unbind(1), strict=True):
                h, c, gate = lstm_step(x, h * keep_t, c * keep_t, cell.weight_hh)
                outputs.append(h)
                gates.append(gate)
            gate = torch.stack(gates, 1).flatten(0, 1) if self.skip.gated else None
            step[CORE] = self.skip(torch.stack(outputs, 1).flatten(0, 1), step[ENCODED], gate)
        seq[NEXT_HIDDEN] = h
        seq[NEXT_CELL] = c


def lstm_step(
    projected: torch.Tensor, h: torch.Tensor, c: torch.Tensor, weight_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM step given the input's projection ``x W_ih^T + b_ih + b_hh`` [B, 4H]: (h', c', o) [B, H] each, o the
    output gate after its sigmoid."""
    i, f, g, o = (projected + F.linear(h, weight_hh)).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    o = torch.sigmoid(o)
    return o * torch.tanh(c), c, o
