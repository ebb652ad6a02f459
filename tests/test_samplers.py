"""Minibatch samplers: coverage of the sequential sampler, and the prioritized sampler against its definitions
(Schaul et al. 2016: P(i) = p_i^alpha / sum p^alpha, w_i = (N P(i))^-beta / max w) with sampling without
replacement compared to the exact probabilities of drawing one item after another (what
``torch.multinomial(replacement=False)`` does)."""

import itertools

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


def exact_inclusion(probs: list[float], k: int) -> list[float]:
    """P(item in a k-subset drawn one item after another, each proportional to probs among those left)."""
    n = len(probs)
    inclusion = [0.0] * n
    for order in itertools.permutations(range(n), k):
        p, left = 1.0, 1.0
        for item in order:
            p *= probs[item] / left
            left -= probs[item]
        for item in order:
            inclusion[item] += p
    return inclusion


def test_prioritized_draws_without_replacement_with_the_probabilities_of_sequential_drawing():
    torch.manual_seed(0)
    priorities = torch.tensor([[4.0], [2.0], [1.0], [0.5], [0.5]])  # one-step segments: p_i = |A_i|
    sampler = Prioritized(segments=5, minibatch_segments=2, device=torch.device("cpu"), alpha=1.0, beta0=1.0)
    sampler.prepare(priorities, 0.0)
    probs = (priorities[:, 0] / priorities.sum()).tolist()
    counts = torch.zeros(5)
    draws = 10_000
    for _ in range(draws):
        idx, _ = sampler.minibatch(0)
        assert idx.unique().numel() == 2  # without replacement
        counts[idx] += 1
    torch.testing.assert_close(counts / draws, torch.tensor(exact_inclusion(probs, 2)), atol=0.02, rtol=0)


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
