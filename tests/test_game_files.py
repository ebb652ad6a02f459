"""A MettaGrid game is a file (``env.game=...``): the shipped games, the allow-list of MettaGrid's map builders and
scenes, refusals of files that name code (with no code run), games machina cannot serve, and the dump command."""

import importlib
import inspect
import json
import pickle
import re
import sys
import typing
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mettagrid")

from mettagrid.config.mettagrid_config import MettaGridConfig  # noqa: E402
from mettagrid.map_builder.map_builder import MapBuilder, MapBuilderConfig  # noqa: E402
from mettagrid.mapgen.scene import Scene, SceneConfig  # noqa: E402
from mettagrid.simulator.simulator import Simulation  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from machina.env.mettagrid import game as mettagrid_game  # noqa: E402
from machina.env.mettagrid import game_file  # noqa: E402
from machina.env.mettagrid.game_file import ALLOWED_TYPES, REFUSED_SCENES, SHIPPED, read_game  # noqa: E402
from machina.errors import ConfigError  # noqa: E402
from tests.commands import run_module
from tests.conftest import ROOT, compose_config  # noqa: E402

ARENA = mettagrid_game.arena_config().model_dump(mode="json")
# The modules whose validators call load_symbol on a `type` (each imported the name itself).
LOAD_SYMBOL_USERS = ("mettagrid.map_builder.map_builder", "mettagrid.mapgen.scene", "mettagrid.mapgen.mapgen")


