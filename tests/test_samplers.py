"""Minibatch samplers: coverage of the sequential sampler, and the prioritized sampler against its definitions
(Schaul et al. 2016: P(i) = p_i^alpha / sum p^alpha, independent draws from P, w_i = (N P(i))^-beta / max w), and
against what the importance weights are for: an unbiased uniform mean of the loss over the segments."""

import pytest
import torch

from machina.training.samplers import Prioritized, Sequential


@pytest.mark.parametrize("shuffle", [False, True])
def test_sequential_covers_every_segment_once_per_update_epoch(shuffle):
    sampler = Sequential(segments=12, minibatch_segments=3, device=torch.device("cpu"), shuffle=shuffle)
    orders = []
    for _ in range(2):
        sampler.prepare(torch.zeros(12, 4), 0.0)
        drawn = [torch.arange(12)[sampler.minibatch(i)[0]] for i in range(4)]
        assert all(sampler.minibatch(i)[1] is None for i in range(4))
        order = torch.cat(drawn)
        assert sorted(order.tolist()) == list(range(12))
        orders.append(order.tolist())
    if shuffle:
        assert orders[0] != orders[1] or orders[0] != list(range(12))
    else:
        assert orders == [list(range(12))] * 2
        assert isinstance(sampler.minibatch(0)[0], slice)  # zero-copy views of the buffer


def test_prioritized_draws_independently_with_the_priority_probabilities():
    """Every row of a minibatch is an independent draw from P (with replacement): the draw frequencies match P, a
    segment can appear twice in one minibatch, and the first and second rows are uncorrelated."""
    torch.manual_seed(0)
    priorities = torch.tensor([[4.0], [2.0], [1.0], [0.5], [0.5]])  # one-step segments: p_i = |A_i|
    sampler = Prioritized(segments=5, minibatch_segments=2, device=torch.device("cpu"), alpha=1.0, beta0=1.0)
    sampler.prepare(priorities, 0.0)
    probs = priorities[:, 0] / priorities.sum()
    draws = torch.stack([sampler.minibatch(0)[0] for _ in range(10_000)])  # [draws, 2]
    assert draws.dtype == torch.int64 and int(draws.min()) >= 0 and int(draws.max()) <= 4
    for row in range(2):
        freq = torch.bincount(draws[:, row], minlength=5) / len(draws)
        torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    same = (draws[:, 0] == draws[:, 1]).float().mean()
    assert float(same) == pytest.approx(float((probs**2).sum()), abs=0.015)  # P(i_1 = i_2) = sum_i P(i)^2


def uniform_mean_estimates(sampler: Prioritized, f: torch.Tensor, minibatches: int) -> tuple[torch.Tensor, ...]:
    """Per minibatch: the loss-style mean of w * f over its samples, and the mean of w (both [minibatches])."""
    wf, w = [], []
    for _ in range(minibatches):
        idx, weights = sampler.minibatch(0)
        wf.append((weights[:, 0] * f[idx]).mean())
        w.append(weights[:, 0].mean())
    return torch.stack(wf), torch.stack(w)


