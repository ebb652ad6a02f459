"""Adding a policy component takes a class and an override: this file's ``ScaledCritic`` fills the critic slot with
``policy.critic._target_=tests.test_add_component.ScaledCritic`` and trains a debug epoch. Its policy files are data:
loading one is refused, naming the class, unless the configuration in force names the class
(``machina.files.trusted``: a config on the search path, or the command's composed config)."""

import pytest
import torch
from tensordict import TensorDict

from machina.errors import ConfigError
from machina.files.trusted import in_force
from machina.keys import CORE, VALUES
from machina.policy.component import Component, PolicyDims
from machina.policy.io import load_policy, policy_payload
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config

ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled", "system.threads=1"]
OVERRIDES = [
    *ONE_EPOCH,
    "policy.critic._target_=tests.test_add_component.ScaledCritic",
    "~policy.critic.hidden",  # CriticHead's setting; this component has its own
    "+policy.critic.scale=3.0",
]


class ScaledCritic(Component):
    """``CORE`` [N, H] -> ``VALUES`` [N]: a linear value times a fixed ``scale``; counts its forwards."""

    in_keys = (CORE,)
    out_keys = (VALUES,)

    def __init__(self, dims: PolicyDims, scale: float = 1.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dims.widths[CORE], 1)
        self.scale = scale
        self.out_widths = {VALUES: 1}
        self.forwards = 0

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        self.forwards += 1
        step[VALUES] = self.scale * self.linear(step[CORE]).view(-1)


def test_a_component_defined_here_fills_a_slot_and_trains_an_epoch():
    cfg = compose_config(OVERRIDES)
    parts = build(cfg)
    critic = parts.policy.critic
    assert isinstance(critic, ScaledCritic) and critic.scale == 3.0
    before = critic.linear.weight.detach().clone()
    trainer = build_trainer(cfg, parts, sinks=[])
    trainer.train()
    assert trainer.epoch == 1
    rollout_steps = parts.experience.batch_size // parts.env.spec.num_agents
    # Every rollout step and the bootstrap ran it, and then each minibatch of the update.
    assert critic.forwards >= rollout_steps + 1 + parts.experience.num_minibatches
    assert not torch.equal(critic.linear.weight, before)  # the value loss trained it
    stored = parts.experience.rows(VALUES)
    assert torch.isfinite(stored).all() and stored.abs().max() > 0


def test_its_policy_file_loads_only_where_the_configuration_in_force_names_the_class(tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_config(OVERRIDES)
    parts = build(cfg)
    payload = policy_payload(parts.policy, OmegaConf.to_container(cfg.policy, resolve=True), parts.env.spec.obs)
    path = tmp_path / "policy.pt"
    torch.save(payload, path)
    with pytest.raises(
        ConfigError,
        match=r"architecture\.critic\._target_ is 'tests\.test_add_component\.ScaledCritic', which no config on "
        r"the search path names",
    ):
        load_policy(path)  # machina's conf/ alone does not name it
    policy, _ = load_policy(path, trusted=in_force(cfg))  # this command's composed config does
    assert isinstance(policy.critic, ScaledCritic) and policy.critic.scale == 3.0
    for name, weight in parts.policy.state_dict().items():
        assert torch.equal(policy.state_dict()[name], weight), name
