"""Every option of every config group composes and builds; presets apply from any working directory."""

from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.startup.build import build_losses
from tests.commands import run_script
from tests.conf_walk import env_for_policy
from tests.conftest import CONF, compose_config

GROUPS = ["env", "policy", "losses", "experience", "system", "trainer", "optimizer", "wandb"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    cfg = compose_config([f"{group}={option}"])
    assert group in cfg
    if group == "losses":
        assert list(cfg.losses) == [option] and cfg.losses[option].enabled is True


def test_defaults_are_the_machina_1_recipe():
    cfg = compose_config()
    assert list(cfg.losses) == ["ppo"]
    assert cfg.system.torch_deterministic is False  # the preset wins over conf/system/default.yaml
    assert cfg.policy.action_probs.emit_full_log_probs is False
    assert cfg.policy.encoder._target_.endswith("TokenBagEncoder")  # policy=fast


def test_command_line_beats_the_preset():
    cfg = compose_config(["losses=[ppo,supervisor]", "system.torch_deterministic=true", "policy=vit"])
    assert list(cfg.losses) == ["ppo", "supervisor"]
    assert cfg.system.torch_deterministic is True
    assert cfg.policy.action_probs.emit_full_log_probs is True


# conv builds a PettingZoo pursuit env (about 4 s): in the full suite; test_conv_encoder.py covers it in the fast tier.
@pytest.mark.parametrize(
    "policy", [p if p != "conv" else pytest.param(p, marks=pytest.mark.slow) for p in options("policy")]
)
def test_every_policy_builds_for_its_env(policy):
    """Each policy option builds for the env it plays (the default env, or the first whose observations it reads,
    derived: ``tests.conf_walk.env_for_policy``) and acts on that env's observations with its actions."""
    cfg = compose_config([f"policy={policy}", f"env={env_for_policy(policy)}", "env.num_envs=2"])
    env = instantiate(cfg.env)
    try:
        net = instantiate(cfg.policy, obs_spec=env.spec.obs, num_actions=env.spec.num_actions)
        obs = env.reset()[keys.OBS]
        td = TensorDict({keys.OBS: obs.unsqueeze(1), keys.EPISODE_START: torch.ones(len(obs), 1)}, [len(obs)])
        td.update(net.initial_state(len(obs), "cpu"))
        with torch.no_grad():
            actions = net(td)[keys.ACTIONS]
    finally:
        env.close()
    assert net.num_actions == env.spec.num_actions
    assert actions.shape == (env.spec.num_agents, 1) and ((actions >= 0) & (actions < env.spec.num_actions)).all()


@pytest.mark.parametrize("loss", options("losses"))
def test_every_loss_builds(loss):
    cfg = compose_config([f"losses={loss}"])
    if loss == "eer_kickstarter":
        with pytest.raises(ConfigError, match="losses.eer_kickstarter.teacher.path=None names no teacher"):
            build_losses(cfg.losses)
    else:
        (built,) = build_losses(cfg.losses).values()
        assert isinstance(built, torch.nn.Module)


def test_disabled_loss_is_not_built():
    cfg = compose_config(["losses=[ppo,supervisor]", "losses.supervisor.enabled=false"])
    assert list(build_losses(cfg.losses)) == ["ppo"]


def test_loss_without_target_is_refused():
    cfg = compose_config(["+losses.custom.coef=1"])
    with pytest.raises(ConfigError, match="losses.custom has settings but no _target_"):
        build_losses(cfg.losses)


def test_a_preset_tuning_a_loss_that_is_left_out_says_how_to_drop_it():
    """machina_1_dagger sets the supervisor's schedule; losses=[ppo] leaves the loss out but not its settings."""
    cfg = compose_config(["experiment=machina_1_dagger", "losses=[ppo]"])
    with pytest.raises(ConfigError) as refused:
        build_losses(cfg.losses)
    message = str(refused.value)
    assert "'supervisor' is not among the selected losses ['ppo']" in message
    assert "losses.supervisor.enabled=false" in message and "\n" not in message
    dropped = compose_config(["experiment=machina_1_dagger", "losses.supervisor.enabled=false"])
    assert list(build_losses(dropped.losses)) == ["ppo"]


def test_train_py_refuses_a_left_out_loss_with_that_message_and_writes_nothing(tmp_path):
    """The derived emit_full_log_probs reads the losses before they are built: it must pass over the left-out loss's
    settings (no _target_) so that the command stops with the message above, not an interpolation error."""
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py", "experiment=machina_1_dagger", "losses=[ppo]", "debug=tiny", f"hydra.run.dir={run_dir}"
    )
    output = result.output
    assert result.returncode == 2
    assert "ConfigError: losses.supervisor has settings but no _target_" in output, output[-2000:]
    assert "Traceback" not in output and "interpolation" not in output
    assert not run_dir.exists()


@pytest.mark.parametrize("option", options("optimizer"))
def test_optimizers_are_partials(option):
    cfg = compose_config([f"optimizer={option}"])
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(instantiate(cfg.optimizer)(params), torch.optim.Optimizer)


@pytest.mark.parametrize("option", options("wandb"))
def test_wandb_modes(option):
    assert compose_config([f"wandb={option}"]).wandb.mode == option


def test_preset_applies_from_another_working_directory(tmp_path):
    result = run_script("train.py", "experiment=machina_1_supervisor", "--cfg", "job", "--resolve", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load(result.stdout)
    assert list(job["losses"]) == ["ppo", "supervisor"]
    assert job["policy"]["action_probs"]["emit_full_log_probs"] is True
    assert not (Path(tmp_path) / "outputs").exists()  # --cfg prints only; nothing runs
