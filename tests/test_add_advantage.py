"""Adding an advantage estimator takes a class and an override or a YAML file, nothing else: the estimators defined
here are selected from the command line (``learner.advantage._target_=...``) and from a config folder on Hydra's
search path (``learner/advantage=myopic``), each trains a debug epoch, and its advantages are what the losses get."""

import torch

from machina import keys
from machina.startup.build import build, build_trainer
from machina.training.advantage import VTrace
from machina.training.learner import explained_variance
from tests.conftest import compose_config

ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled", "system.threads=1"]


class Myopic:
    """A_t = scale * (r_t - V(x_t)): one step, no bootstrap. Keeps every advantage tensor it returns."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale
        self.returned: list[torch.Tensor] = []

    def __call__(self, experience) -> torch.Tensor:
        advantages = self.scale * (experience.rows(keys.REWARDS) - experience.rows(keys.VALUES))
        self.returned.append(advantages.clone())
        return advantages


class RecordedVTrace(VTrace):
    """The default estimator with the same settings, keeping what it returns."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.returned: list[torch.Tensor] = []

    def __call__(self, experience) -> torch.Tensor:
        advantages = super().__call__(experience)
        self.returned.append(advantages.clone())
        return advantages


def train_one_epoch(overrides):
    """Train one debug epoch in order (no shuffle); return (trainer, the advantages each ppo minibatch got)."""
    cfg = compose_config([*ONE_EPOCH, "experience.sampler.shuffle=false", *overrides])
    parts = build(cfg)
    seen = []
    parts.losses["ppo"].register_forward_pre_hook(lambda _, args: seen.append(args[0][keys.ADVANTAGES].clone()))
    trainer = build_trainer(cfg, parts, sinks=[])
    trainer.run_epoch()
    return trainer, seen


def test_an_estimator_from_a_config_folder_on_the_search_path_reaches_the_losses(tmp_path):
    (tmp_path / "learner" / "advantage").mkdir(parents=True)
    (tmp_path / "learner" / "advantage" / "myopic.yaml").write_text(
        "_target_: tests.test_add_advantage.Myopic\nscale: 2.0\n"
    )
    trainer, seen = train_one_epoch(
        [f"hydra.searchpath=[file://{tmp_path}]", "learner/advantage=myopic", "learner.update_epochs=2"]
    )
    estimator, exp = trainer.learner.advantage, trainer.learner.experience
    assert isinstance(estimator, Myopic) and estimator.scale == 2.0
    assert len(estimator.returned) == 2  # once per update pass
    # Sequential minibatches in row order: minibatch i of pass p trained on rows block i of pass p's advantages.
    blocks = [advantages[rows] for advantages in estimator.returned for rows in exp.blocks]
    assert len(seen) == len(blocks)
    for got, want in zip(seen, blocks, strict=True):
        assert torch.equal(got, want)
    want = 2.0 * (exp.rows(keys.REWARDS) - exp.rows(keys.VALUES))
    assert torch.equal(estimator.returned[0], want)
    values = exp.rows(keys.VALUES)
    device_metrics, _ = trainer.learner.pop_metrics()
    explained = explained_variance(values, want + values)
    torch.testing.assert_close(device_metrics["experience/explained_variance"], explained)


def test_an_estimator_chosen_by_target_keeps_the_groups_settings_and_reaches_the_losses():
    trainer, seen = train_one_epoch(
        [
            "learner.advantage._target_=tests.test_add_advantage.RecordedVTrace",
            "learner.advantage.gamma=0.5",
            "learner.update_epochs=1",  # one pass: one advantage tensor (the main job trains two)
        ]
    )
    estimator = trainer.learner.advantage
    assert type(estimator) is RecordedVTrace and estimator.gamma == 0.5 and estimator.gae_lambda == 0.95
    (advantages,) = estimator.returned
    assert torch.equal(torch.cat(seen), advantages)
