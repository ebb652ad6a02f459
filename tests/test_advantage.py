"""Advantages against independent references written from the published definitions (float64, plain loops):

- GAE (Schulman et al. 2016, eq. 16): A_t = sum_l (gamma lambda)^l delta_{t+l}, summed to the end of the episode
  (or of the rollout), delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with V(s_{t+1}) = 0 after a termination and the
  value of the final observation after a truncation (Pardo et al. 2018, "Time Limits in RL");
- V-trace (Espeholt et al. 2018, eq. 1): v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i)
  rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), with rho_t = min(rho_bar, ratio_t) and c_i = lambda min(c_bar, ratio_i);
and through the buffer: every step of every segment gets an advantage and every reward enters one.
"""

import pytest
import torch

from machina.losses.functional import compute_advantages
from machina.training.experience import agent_major, segment_major

GAMMA, LAM = 0.97, 0.9


def random_trajectories(n=3, length=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, length, generator=g, dtype=torch.float64)
    rewards = torch.randn(n, length, generator=g, dtype=torch.float64)
    ends = torch.rand(n, length, generator=g)
    terminated, truncated = ends < 0.08, (ends >= 0.08) & (ends < 0.16)
    final = torch.randn(n, length, generator=g, dtype=torch.float64) * truncated
    last = torch.randn(n, generator=g, dtype=torch.float64)
    return values, rewards, terminated, truncated, final, last


def successor_value(values, terminated, truncated, final, last, i, t) -> float:
    """V of what follows step t of agent i: 0 after a termination (terminal wins over truncation), V(final
    observation) after a truncation alone, else V(x_{t+1}), and the rollout's last value after its last step."""
    if terminated[i, t]:
        return 0.0
    if truncated[i, t]:
        return float(final[i, t])
    return float(values[i, t + 1]) if t + 1 < values.shape[1] else float(last[i])


def gae_reference(values, rewards, terminated, truncated, final, last, gamma, lam):
    """The sum form of GAE, one agent and one step at a time."""
    n, length = values.shape
    adv = [[0.0] * length for _ in range(n)]
    for i in range(n):

        def delta(t, i=i):
            nxt = successor_value(values, terminated, truncated, final, last, i, t)
            return float(rewards[i, t]) + gamma * nxt - float(values[i, t])

        for t in range(length):
            total, k = 0.0, t
            while True:
                total += (gamma * lam) ** (k - t) * delta(k)
                if terminated[i, k] or truncated[i, k] or k + 1 == length:
                    break
                k += 1
            adv[i][t] = total
    return torch.tensor(adv, dtype=torch.float64)


def vtrace_reference(values, rewards, last, ratio, gamma, lam, rho_bar, c_bar):
    """IMPALA's n-step V-trace target minus V(x_s), for trajectories without episode ends, n to the rollout's end."""
    n, length = values.shape
    out = torch.zeros(n, length, dtype=torch.float64)
    for i in range(n):
        v_next = [*values[i, 1:].tolist(), float(last[i])]
        for s in range(length):
            total, trace = 0.0, 1.0
            for t in range(s, length):
                rho = min(rho_bar, float(ratio[i, t]))
                total += (
                    gamma ** (t - s) * trace * rho * (float(rewards[i, t]) + gamma * v_next[t] - float(values[i, t]))
                )
                trace *= lam * min(c_bar, float(ratio[i, t]))
            out[i, s] = total
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_over_whole_trajectories_with_terminations_and_truncations_matches_the_sum_definition(seed):
    values, rewards, terminated, truncated, final, last = random_trajectories(seed=seed)
    assert terminated.any() and truncated.any()
    ones = torch.ones_like(values)
    got = compute_advantages(values, rewards, terminated, truncated, final, last, ones, GAMMA, LAM)
    want = gae_reference(values, rewards, terminated, truncated, final, last, GAMMA, LAM)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_truncation_bootstraps_from_the_final_observation_and_termination_from_zero():
    values = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    rewards = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    no = torch.zeros(1, 3, dtype=torch.bool)
    end = torch.tensor([[False, True, False]])
    final = torch.tensor([[0.0, 10.0, 0.0]], dtype=torch.float64)
    last = torch.tensor([4.0], dtype=torch.float64)
    ones = torch.ones(1, 3, dtype=torch.float64)
    truncated = compute_advantages(values, rewards, no, end, final, last, ones, 0.5, 1.0)
    terminated = compute_advantages(values, rewards, end, no, torch.zeros_like(final), last, ones, 0.5, 1.0)
    # t=2: 2 + 0.5 * 4 - 3 = 1 (bootstraps from the rollout's last value) in both.
    # t=1 truncated: 1 + 0.5 * 10 - 2 = 4; terminated: 1 - 2 = -1. t=0: 0.5 + 0.5 * 2 - 1 = 0.5, plus 0.5 * A_1.
    assert truncated.tolist() == [[0.5 + 0.5 * 4.0, 4.0, 1.0]]
    assert terminated.tolist() == [[0.5 + 0.5 * -1.0, -1.0, 1.0]]


