"""env=pettingzoo from PettingZoo's parallel API definition (https://pettingzoo.farama.org/api/parallel/), on the
relay of ``tests/test_pettingzoo_relay.py`` (agents that finish at different times, per-agent rewards) and on MPE's
simple_spread_v3: what each slot gets per step, inactive agents, truncations, team statistics, seeds through
``reset``, refused spaces and ids, and what the trainer stores."""

import signal

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.pettingzoo import PettingZooEnv
from machina.env.spec import ImageObsSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.losses.functional import cloning_terms
from machina.losses.ppo import PPOLoss
from machina.progress import Progress
from machina.startup.build import build
from machina.training.learner import explained_variance
from tests.conftest import compose_config

RELAY = "tests.test_pettingzoo_relay:relay"


def relay(num_envs=2, seed=0, outputs=frozenset({keys.ACTIVE}), id=RELAY, pad=False, **kwargs) -> PettingZooEnv:
    return PettingZooEnv(id=id, kwargs=kwargs, pad_observations=pad, num_envs=num_envs, seed=seed, outputs=outputs)


def ones(env):
    return torch.ones(env.spec.num_agents, dtype=torch.int64)


def played(steps: int, **settings) -> PettingZooEnv:
    """A relay reset and stepped ``steps`` times with action 1 for every agent."""
    env = relay(**settings)
    env.reset()
    for _ in range(steps):
        env.step(ones(env))
    return env


def test_spec_lays_out_every_possible_agent_as_a_slot():
    env = relay(num_envs=2)
    assert (env.spec.num_envs, env.spec.agents_per_env, env.spec.num_agents) == (2, 3, 6)
    assert env.spec.num_actions == 3 and env.spec.obs.size == 4 and not env.spec.observes_time
    assert env.spec.outputs == {keys.ACTIVE}
    first = env.reset()
    # Slot i of copy e is possible_agents[i]: the observation says which agent it is.
    assert first[keys.OBS][:, 1].tolist() == [0, 1, 2, 0, 1, 2]
    assert first[keys.ACTIVE].all() and not first[keys.REWARDS].any()


@pytest.mark.parametrize("env_id", [RELAY, "tests.test_pettingzoo_relay:relay_aec"])
def test_agents_that_finish_early_are_inactive_until_the_episode_ends(env_id):
    """runner_i terminates after finish[i] = (2, 4, 5) steps; a finished agent's slot is inactive (zero observation,
    no action sent: the relay asserts it receives actions only for env.agents), each of its steps is terminal with
    zero reward; when the last agent is done the copy starts its next episode."""
    env = relay(num_envs=2, id=env_id)
    env.reset()
    per_step = [env.step(ones(env)) for _ in range(5)]
    reward = torch.tensor([1.1, 2.1, 3.1])

    def col(key):
        return torch.stack([td[key][:3] for td in per_step])

    active = [[1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]]  # for the observation after each step
    assert col(keys.ACTIVE).tolist() == [[bool(a) for a in row] for row in active]
    terminated = [[0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert col(keys.TERMINATED).tolist() == [[bool(a) for a in row] for row in terminated]
    assert not col(keys.TRUNCATED).any()
    acted = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 0, 1]]).float()
    assert torch.allclose(col(keys.REWARDS), acted * reward)
    assert not col(keys.OBS)[1][0].any() and not col(keys.OBS)[3][:2].any()  # inactive slots observe zeros
    assert col(keys.OBS)[4][:, 0].tolist() == [0, 0, 0]  # the new episode's first observation (t = 0)
    assert torch.equal(per_step[-1][keys.TERMINATED][3:], per_step[-1][keys.TERMINATED][:3])  # both copies alike


def test_each_slot_acts_for_its_own_agent():
    env = relay(num_envs=2)
    env.reset()
    td = env.step(torch.tensor([0, 1, 2, 2, 1, 0]))
    assert td[keys.OBS][:, 3].tolist() == [0, 1, 2, 2, 1, 0]  # the relay observes each agent's last action
    assert torch.allclose(td[keys.REWARDS], torch.tensor([1.0, 2.1, 3.2, 1.2, 2.1, 3.0]))


