"""What the policy keeps inside ``ComponentPolicy.weights_fixed`` (the encoder's embedding table, built once per
rollout or evaluation instead of every step): the outputs of computing it every step, never stale once the weights
change outside the block, in an eager or a compiled rollout, and never in the way of a gradient."""

import copy
import json

import pytest
import torch

from machina import keys
from machina.policy.inputs import training_input
from tests.commands import run_script
from tests.test_eval import run_eval
from tests.test_learner import make_trainer
from tests.test_policy import make_policy, random_obs, random_state, sequence_td
from tests.test_rollout import TINY

ENCODER_WEIGHTS = ("bag.weight", "row_rows", "column_rows", "direction_rows", "distance_rows")


def shaken_policy() -> torch.nn.Module:
    """policy=fast with every weight moved off its initial value (the shared rows start at zero, which would make
    a table without them look right)."""
    policy = make_policy("fast")
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return policy


def step_outputs(policy, td) -> dict[str, torch.Tensor]:
    out = policy.act(td.clone())
    return {key: out[key] for key in (keys.LOGITS, keys.VALUES, keys.NEXT_QRNN_CELL)}


def rollout_td(policy, batch=32):
    return sequence_td(
        policy, random_obs(batch, 1)[:, 0], (torch.rand(batch) < 0.2).float(), random_state(policy, batch)
    )


def test_a_step_inside_weights_fixed_gives_the_outputs_of_a_step_outside():
    policy = shaken_policy()
    td = rollout_td(policy)
    with torch.inference_mode():
        plain = step_outputs(policy, td)
        with policy.weights_fixed():
            kept = [step_outputs(policy, td) for _ in range(2)]
    for out in kept:
        for key, value in plain.items():
            assert torch.equal(out[key], value), key


def test_weights_written_between_two_blocks_are_the_weights_the_second_block_plays():
    """An Adam step between two blocks (as the learner's, between two rollouts): the second block must act as a
    policy built with the new weights acts, and differently from the first block (or the check would be empty)."""
    policy = shaken_policy()
    td = rollout_td(policy)
    with torch.no_grad(), policy.weights_fixed():
        before = step_outputs(policy, td)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
    policy(sequence_td(policy, random_obs(8, 4), torch.zeros(8, 4), actions=torch.zeros(8, 4, dtype=torch.long)))[
        keys.VALUES
    ].square().sum().backward()
    optimizer.step()
    rebuilt = make_policy("fast")
    rebuilt.load_state_dict(policy.state_dict())
    with torch.no_grad():
        with policy.weights_fixed():
            after = step_outputs(policy, td)
        expected = step_outputs(rebuilt, td)
    for key, value in expected.items():
        assert torch.equal(after[key], value), key
    assert (after[keys.VALUES] - before[keys.VALUES]).abs().max() > 1e-3


def test_a_forward_with_gradients_inside_the_block_trains_the_embeddings():
    policy = shaken_policy()
    td = sequence_td(policy, random_obs(8, 4), torch.zeros(8, 4), actions=torch.zeros(8, 4, dtype=torch.long))
    with policy.weights_fixed():
        policy(td)[keys.VALUES].sum().backward()
    grads = {name: param.grad for name, param in policy.encoder.named_parameters()}
    for name in ENCODER_WEIGHTS:
        assert grads[name] is not None and grads[name].abs().sum() > 0, name


# Compiled: slow (its first compile takes half a minute on 2 cores); the fast tier keeps the eager rollout here and a
# compiled run in tests/test_system.py.
@pytest.mark.parametrize("compile", ["false", pytest.param("true", marks=pytest.mark.slow)])
@pytest.mark.parametrize("bf16", ["false", "true"])
def test_a_rollout_after_an_update_stores_what_the_updated_weights_give(compile, bf16):
    """Rollout, update (a large learning rate, so the embedding table moves), rollout: the second buffer's stored
    values and log-probabilities are those of a training forward with the updated weights (to float rounding: 1e-5
    in float32; with bf16 products an input that rounds the other way in the two computations moves an output by
    more, 1.3e-5 seen compiled), not of the table the first rollout kept (which gives values 0.19-0.28 away), eager
    and compiled."""
    overrides = ["optimizer.lr=0.01", f"system.compile={compile}", "system.threads=1", f"system.bf16_matmuls={bf16}"]
    trainer = make_trainer(overrides)
    rounding = 1e-3 if bf16 == "true" else 1e-5
    policy, exp = trainer.learner.policy, trainer.learner.experience
    trainer.rollout.run(trainer.progress)
    old_encoder = copy.deepcopy(policy.encoder.state_dict())
    trainer.learner.run(trainer.progress)
    trainer.rollout.run(trainer.progress)
    trainer.learner.prepare()  # the training view of this buffer (its token width), as the next update reads it
    stale = copy.deepcopy(policy)
    stale.encoder.load_state_dict(old_encoder)
    stale_gap = 0.0
    for rows in exp.blocks:  # with gradients: a forward that could read a kept table would not be the reference
        stored, state = exp.segments_at(rows)
        fresh = policy(training_input(stored, state))
        for key in (keys.VALUES, keys.ACT_LOG_PROB):
            torch.testing.assert_close(stored[key], fresh[key].detach(), rtol=0, atol=rounding)
        old = stale(training_input(stored, state))[keys.VALUES].detach()
        stale_gap = max(stale_gap, float((old - stored[keys.VALUES]).abs().max()))
    assert stale_gap > 0.05, stale_gap


@pytest.mark.slow
@pytest.mark.parametrize("compile", ["false", "true"])
def test_the_last_periodic_evaluation_scores_what_eval_py_scores_on_the_same_episodes(tmp_path, compile):
    """train.py evaluates its averaged weights after its last epoch (swapped in, then a kept table built from them);
    eval.py of the run folder, on the same layouts and action draws (its seed = system.seed + evaluation.seed_offset),
    must return the same numbers. A table kept from the training weights, or from an earlier evaluation, would not."""
    run = tmp_path / "run"
    train = ["trainer.eval_interval=1", "evaluation.episodes=64", "learner.average_horizon=2048"]
    # The sizes and thread count of the rollout test above: compiled, its graphs come from the compile cache.
    train += [*TINY, "optimizer.lr=0.01", "system.threads=1", "trainer.total_timesteps=6144"]
    result = run_script("train.py", *train, f"system.compile={compile}", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.output[-3000:]
    periodic = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    out = tmp_path / "eval"
    args = [f"checkpoint={run}", "episodes=64", f"seed={1 + 1_000_003}", "replay=false", f"hydra.run.dir={out}"]
    run_eval(args, cwd=tmp_path)  # asserts eval.py's exit status 0
    report = json.loads((out / "eval.json").read_text())["policy"]
    for stat in ("return", "hearts_made", "resources_gathered"):
        assert periodic[f"eval/{stat}"] == pytest.approx(report[stat], abs=1e-6), stat
