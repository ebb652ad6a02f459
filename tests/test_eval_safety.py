"""eval.py on runs from elsewhere and on careless command lines: a run folder or checkpoint is data, so a payload
planted in its settings runs nothing and is refused with one line naming the file and the key; every setting of
eval.py is checked before anything is evaluated or written; a damaged run folder or an unwritable output folder is
one line, not a traceback. Each case runs ``python eval.py`` as a user would (in this process: ``tests.commands``)
and checks that no file changed."""

import hashlib
import json
import re
import shutil
import sys

import pytest
import torch
import yaml

from machina.env.factory import env_factory
from machina.errors import ConfigError
from machina.files import checksum
from tests.commands import Result, run_script
from tests.conf_walk import options, skipped_without_its_extra
from tests.conftest import compose_config
from tests.test_checkpoint import run

MARKER = "pwned.txt"  # what a payload writes when it runs
CHECKPOINT = "run/checkpoints/checkpoint_000001.pt"

# A module shipped beside the run folder: importing it runs its code.
EVIL_LOSS = f"""
import pathlib
pathlib.Path(__file__).with_name({MARKER!r}).write_text("imported")

class Loss:
    consumes = ()
"""
EVIL_GYM = f"""
import pathlib
import gymnasium
pathlib.Path(__file__).with_name({MARKER!r}).write_text("imported")
gymnasium.register("Evil-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real run folder: one epoch of the tiny run, a checkpoint and a policy file."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run(run_dir, epochs=1)
    return run_dir


@pytest.fixture
def folder(trained, tmp_path):
    """A copy of the trained run at ``tmp_path / "run"``, for one test to plant things in."""
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path


def eval_py(folder, *args: str) -> Result:
    """``python eval.py ARGS`` from the repository root, its output folder ``folder / "out"``."""
    return run_script("eval.py", *args, f"hydra.run.dir={folder / 'out'}")


def refusal(result: Result) -> str:
    """The one error line of a refused eval.py: exit code 2, no traceback."""
    output = result.output
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "Error" in line]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


def files(folder) -> dict[str, str]:
    """sha256 of every file under ``folder`` but the output folder (which Hydra makes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).parts[0] != "out"
    }


def write_text_call(marker) -> dict:
    """A value Hydra would build by calling ``pathlib.Path(marker).write_text("pwned")``: 11 as max(11, 5)."""
    path = {"_target_": "pathlib.Path", "_args_": [str(marker)]}
    return {"_target_": "builtins.max", "_args_": [11, {"_target_": "pathlib.Path.write_text", "_args_": [path, "x"]}]}


def plant_in_yaml(folder, change) -> None:
    """Edit the env node of the run's resolved_config.yaml with ``change(env)``."""
    path = folder / "run" / "resolved_config.yaml"
    config = yaml.safe_load(path.read_text())
    change(config["env"])
    path.write_text(yaml.safe_dump(config))


def plant_in_checkpoint(folder, change) -> None:
    """Edit the env node of the checkpoint's stored config with ``change(env)``, re-sealed so its checksum matches;
    without resolved_config.yaml, eval.py reads the env from the checkpoint."""
    path = folder / CHECKPOINT
    data = torch.load(path, weights_only=True)
    change(data["config"]["env"])
    torch.save(checksum.seal(data), path)
    (folder / "run" / "resolved_config.yaml").unlink()


def gym_env(env_id: str) -> dict:
    return {"_target_": "machina.env.gymnasium.GymnasiumEnv", "_convert_": "all", "id": env_id, "num_envs": 4}


# name: (plant(folder), the file the refusal names, the key it names)
PAYLOADS = {
    "a call nested in a yaml env setting": (
        lambda f: plant_in_yaml(f, lambda env: env.update(height=write_text_call(f / MARKER))),
        "resolved_config.yaml",
        "env.height._target_",
    ),
    "a call nested in a checkpoint's stored config": (
        lambda f: plant_in_checkpoint(f, lambda env: env.update(height=write_text_call(f / MARKER))),
        "checkpoint_000001.pt",
        "env.height._target_",
    ),
    "exec as the env class": (
        lambda f: plant_in_yaml(
            f, lambda env: env.update(_target_="builtins.exec", _args_=[f"open({str(f / MARKER)!r}, 'w')"])
        ),
        "resolved_config.yaml",
        "env._target_",
    ),
    "a resolver importing a module beside the run folder": (
        lambda f: plant_in_yaml(f, lambda env: env.update(height="${consumes:x,{a:{_target_: evil_loss.Loss}}}")),
        "resolved_config.yaml",
        "env.height",
    ),
    "an interpolation reading the environment": (
        lambda f: plant_in_yaml(f, lambda env: env.update(max_steps="${oc.decode:${oc.env:EVAL_STEPS}}")),
        "resolved_config.yaml",
        "env.max_steps",
    ),
    "a gymnasium id importing a module beside the run folder": (
        lambda f: plant_in_yaml(f, lambda env: (env.clear(), env.update(gym_env("evil_gym:Evil-v0")))),
        "resolved_config.yaml",
        "env.id",
    ),
}


