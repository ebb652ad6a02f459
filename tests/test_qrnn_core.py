"""The quasi-recurrent core against the QRNN paper's fo-pooling (Bradbury et al., 2017), written out one step and one
unit at a time: values, gradients, episode resets, and a rollout of single steps against the training forward."""

import pytest
import torch
from tensordict import TensorDict

from machina.env.spec import ObsSpec
from machina.errors import ConfigError
from machina.keys import CORE, ENCODED, EPISODE_START, NEXT_QRNN_CELL, QRNN_CELL
from machina.policy.component import PolicyDims
from machina.policy.linear_scan import linear_scan
from machina.policy.qrnn_core import QRNNCore

SPEC = ObsSpec(max_tokens=4, window=3, feature_names=("wall",), feature_norms=(1.0,))
BATCH, STEPS, WIDTH, HIDDEN = 5, 9, 6, 4


def make_core(seed: int = 0) -> QRNNCore:
    torch.manual_seed(seed)
    core = QRNNCore(PolicyDims(obs=SPEC, num_actions=3, widths={ENCODED: WIDTH}), hidden_size=HIDDEN)
    with torch.no_grad():
        core.gates.bias.normal_()  # zero at the start; a trained core's are not
    return core


def run(core: QRNNCore, x: torch.Tensor, starts: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's training forward over [B, T]: (CORE [B, T, H], NEXT_QRNN_CELL [B, H])."""
    step = TensorDict({ENCODED: x.flatten(0, 1), EPISODE_START: starts.flatten()}, batch_size=[x.shape[0] * x.shape[1]])
    seq = TensorDict({QRNN_CELL: c0}, batch_size=[x.shape[0]])
    core(step, seq)
    return step[CORE].view(x.shape[0], x.shape[1], -1), seq[NEXT_QRNN_CELL]


def by_definition(
    weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, starts: torch.Tensor, c0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fo-pooling with filter width 1, unit by unit: f = sigmoid(W_f x + b_f), o = sigmoid(W_o x + b_o),
    z = tanh(W_z x + b_z); c_t = f_t c_{t-1} + (1 - f_t) z_t with c_{t-1} = 0 where an episode starts; h_t = o_t c_t.
    The weight's rows are forget, output, candidate (H each)."""
    w_f, w_o, w_z = weight.split(HIDDEN)
    b_f, b_o, b_z = bias.split(HIDDEN)
    outs, finals = [], []
    for b in range(x.shape[0]):
        c = [c0[b, u] for u in range(HIDDEN)]
        row = []
        for t in range(x.shape[1]):
            h = []
            for u in range(HIDDEN):
                f = torch.sigmoid(w_f[u] @ x[b, t] + b_f[u])
                o = torch.sigmoid(w_o[u] @ x[b, t] + b_o[u])
                z = torch.tanh(w_z[u] @ x[b, t] + b_z[u])
                before = c[u] * 0 if starts[b, t] else c[u]
                c[u] = f * before + (1 - f) * z
                h.append(o * c[u])
            row.append(torch.stack(h))
        outs.append(torch.stack(row))
        finals.append(torch.stack(c))
    return torch.stack(outs), torch.stack(finals)


def test_the_sequence_forward_and_its_gradients_equal_fo_pooling_written_out():
    core = make_core()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, STEPS, WIDTH, generator=g)
    starts = (torch.rand(BATCH, STEPS, generator=g) < 0.25).float()
    starts[0, 0] = 1.0
    c0 = torch.randn(BATCH, HIDDEN, generator=g)
    out_grad = torch.randn(BATCH, STEPS, HIDDEN, generator=g)

    xs = x.clone().requires_grad_()
    got, got_c = run(core, xs, starts, c0)
    ((got * out_grad).sum() + got_c.sum()).backward()

    xr = x.clone().requires_grad_()
    weight = core.gates.weight.detach().clone().requires_grad_()
    bias = core.gates.bias.detach().clone().requires_grad_()
    want, want_c = by_definition(weight, bias, xr, starts, c0)
    ((want * out_grad).sum() + want_c.sum()).backward()

    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_c, want_c)
    torch.testing.assert_close(xs.grad, xr.grad)
    torch.testing.assert_close(core.gates.weight.grad, weight.grad)
    torch.testing.assert_close(core.gates.bias.grad, bias.grad)


def test_single_steps_as_the_rollout_takes_them_equal_the_training_forward():
    core = make_core()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, STEPS, WIDTH, generator=g)
    starts = (torch.rand(BATCH, STEPS, generator=g) < 0.25).float()
    c = torch.randn(BATCH, HIDDEN, generator=g)
    with torch.no_grad():
        whole, whole_c = run(core, x, starts, c)
        for t in range(STEPS):
            out, c = run(core, x[:, t : t + 1], starts[:, t : t + 1], c)
            torch.testing.assert_close(out[:, 0], whole[:, t])
    torch.testing.assert_close(c, whole_c)


