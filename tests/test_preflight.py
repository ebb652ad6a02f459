"""The check of train.py's command line before Hydra starts: misspelt group options and keys get the valid choices and
the closest one, exit 2 and no run folder; an unwritable run folder is refused; sweeps pass untouched."""

import os

import pytest

from machina.errors import ConfigError
from machina.startup import preflight
from machina.startup.preflight import check
from tests.conftest import CONF, run_train


def refused(argv) -> str:
    with pytest.raises(ConfigError) as err:
        check(argv, CONF)
    return str(err.value)


@pytest.mark.parametrize(
    "argv, wrong, closest, options",
    [
        (["losses=[ppo,supervisr]"], "supervisr", "supervisor", "ppo, sliced_scripted_cloner, supervisor"),
        (["policy=fsat"], "fsat", "fast", "options: conv, fast, mlp, vit"),
        (["experiment=machina1_supervisor"], "machina1_supervisor", "machina_1_supervisor", "machina_1_sweep"),
        (["-m", "losses=[ppo],[ppo,supervisr]"], "supervisr", "supervisor", "eer_cloner"),  # every sweep value
        (["-m", "losses=choice([ppo],[ppo,eer_clner])"], "eer_clner", "eer_cloner", "eer_kickstarter"),
        (["-m", "hydra/launcher=jobilb"], "jobilb", "joblib", "basic"),
    ],
)
def test_a_misspelt_group_option_lists_the_options_and_the_closest(argv, wrong, closest, options):
    message = refused(argv)
    group = argv[-1].split("=")[0]
    assert f"'{wrong}' is not an option of group {group} (did you mean '{closest}'?)" in message
    assert options in message


@pytest.mark.parametrize(
    "argv, closest",
    [
        (["trainer.total_timestep=10"], "trainer.total_timesteps"),
        (["env.num_env=8"], "env.num_envs"),
        (["sytem.seed=3"], "system.seed"),  # a misspelt parent
        (["seed=3"], "system.seed"),  # a key with that name elsewhere
        (["-m", "learner.advantage.gama=0.9,0.99"], "learner.advantage.gamma"),
        (["-m", "optimizer.lrr=interval(0.0001,0.01)"], "optimizer.lr"),
        (["policy=vit", "policy.encoder.num_latent=4"], "policy.encoder.num_latents"),  # a key of the chosen option
    ],
)
def test_a_misspelt_key_gets_the_closest_key(argv, closest):
    message = refused(argv)
    assert f"no key '{argv[-1].split('=')[0]}' in the config (did you mean '{closest}'?)" in message
    assert "+" not in message  # Hydra's advice to add the key with + is wrong here: the constructor would refuse it


def test_an_unknown_key_without_a_close_one_lists_the_keys_next_to_it():
    assert "no key 'trainer.blah' in the config; keys under trainer: _target_, checkpoint_interval," in refused(
        ["trainer.blah=1"]
    )


def test_eval_py_says_how_to_change_a_setting_of_the_run_s_env_that_its_own_env_lacks(monkeypatch):
    """eval.yaml composes machina_1's env; a MettaGrid run's game is changed with +env.game=..."""
    monkeypatch.setattr("sys.argv", ["eval.py"])
    with pytest.raises(ConfigError) as err:
        check(["checkpoint=RUN", "env.game=dungeon"], CONF, "eval")
    assert "no key 'env.game' in the config" in str(err.value)
    assert "add it: +env.game=dungeon" in str(err.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "losses=[ppo],[ppo,supervisor]", "system.torch_deterministic=true,false"],
        ["-m", "experiment=machina_1_sweep"],
        ["-m", "experiment=machina_1_optuna", "hydra.sweeper.n_trials=2", "objective=summary/sps_mean"],
        ["-m", "optimizer.lr=interval(0.0001,0.01)", "learner.advantage.gamma=tag(log,interval(0.9,0.99))"],
        ["-m", "learner.update_epochs=range(1,3)", "losses=choice([ppo],[ppo,supervisor])", "losses=glob(*)"],
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=x"],
        ["-m", "policy=fast,vit", "policy.encoder.num_latents=4"],  # a key of the second option only
        [
            "+losses.extra._target_=x.Loss",
            "+losses.extra.coef=1",
            "~learner.advantage.c_clip",
            "++learner.advantage.gamma=0.9",
        ],
        ["+losses=supervisor"],
        ["losses=[]", "hydra.run.dir=somewhere", "hydra.job.chdir=true", "trainer.total_timesteps=1e6"],
        ["losses=ppo,supervisor"],  # a sweep without -m: Hydra explains it
        ["--cfg", "job", "--resolve", "losses=supervisor", "losses.supervisor.action_loss_coef=2"],
        ["--help"],
    ],
)
def test_valid_command_lines_and_sweeps_pass_untouched(argv):
    check(argv, CONF)


def test_a_run_folder_inside_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    message = refused([f"hydra.run.dir={tmp_path / 'file' / 'run'}"])
    assert f"cannot use the run folder '{tmp_path / 'file' / 'run'}': '{tmp_path / 'file'}' is not a folder" in message
    assert f"'{tmp_path / 'file'}' is not a folder" in refused(["-m", f"hydra.sweep.dir={tmp_path / 'file'}"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_existing_run_folder_that_is_not_writable_is_refused(tmp_path):
    (tmp_path / "run").mkdir(mode=0o555)
    assert f"'{tmp_path / 'run'}' is not writable" in refused([f"hydra.run.dir={tmp_path / 'run'}"])


@pytest.mark.slow  # a train.py process; test_folder_trust.py checks the real script's exit code in the fast tier
def test_train_py_exits_2_with_the_message_and_creates_nothing(tmp_path, wandb_dirs):
    run_dir = tmp_path / "run"
    for args, message in [
        (["trainer.total_timestep=10"], "(did you mean 'trainer.total_timesteps'?)"),
        (["losses=[ppo,supervisr]"], "(did you mean 'supervisor'?); options: eer_cloner"),
    ]:
        result = run_train([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"ConfigError: {args[0]}: ") and message in line
        assert list(tmp_path.iterdir()) == []  # no run folder, no outputs/, no W&B files


@pytest.mark.parametrize(
    "old, new",
    [
        ("trainer.update_epochs=3", "learner.update_epochs=3"),
        ("-m", "-m"),
        ("trainer.gamma=0.9,0.99", "learner.advantage.gamma=0.9,0.99"),
        ("learner.gamma=0.9", "learner.advantage.gamma=0.9"),
        ("learner.compact_tokens=false", "experience.compact_tokens=false"),
        ("trainer.evaluation.episodes=8", "evaluation.episodes=8"),
        ("experience.sampling=prioritized", "experience/sampler=prioritized"),
        ("experience.prio_alpha=0.5", "experience.sampler.alpha=0.5"),
        ("losses.eer_kickstarter.teacher_checkpoint=/t.pt", "losses.eer_kickstarter.teacher.path=/t.pt"),
        ("++trainer.vtrace_c_clip=2", "++learner.advantage.c_clip=2"),
        ("trainer.total_timesteps=10", "trainer.total_timesteps=10"),
        ("trainer.gamma_extra=1", "trainer.gamma_extra=1"),  # only whole keys move
    ],
)
def test_moved_keys_keep_their_old_spelling(old, new, capsys):
    assert preflight.renamed([old]) == [new]
    note = capsys.readouterr().err
    assert (f"is now {new.split('=')[0].lstrip('+')}" in note) == (old != new)
