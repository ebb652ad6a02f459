"""A MettaGrid game file costs no more than it holds, tells nothing it holds, and stays with the run that played it.

From the outside, as a careless or hostile user would: a FIFO, a device, a socket or a folder named ``*.yaml``; a
file over the bound; a ``type`` that is a list; a game too large to allocate; a credentials file named as a game; a
game file changed or deleted after its run trained; a resume on another game.
"""

import json
import os
import socket

import pytest
import torch

from machina.errors import ConfigError
from tests.commands import Result, run_script
from tests.conftest import run_train
from tests.test_mettagrid_workers import deadline

pytest.importorskip("mettagrid")

from machina.env.mettagrid import MettaGridEnv, game_file  # noqa: E402 (needs the extra)
from machina.env.mettagrid.game import arena_config, render_game, write_game  # noqa: E402
from machina.env.mettagrid.game_file import read_game  # noqa: E402

ARENA = arena_config(agents_per_env=2).model_dump(mode="json")
TINY = ["env=mettagrid", "debug=tiny", "env.num_envs=2", "env.workers=0", "env.overlap=false", "policy=fast",
        "wandb=disabled"]  # fmt: skip
SECRET = "sk-live-0123456789abcdef"


def eval_py(args, cwd):
    """``python eval.py ARGS`` from ``cwd``, in this process."""
    return run_script("eval.py", *args, cwd=cwd)


def train_py(args, cwd):
    """``python train.py ARGS`` from ``cwd``, in this process."""
    return run_script("train.py", *args, cwd=cwd)


def arena_with(**game) -> dict:
    data = json.loads(json.dumps(ARENA))
    for dotted, value in game.items():
        *parents, leaf = dotted.split("__")
        node = data["game"]
        for part in parents:
            node = node[part]
        node[leaf] = value
    return data


