"""The quasi-recurrent core: gates computed from the input alone, so the only step-by-step work is elementwise."""

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from machina.keys import CORE, ENCODED, EPISODE_START, NEXT_QRNN_CELL, QRNN_CELL
from machina.policy.component import Component, PolicyDims
from machina.policy.core_skip import CoreSkip
from machina.policy.linear_scan import linear_scan


class QRNNCore(Component):
    """``ENCODED`` [B*T, D] -> ``CORE`` [B*T, H] (H + D with ``skip=concat``), carrying ``QRNN_CELL`` [B, H] through
    the sequence.

    A QRNN layer with filter width 1 and fo-pooling (Bradbury et al., 2017, "Quasi-Recurrent Neural Networks"):

        f, o = sigmoid(x W_f + b_f), sigmoid(x W_o + b_o)      z = tanh(x W_z + b_z)
        c_t = f_t * c_{t-1} + (1 - f_t) * z_t                 h_t = o_t * c_t

    Unlike an LSTM, no gate reads the previous state, so the matrix products of a sequence take all B*T steps at
    once (three [B*T, D] x [D, H] products) and the step-by-step part is one multiply-add per step on [B, H]. An
    LSTM instead multiplies its [B, H] state by a [H, 4H] matrix at every step, forward and backward, which is most
    of an LSTM policy's update on a CPU without bf16 units. Memory lives in the forget gate: a unit whose ``f`` is
    near 1 integrates over many steps, one whose ``f`` is near 0 follows the current observation.

    Reads ``EPISODE_START`` [B*T] from the flat step TensorDict: where it is 1 the state is zeroed before that step.
    Reads the start state ``QRNN_CELL`` from and writes ``NEXT_QRNN_CELL`` [B, H] (the state after the last step) to the
    per-sequence TensorDict.

    Args:
        hidden_size: H, the width of the state.
        skip: none | highway | concat: the step's input passed to the heads past the state (``core_skip.py``);
            ``highway`` is ``CORE = h + (1 - o) * x`` with the output gate ``o`` above.
    """

    in_keys = (ENCODED, EPISODE_START, QRNN_CELL)
    out_keys = (CORE, NEXT_QRNN_CELL)

    def __init__(self, dims: PolicyDims, hidden_size: int = 128, skip: str = "none") -> None:
        super().__init__()
        # Rows [0, H) forget, [H, 2H) output, [2H, 3H) candidate.
        self.gates = nn.Linear(dims.widths[ENCODED], 3 * hidden_size)
        nn.init.orthogonal_(self.gates.weight, 1.0)
        nn.init.zeros_(self.gates.bias)
        self.skip = CoreSkip(skip, dims.widths[ENCODED], hidden_size)
        self.out_widths = {CORE: self.skip.width}
        self.input_spec = {EPISODE_START: ((), torch.float32)}
        self.state_widths = {QRNN_CELL: hidden_size}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        c = seq[QRNN_CELL]
        batch, width = c.shape
        steps = step[ENCODED].shape[0] // batch
        # Three products rather than one [D, 3H] product split three ways: the slices' backward would fill a zero
        # [B*T, 3H] gradient per slice and copy into it (about a fifth of the core's time on an AVX2 CPU).
        weight, bias = self.gates.weight.split(width), self.gates.bias.split(width)
        x = step[ENCODED]
        forget = torch.sigmoid(F.linear(x, weight[0], bias[0]))
        output = torch.sigmoid(F.linear(x, weight[1], bias[1]))
        candidate = torch.tanh(F.linear(x, weight[2], bias[2]))
        # (1 - f) * z: what each step writes; f * (1 - start): what it keeps of the state before it. Each one op, as
        # z - z * f and f - f * start, with no scalar operand (a conversion op of its own).
        written = torch.addcmul(candidate, candidate, forget, value=-1.0)
        kept = torch.addcmul(forget, forget, step[EPISODE_START].view(-1, 1), value=-1.0)
        if steps == 1:
            c = torch.addcmul(written, kept, c)
            cells = c
        else:
            cells = linear_scan(written.view(batch, steps, width), kept.view(batch, steps, width), c)
            c = cells[:, -1]
            cells = cells.flatten(0, 1)
        step[CORE] = self.skip(output * cells, x, output)
        seq[NEXT_QRNN_CELL] = c