@pytest.fixture
def beside_the_run(folder, monkeypatch):
    """The payload modules shipped beside the run folder, that folder first on the import path (as PYTHONPATH
    would put it) and EVAL_STEPS set; afterwards every import of them is forgotten (and the env id one registers),
    so that an import in a later test would run their code again."""
    (folder / "evil_loss.py").write_text(EVIL_LOSS)
    (folder / "evil_gym.py").write_text(EVIL_GYM)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("EVAL_STEPS", "40")
    yield folder
    for name in ("evil_loss", "evil_gym"):
        sys.modules.pop(name, None)
    if "gymnasium" in sys.modules:
        sys.modules["gymnasium"].registry.pop("Evil-v0", None)


@pytest.mark.parametrize("name", PAYLOADS)
def test_a_payload_in_the_run_s_settings_runs_nothing_and_is_refused(beside_the_run, name):
    folder = beside_the_run
    plant, file, key = PAYLOADS[name]
    plant(folder)
    before = files(folder)
    line = refusal(eval_py(folder, f"checkpoint={folder / CHECKPOINT}", "episodes=2", "replay=false"))
    assert file in line and key in line, line
    assert not (folder / MARKER).exists()
    assert files(folder) == before  # nothing written, no module imported (it would leave __pycache__)
    assert not (folder / "out" / "eval.json").exists()


def test_a_module_in_a_gymnasium_id_is_imported_when_the_command_line_gives_the_id(beside_the_run):
    """The user's own choice on the command line is theirs: the refusal is about ids read from a file."""
    folder = beside_the_run
    plant_in_yaml(folder, lambda node: (node.clear(), node.update(gym_env("CartPole-v1"))))
    args = [f"checkpoint={folder / CHECKPOINT}", "episodes=2", "replay=false", "+env.id=evil_gym:Evil-v0"]
    line = refusal(eval_py(folder, *args))
    assert (folder / MARKER).exists()
    assert "trained on observations" in line  # a token policy on CartPole's vector observations, refused


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "give checkpoint=PATH"),
        (["episodes=0"], "episodes=0 must be an integer >= 1"),
        (["greedy=maybe"], "greedy='maybe' must be true or false"),
        (["seed=-1"], "seed=-1 must be an integer in 0.."),
        (["replay=yes"], "replay='yes' must be true or false"),
        (["replay_steps=-1"], "replay_steps=-1 must be an integer in 1..10000"),
        (["replay_steps=100000000"], "replay_steps=100000000 must be an integer in 1..10000"),
        (["replay_fps=0"], "replay_fps=0 must be a number > 0"),
        (["replay_cell=0"], "replay_cell=0 must be an integer in 1..64"),
        (["device=cuda:99"], "device='cuda:99' but"),
        (["env=nosuch"], "'nosuch' is not an option of group env"),
        (["episods=4"], "no key 'episods'"),
        (["+extra=1"], "extra is not a setting of eval.py"),
    ],
)
def test_a_bad_setting_is_refused_before_anything_is_evaluated_or_written(folder, args, expected):
    checkpoint = [] if args == [] else [f"checkpoint={folder / CHECKPOINT}"]
    before = files(folder)
    line = refusal(eval_py(folder, *checkpoint, *args))
    assert expected in line and "system.device" not in line, line
    assert files(folder) == before
    assert not (folder / "out" / "eval.json").exists() and not (folder / "out" / "replay.gif").exists()


