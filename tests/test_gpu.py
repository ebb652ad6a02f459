"""GPU checks: no host-device sync in a rollout step or a minibatch. Skipped where no CUDA device exists."""

import pytest
import torch

from machina.build import build, build_trainer
from tests.conftest import compose_config
from tests.test_train import TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("losses", ["[ppo]", "[ppo,supervisor]", "[sliced_scripted_cloner,ppo]"])
def test_rollout_and_update_never_sync_on_cuda(losses):
    cfg = compose_config([*TINY, f"losses={losses}", "system.device=cuda"])
    trainer = build_trainer(cfg, build(cfg), sinks=[])
    trainer.rollout.run(trainer.progress)  # warm-up: lazy init and first-touch allocations may sync
    trainer.learner.run(trainer.progress)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        trainer.rollout.run(trainer.progress)
        trainer.learner.run(trainer.progress)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