def write(tmp_path: Path, data, name: str = "game.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data), encoding="utf-8")
    return path


def arena_with(**changes) -> dict:
    """The arena's data with ``changes`` applied: dotted keys under ``game`` (``obs.width=17``)."""
    data = json.loads(json.dumps(ARENA))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data["game"]
        for key in parents:
            node = node[key]
        node[last] = value
    return data


@pytest.fixture
def symbol_loads(monkeypatch):
    """Every call of MettaGrid's load_symbol (the import of a `type`), recorded, then passed on."""
    from mettagrid.util import module

    calls, real = [], module.load_symbol

    def recording(name, *args, **kwargs):
        calls.append(name)
        return real(name, *args, **kwargs)

    for name in ("mettagrid.util.module", *LOAD_SYMBOL_USERS):
        monkeypatch.setattr(importlib.import_module(name), "load_symbol", recording)
    return calls


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A module of the test's own on sys.path whose import (or class) writes a marker file; returns the marker."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "evil_game_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nclass Evil:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evil_game_module", raising=False)
    return marker


# ---------------------------------------------------------------------------------------------- shipped games
def test_the_shipped_arena_is_the_arena_built_in_python(symbol_loads):
    assert read_game("arena").model_dump() == mettagrid_game.arena_config().model_dump()
    # The check records what MettaGrid imports, so the refusals below that record nothing mean something.
    assert symbol_loads == ["mettagrid.map_builder.random_map.RandomMapBuilder.Config"]


@pytest.mark.parametrize("game", sorted(mettagrid_game.GAMES))
def test_every_shipped_game_is_its_builder_and_runs_in_mettagrid(game):
    path = SHIPPED / f"{game}.yaml"
    build, description = mettagrid_game.GAMES[game]
    assert path.read_text().splitlines()[0] == f"# {description}"
    cfg = read_game(game)
    assert cfg.model_dump() == build().model_dump()
    assert read_game(str(path)).model_dump() == cfg.model_dump()  # by path too
    cfg.game.map_builder.seed = 3
    sim = Simulation(cfg, seed=3)
    for _ in range(5):
        sim.step()
    assert sim.current_step == 5 and len(sim.agents()) == cfg.game.num_agents


def test_every_shipped_game_file_is_in_the_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"machina.env.mettagrid" = ["games/*.yaml"]' in pyproject
    assert sorted(p.stem for p in SHIPPED.glob("*.yaml")) == sorted(mettagrid_game.GAMES)


# --------------------------------------------------------------------------------------------- the allow-list
def builder_and_scene_types() -> dict[str, type]:
    """Every map builder and scene config class in MettaGrid's map_builder and mapgen packages, by type name."""
    import mettagrid

    root = Path(mettagrid.__file__).parent
    found = {}
    for file in [*(root / "map_builder").rglob("*.py"), *(root / "mapgen").rglob("*.py")]:
        module = importlib.import_module("mettagrid." + ".".join(file.relative_to(root).with_suffix("").parts))
        for cls in vars(module).values():
            own = inspect.isclass(cls) and cls.__module__ == module.__name__ and cls not in (MapBuilder, Scene)
            if own and issubclass(cls, MapBuilder | Scene):
                found[cls.Config._type_str()] = cls.Config
    return found


def test_the_allow_list_names_mettagrid_builder_and_scene_configs_as_mettagrid_spells_them():
    from mettagrid.util.module import load_symbol

    found = builder_and_scene_types()
    for name in ALLOWED_TYPES | set(REFUSED_SCENES):
        cls = load_symbol(name)
        assert issubclass(cls, MapBuilderConfig | SceneConfig) and cls._type_str() == name, name
    # Every builder and scene MettaGrid ships is either allowed or refused for a stated reason: a MettaGrid upgrade
    # that adds one fails here until someone reads it.
    assert set(found) == ALLOWED_TYPES | set(REFUSED_SCENES)
    assert not ALLOWED_TYPES & set(REFUSED_SCENES)


def test_only_builders_and_scenes_read_a_type_key_as_a_class_path():
    """One model in a MettaGridConfig has a field called `type`: a building distribution, whose kinds are plain
    words (other discriminators are handler_type, filter_type, pydantic_type, ...). So a `type` key anywhere else
    is a builder's or scene's class path, read by load_symbol, or a mistake: refusing every `type` off the
    allow-list and the distribution kinds is exact."""
    from mettagrid.mapgen.scenes.building_distributions import DistributionConfig, DistributionType

    seen: set[type] = set()
    typed: list[type] = []

    def models(annotation) -> list[type]:
        own = [annotation] if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else []
        return own + [m for arg in typing.get_args(annotation) for m in models(arg)]

    def visit(model: type) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if "type" in (name, field.alias):
                typed.append(model)
            for inner in models(field.annotation):
                visit(inner)

    for model in (MettaGridConfig, *builder_and_scene_types().values()):
        visit(model)
    assert len(seen) > 100 and typed == [DistributionConfig]
    assert DistributionConfig.model_fields["type"].annotation is DistributionType
    assert {kind.value for kind in DistributionType} == game_file.DISTRIBUTION_KINDS
    assert not any("." in kind for kind in game_file.DISTRIBUTION_KINDS)


# ------------------------------------------------------------------------------------------- files naming code
SCENES = "mettagrid.mapgen.scenes."
HOSTILE = {
    "os.system": (["map_builder"], "os.system"),
    "subprocess.Popen": (["map_builder"], "subprocess.Popen"),
    "a module of the user's": (["map_builder"], "evil_game_module.Evil"),
    "a MettaGrid scene that reads files": (
        ["map_builder", "instance"],
        "mettagrid.mapgen.scenes.yaml.YamlScene.Config",
    ),
    "a scene instance of a foreign type": (["map_builder", "instance"], "evil_game_module.Evil"),
    "a child scene of a foreign type": (["map_builder", "instance", "children", 0, "scene"], "evil_game_module.Evil"),
}


def dungeon_with_type(where: list, type_name: str) -> dict:
    data = mettagrid_game.dungeon_config().model_dump(mode="json")
    node = data["game"]
    for key in where:
        node = node[key]
    node["type"] = type_name
    return data


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_type_off_the_allow_list_is_refused_before_mettagrid_imports_it(case, tmp_path, symbol_loads, marker_module):
    where, type_name = HOSTILE[case]
    path = write(tmp_path, dungeon_with_type(where, type_name))
    key = "game." + ".".join(f"{k}" if isinstance(k, str) else f"[{k}]" for k in where).replace(".[", "[") + ".type"
    with pytest.raises(ConfigError) as err:
        read_game(str(path))
    message = str(err.value)
    assert message.startswith(f"env.game={path}: {key}={type_name!r} ") and "\n" not in message
    assert symbol_loads == [] and not marker_module.exists() and "evil_game_module" not in sys.modules


def test_the_refusal_names_why_a_mettagrid_scene_is_refused(tmp_path):
    path = write(tmp_path, dungeon_with_type(["map_builder", "instance"], "mettagrid.mapgen.scenes.ascii.Ascii.Config"))
    with pytest.raises(ConfigError, match="reads the map file its uri names"):
        read_game(str(path))


def test_the_same_file_with_mettagrid_types_loads(tmp_path, symbol_loads):
    """The control for the refusals above: the dungeon written the same way, with its own types, is read."""
    assert read_game(str(write(tmp_path, mettagrid_game.dungeon_config().model_dump(mode="json")))).game.num_agents
    assert "mettagrid.mapgen.mapgen.MapGen.Config" in symbol_loads


def test_a_python_yaml_tag_is_refused_without_running_it(tmp_path, symbol_loads):
    marker = tmp_path / "ran.marker"
    text = yaml.safe_dump(ARENA) + f"evil: !!python/object/apply:os.system ['touch {marker}']\n"
    path = tmp_path / "tagged.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"env.game={path}: not valid YAML \(could not determine a constructor"):
        read_game(str(path))
    assert not marker.exists() and symbol_loads == []


class WritesMarker:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling opens the marker for writing, which creates it
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("name", ["game.yaml", "game.json", "game.pkl", "game.pt"])
def test_a_pickle_is_never_unpickled(name, tmp_path):
    marker = tmp_path / "unpickled.marker"
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"game": WritesMarker(marker)}))
    with pytest.raises(ConfigError, match=rf"^env.game={path}: (not valid|cannot be read|a game file ends in)"):
        read_game(str(path))
    assert not marker.exists()


