"""GAE with clipped importance ratios, against a plain per-element reference loop."""

import pytest
import torch

from machina.training.advantage import compute_advantages


def reference(values, rewards, dones, ratio, gamma, lam, rho_bar, c_bar):
    segments, horizon = values.shape
    adv = torch.zeros(segments, horizon, dtype=torch.float64)
    for s in range(segments):
        running = 0.0
        for t in range(horizon - 2, -1, -1):
            nd = 1.0 - float(dones[s, t + 1])
            rho = min(float(ratio[s, t]), rho_bar)
            c = min(float(ratio[s, t]), c_bar)
            delta = rho * (float(rewards[s, t + 1]) + gamma * float(values[s, t + 1]) * nd - float(values[s, t]))
            running = delta + gamma * lam * c * nd * running
            adv[s, t] = running
    return adv


@pytest.mark.parametrize("with_ratio", [False, True])
def test_matches_reference_loop(with_ratio):
    g = torch.Generator().manual_seed(0)
    shape = (5, 9)
    values = torch.randn(shape, generator=g)
    rewards = torch.randn(shape, generator=g)
    dones = (torch.rand(shape, generator=g) < 0.2).float()
    ratio = torch.rand(shape, generator=g) * 2 if with_ratio else torch.ones(shape)
    got = compute_advantages(values, rewards, dones, ratio, 0.97, 0.9, 1.0, 0.8)
    want = reference(values, rewards, dones, ratio, 0.97, 0.9, 1.0, 0.8)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.all(got[:, -1] == 0)


def test_hand_computed_single_segment():
    values = torch.tensor([[1.0, 2.0, 3.0]])
    rewards = torch.tensor([[0.0, 1.0, 5.0]])
    dones = torch.tensor([[0.0, 0.0, 1.0]])
    adv = compute_advantages(values, rewards, dones, torch.ones(1, 3), gamma=0.5, gae_lambda=1.0)
    # t=1: episode ends at t=2 -> delta = 5 - 2 = 3; t=0: delta = 1 + 0.5*2 - 1 = 1, A = 1 + 0.5*3 = 2.5
    assert adv.tolist() == [[2.5, 3.0, 0.0]]
