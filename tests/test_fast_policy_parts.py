"""``policy=fast``'s encoder and core against their definitions: the token bag as a sum of one table row per token
(written out token by token), its weight gradient against PyTorch's own ``embedding_bag``, and the LSTM core's
training path against ``nn.LSTMCell`` stepped one step at a time (values and gradients)."""

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from machina.env.spec import PAD_TOKEN, ObsSpec
from machina.keys import CELL, CORE, ENCODED, EPISODE_START, HIDDEN, NEXT_CELL, NEXT_HIDDEN
from machina.policy.bag_encoder import TokenBagEncoder
from machina.policy.bag_sum import bag_sum
from machina.policy.component import PolicyDims
from machina.policy.lstm_core import LSTMCore

SPEC = ObsSpec(
    max_tokens=12,
    window=5,
    feature_names=("wall", "ore", "hp", "progress"),
    feature_norms=(1.0, 4.0, 16.0, 200.0),  # three categorical features (norm <= 16), one scaled
)


def tokens(count: int, seed: int = 0) -> torch.Tensor:
    """uint8 [count, M, 3]: random real tokens (values up to 255, beyond every categorical range), padding after a
    random number of them, and some unknown feature ids."""
    g = torch.Generator().manual_seed(seed)
    m = SPEC.max_tokens
    dy, dx = torch.randint(0, SPEC.window, (2, count, m), generator=g)
    feature = torch.randint(0, SPEC.num_features + 2, (count, m), generator=g)  # the last two ids are unknown
    value = torch.randint(0, 256, (count, m), generator=g)
    obs = torch.stack((dy << 4 | dx, feature, value), -1).to(torch.uint8)
    real = torch.arange(m) < torch.randint(0, m + 1, (count, 1), generator=g)
    obs[~real] = PAD_TOKEN
    return obs


def bag_by_definition(table: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """The encoder docstring's sum, token by token: a categorical feature owns ``(norm + 1) * cells`` rows, one per
    (value clamped to norm, cell), weighted 1; a scaled feature owns ``cells`` rows weighted value / norm; features
    own consecutive blocks in id order; padding and unknown ids add nothing."""
    cells = SPEC.window**2
    sizes = [(int(n) + 1) * cells if n <= 16 else cells for n in SPEC.feature_norms]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    out = torch.zeros(obs.shape[0], table.shape[1])
    for i, observation in enumerate(obs.tolist()):
        for location, feature, value in observation:
            if feature >= SPEC.num_features:
                continue
            cell = (location >> 4) * SPEC.window + (location & 0xF)
            norm = SPEC.feature_norms[feature]
            if norm <= 16:
                row, weight = starts[feature] + min(value, int(norm)) * cells + cell, 1.0
            else:
                row, weight = starts[feature] + cell, value / norm
            out[i] += weight * table[row]
    return out


def test_token_bag_sums_one_table_row_per_token():
    encoder = TokenBagEncoder(PolicyDims(obs=SPEC, num_actions=3, widths={}), embed_dim=8, hidden=8)
    obs = tokens(64)
    table = encoder.bag.weight.detach()
    got = bag_sum(table, *encoder.token_rows(obs))
    torch.testing.assert_close(got, bag_by_definition(table, obs), rtol=1e-5, atol=1e-5)


def test_bag_sum_gradient_equals_embedding_bags():
    g = torch.Generator().manual_seed(1)
    table = torch.randn(50, 6, generator=g)
    rows = torch.randint(0, 50, (40, 9), generator=g)
    rows[:, -3:] = 7  # many repeats of one row, as padding gives
    weights = torch.rand(40, 9, generator=g)
    out_grad = torch.randn(40, 6, generator=g)
    grads = []
    for fn in (bag_sum, lambda w, r, t: F.embedding_bag(r, w, per_sample_weights=t, mode="sum")):
        weight = table.clone().requires_grad_()
        out = fn(weight, rows, weights)
        out.backward(out_grad)
        grads.append((out.detach(), weight.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-5, atol=1e-6)
    assert grads[0][1].layout == torch.strided  # a dense gradient: optimizers see what they always saw


def test_lstm_core_sequence_equals_lstm_cell_stepped_with_resets():
    torch.manual_seed(0)
    batch, steps, width, hidden = 5, 7, 6, 4
    core = LSTMCore(PolicyDims(obs=SPEC, num_actions=3, widths={ENCODED: width}), hidden_size=hidden)
    reference = torch.nn.LSTMCell(width, hidden)
    reference.load_state_dict(core.cell.state_dict())
    x = torch.randn(batch, steps, width)
    starts = (torch.rand(batch, steps) < 0.3).float()
    h0, c0 = torch.randn(batch, hidden), torch.randn(batch, hidden)
    out_grad = torch.randn(batch, steps, hidden)

    xs = x.clone().requires_grad_()
    step = TensorDict({ENCODED: xs.flatten(0, 1), EPISODE_START: starts.flatten()}, batch_size=[batch * steps])
    seq = TensorDict({HIDDEN: h0, CELL: c0}, batch_size=[batch])
    core(step, seq)
    got = step[CORE].view(batch, steps, hidden)
    ((got * out_grad).sum() + seq[NEXT_HIDDEN].sum() + seq[NEXT_CELL].sum()).backward()

    xr = x.clone().requires_grad_()
    h, c, outs = h0, c0, []
    for t in range(steps):  # the definition: zero the state where an episode starts, then one cell step
        keep = (1 - starts[:, t]).unsqueeze(1)
        h, c = reference(xr[:, t], (h * keep, c * keep))
        outs.append(h)
    want = torch.stack(outs, 1)
    ((want * out_grad).sum() + h.sum() + c.sum()).backward()

    torch.testing.assert_close(got, want)
    torch.testing.assert_close(seq[NEXT_HIDDEN], h)
    torch.testing.assert_close(xs.grad, xr.grad)
    for (name, mine), theirs in zip(core.cell.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, msg=name)