@pytest.mark.parametrize(
    "where", [["_target_"], ["game", "agent", "_target_"], ["game", "objects", "mine", "_target_"]]
)
def test_a_target_anywhere_is_refused(where, tmp_path, symbol_loads):
    data = json.loads(json.dumps(ARENA))
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = {"_target_": "os.system"} if where[-1] == "x" else "os.system"
    path = write(tmp_path, data, "game.json")
    key = ".".join(where) + ("._target_" if where[-1] == "x" else "")
    with pytest.raises(ConfigError, match=rf"^env.game={path}: {key}='os.system' names code"):
        read_game(str(path))
    assert symbol_loads == []


def test_other_suffixes_large_files_and_aliases_are_refused(tmp_path, monkeypatch):
    script = tmp_path / "game.py"
    script.write_text("import os\n")
    with pytest.raises(ConfigError, match=r"a game file ends in .yaml, .yml or .json, not '.py'"):
        read_game(str(script))
    path = write(tmp_path, ARENA)
    monkeypatch.setattr(game_file, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(ConfigError, match=r"bytes, more than a game file may hold"):
        read_game(str(path))
    monkeypatch.undo()
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text("a: &x [1, 2]\nb: *x\n")
    with pytest.raises(ConfigError, match=r"b repeats another entry \(a YAML alias\)"):
        read_game(str(aliased))
    with pytest.raises(ConfigError, match=r"env.game=no_such_game \(.*no_such_game.yaml\): no such file .*arena"):
        read_game("no_such_game")


# ----------------------------------------------------------------------------------- games machina cannot serve
UNSERVABLE = {
    "a window wider than 15": (dict(obs__width=17, obs__height=17), r"game.obs.width=17 must be odd and at most 15"),
    "an even window": (dict(obs__width=10, obs__height=10), r"game.obs.width=10 must be odd"),
    "a window that is not square": (dict(obs__height=9), r"game.obs.width=11 differs from game.obs.height=9"),
    "vibe actions": (dict(actions__change_vibe__enabled=True), r"game.actions.change_vibe.enabled=True needs a second"),
    "no actions": (
        dict(actions__noop__enabled=False, actions__move__enabled=False),
        r"game.actions=<none> enables no action",
    ),
    "no agents": (dict(num_agents=0), r"not a valid MettaGridConfig \(.*game.num_agents Input should be greater"),
}


@pytest.mark.parametrize("case", sorted(UNSERVABLE))
def test_a_game_machina_cannot_serve_is_refused_naming_the_setting(case, tmp_path):
    changes, message = UNSERVABLE[case]
    path = write(tmp_path, arena_with(**changes))
    with pytest.raises(ConfigError, match=rf"^env.game={path}: {message}") as err:
        read_game(str(path))
    assert "\n" not in str(err.value)


def test_the_arena_tables_come_from_the_game():
    cfg = read_game("arena")
    assert game_file.action_names(cfg) == ("noop", "move_north", "move_south", "move_west", "move_east")
    names, norms = game_file.feature_table(cfg)
    assert len(names) == len(norms) == 20 and "inv:heart" in names and all(n > 0 for n in norms)


# --------------------------------------------------------------------------------------------------- the dump
def test_dump_writes_a_game_file_that_reads_back(tmp_path):
    out = tmp_path / "small.yaml"
    args = ["dump", "arena", str(out), "agents_per_env=2", "max_steps=50", "heart_reward=0.5"]
    result = run_module("machina.env.mettagrid.game", *args)
    assert result.returncode == 0, result.stderr
    summary = "2 agents, 5 actions, 20 features, window 11x11, 128 tokens, max_steps 50"
    assert result.stdout == f"{out}: {summary}\n"
    assert out.read_text().startswith("# arena: agents mine ore") and "agents_per_env=2" in out.read_text()
    expected = mettagrid_game.arena_config(agents_per_env=2, max_steps=50, heart_reward=0.5)
    assert read_game(str(out)).model_dump() == expected.model_dump()


def test_dump_json_and_a_users_function(tmp_path, monkeypatch):
    (tmp_path / "my_games.py").write_text(
        "from machina.env.mettagrid.game import arena_config\n"
        "def tiny(cap=4):\n    return arena_config(agents_per_env=1, inventory_cap=cap)\n"
        "def not_a_game():\n    return {'game': {}}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "tiny.json"
    assert mettagrid_game.main(["dump", "my_games:tiny", str(out), "cap=2"]) == 0
    assert (
        read_game(str(out)).model_dump() == mettagrid_game.arena_config(agents_per_env=1, inventory_cap=2).model_dump()
    )
    with pytest.raises(ConfigError, match="my_games:not_a_game returned a dict, not a MettaGridConfig"):
        mettagrid_game.dump("my_games:not_a_game", str(tmp_path / "x.yaml"), [])


@pytest.mark.parametrize(
    "args, message",
    [
        (["chess", "g.yaml"], r"unknown game 'chess': use one of \['arena', 'dungeon'\] or module.path:function"),
        (["arena", "g.yaml", "colour=red"], r"arena takes the settings agents_per_env, .*; got colour"),
        (["arena", "g.yaml", "agents_per_env"], r"'agents_per_env': a setting is key=value"),
        (["arena", "g.yaml", "agents_per_env=many"], r"arena agents_per_env=many: .*valid integer"),
        (["arena", "g.pkl"], r"a game file ends in .yaml, .yml or .json, not '.pkl'"),
        (["arena", "g.yaml", "window=17"], r"g.yaml: game.obs.width=17 must be odd and at most 15"),
        (["arena", "no_such_folder/g.yaml"], r"cannot write the game file 'no_such_folder/g.yaml': No such file"),
    ],
)
def test_dump_refuses_bad_input_and_writes_nothing(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mettagrid_game.main(["dump", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert list(tmp_path.iterdir()) == []


def test_dump_refuses_a_game_mettagrid_cannot_read_back(tmp_path):
    """MettaGrid's Maze scene writes its room size as {} and cannot read it back: the dump says so, writes nothing."""
    from mettagrid.mapgen.mapgen import MapGen
    from mettagrid.mapgen.scenes.maze import Maze

    cfg = mettagrid_game.arena_config()
    cfg.game.map_builder = MapGen.Config(width=11, height=11, instance=Maze.Config())
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match=r"maze.yaml: not a valid MettaGridConfig"):
        mettagrid_game.write_game(cfg, tmp_path / "maze.yaml")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("game", ["arena", "variant"])
def test_a_game_file_trains_one_debug_epoch(game, tmp_path):
    if not (ROOT / "conf" / "env" / "mettagrid.yaml").exists():
        pytest.skip("env=mettagrid (conf/env/mettagrid.yaml) is not there yet")
    from machina.startup.build import build, build_trainer

    if game == "variant":  # a fixed map, one agent per env, short episodes, written as a test would write a level
        rows = ["#######", "#m@.c.#", "#.....#", "#######"]
        game = str(
            mettagrid_game.write_game(mettagrid_game.arena_config(1, map_rows=rows, max_steps=20), tmp_path / "v.yaml")
        )
    overrides = ["env=mettagrid", f"env.game={game}", "debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled"]
    cfg = compose_config([*overrides, "policy=fast"])
    trainer = build_trainer(cfg, build(cfg), sinks=[])
    trainer.rollout.run(trainer.progress)
    assert trainer.rollout.env.spec.num_actions == 5
