"""``policy=fast``'s encoder and core against their definitions: the token bag as a sum of one table row per token
(written out token by token), its weight gradient against PyTorch's own ``embedding_bag``, and the LSTM core's
training path against ``nn.LSTMCell`` stepped one step at a time (values and gradients)."""

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from machina.env.spec import PAD_TOKEN, ObsSpec
from machina.errors import ConfigError
from machina.keys import CELL, CORE, ENCODED, EPISODE_START, HIDDEN, NEXT_CELL, NEXT_HIDDEN, OBS
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


def bag_by_definition(
    table: torch.Tensor,
    obs: torch.Tensor,
    axes: tuple | None = None,
    directions: torch.Tensor | None = None,
    distances: torch.Tensor | None = None,
) -> torch.Tensor:
    """The encoder docstring's sum, token by token: a categorical feature owns ``(norm + 1) * cells`` rows, one per
    (value clamped to norm, cell), weighted 1; a scaled feature owns ``cells`` rows weighted value / norm; features
    own consecutive blocks in id order; padding and unknown ids add nothing. ``axes``: (rows [levels, window, D],
    columns [levels, window, D]), the row of a (feature, value)'s window row and column, added to its cell's row.
    ``directions`` [levels, 3, 3, D]: the row of a (feature, value)'s direction from the window's centre, indexed by
    (is the cell above, on or below the centre's row; left of, on or right of its column), added as well;
    ``distances`` [levels, K, D]: the row of its Manhattan distance from the centre, added as well."""
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
            embedding = table[row]
            if axes is not None:  # level: the (feature, value) block the row lies in
                level = (row - cell) // cells
                embedding = embedding + axes[0][level, location >> 4] + axes[1][level, location & 0xF]
            level, centre, dy, dx = (row - cell) // cells, SPEC.window // 2, location >> 4, location & 0xF
            if directions is not None:
                vertical = 0 if dy < centre else 1 if dy == centre else 2
                horizontal = 0 if dx < centre else 1 if dx == centre else 2
                embedding = embedding + directions[level, vertical, horizontal]
            if distances is not None:
                embedding = embedding + distances[level, abs(dy - centre) + abs(dx - centre)]
            out[i] += weight * embedding
    return out


def test_token_bag_sums_one_table_row_per_token():
    encoder = TokenBagEncoder(PolicyDims(obs=SPEC, num_actions=3, widths={}), embed_dim=8, hidden=8)
    obs = tokens(64)
    table = encoder.bag.weight.detach()
    got = bag_sum(table, *encoder.token_rows(obs))
    torch.testing.assert_close(got, bag_by_definition(table, obs), rtol=1e-5, atol=1e-5)


def test_axis_embeddings_add_the_row_and_column_of_each_tokens_line():
    dims = PolicyDims(obs=SPEC, num_actions=3, widths={})
    encoder = TokenBagEncoder(dims, embed_dim=8, hidden=8, axis_embeddings=True)
    obs = tokens(64, seed=3)
    plain = TokenBagEncoder(dims, embed_dim=8, hidden=8)
    plain.load_state_dict(encoder.state_dict(), strict=False)
    step = TensorDict({OBS: obs}, batch_size=[64])
    before = [step.clone(), step.clone()]
    encoder(before[0], None), plain(before[1], None)
    torch.testing.assert_close(before[0][ENCODED], before[1][ENCODED])  # axis rows start at zero: the same policy

    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        encoder.row_rows.normal_(generator=g)
        encoder.column_rows.normal_(generator=g)
    axes = (encoder.row_rows.detach()[:, :, 0], encoder.column_rows.detach()[:, 0])
    got = bag_sum(encoder.table().detach(), *encoder.token_rows(obs))
    torch.testing.assert_close(got, bag_by_definition(encoder.bag.weight.detach(), obs, axes), rtol=1e-5, atol=1e-5)


def test_direction_and_distance_embeddings_add_the_rows_of_each_tokens_direction_and_distance_from_the_agent():
    dims = PolicyDims(obs=SPEC, num_actions=3, widths={})
    g = torch.Generator().manual_seed(5)
    obs = tokens(64, seed=6)
    for axis, direction, distance in ((False, True, False), (False, False, True), (True, True, True)):
        shared = {"axis_embeddings": axis, "direction_embeddings": direction, "distance_embeddings": distance}
        encoder = TokenBagEncoder(dims, embed_dim=8, hidden=8, **shared)
        plain = TokenBagEncoder(dims, embed_dim=8, hidden=8)
        plain.load_state_dict(encoder.state_dict(), strict=False)
        torch.testing.assert_close(encoder.table(), plain.table())  # zero at the start: the same policy
        with torch.no_grad():
            for parameter in (p for name, p in encoder.named_parameters() if name.endswith("_rows")):
                parameter.normal_(generator=g)
        levels = encoder.bag.weight.shape[0] // SPEC.window**2
        expected = bag_by_definition(
            encoder.bag.weight.detach(),
            obs,
            (encoder.row_rows.detach()[:, :, 0], encoder.column_rows.detach()[:, 0]) if axis else None,
            encoder.direction_rows.detach().view(levels, 3, 3, 8) if direction else None,  # documented order
            encoder.distance_rows.detach() if distance else None,
        )
        got = bag_sum(encoder.table().detach(), *encoder.token_rows(obs))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert encoder.table().shape == plain.table().shape