def test_team_statistics_sum_the_agents_rewards():
    env = played(5, num_envs=2)
    stats = env.episode_stats()
    team = 2 * 1.1 + 4 * 2.1 + 5 * 3.1  # each agent's return over the steps it played
    assert stats["episodes"] == 2 and stats["length"] == 10
    assert torch.isclose(stats["team_return"], torch.tensor(2 * team))
    assert torch.isclose(stats["return"], torch.tensor(2 * team / 3))  # the per-agent mean, the env contract's
    last = env.last_episodes()
    assert last["episodes"].tolist() == [1, 1] and torch.allclose(last["team_return"], torch.tensor([team, team]))
    assert env.episode_stats()["episodes"] == 0


def test_truncated_agents_hand_their_final_observation():
    """max_cycles=3 truncates the two agents still running (runner_0 terminated at step 2); the adapter gives their
    last observation as FINAL_OBS, and OBS is already the next episode's."""
    env = relay(num_envs=1, finish=(2, 10, 10), max_cycles=3)
    env.reset()
    env.step(ones(env))
    second = env.step(ones(env))
    assert keys.FINAL_OBS not in second.keys()
    third = env.step(ones(env) * 2)
    assert third[keys.TRUNCATED].tolist() == [False, True, True]
    assert third[keys.TERMINATED].tolist() == [True, False, False]  # runner_0's inactive step
    final = third[keys.FINAL_OBS]
    assert final[1:, 0].tolist() == [3, 3] and final[1:, 3].tolist() == [2, 2]  # t = 3, last action 2
    assert torch.equal(final[0], third[keys.OBS][0])  # rows not truncated: the current observation
    assert third[keys.OBS][:, 0].tolist() == [0, 0, 0] and third[keys.ACTIVE].all()


def test_seeds_go_through_reset():
    """Copy e's k-th episode is reset with seed (seed * E + e) * 1_000_000 + k: the relay's tag is the first draw
    of numpy's generator seeded with it."""
    env = relay(num_envs=2, seed=5)
    tags = env.reset()[keys.OBS][::3, 2]
    expected = [np.random.default_rng((5 * 2 + e) * 1_000_000).uniform() for e in range(2)]
    assert np.allclose(tags.numpy(), expected)
    for _ in range(5):
        obs = env.step(ones(env))[keys.OBS]
    assert np.allclose(
        obs[::3, 2].numpy(), [np.random.default_rng((5 * 2 + e) * 1_000_000 + 1).uniform() for e in range(2)]
    )
    assert torch.equal(relay(num_envs=2, seed=5).reset()[keys.OBS], relay(num_envs=2, seed=5).reset()[keys.OBS])


def test_a_restored_env_keeps_its_counters_and_starts_new_episodes():
    state = played(7, num_envs=2).state_dict()
    copy = relay(num_envs=2)
    copy.load_state_dict(state)
    assert torch.equal(copy.state_dict()["episodes"], torch.tensor([1, 1]))
    assert copy.observe()[keys.OBS][:, 0].tolist() == [0] * 6  # new episodes
    with pytest.raises(ConfigError, match="episodes"):
        copy.load_state_dict({**state, "episodes": torch.tensor([-1, 0])})


