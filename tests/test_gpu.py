"""GPU checks: no host-device sync in a rollout step or a minibatch, and CUDA graphs that replay what the eager
code computes. Skipped where no CUDA device exists (``tests/test_cuda_graph.py`` checks the graph plumbing on CPU)."""

import pytest
import torch

from machina import keys
from machina.policy.inputs import training_input
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config
from tests.test_checkpoint import teacher  # noqa: F401 (a fixture: a policy file for eer_kickstarter)
from tests.test_train import TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LOSSES = ["[ppo]", "[ppo,supervisor]", "[sliced_scripted_cloner,ppo]", "[ppo,eer_cloner]", "[ppo,eer_kickstarter]"]


def cuda_trainer(overrides):
    cfg = compose_config([*TINY, "system.device=cuda", *overrides])
    return build_trainer(cfg, build(cfg), sinks=[])


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("sampler", ["sequential", "prioritized"])
@pytest.mark.parametrize("losses", LOSSES)
def test_rollout_and_update_never_sync_on_cuda(losses, sampler, cuda_graphs, request):
    extra = [f"losses.eer_kickstarter.teacher.path={request.getfixturevalue('teacher')}"] if "kick" in losses else []
    trainer = cuda_trainer(
        [f"losses={losses}", f"experience/sampler={sampler}", f"system.cuda_graphs={cuda_graphs}", *extra]
    )
    trainer.rollout.run(trainer.progress)  # warm-up (and captures): lazy init and first-touch allocations may sync
    trainer.learner.run(trainer.progress)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.rollout.run(trainer.progress)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    trainer.learner.prepare()  # the epoch's one host read: the width of the compacted token observations
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.learner.update(trainer.progress)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.isfinite(trainer.learner.experience.buffer[keys.VALUES]).all()


@pytest.mark.parametrize("losses", ["[ppo]", "[ppo,supervisor]"])
def test_a_graphed_rollout_stores_what_the_eager_policy_and_env_compute(losses):
    """[ppo]: forward and env step in one graph; [ppo,supervisor]: the forward's graph, teacher-led hooks, then the
    env eagerly. The stored values and log-probs are the eager policy's on the stored steps, and the stored
    rewards what the eager env returns for the stored actions from the same state."""
    trainer = cuda_trainer([f"losses={losses}", "system.cuda_graphs=true"])
    rollout, exp = trainer.rollout, trainer.learner.experience
    assert (rollout.whole_step is not None) == (losses == "[ppo]")
    env_before = {k: v.clone() for k, v in trainer.rollout.env.state_dict().items()}
    live_before = rollout.live.clone()
    trainer.learner.policy.eval()
    rollout.run(trainer.progress)
    with torch.no_grad():
        again = trainer.learner.policy(training_input(exp.buffer, exp.row_state))
    torch.testing.assert_close(exp.buffer[keys.VALUES], again[keys.VALUES], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(exp.buffer[keys.ACT_LOG_PROB], again[keys.ACT_LOG_PROB], rtol=1e-4, atol=1e-4)
    # Replay the stored actions through an eager copy of the env from where the rollout started.
    eager = cuda_trainer([f"losses={losses}"]).rollout.env
    eager.load_state_dict(env_before)
    eager.prepare_rollout(exp.batch_size // exp.num_agents)
    n = exp.num_agents
    for t in range(exp.batch_size // n):
        row, col = divmod(t, exp.bptt_horizon)
        rows = slice(row * n, (row + 1) * n)
        result = eager.step(exp.buffer[keys.ACTIONS][rows, col])
        assert torch.equal(result[keys.REWARDS], exp.buffer[keys.REWARDS][rows, col]), t
    assert not torch.equal(rollout.live[keys.OBS], live_before[keys.OBS])


def test_a_graphed_update_trains_what_the_eager_update_does():
    graphed, eager = (cuda_trainer([f"system.cuda_graphs={flag}", "learner.update_epochs=2"]) for flag in (True, False))
    eager.learner.policy.load_state_dict(graphed.learner.policy.state_dict())
    graphed.rollout.run(graphed.progress)
    for key in ("buffer", "row_state"):
        getattr(eager.learner.experience, key).update_(getattr(graphed.learner.experience, key))
    eager.learner.experience.last_values.copy_(graphed.learner.experience.last_values)
    for trainer in (graphed, eager):
        trainer.learner.run(trainer.progress)
    assert graphed.learner.whole_update.graphs
    for (name, a), b in zip(eager.learner.policy.named_parameters(), graphed.learner.policy.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