def test_shared_rows_share_what_is_learned_about_a_cell_along_its_lines_its_direction_and_its_distance():
    """One gradient step on "ore at cell (1, 1)" (up and left of the 5x5 window's centre (2, 2), 2 steps away) moves
    the encoding of ore at (1, 4) and (4, 1) (the same row, the same column) only with axis embeddings, of ore at
    (0, 0) (up and left) only with direction embeddings, of ore at (3, 3) (2 steps away) only with distance
    embeddings, and of ore at (3, 4) (none of these) in no encoder."""

    def ore_at(dy: int, dx: int) -> torch.Tensor:
        obs = torch.full((1, SPEC.max_tokens, 3), PAD_TOKEN, dtype=torch.uint8)
        obs[0, 0] = torch.tensor([dy << 4 | dx, 1, 2])
        return obs

    cells = {
        "trained": ore_at(1, 1),
        "row": ore_at(1, 4),
        "column": ore_at(4, 1),
        "direction": ore_at(0, 0),
        "distance": ore_at(3, 3),
        "none": ore_at(3, 4),
    }
    moved = {}
    for shared in (None, "axis", "direction", "distance"):
        torch.manual_seed(0)
        dims = PolicyDims(obs=SPEC, num_actions=3, widths={})
        encoder = TokenBagEncoder(dims, 8, 8, **({f"{shared}_embeddings": True} if shared else {}))

        def encode(obs: torch.Tensor, encoder: TokenBagEncoder = encoder) -> torch.Tensor:
            return bag_sum(encoder.table(), *encoder.token_rows(obs))

        before = {name: encode(obs).detach() for name, obs in cells.items()}
        encode(cells["trained"]).sum().backward()
        with torch.no_grad():
            for parameter in encoder.parameters():
                if parameter.grad is not None:
                    parameter -= 0.1 * parameter.grad
        moved[shared] = {name for name, obs in cells.items() if not torch.equal(encode(obs).detach(), before[name])}
    assert moved[None] == {"trained"}
    assert moved["axis"] == {"trained", "row", "column"}
    assert moved["direction"] == {"trained", "direction"}
    assert moved["distance"] == {"trained", "distance"}