def test_an_episode_start_cuts_the_state_and_the_gradient_to_the_steps_before_it():
    core = make_core()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, STEPS, WIDTH, generator=g).requires_grad_()
    starts = torch.zeros(1, STEPS)
    starts[0, 4] = 1.0
    out, _ = run(core, x, starts, torch.randn(1, HIDDEN, generator=g))
    out[0, 4:].sum().backward()
    assert x.grad[0, :4].abs().max() == 0  # nothing after the start depends on the steps before it
    assert x.grad[0, 4:].abs().min() > 0
    with torch.no_grad():
        other, _ = run(core, x, starts, torch.randn(1, HIDDEN, generator=g) * 100)
    torch.testing.assert_close(other[0, 4:], out[0, 4:].detach())
    assert not torch.allclose(other[0, :4], out[0, :4].detach())


def test_without_a_start_the_last_step_remembers_the_first():
    core = make_core()
    x = torch.randn(1, STEPS, WIDTH).requires_grad_()
    out, _ = run(core, x, torch.zeros(1, STEPS), torch.zeros(1, HIDDEN))
    out[0, -1].sum().backward()
    assert x.grad[0, 0].abs().max() > 0


def random_inputs(seed: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, T, width], episode starts [B, T] (a quarter of the steps), a start state [B, H]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, STEPS, width, generator=g)
    starts = (torch.rand(BATCH, STEPS, generator=g) < 0.25).float()
    return x, starts, torch.randn(BATCH, HIDDEN, generator=g)


def skip_core(skip: str, width: int) -> QRNNCore:
    torch.manual_seed(4)
    core = QRNNCore(PolicyDims(obs=SPEC, num_actions=3, widths={ENCODED: width}), hidden_size=HIDDEN, skip=skip)
    with torch.no_grad():
        core.gates.bias.normal_()
    return core


def test_the_highway_adds_the_input_where_the_output_gate_is_closed():
    """SRU's highway (Lei et al. 2018) with the output gate o as its gate: CORE = o c + (1 - o) x."""
    core = skip_core("highway", HIDDEN)
    x, starts, c0 = random_inputs(5, HIDDEN)
    got, got_c = run(core, x, starts, c0)
    weight, bias = core.gates.weight.detach(), core.gates.bias.detach()
    h, want_c = by_definition(weight, bias, x, starts, c0)
    o = torch.sigmoid(x @ weight[HIDDEN : 2 * HIDDEN].T + bias[HIDDEN : 2 * HIDDEN])
    torch.testing.assert_close(got, h + (1 - o) * x)
    torch.testing.assert_close(got_c, want_c)


def test_concat_passes_the_input_beside_the_state_and_widens_the_output():
    core = skip_core("concat", WIDTH)
    assert core.out_widths[CORE] == HIDDEN + WIDTH
    x, starts, c0 = random_inputs(6, WIDTH)
    got, _ = run(core, x, starts, c0)
    h, _ = by_definition(core.gates.weight.detach(), core.gates.bias.detach(), x, starts, c0)
    torch.testing.assert_close(got, torch.cat([h, x], -1))
    with torch.no_grad():  # the rollout's single steps give the same
        c = c0
        for t in range(STEPS):
            out, c = run(core, x[:, t : t + 1], starts[:, t : t + 1], c)
            torch.testing.assert_close(out[:, 0], got[:, t])


def test_the_highway_projects_an_input_of_another_width_as_the_sru_does():
    """D != H: CORE = h + (1 - o) (x P^T), P a learned [H, D] matrix without bias; D == H adds no parameter."""
    core = skip_core("highway", WIDTH)
    assert core.skip.projection.weight.shape == (HIDDEN, WIDTH) and core.skip.projection.bias is None
    assert skip_core("highway", HIDDEN).skip.projection is None and skip_core("none", WIDTH).skip.projection is None
    x, starts, c0 = random_inputs(7, WIDTH)
    with torch.no_grad():
        got, _ = run(core, x, starts, c0)
        weight, bias = core.gates.weight, core.gates.bias
        h, _ = by_definition(weight, bias, x, starts, c0)
        o = torch.sigmoid(x @ weight[HIDDEN : 2 * HIDDEN].T + bias[HIDDEN : 2 * HIDDEN])
        torch.testing.assert_close(got, h + (1 - o) * (x @ core.skip.projection.weight.T))


def test_a_skip_that_does_not_exist_is_refused():
    with pytest.raises(ConfigError, match="skip='sideways' must be one of none, highway, concat"):
        skip_core("sideways", HIDDEN)


def test_the_scan_and_its_written_out_backward_match_the_recurrence_in_float64():
    """linear_scan: c_t = w_t + k_t c_{t-1} from c_{-1} = start; torch.autograd.gradcheck compares its hand-written
    backward with finite differences for every input, the start state and a gradient reaching the last state too."""
    g = torch.Generator().manual_seed(8)
    written, kept = (torch.randn(3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    start = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    cells = linear_scan(written, kept, start)
    c = start
    for t in range(7):
        c = written[:, t] + kept[:, t] * c
        torch.testing.assert_close(cells[:, t], c)
    weights = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda w, k, s: ((linear_scan(w, k, s) * weights).sum(), linear_scan(w, k, s)[:, -1].square().sum()),
        (written, kept, start),
    )