def test_active_is_returned_only_when_asked_for():
    env = relay(outputs=frozenset())
    assert keys.ACTIVE not in env.reset().keys() and keys.ACTIVE not in env.step(ones(env)).keys()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"obs_sizes": [4, 5, 4]}, r"observation shapes differ \(4 for runner_0, runner_2; 5 for runner_1\)"),
        (
            {"masks": True},
            r"agent runner_0's observation space Dict\(.*not supported.*Dict observations \(such as action",
        ),
        ({"actions": [3, 3, 4]}, r"action spaces differ .* runner_0, runner_1.* runner_2"),
        ({"box_actions": True}, r"agent runner_0's action space Box"),
    ],
)
def test_agents_with_other_spaces_are_refused_naming_them(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        relay(**kwargs)


def test_padding_widens_every_observation_to_the_widest():
    env = relay(obs_sizes=[4, 6, 4], pad=True)
    obs = env.reset()[keys.OBS]
    assert obs.shape == (6, 6) and obs[1, 4:].tolist() == [7, 7] and not obs[0, 4:].any()


def test_pad_observations_does_not_pad_action_spaces():
    with pytest.raises(ConfigError, match="action spaces differ"):
        relay(actions=[3, 4, 3], pad=True)


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("no_such_module_xyz", "env.id=no_such_module_xyz: cannot import no_such_module_xyz"),
        ("tests.test_pettingzoo_relay:nope", "has no nope"),
        ("tests.test_pettingzoo_relay", "has no parallel_env or env"),
        ("tests.test_pettingzoo_relay:sequential", "AEC env whose metadata does not set is_parallelizable"),
        ("tests.test_pettingzoo_relay:not_an_env", "returned object, not a PettingZoo ParallelEnv or AECEnv"),
        ("a b:c", "is not a PettingZoo env"),
        ("mpe2.simple_spread_v3:", "is not a PettingZoo env"),
        ("classic/nope-v1", "is not a registered PettingZoo env; registered: .*classic/rps-v2"),
        # Box2D missing (as with the pettingzoo extra), or present: continuous actions.
        ("sisl/multiwalker-v9", r"Failed to import entry point .* pip install 'pettingzoo\[sisl\]'|action space Box"),
    ],
)
def test_bad_ids_are_refused_in_one_line(env_id, message):
    with pytest.raises(ConfigError, match=message) as refused:
        relay(id=env_id)
    assert "\n" not in str(refused.value)


def test_a_constructor_that_never_returns_is_refused_in_one_line(monkeypatch):
    """Pursuit draws random free cells until each of its 38 agents (8 pursuers, 30 evaders) lands on one: on a 4 x 4
    grid of 16 cells that never ends. The run is refused, naming the env, instead of hanging at start-up."""
    from machina.env import time_limit

    monkeypatch.setattr(time_limit, "CONSTRUCTOR_SECONDS", 1.0)
    with pytest.raises(ConfigError, match=r"^env.id=sisl/pursuit-v5: its constructor did not return within 1 s"):
        PettingZooEnv("sisl/pursuit-v5", kwargs={"x_size": 4, "y_size": 4}, num_envs=1)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    PettingZooEnv("sisl/pursuit-v5", kwargs={"max_cycles": 10}, num_envs=1).close()  # one that fits: built at once


def test_mpe_spread_shares_its_reward_and_truncates_every_agent():
    env = PettingZooEnv(id="mpe2.simple_spread_v3", kwargs={"max_cycles": 5}, num_envs=2)
    env.reset()
    for _ in range(5):
        td = env.step(torch.randint(0, 5, (6,)))
    assert td[keys.TRUNCATED].all() and keys.FINAL_OBS in td.keys()
    stats = env.episode_stats()
    assert stats["episodes"] == 2 and stats["length"] == 10
    assert torch.isclose(stats["team_return"], 3 * stats["return"])
    assert env.render(1).shape == (700, 700, 3)


