"""MettaGrid games built with MettaGrid's own config API (``pip install -e '.[mettagrid]'``), and the command that
writes a game built in Python to a game file (``machina/env/mettagrid/game_file.py`` reads it back as data).

MettaGrid's shipped builders put only walls on the map, so the games' objects are generic grid objects with
``on_use`` handlers (an agent "uses" an object by moving into it):

- ``arena``: ``mine`` gives the agent one ``ore`` (up to ``inventory_cap``); ``converter`` takes ``ore_per_heart``
  ore and gives one ``heart``; reward ``heart_reward`` per heart that enters the agent's inventory.
- ``dungeon``: rooms joined by corridors from MettaGrid's map generator (``MapGen`` + its ``BSP`` scene), with
  ``coins`` coins placed at random on the floor; moving into a coin takes it off the map; reward ``coin_reward``
  per coin. The agents must search a dungeon they see only through their window.

Writing a game file (the builders' settings as ``key=value``, parsed as YAML scalars or lists)::

    python -m machina.env.mettagrid.game dump arena arena.yaml agents_per_env=2 max_steps=100
    python -m machina.env.mettagrid.game dump my_games.race:race_config race.json laps=3

``module.path:function`` imports the module and calls the function with the given settings: that runs your code,
which is your choice when you type the command. The file it writes is plain data, and reading it back runs none.

This module imports mettagrid at the top; import it only when the extra is installed.
"""

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from mettagrid.config.filter import actorHas, isNot
from mettagrid.config.handler_config import Handler
from mettagrid.config.mettagrid_config import (
    ActionsConfig,
    AgentConfig,
    ChangeVibeActionConfig,
    GameConfig,
    GridObjectConfig,
    InventoryConfig,
    MettaGridConfig,
    MoveActionConfig,
    NoopActionConfig,
    WallConfig,
)
from mettagrid.config.mutation import logStat, updateActor, withdraw
from mettagrid.config.mutation.stats_mutation import StatsEntity, StatsTarget
from mettagrid.config.obs_config import GlobalObsConfig, ObsConfig
from mettagrid.config.reward_config import inventoryReward
from mettagrid.map_builder.ascii import AsciiMapBuilder
from mettagrid.map_builder.random_map import RandomMapBuilder
from mettagrid.mapgen.mapgen import MapGen
from mettagrid.mapgen.scene import ChildrenAction
from mettagrid.mapgen.scenes.bsp import BSP
from mettagrid.mapgen.scenes.make_connected import MakeConnected
from mettagrid.mapgen.scenes.random import Random

from machina.env.mettagrid import game_file
from machina.errors import ConfigError, one_line
from machina.files.atomic import atomic_write

# Agent stats (per agent, summed over an env's agents at episode end) that machina reports as episode stats.
ORE_STAT, HEART_STAT, COIN_STAT = "ore.mined", "heart.made", "coin.taken"
# ASCII maps (tests, hand-made levels): '#' wall, '.' empty, '@' agent, 'm' mine, 'c' converter.
ASCII_LEGEND = {"#": "wall", ".": "empty", "@": "agent.agent", "m": "mine", "c": "converter"}


def _count(stat: str):
    """A mutation that adds one to the acting agent's ``stat`` (read back with the episode stats)."""
    return logStat(stat, target=StatsTarget.AGENT, entity=StatsEntity.ACTOR)


def _game(agents: int, max_steps: int, max_tokens: int, window: int, **fields: Any) -> GameConfig:
    """What machina's games share: a square ``window``, time-limit truncation, moves and noop only (no vibes)."""
    return GameConfig(
        num_agents=agents,
        max_steps=max_steps,
        episode_truncates=True,  # reaching max_steps is a time limit (truncation), as in machina_1
        # Global tokens: episode progress and last reward; last_action would repeat what the policy just chose.
        obs=ObsConfig(
            width=window, height=window, num_tokens=max_tokens, global_obs=GlobalObsConfig(last_action=False)
        ),
        actions=ActionsConfig(
            noop=NoopActionConfig(), move=MoveActionConfig(), change_vibe=ChangeVibeActionConfig(enabled=False)
        ),
        **fields,
    )