@pytest.mark.parametrize(("rho_bar", "c_bar"), [(1.0, 1.0), (1.0, 0.8), (2.0, 0.5)])
def test_vtrace_at_ratio_not_one_matches_impala(rho_bar, c_bar):
    values, rewards, _, _, _, last = random_trajectories(n=2, length=12, seed=3)
    ratio = torch.rand(values.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2
    no = torch.zeros(values.shape, dtype=torch.bool)
    got = compute_advantages(values, rewards, no, no, torch.zeros_like(values), last, ratio, GAMMA, LAM, rho_bar, c_bar)
    want = vtrace_reference(values, rewards, last, ratio, GAMMA, LAM, rho_bar, c_bar)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_agent_major_follows_each_agents_segments_in_pass_order_and_back():
    agents, passes, horizon = 3, 4, 5
    # Buffer row p * N + i, column t holds step p * T + t of agent i: encode (agent, step) as 100 * agent + step.
    rows = torch.tensor(
        [[100.0 * i + p * horizon + t for t in range(horizon)] for p in range(passes) for i in range(agents)]
    )
    trajectories = agent_major(rows, agents)
    assert trajectories.tolist() == [[100.0 * i + k for k in range(passes * horizon)] for i in range(agents)]
    assert torch.equal(segment_major(trajectories, agents * passes), rows)


def test_every_step_gets_an_advantage_and_every_reward_enters_one():
    """Through the buffer layout: the gradient of the summed advantages w.r.t. each stored reward is >= 1 (its own
    step's delta, at ratio 1) and each step's advantage is the reference's: no placeholder at segment edges."""
    agents, passes, horizon = 4, 3, 6
    segments = agents * passes
    g = torch.Generator().manual_seed(5)
    values = torch.randn(segments, horizon, generator=g, dtype=torch.float64)
    rewards = torch.randn(segments, horizon, generator=g, dtype=torch.float64, requires_grad=True)
    ended = torch.rand(segments, horizon, generator=g) < 0.1
    last = torch.randn(agents, generator=g, dtype=torch.float64)
    no = torch.zeros_like(ended)

    def traj(x):
        return agent_major(x, agents)

    zeros = torch.zeros(agents, passes * horizon, dtype=torch.float64)
    adv = compute_advantages(
        traj(values), traj(rewards), traj(ended), traj(no), zeros, last, torch.ones_like(zeros), GAMMA, LAM
    )
    adv = segment_major(adv, segments)
    adv.sum().backward()
    assert (rewards.grad >= 1.0).all()
    want = gae_reference(traj(values), traj(rewards.detach()), traj(ended), traj(no), zeros, last, GAMMA, LAM)
    torch.testing.assert_close(adv.detach(), segment_major(want, segments), rtol=0, atol=1e-6)
    assert (adv[:, -1] != 0).all()  # the last step of every segment has a real advantage


def test_a_step_both_terminated_and_truncated_bootstraps_from_zero():
    """Gymnasium: terminated means the MDP ended (no future value), truncated that it was cut short; a step flagged
    both ended the MDP, so its target is r_t alone, whatever V(final observation) the rollout recorded for it."""
    values = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    rewards = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
    both = torch.tensor([[False, True, False]])
    final = torch.tensor([[0.0, 4.95, 0.0]], dtype=torch.float64)
    last = torch.tensor([4.0], dtype=torch.float64)
    ones = torch.ones(1, 3, dtype=torch.float64)
    adv = compute_advantages(values, rewards, both, both, final, last, ones, 0.5, 1.0)
    # t=1: target r_1 = 1, so A_1 = 1 - V(x_1) = -1. t=2: 2 + 0.5 * 4 - 3 = 1. t=0: 0.5 + 0.5 * 2 - 1 + 0.5 * A_1.
    assert adv.tolist() == [[0.5 + 0.5 * -1.0, -1.0, 1.0]]
    assert (adv + values)[0, 1].item() == 1.0  # the V-trace target of the doubly flagged step is its reward
    # The same steps, V-trace at ratio != 1: the doubly flagged step's delta is rho_1 * (r_1 - V(x_1)).
    ratio = torch.tensor([[0.5, 0.8, 1.5]], dtype=torch.float64)
    adv = compute_advantages(values, rewards, both, both, final, last, ratio, 0.5, 1.0)
    assert adv[0, 1].item() == pytest.approx(0.8 * (1.0 - 2.0))


def vtrace_with_episode_ends(values, rewards, terminated, truncated, final, last, ratio, gamma, lam, rho_bar, c_bar):
    """Espeholt et al. 2018, eq. 1, one agent and one step at a time, in float64:
    v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) rho_t delta_t, delta_t = r_t + gamma V(x_{t+1})
    - V(x_t), rho_t = min(rho_bar, ratio_t), c_i = lambda min(c_bar, ratio_i); the sum stops at the episode's end
    (or the rollout's), V(x_{t+1}) is 0 after a termination (also when truncated too), V(final observation) after a
    truncation alone, the rollout's last value after its last step. Returns v_s - V(x_s)."""
    n, length = values.shape
    out = torch.zeros(n, length, dtype=torch.float64)
    for i in range(n):
        for s in range(length):
            total, trace = 0.0, 1.0
            for t in range(s, length):
                nxt = successor_value(values, terminated, truncated, final, last, i, t)
                delta = float(rewards[i, t]) + gamma * nxt - float(values[i, t])
                total += gamma ** (t - s) * trace * min(rho_bar, float(ratio[i, t])) * delta
                if terminated[i, t] or truncated[i, t]:
                    break
                trace *= lam * min(c_bar, float(ratio[i, t]))
            out[i, s] = total
    return out


@pytest.mark.parametrize(("rho_bar", "c_bar", "lam"), [(1.0, 1.0, 1.0), (1.0, 0.8, LAM), (2.0, 0.5, LAM)])
def test_vtrace_with_current_policy_ratios_and_episode_ends_matches_the_papers_sum(rho_bar, c_bar, lam):
    """Ratios pi/mu from two categorical policies (mu acted, pi is current), episodes that terminate, truncate, or
    both; the float32 computation against the float64 sum."""
    values, rewards, terminated, truncated, final, last = random_trajectories(n=3, length=20, seed=7)
    g = torch.Generator().manual_seed(8)
    terminated[0, 5] = truncated[0, 5] = True  # both: terminal wins
    final[0, 5] = 4.95
    mu_logits = torch.randn(*values.shape, 5, generator=g, dtype=torch.float64)
    pi_logits = mu_logits + 0.5 * torch.randn(*values.shape, 5, generator=g, dtype=torch.float64)
    actions = torch.multinomial(mu_logits.softmax(-1).view(-1, 5), 1, generator=g).view(*values.shape, 1)
    log_mu = mu_logits.log_softmax(-1).gather(-1, actions).squeeze(-1)
    log_pi = pi_logits.log_softmax(-1).gather(-1, actions).squeeze(-1)
    ratio = (log_pi - log_mu).exp()
    assert (ratio > c_bar).any() and (ratio < min(c_bar, rho_bar)).any()  # the clips matter
    f32 = [x.float() for x in (values, rewards)]
    got = compute_advantages(
        *f32, terminated, truncated, final.float(), last.float(), ratio.float(), GAMMA, lam, rho_bar, c_bar
    )
    want = vtrace_with_episode_ends(
        values, rewards, terminated, truncated, final, last, ratio, GAMMA, lam, rho_bar, c_bar
    )
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
