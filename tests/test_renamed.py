"""Moved config keys keep their old command-line spellings (machina/startup/renamed.py): every old spelling maps to a
key or group that exists, the rewrite keeps prefixes and values and notes each move, and train.py's command line
takes the old learner.* spellings of the advantage settings."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from machina.startup import preflight
from machina.startup.build import build
from machina.startup.renamed import RENAMED, renamed
from tests.commands import run_script
from tests.conftest import compose_config

CONF = Path(__file__).resolve().parents[1] / "conf"
# Groups selected so that every renamed key's new home is in the composed config.
ALL_HOMES = ["debug=tiny", "losses=[ppo,eer_kickstarter]", "experience/sampler=prioritized"]


def key_paths(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from key_paths(value, f"{prefix}{key}.")


@pytest.mark.parametrize("old, new", RENAMED.items())
def test_every_old_spelling_names_a_key_or_group_that_exists(old, new):
    if "/" in new:
        group, _ = new.split("/")
        assert (CONF / group / new.split("/")[1]).is_dir()
        return
    paths = set(key_paths(OmegaConf.to_container(compose_config(ALL_HOMES), resolve=False)))
    assert new in paths
    assert old not in paths  # the old spelling is gone, or it would be two spellings of one setting


@pytest.mark.parametrize(
    "old, new",
    [
        ("learner.gamma=0.9", "learner.advantage.gamma=0.9"),
        ("learner.gae_lambda=0.8", "learner.advantage.gae_lambda=0.8"),
        ("learner.vtrace_rho_clip=2", "learner.advantage.rho_clip=2"),
        ("learner.vtrace_c_clip=0.5", "learner.advantage.c_clip=0.5"),
        ("trainer.gamma=0.9,0.99", "learner.advantage.gamma=0.9,0.99"),  # moved twice: straight to today's key
        ("++learner.vtrace_c_clip=2", "++learner.advantage.c_clip=2"),
        ("~learner.gamma", "~learner.advantage.gamma"),
        ("learner.compact_tokens=false", "experience.compact_tokens=false"),
        ("learner.gamma_extra=1", "learner.gamma_extra=1"),  # only whole keys move
        ("learner.update_epochs=2", "learner.update_epochs=2"),
        ("-m", "-m"),
    ],
)
def test_the_rewrite_keeps_prefix_and_value_and_notes_each_move(old, new, capsys):
    assert renamed([old]) == [new]
    note = capsys.readouterr().err
    moved_to = new.lstrip("+~").split("=")[0]
    assert (f"is now {moved_to}; taking it as such" in note) == (old != new)
    assert note.count("\n") == (old != new)  # one line per rewritten override


def test_old_advantage_spellings_compose_and_build_the_estimator_with_their_values():
    old = ["learner.gamma=0.5", "learner.gae_lambda=0.7", "learner.vtrace_rho_clip=2.0", "learner.vtrace_c_clip=0.5"]
    cfg = compose_config([*ALL_HOMES[:1], "wandb=disabled", *renamed(old)])
    advantage = build(cfg).learner.advantage
    assert (advantage.gamma, advantage.gae_lambda, advantage.rho_clip, advantage.c_clip) == (0.5, 0.7, 2.0, 0.5)


def test_preflight_checks_the_new_spelling_of_an_old_key():
    argv = preflight.check_or_exit(["learner.gamma=0.9", "--cfg", "job"], CONF)
    assert argv == ["learner.advantage.gamma=0.9", "--cfg", "job"]


def test_train_py_takes_the_old_spellings(tmp_path):
    result = run_script("train.py", "learner.gamma=0.93", "learner.vtrace_c_clip=0.6", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    advantage = OmegaConf.create(result.stdout).learner.advantage
    assert advantage.gamma == 0.93 and advantage.c_clip == 0.6
    assert "learner.gamma is now learner.advantage.gamma" in result.stderr
    assert list(tmp_path.iterdir()) == []  # printing the config writes nothing