def arena_config(
    agents_per_env: int = 4,
    height: int = 11,
    width: int = 11,
    walls: int = 10,
    mines: int = 4,
    converters: int = 2,
    ore_per_heart: int = 2,
    inventory_cap: int = 4,
    heart_reward: float = 1.0,
    max_steps: int = 200,
    max_tokens: int = 128,
    window: int = 11,
    map_rows: list[str] | None = None,
) -> MettaGridConfig:
    """One env's arena: ``height x width`` interior plus a wall border, objects placed at random (a new map for
    every episode seed), or the fixed ASCII ``map_rows`` (border included) when given."""
    mine = GridObjectConfig(
        name="mine",
        map_name="mine",
        on_use_handler=Handler(
            filters=[isNot(actorHas({"ore": inventory_cap}))], mutations=[updateActor({"ore": 1}), _count(ORE_STAT)]
        ),
    )
    converter = GridObjectConfig(
        name="converter",
        map_name="converter",
        on_use_handler=Handler(
            filters=[actorHas({"ore": ore_per_heart})],
            mutations=[updateActor({"ore": -ore_per_heart, "heart": 1}), _count(HEART_STAT)],
        ),
    )
    if map_rows is None:
        objects = {"wall": walls, "mine": mines, "converter": converters}
        map_builder = RandomMapBuilder.Config(
            width=width + 2, height=height + 2, agents=agents_per_env, objects=objects, border_width=1
        )
    else:
        map_builder = AsciiMapBuilder.Config(map_data=map_rows, char_to_map_name=ASCII_LEGEND)
    game = _game(
        agents_per_env,
        max_steps,
        max_tokens,
        window,
        resource_names=["ore", "heart"],
        objects={"wall": WallConfig(), "mine": mine, "converter": converter},
        agent=AgentConfig(
            inventory=InventoryConfig(default_limit=inventory_cap),
            rewards={"heart": inventoryReward("heart", weight=heart_reward)},
        ),
        map_builder=map_builder,
    )
    return MettaGridConfig(label="machina.mettagrid_arena", game=game)


def dungeon_config(
    agents_per_env: int = 2,
    size: int = 17,
    rooms: int = 4,
    coins: int = 8,
    coin_reward: float = 1.0,
    max_steps: int = 200,
    max_tokens: int = 128,
    window: int = 11,
) -> MettaGridConfig:
    """One env's dungeon: ``rooms`` rooms joined by one-cell corridors in a ``size x size`` area (MettaGrid's
    ``BSP`` and ``MakeConnected`` scenes) inside a wall border, a new one per episode seed, with the agents and
    ``coins`` coins placed at random on its floor. Moving into a coin takes it: the coin leaves the map."""
    coin = GridObjectConfig(
        name="coin",
        map_name="coin",
        inventory=InventoryConfig(initial={"coin": 1}),
        on_use_handler=Handler(mutations=[withdraw({"coin": 1}, remove_when_empty=True), _count(COIN_STAT)]),
    )
    place = Random.Config(agents=agents_per_env, objects={"coin": coins}, too_many_is_ok=False)
    layout = BSP.Config(
        rooms=rooms,
        min_room_size=3,
        min_room_size_ratio=0.4,
        max_room_size_ratio=0.9,
        # MakeConnected digs a corridor to any room BSP left unjoined, so every coin can be reached.
        children=[
            ChildrenAction(scene=MakeConnected.Config(), where="full"),
            ChildrenAction(scene=place, where="full"),
        ],
    )
    game = _game(
        agents_per_env,
        max_steps,
        max_tokens,
        window,
        resource_names=["coin"],
        objects={"wall": WallConfig(), "coin": coin},
        agent=AgentConfig(rewards={"coin": inventoryReward("coin", weight=coin_reward)}),
        map_builder=MapGen.Config(width=size, height=size, border_width=1, instance=layout),
    )
    return MettaGridConfig(label="machina.dungeon", game=game)


# The games this module builds, by the name ``dump`` takes, with the one-line description a game file starts with.
GAMES: dict[str, tuple[Callable[..., MettaGridConfig], str]] = {
    "arena": (arena_config, "arena: agents mine ore and turn it into hearts at converters (reward per heart made)"),
    "dungeon": (
        dungeon_config,
        "dungeon: agents search rooms and corridors, new every episode, for coins (reward per coin)",
    ),
}


