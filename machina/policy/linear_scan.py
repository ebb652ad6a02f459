"""The QRNN's recurrence ``c_t = written_t + kept_t * c_{t-1}`` over a whole sequence, with its backward written out.

Autograd over the step loop records one node per step and allocates a fresh [B, H] tensor for every step's output
and every step's gradient, then stacks them; here the forward writes each step into one preallocated [B, T, H]
output and the backward runs the same recurrence in reverse into one preallocated gradient, one fused multiply-add
per step each way. The steps are strided views of batch-major tensors (rows of H contiguous floats), so neither
direction transposes its inputs to time-major first.

Only outside ``torch.compile``: the compiler fuses the plain step loop itself, and traces it without a graph break
(writing into views of a preallocated output inside a custom function breaks the graph).

The backward, for the loss gradient ``g_t`` of each output ``c_t`` and ``g_final`` of the last state:

    d_t = g_t + kept_{t+1} * d_{t+1}     (d_{T-1} = g_{T-1} + g_final)
    d written_t = d_t      d kept_t = d_t * c_{t-1}      d c_start = kept_0 * d_0
"""

import torch


class _LinearScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, written: torch.Tensor, kept: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        cells = torch.empty_like(written)
        c = start
        for t in range(written.shape[1]):
            c = torch.addcmul(written[:, t], kept[:, t], c, out=cells[:, t])
        ctx.save_for_backward(kept, cells, start)
        return cells

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kept, cells, start = ctx.saved_tensors
        d = grad.clone(memory_format=torch.contiguous_format)  # d_t, built in place from the last step back
        for t in range(d.shape[1] - 2, -1, -1):
            d[:, t].addcmul_(kept[:, t + 1], d[:, t + 1])
        d_kept = torch.empty_like(d)  # d_t * c_{t-1}, written in two parts: no [B, T, H] copy of the c_{t-1}
        torch.mul(d[:, 1:], cells[:, :-1], out=d_kept[:, 1:])
        torch.mul(d[:, 0], start, out=d_kept[:, 0])
        return d, d_kept, kept[:, 0] * d[:, 0]


def linear_scan(written: torch.Tensor, kept: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """float32 [B, T, H]: ``c_t = written_t + kept_t * c_{t-1}`` for t = 0..T-1 with ``c_{-1} = start`` [B, H], from
    ``written`` and ``kept`` [B, T, H]. The last state is ``[:, -1]``: a gradient that reaches it through that view
    joins the gradient of the last output, as in the backward above."""
    if torch.compiler.is_compiling():
        c, cells = start, []
        for t in range(written.shape[1]):
            c = torch.addcmul(written[:, t], kept[:, t], c)
            cells.append(c)
        return torch.stack(cells, 1)
    return _LinearScan.apply(written.contiguous(), kept.contiguous(), start)
