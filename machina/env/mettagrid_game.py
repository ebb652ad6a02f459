"""The ``mettagrid_arena`` game, written with MettaGrid's own config API (``pip install -e '.[mettagrid]'``).

MettaGrid's shipped builders put only walls on the map, so the economy is built here from generic grid objects and
their ``on_use`` handlers (an agent "uses" an object by moving into it):

- ``mine``: gives the agent one ``ore`` (up to ``inventory_cap``);
- ``converter``: takes ``ore_per_heart`` ore from the agent and gives it one ``heart``;
- reward: ``heart_reward`` per heart that enters the agent's inventory (MettaGrid's inventory reward).

This module imports mettagrid at the top; ``machina.env.mettagrid`` imports it lazily, so that the rest of machina
(and composing ``env=mettagrid_arena``) works without the extra.
"""

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
from mettagrid.config.mutation import logStat, updateActor
from mettagrid.config.mutation.stats_mutation import StatsEntity, StatsTarget
from mettagrid.config.obs_config import GlobalObsConfig, ObsConfig
from mettagrid.config.reward_config import inventoryReward
from mettagrid.map_builder.ascii import AsciiMapBuilder
from mettagrid.map_builder.random_map import RandomMapBuilder

# Agent stats (per agent, summed over an env's agents at episode end) that machina reports as episode stats.
ORE_STAT, HEART_STAT = "ore.mined", "heart.made"
# ASCII maps (tests, hand-made levels): '#' wall, '.' empty, '@' agent, 'm' mine, 'c' converter.
ASCII_LEGEND = {"#": "wall", ".": "empty", "@": "agent.agent", "m": "mine", "c": "converter"}


def _count(stat: str):
    """A mutation that adds one to the acting agent's ``stat`` (read back with the episode stats)."""
    return logStat(stat, target=StatsTarget.AGENT, entity=StatsEntity.ACTOR)


def arena_config(
    agents_per_env: int,
    height: int,
    width: int,
    walls: int,
    mines: int,
    converters: int,
    ore_per_heart: int,
    inventory_cap: int,
    heart_reward: float,
    max_steps: int,
    max_tokens: int,
    window: int,
    map_rows: list[str] | None = None,
) -> MettaGridConfig:
    """One env's game: ``height x width`` interior plus a wall border, objects placed at random (a new map for
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
    game = GameConfig(
        num_agents=agents_per_env,
        max_steps=max_steps,
        episode_truncates=True,  # reaching max_steps is a time limit (truncation), as in machina_1
        resource_names=["ore", "heart"],
        # Global tokens: episode progress and last reward; last_action would repeat what the policy just chose.
        obs=ObsConfig(
            width=window,
            height=window,
            num_tokens=max_tokens,
            global_obs=GlobalObsConfig(last_action=False),
        ),
        actions=ActionsConfig(
            noop=NoopActionConfig(), move=MoveActionConfig(), change_vibe=ChangeVibeActionConfig(enabled=False)
        ),
        objects={"wall": WallConfig(), "mine": mine, "converter": converter},
        agent=AgentConfig(
            inventory=InventoryConfig(default_limit=inventory_cap),
            rewards={"heart": inventoryReward("heart", weight=heart_reward)},
        ),
        map_builder=map_builder,
    )
    return MettaGridConfig(label="machina.mettagrid_arena", game=game)


def feature_table(cfg: MettaGridConfig) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Feature names and normalisers indexed by MettaGrid's observation feature id (ids are 0..F-1)."""
    features = sorted(cfg.game.id_map().features(), key=lambda f: f.id)
    assert [f.id for f in features] == list(range(len(features))), "MettaGrid feature ids are not contiguous"
    return tuple(f.name for f in features), tuple(float(f.normalization) for f in features)


def action_names(cfg: MettaGridConfig) -> tuple[str, ...]:
    """Action names in MettaGrid's action-id order (noop, move_north, move_south, move_west, move_east)."""
    return tuple(action.name for action in cfg.game.actions.actions())