def rows(parts, key):
    """A stored key per agent in time order: [N, steps]."""
    x, n = parts.experience.buffer[key], parts.env.spec.num_agents
    segments, horizon = x.shape[:2]
    return x.view(segments // n, n, horizon).transpose(0, 1).reshape(n, -1)


def relay_rollout(*overrides: str):
    """The trainer's parts for 2 relays (6 agents, 120 agent steps per epoch) after one rollout."""
    base = ["env=pettingzoo", f"env.id={RELAY}", "env.num_envs=2", "policy=mlp", "experience.batch_size=120"]
    parts = build(compose_config([*base, "experience.minibatch_size=30", *overrides]))
    parts.rollout.run(Progress(0, 1))
    return parts


def test_the_trainer_stores_which_agents_acted():
    """The rollout stores ACTIVE with each observation: False exactly on the rows of finished agents."""
    parts = relay_rollout("experience.bptt_horizon=5")
    assert keys.ACTIVE in parts.experience.step_keys
    finish = torch.tensor([2, 4, 5]).repeat(2)
    # Episodes last 5 steps (the last runner's finish); an agent acts on the observations at t < its finish.
    t = torch.arange(20) % 5
    assert torch.equal(rows(parts, keys.ACTIVE), t.unsqueeze(0) < finish.unsqueeze(1))
    assert torch.equal(rows(parts, keys.TERMINATED), t.unsqueeze(0) + 1 >= finish.unsqueeze(1))


def minibatch(generator, shape=(4, 6)):
    actions = 5
    data = TensorDict(
        {
            keys.ADVANTAGES: torch.randn(shape, generator=generator),
            keys.ACT_LOG_PROB: -torch.rand(shape, generator=generator),
            keys.VALUES: torch.randn(shape, generator=generator),
            keys.PRIO_WEIGHTS: torch.rand(shape, generator=generator) + 0.5,
            keys.TEACHER_ACTIONS: torch.randint(0, actions, shape, generator=generator),
            keys.ACTIVE: torch.rand(shape, generator=generator) < 0.6,
        },
        batch_size=shape,
    )
    logits = torch.randn(*shape, actions, generator=generator)
    policy_out = TensorDict(
        {
            keys.ACT_LOG_PROB: data[keys.ACT_LOG_PROB] + 0.3 * torch.randn(shape, generator=generator),
            keys.VALUES: torch.randn(shape, generator=generator),
            keys.ENTROPY: torch.rand(shape, generator=generator),
            keys.FULL_LOG_PROBS: logits.log_softmax(-1),
        },
        batch_size=shape,
    )
    return data, policy_out


@pytest.mark.parametrize("with_ppo_mask", [False, True])
def test_ppo_on_rows_of_inactive_agents_is_ppo_on_the_active_rows_alone(with_ppo_mask):
    """No fake transitions: every PPO term (and the advantage normalisation) over a minibatch with ACTIVE is the
    same term computed on the minibatch's active rows alone, as if the inactive rows had never been stored."""
    data, policy_out = minibatch(torch.Generator().manual_seed(0))
    kept = data[keys.ACTIVE]
    if with_ppo_mask:
        data[keys.PPO_MASK] = torch.arange(24).view(4, 6) % 3 != 0
        kept = kept & data[keys.PPO_MASK]
    loss = PPOLoss(norm_adv=True, ent_coef=0.01)
    masked = loss(data, policy_out, Progress(0, 1))
    alone = data[kept].exclude(keys.ACTIVE, keys.PPO_MASK)
    reference = loss(alone, policy_out[kept], Progress(0, 1))
    for name in ("loss_policy", "loss_value", "loss_entropy", "approx_kl", "clipfrac", "value_clipfrac"):
        assert torch.allclose(masked[name], reference[name], atol=1e-6), name


def test_cloning_losses_leave_out_the_rows_of_inactive_agents():
    data, policy_out = minibatch(torch.Generator().manual_seed(1))
    active = data[keys.ACTIVE]
    nll, _ = cloning_terms(data, policy_out)
    alone, _ = cloning_terms(data[active].exclude(keys.ACTIVE), policy_out[active])
    assert torch.allclose(nll, alone)


@pytest.mark.parametrize(
    "grid, spec",
    [
        ((2, 2, 3), ImageObsSpec(size=12, height=2, width=2, channels=3)),  # (H, W, C), 1-4 channels: an image
        ((3, 3, 1), ImageObsSpec(size=9, height=3, width=3, channels=1)),
        ((3, 5), VectorObsSpec(size=15)),  # knights-archers-zombies' (27, 5) kind: a table, flattened
        ((2, 2, 5), VectorObsSpec(size=20)),  # 5 "channels": not an image
        ((4,), VectorObsSpec(size=4)),
    ],
)
def test_a_box_of_any_shape_is_flattened_and_an_image_keeps_its_shape(grid, spec):
    env = relay(grid=grid)
    assert env.spec.obs == spec and type(env.spec.obs) is type(spec)
    assert env.reset()[keys.OBS].shape == (env.spec.num_agents, spec.size)


def test_a_grid_observation_is_flattened_row_major():
    """The relay's (2, 3) observation is [[t, slot, tag], [last action, 7, 7]]: numpy's row-major flattening."""
    env = played(1, grid=(2, 3))
    first = env.observe()[keys.OBS][:3]
    assert first[:, [0, 1, 3, 4, 5]].tolist() == [[1, i, 1, 7, 7] for i in range(3)]


def test_pursuit_rows_are_its_agents_images_flattened():
    """sisl/pursuit-v5 (SISL, installed with pettingzoo): each pursuer's (7, 7, 3) observation, as the env alone
    gives it for the same reset seed, flattened row-major into its row."""
    from pettingzoo.sisl import pursuit_v5

    env = relay(id="sisl/pursuit-v5", num_envs=1, max_cycles=10)
    assert env.spec.obs == ImageObsSpec(size=147, height=7, width=7, channels=3) and env.spec.num_actions == 5
    alone = pursuit_v5.parallel_env(max_cycles=10)
    expected, _ = alone.reset(seed=0)  # copy 0's first episode of seed 0
    rows = env.reset()[keys.OBS]
    for i, name in enumerate(alone.possible_agents):
        assert torch.equal(rows[i], torch.from_numpy(expected[name].reshape(-1)).float())
    alone.close()
    env.close()


def test_a_discrete_observation_is_one_hot():
    """classic/rps-v2: each player observes the other's last move, Discrete(4) (3: none yet); rock (0) beats
    scissors (2) for +1 / -1."""
    env = relay(id="classic/rps-v2", num_envs=1, outputs=frozenset())
    assert env.spec.obs == VectorObsSpec(size=4)
    assert env.reset()[keys.OBS].tolist() == [[0, 0, 0, 1]] * 2
    td = env.step(torch.tensor([0, 2]))
    assert td[keys.OBS].tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
    assert td[keys.REWARDS].tolist() == [1.0, -1.0]


def test_the_buffer_statistics_and_the_prioritized_draws_leave_out_inactive_agents():
    """A rollout of the relay (runners finish after 2, 4, 5 of each 5-step episode): the experience's statistics are
    those of the rows whose agent acted (each of their rewards is (i + 1) + a / 10 >= 1; the others are 0), and the
    prioritized sampler never hands out a one-step segment of an agent that had finished."""
    parts = relay_rollout("experience.bptt_horizon=1", "experience/sampler=prioritized")
    exp = parts.experience
    active = exp.buffer[keys.ACTIVE]
    assert 0 < int(active.sum()) < active.numel()
    metrics = exp.metrics()
    for key in (keys.REWARDS, keys.VALUES):
        assert float(metrics[f"experience/{key}_mean"]) == pytest.approx(float(exp.buffer[key][active].mean()))
    assert float(metrics["experience/rewards_mean"]) >= 1.0
    torch.manual_seed(0)
    for _ in range(20):
        exp.prepare_minibatches(torch.randn(exp.segments, 1), 0.0)
        for i in range(exp.num_minibatches):
            assert exp.minibatch(i, torch.zeros(exp.segments, 1)).stored[keys.ACTIVE].all()


def test_explained_variance_over_the_active_rows_is_that_of_those_rows_alone():
    generator = torch.Generator().manual_seed(0)
    values, returns = torch.randn(6, 5, generator=generator), torch.randn(6, 5, generator=generator)
    rows = torch.rand(6, 5, generator=generator) < 0.5
    got = explained_variance(values, returns, rows)
    assert float(got) == pytest.approx(float(explained_variance(values[rows], returns[rows])), abs=1e-5)
    assert float(got) != pytest.approx(float(explained_variance(values, returns)), abs=1e-3)
