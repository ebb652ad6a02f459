"""Buffer arithmetic and its errors, row-aligned storing, row-start state, and the verbs training uses: trajectories,
minibatches with their state and weights, recorded ratios, the token-compacted training view, its statistics."""

import math
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.spec import PAD_TOKEN
from machina.errors import ConfigError
from machina.startup.build import merge_specs
from machina.training.experience import Experience
from machina.training.samplers import Prioritized, Sequential

SPEC = {keys.OBS: ((2, 3), torch.uint8), keys.REWARDS: ((), torch.float32), keys.ACTIONS: ((), torch.int64)}
STATE = {keys.HIDDEN: ((4,), torch.float32)}


def make(num_agents=4, batch_size=32, bptt=4, minibatch=8):
    return Experience(SPEC, STATE, num_agents, batch_size, bptt, minibatch, partial(Sequential, shuffle=False))


def test_geometry():
    exp = make()
    assert exp.segments == 8 and exp.minibatch_segments == 2 and exp.num_minibatches == 4
    assert exp.buffer.batch_size == torch.Size([8, 4])
    assert exp.buffer[keys.OBS].shape == (8, 4, 2, 3) and exp.buffer[keys.OBS].dtype == torch.uint8
    assert exp.row_state[keys.HIDDEN].shape == (8, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 36}, r"batch_size=36 must be a multiple of agents x bptt_horizon = 4 x 4 = 16.*try"),
        ({"minibatch": 6}, r"minibatch_size=6 must be a multiple of bptt_horizon=4"),
        ({"minibatch": 12}, r"minibatch_size=12 must divide batch_size=32"),
        ({"minibatch": 64}, r"minibatch_size=64 must divide"),
        ({"batch_size": 0}, r"^batch_size=0 must be an integer >= 1"),
        ({"num_agents": -4}, r"^num_agents=-4 must be an integer >= 1"),
    ],
)
def test_size_errors_explain_the_arithmetic(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make(**kwargs)


def _step(t: int, n: int = 4) -> TensorDict:
    agents = torch.arange(n)
    return TensorDict(
        {
            keys.OBS: torch.full((n, 2, 3), t, dtype=torch.uint8),
            keys.REWARDS: agents * 100.0 + t,
            keys.ACTIONS: agents,
            keys.VALUES: torch.zeros(n),  # not in the spec: must not be stored
        },
        batch_size=[n],
    )


def test_row_aligned_storing_fills_rows_in_time_order_pass_by_pass():
    exp = make()
    exp.reset_for_rollout()
    t_global = 0
    while not exp.full:
        state = TensorDict({keys.HIDDEN: torch.full((4, 4), float(t_global))}, batch_size=[4])
        exp.store(_step(t_global), state)
        t_global += 1
    assert t_global == 8  # 2 passes x bptt 4
    rewards = exp.buffer[keys.REWARDS]
    # Pass 0 -> rows 0..3 hold steps 0..3 of agents 0..3; pass 1 -> rows 4..7 hold steps 4..7.
    for agent in range(4):
        assert rewards[agent].tolist() == [agent * 100.0 + t for t in range(4)]
        assert rewards[4 + agent].tolist() == [agent * 100.0 + t for t in range(4, 8)]
    # The recurrent state recorded for each row is the one at its first step.
    assert exp.row_state[keys.HIDDEN][:4].unique().tolist() == [0.0]
    assert exp.row_state[keys.HIDDEN][4:].unique().tolist() == [4.0]
    assert keys.VALUES not in exp.buffer.keys()


def test_reset_for_rollout_restarts_at_row_zero_and_resets_ratio():
    exp = make()
    exp.buffer[keys.RATIO].fill_(3.0)
    for t in range(5):
        exp.store(_step(t), TensorDict({keys.HIDDEN: torch.zeros(4, 4)}, batch_size=[4]))
    exp.reset_for_rollout()
    exp.store(_step(9), TensorDict({keys.HIDDEN: torch.zeros(4, 4)}, batch_size=[4]))
    assert exp.buffer[keys.REWARDS][0, 0] == 9.0
    assert torch.all(exp.buffer[keys.RATIO] == 1.0)


def test_one_step_segments_are_allowed():
    exp = make(bptt=1, batch_size=8, minibatch=4)  # feed-forward policies train on single steps
    assert exp.segments == 8 and exp.num_minibatches == 2


def test_merge_specs_unions_and_refuses_conflicts():
    a = {keys.ACTIONS: ((), torch.int64)}
    b = {keys.ACTIONS: ((), torch.int64), keys.TEACHER_ACTIONS: ((), torch.int64)}
    assert set(merge_specs({"policy": a, "supervisor": b})) == {keys.ACTIONS, keys.TEACHER_ACTIONS}
    with pytest.raises(ConfigError, match="'actions' is declared as .* by policy and as .* by bad"):
        merge_specs({"policy": a, "bad": {keys.ACTIONS: ((), torch.float32)}})


# The verbs the rollout and the learner use instead of the buffer's tensors.
TRAIN_SPEC = {
    keys.OBS: ((6, 3), torch.uint8),
    keys.ACT_LOG_PROB: ((), torch.float32),
    keys.VALUES: ((), torch.float32),
    keys.REWARDS: ((), torch.float32),
}


def filled(sampler=None, compact_tokens=True, widths=(2, 4)) -> Experience:
    """4 agents x 2 passes x 4 steps; step t of agent i has reward 100 i + t, hidden state t at its row start, and
    observations whose first ``widths[pass]`` token slots are real (the rest padding)."""
    sampler = sampler or partial(Sequential, shuffle=False)
    exp = Experience(TRAIN_SPEC, STATE, 4, 32, 4, 8, sampler, compact_tokens=compact_tokens)
    exp.reset_for_rollout()
    for t in range(8):
        obs = torch.full((4, 6, 3), PAD_TOKEN, dtype=torch.uint8)
        obs[:, : widths[t // 4]] = t
        step = {
            keys.OBS: obs,
            keys.ACT_LOG_PROB: torch.full((4,), -1.0),
            keys.VALUES: torch.full((4,), 0.5),
            keys.REWARDS: torch.arange(4) * 100.0 + t,
        }
        exp.store(step, TensorDict({keys.HIDDEN: torch.full((4, 4), float(t))}, batch_size=[4]))
    return exp


def test_trajectories_are_each_agents_steps_in_time_order_and_to_rows_inverts_them():
    exp = filled()
    rewards = exp.trajectories(keys.REWARDS)
    assert rewards.tolist() == [[100.0 * i + t for t in range(8)] for i in range(4)]
    assert torch.equal(exp.to_rows(rewards), exp.rows(keys.REWARDS))
    assert exp.stores(keys.REWARDS) and not exp.stores(keys.FINAL_VALUES)
    exp.store_last_values(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert exp.last_values.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_sequential_minibatch_is_views_of_the_buffer_with_advantages_uniform_weights_and_row_state():
    exp = filled(compact_tokens=False)
    exp.prepare_training()
    advantages = torch.arange(32.0).view(8, 4)
    exp.prepare_minibatches(advantages, 0.0)
    batch = exp.minibatch(1, advantages)
    assert batch.rows == slice(2, 4)
    assert batch.stored[keys.REWARDS].data_ptr() == exp.rows(keys.REWARDS)[2].data_ptr()  # a view, no copy
    assert torch.equal(batch.data[keys.ADVANTAGES], advantages[2:4])
    assert torch.equal(batch.data[keys.PRIO_WEIGHTS], torch.ones(2, 4))
    assert batch.state[keys.HIDDEN][:, 0].tolist() == [0.0, 0.0]  # rows 2, 3: pass 0, which began at step 0
    batch.data["extra"] = torch.zeros(2, 4)  # losses may add keys: the buffer does not get them
    assert "extra" not in exp.buffer.keys()
    # The same row-side tensors every call (built once): uniform weights are not reallocated per minibatch.
    assert exp.minibatch(2, advantages).data[keys.PRIO_WEIGHTS] is batch.data[keys.PRIO_WEIGHTS]


def test_a_prioritized_minibatch_carries_the_samplers_rows_and_weights():
    exp = filled(sampler=partial(Prioritized, alpha=1.0, beta0=1.0))
    exp.prepare_training()
    advantages = torch.rand(8, 4) + 0.1
    exp.prepare_minibatches(advantages, 1.0)
    torch.manual_seed(0)
    batch = exp.minibatch(0, advantages)
    torch.manual_seed(0)
    rows, weights = exp.sampler.minibatch(0)
    assert torch.equal(batch.rows, rows)
    assert torch.equal(batch.data[keys.ADVANTAGES], advantages[rows])
    assert torch.equal(batch.data[keys.PRIO_WEIGHTS], weights.expand(2, 4))
    assert torch.equal(batch.state[keys.HIDDEN], exp.row_state[keys.HIDDEN][rows])


@pytest.mark.parametrize("rows", [slice(2, 4), torch.tensor([5, 1])], ids=["slice", "index"])
def test_recorded_ratios_land_in_the_buffers_own_rows(rows):
    exp = filled()
    exp.prepare_training()
    stored, _ = exp.segments_at(slice(0, 8))
    log_prob = torch.full((2, 4), -1.0 + math.log(2.0))
    exp.record_ratios(rows, stored[rows], log_prob)
    ratio = exp.rows(keys.RATIO)
    written = torch.zeros(8, dtype=torch.bool)
    written[rows] = True
    torch.testing.assert_close(ratio[written], torch.full((2, 4), 2.0))
    assert (ratio[~written] == 1.0).all()
    exp.reset_for_rollout()
    assert (exp.rows(keys.RATIO) == 1.0).all()


def test_the_training_view_cuts_tokens_to_the_widest_real_observation():
    exp = filled(widths=(2, 4))
    exp.prepare_training()
    stored, state = exp.segments_at(exp.blocks[0])
    assert stored[keys.OBS].shape == (2, 4, 4, 3)  # slots 5 and 6 are padding in every observation
    assert stored[keys.OBS].data_ptr() == exp.rows(keys.OBS).data_ptr()  # a view of the buffer
    assert float(exp.metrics()["experience/token_width"]) == 4.0
    assert exp.varying_dims == {keys.OBS: 2}
    everything = filled(widths=(6, 1), compact_tokens=False)
    everything.prepare_training()
    assert everything.segments_at(everything.blocks[0])[0][keys.OBS].shape == (2, 4, 6, 3)
    assert "experience/token_width" not in everything.metrics() and everything.varying_dims == {}
    # Only uint8 token observations are cut: a float observation is kept whole whatever the setting.
    floats = Experience({keys.OBS: ((6,), torch.float32)}, STATE, 4, 32, 4, 8, partial(Sequential, shuffle=False))
    assert not floats.compact_tokens


def test_an_all_padding_buffer_keeps_one_token_slot():
    exp = filled(widths=(0, 0))
    exp.prepare_training()
    assert exp.segments_at(exp.blocks[0])[0][keys.OBS].shape[2] == 1


def test_the_experience_reports_its_own_statistics():
    exp = filled()
    exp.prepare_training()
    metrics = exp.metrics()
    assert set(metrics) == {
        "experience/rewards_mean",
        "experience/values_mean",
        "experience/ratio_mean",
        "experience/token_width",
    }
    assert float(metrics["experience/rewards_mean"]) == pytest.approx(150.0 + 3.5)
    assert all(value.dim() == 0 for value in metrics.values())


ACTIVE_SPEC = {
    keys.REWARDS: ((), torch.float32),
    keys.VALUES: ((), torch.float32),
    keys.ACT_LOG_PROB: ((), torch.float32),
    keys.ACTIVE: ((), torch.bool),
}


def finishing(sampler=None) -> Experience:
    """4 agents x 8 steps in one-step segments: agent i acts on steps t < 2 (i + 1) (agents that finish at different
    times), with reward 10 i + t and value t when it acts and reward 0, value -50 on its rows after (what a policy
    computes on an inactive agent's zero observation: any number)."""
    sampler = sampler or partial(Sequential, shuffle=False)
    exp = Experience(ACTIVE_SPEC, {}, 4, 32, 1, 8, sampler)
    exp.reset_for_rollout()
    agents = torch.arange(4)
    for t in range(8):
        active = t < 2 * (agents + 1)
        step = {
            keys.REWARDS: torch.where(active, agents * 10.0 + t, 0.0),
            keys.VALUES: torch.where(active, float(t), -50.0),
            keys.ACT_LOG_PROB: torch.full((4,), -1.0),
            keys.ACTIVE: active,
        }
        exp.store(step, TensorDict({}, batch_size=[4]))
    return exp


def test_the_statistics_are_those_of_the_rows_whose_agent_acted():
    exp = finishing()
    active = exp.buffer[keys.ACTIVE]
    metrics = exp.metrics()
    for key in (keys.REWARDS, keys.VALUES, keys.RATIO):
        expected = exp.buffer[key][active].mean()
        assert float(metrics[f"experience/{key}_mean"]) == pytest.approx(float(expected))
    # 2 + 4 + 6 + 8 = 20 active rows: rewards sum to 10 (0 + 4 + 12 + 24) + (1 + 6 + 15 + 28), values to 50
    assert float(metrics["experience/rewards_mean"]) == pytest.approx((400 + 50) / 20)
    assert float(metrics["experience/values_mean"]) == pytest.approx(50 / 20)


def test_a_prioritized_experience_never_hands_out_a_segment_whose_agent_never_acted():
    exp = finishing(partial(Prioritized, alpha=0.6, beta0=0.4))
    torch.manual_seed(0)
    for _ in range(50):
        exp.prepare_minibatches(torch.randn(exp.segments, 1) * 10, 0.5)
        for i in range(exp.num_minibatches):
            batch = exp.minibatch(i, torch.zeros(exp.segments, 1))
            assert batch.stored[keys.ACTIVE].all(), batch.rows