def film_by_definition(self_rows: torch.Tensor, obs: torch.Tensor, lead: int) -> torch.Tensor:
    """``[gamma, beta]`` [N, 2 * hidden] as the encoder docstring defines them, token by token: of the first ``lead``
    tokens, those on the window's centre cell (the agent's own) add the row of their (feature, value), a categorical
    feature's value clamped to its norm and weighted 1, a scaled feature's one row weighted value / norm; features own
    consecutive blocks of rows in id order; padding and unknown ids add nothing."""
    sizes = [int(n) + 1 if n <= 16 else 1 for n in SPEC.feature_norms]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    centre = (SPEC.window // 2) << 4 | (SPEC.window // 2)
    out = torch.zeros(obs.shape[0], self_rows.shape[1])
    for i, observation in enumerate(obs[:, :lead].tolist()):
        for location, feature, value in observation:
            if feature >= SPEC.num_features or location != centre:
                continue
            norm = SPEC.feature_norms[feature]
            if norm <= 16:
                out[i] += self_rows[starts[feature] + min(value, int(norm))]
            else:
                out[i] += value / norm * self_rows[starts[feature]]
    return out


def test_self_film_scales_and_shifts_the_encoding_by_the_tokens_on_the_agents_own_cell():
    """ENCODED = MLP(bag) * (1 + gamma) + beta, [gamma, beta] summed over the agent's own-cell tokens among the first
    ``self_tokens``; zero rows at the start, so the first policy is the one without it."""
    dims = PolicyDims(obs=SPEC, num_actions=3, widths={})
    encoder = TokenBagEncoder(dims, embed_dim=8, hidden=6, self_film=True, self_tokens=7)
    plain = TokenBagEncoder(dims, embed_dim=8, hidden=6)
    plain.load_state_dict(encoder.state_dict(), strict=False)
    obs = tokens(96, seed=5)
    g = torch.Generator().manual_seed(6)
    own = torch.rand(obs.shape[:2], generator=g) < 0.5  # half the tokens moved onto the agent's cell
    obs[..., 0] = torch.where(own & (obs[..., 1] != PAD_TOKEN), (SPEC.window // 2) * 17, obs[..., 0])
    step = TensorDict({OBS: obs}, batch_size=[96])
    before = [step.clone(), step.clone()]
    encoder(before[0], None), plain(before[1], None)
    torch.testing.assert_close(before[0][ENCODED], before[1][ENCODED])

    with torch.no_grad():
        encoder.self_rows.normal_(generator=g)
    encoder(step, None)
    base = encoder.mlp(bag_by_definition(encoder.bag.weight.detach(), obs)).detach()
    gamma, beta = film_by_definition(encoder.self_rows.detach(), obs, 7).chunk(2, -1)
    # Among the first 7 tokens there are own-cell tokens and others, and past them own-cell tokens too: an encoder that
    # read every cell, or every token, would not match the definition.
    centre, real = obs[..., 0] == (SPEC.window // 2) * 17, obs[..., 1] < SPEC.num_features
    assert (centre & real)[:, :7].any(1).float().mean() > 0.8 and (~centre & real)[:, :7].any()
    assert (centre & real)[:, 7:].any()
    torch.testing.assert_close(step[ENCODED].detach(), base * (1 + gamma) + beta, rtol=1e-5, atol=1e-5)


def test_self_film_refuses_a_count_of_tokens_it_cannot_read():
    dims = PolicyDims(obs=SPEC, num_actions=3, widths={})
    for bad in (0, -3, 2.5, "4"):
        with pytest.raises(ConfigError, match=rf"policy.encoder.self_tokens={bad!r} must be an integer >= 1"):
            TokenBagEncoder(dims, self_film=True, self_tokens=bad)


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


@pytest.mark.parametrize("skip", ["highway", "concat"])
def test_lstm_core_skip_passes_the_input_past_the_state_in_training_and_in_rollout(skip):
    """SRU's highway (Lei et al. 2018) with the LSTM's output gate o = sigmoid(W_io x + W_ho h + b_o) as its gate:
    CORE = h' + (1 - o) x; concat: CORE = [h', x]. The rollout's single steps give what the training forward gives."""
    torch.manual_seed(1)
    batch, steps, hidden = 5, 7, 4
    core = LSTMCore(PolicyDims(obs=SPEC, num_actions=3, widths={ENCODED: hidden}), hidden_size=hidden, skip=skip)
    assert core.out_widths[CORE] == (hidden if skip == "highway" else 2 * hidden)
    reference = torch.nn.LSTMCell(hidden, hidden)
    reference.load_state_dict(core.cell.state_dict())
    x = torch.randn(batch, steps, hidden)
    starts = (torch.rand(batch, steps) < 0.3).float()
    h0, c0 = torch.randn(batch, hidden), torch.randn(batch, hidden)
    with torch.no_grad():
        step = TensorDict({ENCODED: x.flatten(0, 1), EPISODE_START: starts.flatten()}, batch_size=[batch * steps])
        core(step, TensorDict({HIDDEN: h0, CELL: c0}, batch_size=[batch]))
        got = step[CORE].view(batch, steps, -1)
        h, c = h0, c0
        rows = slice(3 * hidden, None)  # nn.LSTMCell's gate order: i, f, g, o
        for t in range(steps):
            keep = (1 - starts[:, t]).unsqueeze(1)
            h, c = h * keep, c * keep
            o = torch.sigmoid(
                x[:, t] @ reference.weight_ih[rows].T
                + h @ reference.weight_hh[rows].T
                + reference.bias_ih[rows]
                + reference.bias_hh[rows]
            )
            h, c = reference(x[:, t], (h, c))
            want = h + (1 - o) * x[:, t] if skip == "highway" else torch.cat([h, x[:, t]], -1)
            torch.testing.assert_close(got[:, t], want)
        state = TensorDict({HIDDEN: h0, CELL: c0}, batch_size=[batch])
        for t in range(steps):  # the rollout: one step at a time, the state carried
            one = TensorDict({ENCODED: x[:, t], EPISODE_START: starts[:, t]}, batch_size=[batch])
            core(one, state)
            torch.testing.assert_close(one[CORE], got[:, t])
            state = TensorDict({HIDDEN: state[NEXT_HIDDEN], CELL: state[NEXT_CELL]}, batch_size=[batch])
