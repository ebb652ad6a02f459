"""GPU checks: no host-device sync in a rollout step or a minibatch. Skipped where no CUDA device exists."""

import pytest
import torch

from machina import keys
from machina.build import build, build_trainer
from machina.policy.inputs import rollout_input
from machina.training.cuda_graph import GraphedForward
from tests.conftest import compose_config
from tests.test_train import TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("losses", ["[ppo]", "[ppo,supervisor]", "[sliced_scripted_cloner,ppo]"])
def test_rollout_and_update_never_sync_on_cuda(losses, cuda_graphs):
    cfg = compose_config([*TINY, f"losses={losses}", "system.device=cuda", f"system.cuda_graphs={cuda_graphs}"])
    trainer = build_trainer(cfg, build(cfg), sinks=[])
    trainer.rollout.run(trainer.progress)  # warm-up (and capture): lazy init and first-touch allocations may sync
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
    assert torch.isfinite(trainer.experience.buffer[keys.VALUES]).all()


def test_cuda_graph_forward_matches_eager_and_follows_weight_updates():
    cfg = compose_config([*TINY, "system.device=cuda", "system.cuda_graphs=true"])
    parts = build(cfg)
    trainer = build_trainer(cfg, parts, sinks=[])
    policy, rollout = parts.policy, trainer.rollout
    assert isinstance(rollout.forward, GraphedForward)
    policy.eval()
    step = rollout.step_td
    for _ in range(2):  # the first call captures, the second replays
        with torch.no_grad():
            graphed = rollout.forward(rollout_input(step, rollout.state))
            eager = policy(rollout_input(step, rollout.state))
        for key in (keys.VALUES, keys.NEXT_HIDDEN, keys.NEXT_CELL):
            torch.testing.assert_close(graphed[key], eager[key])
        with torch.no_grad():  # an in-place update, as the optimizer makes: the replay must read it
            for param in policy.parameters():
                param.mul_(0.5)
    kept = rollout.forward(rollout_input(step, rollout.state))[keys.VALUES]
    copy = kept.clone()
    other_state = rollout.state.clone().apply_(lambda x: x.fill_(0.5))
    # Keep the other state, do not reset it.
    step = step.clone().set(keys.EPISODE_START, torch.zeros_like(step[keys.EPISODE_START]))
    other = rollout.forward(rollout_input(step, other_state))[keys.VALUES]
    assert not torch.equal(other, copy)  # the replay computed something else...
    torch.testing.assert_close(kept, copy)  # ...and the earlier outputs are not the graph's static memory