def refused(done: Result, words: str) -> bool:
    """Whether the command stopped with exit 2 and one line holding ``words``, no traceback."""
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if words in line]
    return done.returncode == 2 and len(lines) == 1 and "Traceback" not in out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-epoch run on a game file of its own: (its folder, the game file)."""
    home = tmp_path_factory.mktemp("trained")
    game = write_game(arena_config(agents_per_env=2, mines=6), home / "my_arena.yaml")
    run_dir = home / "run"
    done = train_py([*TINY, f"env.game={game}", "trainer.total_timesteps=320", f"hydra.run.dir={run_dir}"], home)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, game


@pytest.mark.slow  # the real train.py: its exit code, within a timeout
def test_a_fifo_named_as_a_game_is_refused_at_once_by_train_py_and_eval_py(tmp_path, trained):
    fifo = tmp_path / "game.yaml"
    os.mkfifo(fifo)  # open() for reading would wait for a writer that never comes
    run_dir = tmp_path / "run"
    done = run_train([*TINY, f"env.game={fifo}", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=120)
    assert refused(done, "is a FIFO (named pipe), not a regular file"), done.stdout + done.stderr
    assert not run_dir.exists()
    out = tmp_path / "eval"
    with deadline(120):  # a hang guard, as the subprocess's timeout above
        done = eval_py(
            [f"checkpoint={trained[0]}", f"+env.game={fifo}", "replay=false", f"hydra.run.dir={out}"], tmp_path
        )
    assert refused(done, "is a FIFO (named pipe), not a regular file") and not out.exists()


def test_a_fifo_named_as_a_game_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "game.yaml"
    os.mkfifo(fifo)
    with deadline(30), pytest.raises(ConfigError) as err:  # a hang guard: open() for reading would wait forever
        read_game(str(fifo))
    assert str(err.value) == f"env.game={fifo}: is a FIFO (named pipe), not a regular file; only regular files are read"


def make_socket(path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return server


@pytest.mark.parametrize(
    "kind, make, words",
    [
        ("a link to /dev/zero", lambda p: p.symlink_to("/dev/zero"), "is a character device"),
        ("a folder", lambda p: p.mkdir(), "is a folder"),
        ("a socket", make_socket, "is a socket"),
    ],
)
def test_a_game_name_that_is_not_a_regular_file_is_refused_unread(kind, make, words, tmp_path):
    path = tmp_path / "game.yaml"
    kept = make(path)
    with pytest.raises(ConfigError) as err:
        read_game(str(path))
    assert str(err.value) == f"env.game={path}: {words}, not a regular file; only regular files are read"
    if kept is not None:
        kept.close()


def test_a_game_file_over_the_bound_is_refused_and_one_under_it_is_read(tmp_path):
    text = render_game(arena_config(agents_per_env=2), ".yaml")
    under = tmp_path / "under.yaml"
    under.write_text(text + "#" * (game_file.MAX_BYTES - len(text.encode()) - 1) + "\n")
    assert read_game(str(under)).game.num_agents == 2
    over = tmp_path / "over.yaml"
    over.write_text(text + "#" * (game_file.MAX_BYTES - len(text.encode())) + "\n")
    with pytest.raises(ConfigError, match=rf"more than {game_file.MAX_BYTES:,} bytes, more than a game file may hold"):
        read_game(str(over))


@pytest.mark.parametrize("value", [["mettagrid.map_builder.random_map.RandomMapBuilder.Config"], {"a": 1}])
def test_a_type_that_is_a_list_or_a_mapping_is_named(value, tmp_path):
    path = tmp_path / "game.json"
    path.write_text(json.dumps(arena_with(map_builder__type=value)))
    with pytest.raises(ConfigError) as err:
        read_game(str(path))
    assert str(err.value).startswith(f"env.game={path}: game.map_builder.type is a {type(value).__name__}, not")


@pytest.mark.parametrize(
    "change, setting",
    [
        (dict(map_builder__width=100_000), "game.map_builder.width=100000"),
        (dict(obs__num_tokens=10**9), "game.obs.num_tokens=1000000000"),
    ],
)
def test_a_game_too_large_to_allocate_names_its_own_field(change, setting, tmp_path):
    path = tmp_path / "game.json"
    path.write_text(json.dumps(arena_with(**change)))
    with pytest.raises(ConfigError) as err:
        read_game(str(path))
    assert str(err.value).startswith(f"env.game={path}: {setting} ")


def test_a_game_of_20000_agents_stops_train_py_in_one_line_before_anything_is_written(tmp_path):
    path = tmp_path / "crowd.json"
    path.write_text(json.dumps(arena_with(num_agents=20_000, map_builder__agents=20_000)))
    run_dir = tmp_path / "run"
    done = train_py([*TINY, f"env.game={path}", f"hydra.run.dir={run_dir}"], tmp_path)
    assert refused(done, f"game.num_agents=20000 is more than {game_file.MAX_AGENTS} agents per env")
    assert not run_dir.exists()


def test_a_credentials_file_named_as_a_game_is_refused_without_a_word_of_it(tmp_path):
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"type": "service_account", "api_key": SECRET, "game": {"api_key": SECRET}}))
    with pytest.raises(ConfigError) as err:
        read_game(str(creds))
    assert SECRET not in str(err.value) and str(creds) in str(err.value)
    creds.write_text(json.dumps({"api_key": SECRET, "game": {"num_agents": SECRET}}))
    with pytest.raises(ConfigError) as err:
        read_game(str(creds))
    assert SECRET not in str(err.value) and "game.num_agents" in str(err.value)


@pytest.mark.slow  # a MettaGrid training (the trained run) and evaluations
def test_a_run_is_evaluated_on_its_own_game_when_the_file_changes_and_resumes_only_on_it(tmp_path, trained):
    run_dir, game = trained
    args = [f"checkpoint={run_dir}", "episodes=2", "replay=false"]
    before = eval_py([*args, f"hydra.run.dir={tmp_path / 'before'}"], tmp_path)
    assert before.returncode == 0, before.stderr[-2000:]
    original = game.read_text()
    try:
        write_game(arena_config(agents_per_env=2, mines=1, converters=1), game)  # the same agents, another game
        after = eval_py([*args, f"hydra.run.dir={tmp_path / 'after'}"], tmp_path)
        assert after.returncode == 0, after.stderr[-2000:]
        rows = [json.loads((tmp_path / name / "eval.json").read_text()) for name in ("before", "after")]
        assert rows[0]["policy"] == rows[1]["policy"] and rows[0]["random"] == rows[1]["random"]

        copy = tmp_path / "copy"
        resumed = train_py([*TINY, f"env.game={game}", "trainer.total_timesteps=640", f"resume={run_dir}",
                            f"hydra.run.dir={copy}"], tmp_path)  # fmt: skip
        assert resumed.returncode == 2
        assert f"env.game={game}: not the game this run trained on" in resumed.stdout + resumed.stderr
    finally:
        game.write_text(original)


@pytest.mark.slow  # a MettaGrid training (the trained run) and evaluations
def test_eval_reads_no_game_file_a_run_folder_names_without_a_kept_copy(tmp_path, trained):
    run_dir, _ = trained
    creds = tmp_path / "credentials.yaml"
    creds.write_text(f"api_key: {SECRET}\n")
    folder = tmp_path / "elsewhere"
    (folder / "checkpoints").mkdir(parents=True)
    policy = sorted((run_dir / "checkpoints").glob("policy_*.pt"))[-1]
    (folder / "checkpoints" / policy.name).write_bytes(policy.read_bytes())  # a policy file without its checkpoint
    resolved = (run_dir / "resolved_config.yaml").read_text().replace(f"game: {run_dir.parent}/my_arena.yaml",
                                                                      f"game: {creds}")  # fmt: skip
    (folder / "resolved_config.yaml").write_text(resolved)
    out = tmp_path / "eval"
    done = eval_py([f"checkpoint={folder / 'checkpoints' / policy.name}", "replay=false", f"hydra.run.dir={out}"],
                   tmp_path)  # fmt: skip
    assert done.returncode == 2 and SECRET not in done.stdout + done.stderr
    assert "the run kept no copy of its game" in done.stdout + done.stderr and not out.exists()


@pytest.mark.slow  # a MettaGrid training (the trained run) and evaluations
def test_eval_bounds_what_a_run_folder_asks_of_this_machine(tmp_path, trained):
    run_dir, _ = trained
    folder = tmp_path / "greedy_run"
    (folder / "checkpoints").mkdir(parents=True)
    for path in (run_dir / "checkpoints").iterdir():
        (folder / "checkpoints" / path.name).write_bytes(path.read_bytes())
    resolved = (run_dir / "resolved_config.yaml").read_text()
    (folder / "resolved_config.yaml").write_text(resolved.replace("workers: 0", "workers: 1000"))
    done = eval_py([f"checkpoint={folder}", "episodes=2", "replay=false", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "env.workers=1000 is more than this machine's" in done.stdout + done.stderr

    (folder / "resolved_config.yaml").write_text(resolved.replace("max_steps: 40", f"max_steps: {10**12}"))
    out = tmp_path / "b"
    done = eval_py([f"checkpoint={folder}", "episodes=2", "replay=false", f"hydra.run.dir={out}"], tmp_path)
    assert done.returncode == 2 and not out.exists()
    assert refused(done, f"env.max_steps={10**12}: an evaluation plays at most 100,000 steps")


def test_the_env_state_keeps_the_game_and_refuses_another_or_a_tampered_one(tmp_path):
    path = write_game(arena_config(agents_per_env=2), tmp_path / "one.yaml")
    other = write_game(arena_config(agents_per_env=2, mines=1), tmp_path / "two.json")
    env = MettaGridEnv(game=str(path), num_envs=2, max_steps=5)
    state = env.state_dict()
    env.close()
    kept = bytes(state["game"].numpy().tobytes()).decode()
    as_json = MettaGridEnv(game=str(write_game(arena_config(agents_per_env=2), tmp_path / "one.json")), num_envs=2)
    assert torch.equal(as_json.state_dict()["game"], state["game"])  # the same game, whatever its file's format
    as_json.close()
    again = MettaGridEnv(game=str(path), num_envs=2, max_steps=5, kept_game=kept)  # the copy, the file unread
    again.load_state_dict(state)
    again.close()
    changed = MettaGridEnv(game=str(other), num_envs=2, max_steps=5)
    with pytest.raises(ConfigError, match=rf"^env.game={other}: not the game this run trained on"):
        changed.load_state_dict(state)
    tampered = {**state, "game": state["game"].clone()}
    tampered["game"][10] ^= 1
    with pytest.raises(ConfigError, match="game does not match its game_sha256"):
        changed.load_state_dict(tampered)
    changed.close()
