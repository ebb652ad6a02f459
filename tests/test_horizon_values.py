"""The horizon-values loss from its definitions: the lambda-return (Sutton & Barto 2018, eq. 12.18's recursive form
G_t = r_t + g (1 - done_t) ((1 - lambda) V(x_{t+1}) + lambda G_{t+1})), the n-step sums it reduces to at lambda 0 and
1, the regression 0.5 (V - G)^2 averaged over discounts and live samples; the critic's extra outputs; refusals of
bad settings at construction and at start-up; and a real run that trains and writes a policy file that loads."""

import json

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.losses.horizon_values import HorizonValueLoss, horizon_returns
from machina.policy.component import PolicyDims
from machina.policy.heads import CriticHead
from machina.progress import Progress
from tests.commands import one_error_line, run_script

B, T = 3, 7
GAMMAS = (0.5, 0.9, 0.99)


def minibatch(terminated=None, truncated=None, final_values=False, active=None) -> TensorDict:
    generator = torch.Generator().manual_seed(5)
    data = {
        keys.REWARDS: torch.randn(B, T, generator=generator),
        keys.TERMINATED: torch.zeros(B, T, dtype=torch.bool) if terminated is None else terminated,
        keys.TRUNCATED: torch.zeros(B, T, dtype=torch.bool) if truncated is None else truncated,
        keys.PRIO_WEIGHTS: torch.ones(B, T),
    }
    if final_values:
        data[keys.FINAL_VALUES] = torch.full((B, T), 123.0)  # the main value's: never the horizon values' bootstrap
    if active is not None:
        data[keys.ACTIVE] = active
    return TensorDict(data, batch_size=[B, T])


def random_values() -> torch.Tensor:
    return torch.randn(B, T, len(GAMMAS), generator=torch.Generator().manual_seed(6))


def reference(values, batch, gammas, lam, own_on_truncation=False):
    """The recursive lambda-return, one segment, one discount and one step at a time, in plain Python."""
    out = torch.zeros(B, T - 1, len(gammas))
    for i in range(B):
        for k, g in enumerate(gammas):
            following = float(values[i, T - 1, k])  # G of the last step: its own value, the segment's bootstrap
            for t in range(T - 2, -1, -1):
                r = float(batch[keys.REWARDS][i, t])
                if batch[keys.TERMINATED][i, t]:
                    nxt, following = 0.0, 0.0
                elif batch[keys.TRUNCATED][i, t]:
                    nxt = float(values[i, t, k]) if own_on_truncation else 0.0
                    following = nxt
                else:
                    nxt = float(values[i, t + 1, k])
                following = r + g * ((1 - lam) * nxt + lam * following)
                out[i, t, k] = following
    return out


