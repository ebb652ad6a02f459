"""Team spirit from its definition (OpenAI Five, Berner et al. 2019): each agent's reward becomes (1 - tau) x its own
+ tau x the mean of its env's agents at that step, over agents laid out env by env; the team's sum is kept; tau 0 is
the env's rewards; a schedule ramps tau; refusals for shares outside [0, 1]; and a real run logs the ramp."""

import json
from functools import partial

import pytest
import torch
from hydra.utils import instantiate

from machina import keys
from machina.errors import ConfigError
from machina.schedules import Linear
from machina.training.experience import Experience
from machina.training.samplers import Sequential
from machina.training.team_spirit import TeamSpirit
from tests.conftest import compose_config, run_train

AGENTS, TEAM, BPTT, PASSES = 8, 4, 3, 2  # two envs of four agents; each agent's rollout of 6 steps in two rows


def filled(rewards: torch.Tensor, active: torch.Tensor | None = None) -> Experience:
    """A real buffer holding ``rewards`` [N, L] (agent-major) stored step by step as a rollout stores them."""
    spec = {keys.REWARDS: ((), torch.float32)}
    if active is not None:
        spec[keys.ACTIVE] = ((), torch.bool)
    exp = Experience(spec, {}, AGENTS, AGENTS * BPTT * PASSES, BPTT, BPTT, partial(Sequential, shuffle=False))
    exp.reset_for_rollout()
    for t in range(BPTT * PASSES):
        step = {keys.REWARDS: rewards[:, t]}
        if active is not None:
            step[keys.ACTIVE] = active[:, t]
        exp.store(step, {})
    return exp


def random_rewards() -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    # Sparse and shared like a team game: shaping to one agent, a deposit's 1.0 to all four of an env.
    own = (torch.rand(AGENTS, BPTT * PASSES, generator=generator) < 0.3) * 0.1
    deposit = (torch.rand(AGENTS // TEAM, 1, BPTT * PASSES, generator=generator) < 0.2).float()
    return (own.view(AGENTS // TEAM, TEAM, -1) + deposit).view(AGENTS, -1)


@pytest.mark.parametrize("tau", [0.3, 1.0])
def test_each_agent_gets_its_own_share_plus_tau_times_its_envs_mean(tau):
    rewards = random_rewards()
    exp = filled(rewards)
    assert TeamSpirit(tau, TEAM)(exp, agent_step=0) == tau
    mixed = exp.trajectories(keys.REWARDS)
    for agent in range(AGENTS):
        team = range(agent // TEAM * TEAM, agent // TEAM * TEAM + TEAM)  # agent index = env * A + slot
        for t in range(BPTT * PASSES):
            expected = (1 - tau) * float(rewards[agent, t]) + tau * sum(float(rewards[j, t]) for j in team) / TEAM
            assert float(mixed[agent, t]) == pytest.approx(expected, abs=1e-6)
    # Per env and step the team's total is unchanged, so is the return an evaluation scores.
    torch.testing.assert_close(mixed.view(2, TEAM, -1).sum(1), rewards.view(2, TEAM, -1).sum(1))
    if tau == 1.0:  # every agent of an env is credited alike
        assert torch.equal(mixed.view(2, TEAM, -1).amin(1), mixed.view(2, TEAM, -1).amax(1))


def test_tau_zero_leaves_the_stored_rewards_as_they_are():
    rewards = random_rewards()
    exp = filled(rewards)
    before = exp.rows(keys.REWARDS).clone()
    assert TeamSpirit(0.0, TEAM)(exp, agent_step=10**6) == 0.0
    assert torch.equal(exp.rows(keys.REWARDS), before)


def test_agents_that_did_not_act_share_nothing_and_keep_zero():
    rewards = random_rewards()
    active = torch.ones(AGENTS, BPTT * PASSES, dtype=torch.bool)
    active[1, 2:] = False  # agent 1 of env 0 finished early: its rows are not transitions
    rewards[1, 2:] = 0.0
    exp = filled(rewards, active)
    TeamSpirit(1.0, TEAM)(exp, agent_step=0)
    mixed = exp.trajectories(keys.REWARDS)
    assert torch.equal(mixed[1, 2:], torch.zeros(BPTT * PASSES - 2))
    acting = [0, 2, 3]
    expected = rewards[acting, 4].mean()  # the mean over the three agents still playing
    torch.testing.assert_close(mixed[acting, 4], expected.expand(3))


def test_a_schedule_ramps_tau_over_agent_steps():
    spirit = TeamSpirit(Linear(start=0.0, end=1.0, begin_step=100, end_step=300), TEAM)
    exp = filled(random_rewards())
    assert [spirit(exp, step) for step in (0, 100, 200, 300, 10**6)] == [0.0, 0.0, 0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    "tau",
    [1.5, -0.1, float("nan"), "lots", Linear(start=0.0, end=2.0, end_step=10), Linear(start=-1.0, end=0.0, end_step=5)],
)
def test_a_share_outside_zero_to_one_is_refused(tau):
    with pytest.raises(ConfigError, match=r"learner\.team_spirit"):
        TeamSpirit(tau, TEAM)


def test_agents_that_do_not_make_whole_teams_are_refused():
    with pytest.raises(ConfigError, match="do not make teams of agents_per_env=3"):
        TeamSpirit(1.0, 3)(filled(random_rewards()), agent_step=0)


def test_the_config_builds_a_schedule_from_the_command_line():
    cfg = compose_config(["learner.team_spirit={_target_:machina.schedules.Linear,start:0,end:1,end_step:5}"])
    assert instantiate(cfg.learner.team_spirit) == Linear(start=0, end=1, end_step=5)
    assert compose_config([]).learner.team_spirit == 0.0


def test_a_run_logs_the_ramp_it_trains_with(tmp_path):
    run = tmp_path / "run"
    spirit = "learner.team_spirit={_target_:machina.schedules.Linear,start:0.0,end:1.0,begin_step:1024,end_step:3072}"
    result = run_train(["debug=tiny", "trainer.total_timesteps=5120", spirit, f"hydra.run.dir={run}"])
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Each epoch's tau is the schedule's at the agent step its rollout started from (1,024 steps per epoch).
    assert [row["train/team_spirit"] for row in rows] == [0.0, 0.0, 0.5, 1.0, 1.0]