# name: (the resolved_config.yaml's bytes, what the refusal says)
DAMAGED = {
    "unparsable": (b"env: [unclosed\n", "not valid YAML at line 2"),
    "not a mapping": (b"- a\n- list\n", "holds a list, not a mapping"),
    "no env": (b"seed: 1\n", "has no env settings"),
    "env not a mapping": (b"env: 5\n", "env is of type int, not a mapping"),
    "not utf-8": (b"env: \xff\xfe\n", "cannot be read"),
    "an impossible date": (b"env:\n  height: 2024-13-45\n", "not valid YAML (month must be in 1..12)"),
    "a date": (b"env:\n  _target_: machina.env.machina_1.Machina1Env\n  height: 2024-01-01\n", "env.height is a date"),
    "a billion laughs": (
        b"a: &a [x, x, x, x, x, x, x, x, x]\n"
        + b"".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + b"env: *i\n",
        "b[0] repeats another entry",
    ),
}


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_run_folder_is_one_line(folder, name):
    text, expected = DAMAGED[name]
    (folder / "run" / "resolved_config.yaml").write_bytes(text)
    before = files(folder)
    line = refusal(eval_py(folder, f"checkpoint={folder / 'run'}", "episodes=2", "replay=false"))
    assert "resolved_config.yaml" in line and expected in line, line
    assert files(folder) == before


@pytest.mark.parametrize(
    "text",
    [
        "sk-SECRET-1234\n",  # the whole file one string: resolved_config.yaml a link to a token file
        "env: sk-SECRET-1234\n",
        "env:\n  _target_: machina.env.machina_1.Machina1Env\n  height: sk-${SECRET-1234}\n",
        "env:\n  _target_: machina.env.machina_1.Machina1Env\n  _convert_: sk-SECRET-1234\n",
    ],
)
def test_a_refusal_quotes_no_value_of_the_file_it_read(folder, tmp_path, text):
    # A run folder from elsewhere can name any file of this disk as its resolved_config.yaml (a link): a secret in
    # that file must not be printed by the refusal.
    secret = tmp_path / "token"
    secret.write_text(text)
    config = folder / "run" / "resolved_config.yaml"
    config.unlink()
    config.symlink_to(secret)
    line = refusal(eval_py(folder, f"checkpoint={folder / 'run'}", "episodes=2", "replay=false"))
    assert "resolved_config.yaml" in line and "SECRET" not in line, line


def test_an_output_folder_that_cannot_be_written_is_one_line(folder):
    (folder / "file").write_text("a file where a folder should be")
    line = refusal(eval_py(folder / "file", f"checkpoint={folder / 'run'}"))  # its output folder: file/out
    assert "is not a folder" in line and "hydra.run.dir" in line, line
    (folder / "out" / "eval.json").mkdir(parents=True)  # eval.json cannot replace a folder
    line = refusal(eval_py(folder, f"checkpoint={folder / 'run'}", "episodes=2", "replay=false"))
    assert "cannot write to the output folder" in line and "hydra.run.dir" in line, line
    assert not list((folder / "out").glob(".*.tmp"))


def test_eval_py_evaluates_a_real_run_folder_and_changes_nothing_in_it(folder):
    before = files(folder)
    result = eval_py(folder, f"checkpoint={folder / 'run'}", "episodes=2", "replay_steps=3")
    assert result.returncode == 0, result.output[-3000:]
    report = json.loads((folder / "out" / "eval.json").read_text())
    assert report["checkpoint"] == str(folder / CHECKPOINT) and report["policy"]["episodes"] == 2
    assert (folder / "out" / "replay.gif").stat().st_size > 0 and not list((folder / "out").glob(".*.tmp"))
    assert files(folder) == before


@pytest.mark.parametrize("name", options("env"))
def test_the_composed_env_of_each_env_group_passes_the_checks(name):
    """train.py's periodic evaluation builds its envs from the composed ``env`` through the same checks (every
    conf/env/*.yaml; one whose extra is not installed is skipped)."""
    with skipped_without_its_extra():
        env = env_factory(compose_config([f"env={name}"]).env, "cpu")(num_envs=1, seed=0, stagger=False)
    try:
        assert env.spec.num_envs == 1
    finally:
        env.close()


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"_partial_": True}, "env._partial_ is not an env setting"),
        ({"kwargs": {"x": [1, {"_target_": "os.system"}]}}, "env.kwargs.x[1]._target_ names an object to build"),
        ({"_target_": "os.system"}, "env._target_ is 'os.system', which no config on the search path names"),
        ({"heigth": 7}, "env.heigth is not a setting of Machina1Env"),
        ({"height": "${oc.env:HOME}"}, "env.height is a string with ${...}, an interpolation"),
    ],
)
def test_env_factory_refuses_what_is_not_an_env_with_plain_values(change, expected):
    settings = {**compose_config([]).env, **change}
    with pytest.raises(ConfigError, match=re.escape(expected)) as err:
        env_factory(settings, "cpu")
    assert "\n" not in str(err.value)
