"""Buffer arithmetic and its errors, row-aligned storing, row-start state."""

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.startup.build import merge_specs
from machina.training.experience import Experience
from machina.training.samplers import Sequential

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
        ({"minibatch": 6}, r"minibatch_size=6 must be a multiple of experience.bptt_horizon=4"),
        ({"minibatch": 12}, r"minibatch_size=12 must divide experience.batch_size=32"),
        ({"minibatch": 64}, r"minibatch_size=64 must divide"),
        ({"batch_size": 0}, r"experience.batch_size must be a positive integer"),
        ({"num_agents": -4}, r"env.num_envs \* env.agents_per_env must be a positive integer"),
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
