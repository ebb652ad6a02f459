"""Every preset in experiments/ (found in the folder, so a new one is covered with no edit): its tiny run
(``experiment=<name> debug=tiny``) keeps the preset's recipe and only shrinks its sizes, and one epoch of it builds and
trains in-process with finite losses; a preset that lists another in its defaults holds only its deltas and wins
over the one it lists."""

import json
import math
import re

import pytest
import torch
import yaml
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from machina.run import train
from tests.conf_walk import skipped_without_its_extra
from tests.conftest import CONF, ROOT, compose_config
from tests.test_checkpoint import teacher  # noqa: F401 (a fixture: a policy file for eer_kickstarter)

PRESETS = sorted(path.stem for path in (ROOT / "experiments").glob("*.yaml"))
ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled"]


def leaves(node, prefix: str = "") -> dict:
    """``{"a.b.c": value}`` for every leaf of a nested dict (a list is one leaf)."""
    if isinstance(node, dict):
        return {key: value for k, v in node.items() for key, value in leaves(v, f"{prefix}{k}.").items()}
    return {prefix[:-1]: node}


def composed(overrides) -> dict:
    """The leaves of the composed config; a preset whose sweeper or launcher plugin (the sweep extra) is not
    installed is skipped (Hydra ships only the basic ones, so a missing ``hydra/...`` option is a plugin's)."""
    try:
        cfg = compose_config(overrides)
    except MissingConfigException as error:
        if not (error.missing_cfg_file or "").startswith("hydra/"):
            raise
        pytest.skip(f"{error.missing_cfg_file} is a Hydra plugin's: pip install -e '.[sweep]'")
    return leaves(OmegaConf.to_container(cfg))


@pytest.fixture(autouse=True)
def torch_threads():
    """A preset's system.threads (cartpole: 1) is process-wide; the next test gets the threads back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_every_preset_file_is_global():
    for name in PRESETS:
        assert (ROOT / "experiments" / f"{name}.yaml").read_text().startswith("# @package _global_"), name


@pytest.mark.parametrize("name", PRESETS)
def test_debug_tiny_shrinks_the_sizes_of_a_preset_and_keeps_the_rest(name):
    """Everything the preset sets (losses, update epochs, learning rate, schedules, curriculum, policy, env) survives
    debug=tiny, and debug=tiny's sizes win over the preset's: it comes after the preset."""
    sizes = leaves(yaml.safe_load((CONF / "debug" / "tiny.yaml").read_text()))
    preset, tiny = composed([f"experiment={name}"]), composed([f"experiment={name}", "debug=tiny"])
    assert {k: v for k, v in tiny.items() if k not in sizes} == {k: v for k, v in preset.items() if k not in sizes}
    assert {k: tiny[k] for k in sizes} == sizes


# A tiny training each (about 1 s): the fast tier trains the main job's preset and the Gymnasium one, every preset's
# composition being checked there by the test above; the full suite trains them all.
FAST_PRESETS = ("machina_1", "cartpole")


@pytest.mark.parametrize("name", [n if n in FAST_PRESETS else pytest.param(n, marks=pytest.mark.slow) for n in PRESETS])
def test_every_preset_trains_one_epoch_of_its_tiny_run(name, tmp_path, request):
    overrides = [f"experiment={name}", *ONE_EPOCH]
    config = composed(overrides)
    if config.get("losses.eer_kickstarter.teacher.path", "") is None:  # the preset leaves the teacher to the user
        overrides.append(f"losses.eer_kickstarter.teacher.path={request.getfixturevalue('teacher')}")
    with skipped_without_its_extra():  # a preset of an env whose extra is not installed
        train(compose_config(overrides), tmp_path / "run")

    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["metric/agent_step"] == 1024
    losses = {key: value for key, value in row.items() if key.startswith("losses/")}
    enabled = {key.split(".")[1] for key, on in config.items() if re.fullmatch(r"losses\.\w+\.enabled", key) and on}
    assert {key.split("/")[1] for key in losses} == enabled
    assert all(math.isfinite(value) for value in losses.values()), losses


def test_a_preset_that_lists_another_holds_its_deltas_and_wins_over_it():
    tuned, curriculum = (
        compose_config(["experiment=machina_1_ppo_tuned"]),
        compose_config(["experiment=machina_1_ppo_curriculum"]),
    )
    assert (tuned.learner.update_epochs, curriculum.learner.update_epochs) == (2, 1)
    assert curriculum.optimizer == tuned.optimizer and curriculum.losses == tuned.losses
    assert not tuned.trainer.curriculum and len(curriculum.trainer.curriculum) == 2

    # machina_1_supervisor lists machina_1_sliced_cloner for its cloning budget and overrides its losses.
    sliced, supervisor, dagger = (
        compose_config([f"experiment={name}"])
        for name in ("machina_1_sliced_cloner", "machina_1_supervisor", "machina_1_dagger")
    )
    assert list(sliced.losses) == ["sliced_scripted_cloner", "ppo"]
    assert list(supervisor.losses) == list(dagger.losses) == ["ppo", "supervisor"]
    assert sliced.learner == supervisor.learner == dagger.learner and sliced.experience == dagger.experience
    assert supervisor.losses.supervisor.teacher_led_proportion == 0.5
    assert dagger.losses.supervisor.teacher_led_proportion.start == 0.5
    # The command line's choice wins over both presets' (its order shows it is not theirs).
    chosen = compose_config(["experiment=machina_1_dagger", "losses=[supervisor,ppo]"])
    assert list(chosen.losses) == ["supervisor", "ppo"]