@pytest.mark.parametrize(
    "f",
    [
        [1.0, 1.0, 1.0, 1.0, 1.0],
        pytest.param([0.0, 1.0, 2.0, 3.0, 4.0], marks=pytest.mark.slow),  # 2 s each: the skewed case runs in both tiers
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ],
)
def test_prioritized_importance_weights_make_the_loss_an_unbiased_uniform_mean(f):
    """What PER's importance weights are for (Schaul et al. 2016, sec. 3.4), at beta = 1.

    A loss averages w * term over a minibatch's k samples: L = (1/k) sum_n w(i_n) f(i_n), with w(i) =
    (S P(i))^-1 / max_j (S P(j))^-1 = P_min / P(i). For k independent draws i_n ~ P (what the weights assume),
    E[L] = sum_i P(i) (P_min / P(i)) f(i) = P_min sum_i f(i) = c * (1/S) sum_i f(i), with c = S * P_min, the
    max-normalisation constant, which is also E[mean w] (f = 1). So E[L] = S P_min * uniform mean of f, and
    E[L] / E[mean w] = uniform mean of f. Checked within 4 Monte-Carlo standard errors on 5 one-step segments with
    very unequal priorities, where sampling without replacement inflates E[mean w] by ~14% (0.357 vs 0.3125).
    """
    torch.manual_seed(1)
    priorities = torch.tensor([[4.0], [2.0], [1.0], [0.5], [0.5]])
    sampler = Prioritized(segments=5, minibatch_segments=2, device=torch.device("cpu"), alpha=1.0, beta0=1.0)
    sampler.prepare(priorities, 1.0)
    f = torch.tensor(f)
    probs = priorities[:, 0] / priorities.sum()
    uniform_mean = f.mean()
    c = 5 * probs.min()

    wf, w = uniform_mean_estimates(sampler, f, 20_000)
    n = len(wf)
    se = wf.std() / n**0.5
    assert abs(float(wf.mean() - c * uniform_mean)) < 4 * float(se) + 1e-6
    assert abs(float(w.mean() - c)) < 4 * float(w.std() / n**0.5) + 1e-6
    # The ratio estimator: its standard error by the delta method on the per-minibatch pairs.
    ratio = wf.mean() / w.mean()
    ratio_se = (wf - ratio * w).std() / (w.mean() * n**0.5)
    assert abs(float(ratio - uniform_mean)) < 4 * float(ratio_se) + 1e-6


def test_prioritized_weights_are_normalised_once_by_their_maximum_and_anneal_beta():
    advantages = torch.tensor([[3.0, -1.0], [1.0, 0.0], [0.5, 0.5], [0.25, 0.0]])
    sampler = Prioritized(segments=4, minibatch_segments=4, device=torch.device("cpu"), alpha=0.5, beta0=0.4)
    priority = advantages.abs().sum(1).pow(0.5) + 1e-6
    probs = priority / priority.sum()
    for progress, beta in ((0.0, 0.4), (0.5, 0.7), (1.0, 1.0)):
        sampler.prepare(advantages, progress)
        idx, weights = sampler.minibatch(0)
        raw = (4 * probs) ** -beta
        torch.testing.assert_close(weights[:, 0], (raw / raw.max())[idx])
        assert weights.shape == (4, 1) and float(weights.max()) == pytest.approx(1.0)


def test_prioritized_never_draws_a_segment_whose_agent_never_acted():
    """With ``active`` (envs whose agents finish at different times), a segment none of whose rows acted is never
    drawn, the others with P(i) from the |A| of their active rows only, and the weights are normalised over the
    segments that can be drawn (the largest is 1 at beta = 1)."""
    torch.manual_seed(0)
    advantages = torch.tensor([[1.0, 9.0], [5.0, 5.0], [2.0, 2.0], [7.0, 7.0], [3.0, 0.0]])
    active = torch.tensor([[True, False], [False, False], [True, True], [False, False], [True, True]])
    sampler = Prioritized(segments=5, minibatch_segments=4, device=torch.device("cpu"), alpha=1.0, beta0=1.0)
    sampler.prepare(advantages, 0.0, active=active)
    draws, weights = zip(*(sampler.minibatch(0) for _ in range(5_000)), strict=True)
    draws = torch.stack(draws).flatten()
    freq = torch.bincount(draws, minlength=5) / len(draws)
    assert int(freq[1]) == 0 and int(freq[3]) == 0  # no active row: never drawn
    torch.testing.assert_close(freq, torch.tensor([1.0, 0, 4.0, 0, 3.0]) / 8.0, atol=0.015, rtol=0)
    weights = torch.stack(weights).flatten()
    assert float(weights.max()) == pytest.approx(1.0) and float(weights.min()) == pytest.approx(0.25)


def test_prioritized_draws_uniformly_when_no_row_of_the_buffer_acted():
    sampler = Prioritized(segments=3, minibatch_segments=2, device=torch.device("cpu"), alpha=0.6, beta0=0.4)
    sampler.prepare(torch.randn(3, 2), 0.0, active=torch.zeros(3, 2, dtype=torch.bool))
    idx, weights = sampler.minibatch(0)
    assert ((idx >= 0) & (idx < 3)).all() and torch.equal(weights, torch.ones(2, 1))