def render_game(cfg: MettaGridConfig, suffix: str, description: str = "") -> str:
    """``cfg`` as the text of a game file: YAML for .yaml / .yml (headed by ``description`` as a comment), JSON for
    .json. The file holds MettaGrid's own dump (``model_dump(mode="json")``), whose map builders and scenes are
    named by their ``type``."""
    data = cfg.model_dump(mode="json")
    if suffix.lower() == ".json":
        return json.dumps(data, indent=1) + "\n"
    if suffix.lower() in (".yaml", ".yml"):
        header = "".join(f"# {line}\n" for line in description.splitlines())
        return header + yaml.safe_dump(data, sort_keys=False, width=120)
    raise ConfigError(f"a game file ends in .yaml, .yml or .json, not {suffix or 'nothing'!r}")


def write_game(cfg: MettaGridConfig, path: str | Path, description: str = "") -> Path:
    """Write ``cfg`` to ``path`` as a game file (``render_game``; the suffix picks the format) once
    ``game_file.parse_game`` accepts its text, atomically (``machina.files.atomic``: a temp file, then a rename).
    ConfigError, with nothing written, for a game that would be refused when read back or a path that cannot be
    written."""
    path = Path(path)
    text = render_game(cfg, path.suffix, description)
    game_file.parse_game(text, path.suffix, str(path))
    data = text.encode("utf-8")
    try:
        atomic_write(path, lambda file: file.write(data))
    except OSError as err:  # a missing folder, no permission, a full disk: the path and the reason, one line
        raise ConfigError(f"cannot write the game file {str(path)!r}: {err.strerror or err}") from None
    return path


def summary(cfg: MettaGridConfig) -> str:
    """One line: agents, actions, features, window, tokens and max_steps of ``cfg``."""
    game = cfg.game
    features = len(game_file.feature_table(cfg)[0])
    return (
        f"{game.num_agents} agents, {len(game_file.action_names(cfg))} actions, {features} features, "
        f"window {game.obs.width}x{game.obs.height}, {game.obs.num_tokens} tokens, max_steps {game.max_steps}"
    )


def builder(game: str) -> tuple[Callable[..., MettaGridConfig], str]:
    """The function that builds ``game`` (a name in GAMES, or ``module.path:function``) and its description."""
    if game in GAMES:
        return GAMES[game]
    module, sep, name = game.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"unknown game {game!r}: use one of {sorted(GAMES)} or module.path:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{game}: cannot be loaded ({err})") from None
    if not callable(fn):
        raise ConfigError(f"{game}: is not a function")
    return fn, f"{game}: a game built in Python"


def settings(fn: Callable[..., MettaGridConfig], pairs: list[str], game: str) -> dict[str, Any]:
    """``key=value`` pairs as keyword arguments of ``fn``; values are YAML scalars or lists (``3``, ``0.5``,
    ``true``, ``[a, b]``). ConfigError for a malformed pair or a key ``fn`` does not take."""
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"{pair!r}: a setting is key=value")
        try:
            kwargs[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{pair!r}: the value is not a YAML scalar or list") from None
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        known = ", ".join(inspect.signature(fn).parameters)
        raise ConfigError(f"{game} takes the settings {known}; got {', '.join(kwargs)}") from None
    return kwargs


def dump(game: str, out: str, pairs: list[str]) -> str:
    """Build ``game`` with the ``pairs`` settings, write it to ``out`` (``write_game``), read it back with
    ``game_file.read_game`` and return the line ``dump`` prints: the path and the game's summary."""
    fn, description = builder(game)
    kwargs = settings(fn, pairs, game)
    try:
        cfg = fn(**kwargs)
    except (TypeError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"{game} {' '.join(pairs)}: {one_line(err)}") from None
    if not isinstance(cfg, MettaGridConfig):
        raise ConfigError(f"{game} returned a {type(cfg).__name__}, not a MettaGridConfig")
    if kwargs:
        description += f" ({', '.join(pairs)})"
    path = write_game(cfg, out, description)
    return f"{path}: {summary(game_file.read_game(str(path)))}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m machina.env.mettagrid.game",
        description="Write a MettaGrid game built in Python to a game file (env.game=<file>).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser(
        "dump",
        help="write a game file",
        description="Build a game and write it as a game file, then read it back as machina will.",
        epilog="example: python -m machina.env.mettagrid.game dump arena arena.yaml agents_per_env=2",
    )
    cmd.add_argument("game", help=f"one of {', '.join(GAMES)}, or module.path:function (imports and runs it)")
    cmd.add_argument("out", help="the file to write: .yaml, .yml or .json")
    cmd.add_argument("settings", nargs="*", metavar="key=value", help="arguments of the game's function")
    args = parser.parse_args(argv)
    try:
        print(dump(args.game, args.out, args.settings))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
