"""Adding a sampler takes a class and an override, nothing else: this file's ``FirstBlock`` is selected with
``experience.sampler._target_=tests.test_add_sampler.FirstBlock`` and trains a debug epoch, and what it drew is what
the learner trained on."""

import torch

from machina import keys
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config

ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled", "system.threads=1"]


class FirstBlock:
    """Every minibatch is the buffer's first ``minibatch_segments`` rows with weight ``weight``; records its calls.
    The interface of ``machina.training.samplers``: built with the buffer's geometry, ``prepare`` once per update
    pass, ``minibatch(i)`` -> (rows, weights [B, 1] or None)."""

    def __init__(self, segments: int, minibatch_segments: int, device: torch.device, weight: float = 1.0):
        self.segments = segments
        self.rows = slice(0, minibatch_segments)
        self.weights = torch.full((minibatch_segments, 1), weight, device=device)
        self.calls: list[tuple] = []

    def prepare(self, advantages: torch.Tensor, progress: float, active: torch.Tensor | None) -> None:
        self.calls.append(("prepare", tuple(advantages.shape)))

    def minibatch(self, i: int) -> tuple[slice, torch.Tensor]:
        self.calls.append(("minibatch", i))
        return self.rows, self.weights


def test_a_sampler_defined_here_is_selected_by_override_and_trains_an_epoch():
    cfg = compose_config(
        [
            *ONE_EPOCH,
            "experience.sampler._target_=tests.test_add_sampler.FirstBlock",
            "~experience.sampler.shuffle",  # Sequential's setting; this sampler has its own
            "+experience.sampler.weight=0.5",
            "optimizer.lr=0.01",
            "learner.update_epochs=1",  # one pass: one prepare, one draw per minibatch (the main job trains two)
        ]
    )
    parts = build(cfg)
    sampler, exp = parts.experience.sampler, parts.experience
    assert isinstance(sampler, FirstBlock) and sampler.segments == exp.segments
    weights_seen = []
    parts.losses["ppo"].register_forward_pre_hook(lambda _, args: weights_seen.append(args[0][keys.PRIO_WEIGHTS]))
    trainer = build_trainer(cfg, parts, sinks=[])
    trainer.train()
    assert trainer.epoch == 1
    n = exp.num_minibatches
    assert n > 1
    assert sampler.calls == [("prepare", (exp.segments, exp.bptt_horizon))] + [("minibatch", i) for i in range(n)]
    # The learner trained on what it drew: only the first block's ratios were written back (the policy moved after
    # the first minibatch, so they are not 1), every other row still holds the rollout's 1.
    ratio = exp.rows(keys.RATIO)
    block = sampler.rows
    assert (ratio[block] - 1).abs().max() > 1e-4
    assert (ratio[block.stop :] == 1.0).all()
    assert len(weights_seen) == n and all(torch.equal(w, torch.full_like(w, 0.5)) for w in weights_seen)