@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
def test_the_targets_are_lambda_returns_at_each_discount(lam):
    values, batch = random_values(), minibatch()
    got = horizon_returns(values, batch, torch.tensor(GAMMAS), lam)
    assert got.shape == (B, T - 1, len(GAMMAS))
    torch.testing.assert_close(got, reference(values, batch, GAMMAS, lam), rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_the_one_step_target_and_lambda_one_the_discounted_sum():
    values, batch = random_values(), minibatch()
    r, gammas = batch[keys.REWARDS], torch.tensor(GAMMAS)
    one_step = horizon_returns(values, batch, gammas, 0.0)
    torch.testing.assert_close(one_step, r[:, :-1, None] + gammas * values[:, 1:], rtol=1e-5, atol=1e-5)
    whole = horizon_returns(values, batch, gammas, 1.0)
    for t in range(T - 1):  # sum of g^j r_{t+j} up to the last step, then g^(T-1-t) V(x_{T-1})
        powers = gammas[None, :] ** torch.arange(T - 1 - t, dtype=torch.float32)[:, None]  # [steps, K]
        expected = (r[:, t : T - 1, None] * powers).sum(1) + gammas ** (T - 1 - t) * values[:, T - 1]
        torch.testing.assert_close(whole[:, t], expected, rtol=1e-5, atol=1e-5)


def test_an_ended_episode_is_not_bootstrapped_and_cuts_the_return():
    terminated = torch.zeros(B, T, dtype=torch.bool)
    terminated[0, 2] = True
    truncated = torch.zeros(B, T, dtype=torch.bool)
    truncated[1, 4] = True
    values, batch = random_values(), minibatch(terminated, truncated)
    got = horizon_returns(values, batch, torch.tensor(GAMMAS), 0.9)
    torch.testing.assert_close(got[0, 2], batch[keys.REWARDS][0, 2].expand(len(GAMMAS)))
    torch.testing.assert_close(got[1, 4], batch[keys.REWARDS][1, 4].expand(len(GAMMAS)))
    torch.testing.assert_close(got, reference(values, batch, GAMMAS, 0.9), rtol=1e-5, atol=1e-5)


def test_a_truncation_the_env_does_not_observe_bootstraps_from_the_steps_own_horizon_value():
    truncated = torch.zeros(B, T, dtype=torch.bool)
    truncated[2, 3] = True
    values, batch = random_values(), minibatch(truncated=truncated, final_values=True)
    got = horizon_returns(values, batch, torch.tensor(GAMMAS), 0.9)
    expected = batch[keys.REWARDS][2, 3] + torch.tensor(GAMMAS) * values[2, 3]
    torch.testing.assert_close(got[2, 3], expected)
    torch.testing.assert_close(got, reference(values, batch, GAMMAS, 0.9, True), rtol=1e-5, atol=1e-5)


def test_the_loss_is_half_the_mean_squared_error_over_discounts_and_live_samples_and_trains_only_the_values():
    active = torch.ones(B, T, dtype=torch.bool)
    active[1, :3] = False
    batch = minibatch(active=active)
    values = random_values().requires_grad_(True)
    loss = HorizonValueLoss(GAMMAS, gae_lambda=0.7, coef=2.0)
    out = loss(batch, TensorDict({keys.HORIZON_VALUES: values}, batch_size=[B, T]), Progress(0, 1))
    targets = reference(values.detach(), batch, GAMMAS, 0.7)
    live = active[:, :-1]
    expected = 0.5 * ((values.detach()[:, :-1] - targets) ** 2).mean(-1)[live].mean()
    torch.testing.assert_close(out["horizon_value_loss"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss_horizon_values"].detach(), 2.0 * expected, rtol=1e-5, atol=1e-6)
    out["loss_horizon_values"].backward()
    # The targets are constants: d/dV = coef (V - G) / (K * live samples) on live rows before the last step, else 0.
    grad = torch.zeros_like(values)
    grad[:, :-1] = 2.0 * (values.detach()[:, :-1] - targets) / (len(GAMMAS) * live.sum())
    grad[:, :-1][~live] = 0.0
    torch.testing.assert_close(values.grad, grad, rtol=1e-4, atol=1e-6)


def test_a_critic_with_horizons_outputs_them_beside_the_value():
    dims = PolicyDims(obs=None, num_actions=5, widths={keys.CORE: 16})
    critic = CriticHead(dims, horizons=3)
    assert critic.out_keys == (keys.VALUES, keys.HORIZON_VALUES)
    step = TensorDict({keys.CORE: torch.randn(4, 16)}, batch_size=[4])
    critic(step, TensorDict({}, batch_size=[4]))
    assert step[keys.VALUES].shape == (4,) and step[keys.HORIZON_VALUES].shape == (4, 3)
    plain = CriticHead(dims)
    assert plain.out_keys == (keys.VALUES,)
    step = TensorDict({keys.CORE: torch.randn(4, 16)}, batch_size=[4])
    plain(step, TensorDict({}, batch_size=[4]))
    assert keys.HORIZON_VALUES not in step.keys()


@pytest.mark.parametrize("horizons", [-1, 1.5, True, "3"])
def test_a_bad_horizon_count_is_refused(horizons):
    dims = PolicyDims(obs=None, num_actions=5, widths={keys.CORE: 16})
    with pytest.raises(ValueError, match="policy.critic.horizons"):
        CriticHead(dims, horizons=horizons)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gammas": []}, "gammas is empty"),
        ({"gammas": [0.9, 1.5]}, "gammas"),
        ({"gammas": [float("nan")]}, "gammas"),
        ({"gae_lambda": -0.1}, "gae_lambda"),
        ({"coef": -1.0}, "coef"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        HorizonValueLoss(**kwargs)


def test_a_critic_with_another_count_of_values_is_refused_with_the_fix():
    loss = HorizonValueLoss(GAMMAS)
    out = TensorDict({keys.HORIZON_VALUES: torch.zeros(B, T, 2)}, batch_size=[B, T])
    with pytest.raises(ConfigError, match="set policy.critic.horizons=3"):
        loss(minibatch(), out, Progress(0, 1))


def test_segments_of_one_step_which_hold_no_target_are_refused():
    out = TensorDict({keys.HORIZON_VALUES: torch.zeros(B, 1, len(GAMMAS))}, batch_size=[B, 1])
    with pytest.raises(ConfigError, match="experience.bptt_horizon is 1"):
        HorizonValueLoss(GAMMAS)(minibatch()[:, :1], out, Progress(0, 1))


def test_a_run_without_the_critics_horizons_is_refused_at_start_up(tmp_path):
    result = run_script("train.py", "debug=tiny", "losses=[ppo,horizon_values]", f"hydra.run.dir={tmp_path / 'run'}")
    line = one_error_line(result)
    assert "consumes horizon_values, which the policy does not write" in line
    assert "add +policy.critic.horizons=<number of the loss's gammas>" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_run_trains_the_horizon_values_and_its_policy_file_evaluates(tmp_path):
    run = tmp_path / "run"
    result = run_script(
        "train.py", "debug=tiny", "losses=[ppo,horizon_values]", "+policy.critic.horizons=3", f"hydra.run.dir={run}"
    )
    assert result.returncode == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [row["losses/horizon_values/horizon_value_loss"] for row in rows]
    assert len(losses) == len(rows) > 0 and all(0 < loss < 100 for loss in losses)
    policy = sorted((run / "checkpoints").glob("policy_*.pt"))[-1]
    out = f"hydra.run.dir={run / 'e'}"
    evaluated = run_script("eval.py", f"checkpoint={policy}", "episodes=2", "replay=false", out)
    assert evaluated.returncode == 0, evaluated.output[-3000:]
    assert json.loads((run / "e" / "eval.json").read_text())["policy"]["episodes"] == 2
