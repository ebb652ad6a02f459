"""A MettaGrid game given as a file (``env.game=<name or path>``), read as data and checked before MettaGrid's
config model sees it.

A game file is a ``MettaGridConfig`` dumped to YAML or JSON (``python -m machina.env.mettagrid.game dump``). It
may come from anyone, so reading one must not run code it names. MettaGrid's model is plain data except in one
place: a map builder's or a map-generation scene's ``type`` field is a class path that its validators import with
``mettagrid.util.module.load_symbol`` (any module, even a notebook) before checking what it names. So a file is:

1. refused unless its suffix is .yaml, .yml or .json, it is a regular file (links followed: a FIFO, a device such
   as ``/dev/zero``, a socket or a folder is refused unread) and it is at most ``MAX_BYTES`` long
   (``machina.files.bounded.read_regular``; never unpickled);
2. parsed as plain values only (libyaml's safe loader, else PyYAML's, or ``json``;
   ``machina.files.stored_config.check_plain``: no tag builds an object, no alias, no ``${...}``);
3. walked: a ``_target_`` key anywhere is refused, and so is every ``type`` key anywhere whose value is not one of
   ``ALLOWED_TYPES``, MettaGrid's own map-builder and scene config classes, or ``DISTRIBUTION_KINDS`` (the only
   field called ``type`` in MettaGrid's config models is a building distribution's kind, a plain word;
   tests/test_game_files.py checks that);
4. validated by ``MettaGridConfig.model_validate``, whose ``load_symbol`` calls now only name allowed classes;
5. checked to be a game machina can serve and this machine can allocate (``check_servable``: a square window,
   at most ``MAX_AGENTS`` agents, ``MAX_TOKENS`` tokens and ``MAX_MAP_CELLS`` map cells).

What it costs is bounded by what real games hold: the shipped arena is 18 KB and parses in about 0.01 s; a file at
``MAX_BYTES`` (512 KiB) of the smallest YAML nodes parses in about a second (the 4 MiB bound before it took
minutes and about 1 GB).

Every refusal is one ``ConfigError`` line naming the file and the entry; it quotes no value read from the file (a
file named by mistake may hold secrets) but the class a refused ``type`` or ``_target_`` names and the numbers of a
validated game.
"""

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from machina.errors import ConfigError
from machina.files.bounded import read_regular
from machina.files.stored_config import check_plain, join, shorten

if TYPE_CHECKING:
    from mettagrid.config.mettagrid_config import MettaGridConfig

SHIPPED = Path(__file__).parent / "games"
SUFFIXES = (".yaml", ".yml", ".json")
MAX_BYTES = 512 * 1024  # the arena is 18 KB; a 256 x 256 ASCII map is about 70 KB
MAX_AGENTS = 1024  # agents per env; MettaGrid's stats table overflows between 1,000 and 2,000 arena agents
MAX_TOKENS = 1024  # observation tokens per agent (the games here use 128)
MAX_MAP_CELLS = 512 * 512  # width x height of a map builder that names both (a 3,000 x 3,000 map takes 8 s to build)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: the same safe constructors, 5x faster
MAX_WINDOW = 15  # a token's location byte packs row << 4 | col, and 0xFF marks padding
MAX_FEATURES = 255  # feature byte 0xFF marks padding
VIBE_PREFIX = "change_vibe_"  # mettagrid.config.action_config.CHANGE_VIBE_PREFIX
INSTALL_HINT = "env.game needs the mettagrid extra: pip install -e '.[mettagrid]'"

# MettaGrid's own map builders and map-generation scenes that build a map from their settings alone, spelled as
# MettaGrid writes them (``Config._type_str``).
_SCENES = "mettagrid.mapgen.scenes."
ALLOWED_TYPES = frozenset(
    [
        *(
            f"mettagrid.map_builder.{name}.Config"
            for name in (
                "ascii.AsciiMapBuilder",
                "choice_ascii.ChoiceAsciiMapBuilder",
                "maze.MazeKruskalMapBuilder",
                "maze.MazePrimMapBuilder",
                "perimeter_incontext.PerimeterInContextMapBuilder",
                "random_map.RandomMapBuilder",
            )
        ),
        "mettagrid.mapgen.mapgen.MapGen.Config",
        *(
            f"{_SCENES}{name}.Config"
            for name in (
                "asteroid_mask.AsteroidMask",
                "auto.Auto",
                "auto.AutoLayout",
                "auto.AutoSymmetry",
                "biome_arena.BiomeArena",
                "biome_arena.SequentialBiomeArena",
                "biome_caves.BiomeCaves",
                "biome_city.BiomeCity",
                "biome_desert.BiomeDesert",
                "biome_forest.BiomeForest",
                "biome_plains.BiomePlains",
                "bounded_layout.BoundedLayout",
                "bsp.BSP",
                "bsp.BSPLayout",
                "building_distributions.UniformExtractorScene",
                "compound.Compound",
                "convchain.ConvChain",
                "convchain.ConvChainSlow",
                "ensure_hub_reachable_junction.EnsureHubReachableJunction",
                "four_corner_compounds.FourCornerCompounds",
                "grid_altars.GridHubs",
                "inline_ascii.InlineAscii",
                "layout.Layout",
                "make_connected.MakeConnected",
                "map_corner_placements.MapCornerPlacements",
                "maze.Maze",
                "mean_distance.MeanDistance",
                "mirror.HorizontalMirror",
                "mirror.Mirror",
                "mirror.VerticalMirror",
                "mirror.X4Mirror",
                "multi_left_and_right.MultiLeftAndRight",
                "nop.Nop",
                "perimeter_placements.PerimeterPlacements",
                "radial_maze.RadialMaze",
                "random.Random",
                "random_objects.RandomObjects",
                "random_scene.RandomScene",
                "random_transform.RandomTransform",
                "remove_agents.RemoveAgents",
                "room_grid.RoomGrid",
                "spiral.Spiral",
                "varied_terrain.VariedTerrain",
                "wfc.WFC",
            )
        ),
    ]
)
# MettaGrid's scenes that are refused all the same, and why. The first four read other YAML files while the map is
# built, and MettaGrid imports the ``type`` those files name, unchecked; the last three are internal helpers that
# hold live objects (a grid, a parent scene) rather than settings.
REFUSED_SCENES = {
    f"{_SCENES}ascii.Ascii.Config": "reads the map file its uri names",
    f"{_SCENES}yaml.YamlScene.Config": "reads the scene file it names",
    f"{_SCENES}random_yaml_scene.RandomYamlScene.Config": "reads the scene files it names",
    f"{_SCENES}random_dcss_scene.RandomDcssScene.Config": "reads scene files through RandomYamlScene",
    f"{_SCENES}copy_grid.CopyGrid.Config": "is internal to MettaGrid (holds a grid)",
    f"{_SCENES}transplant_scene.TransplantScene.Config": "is internal to MettaGrid",
    f"{_SCENES}mirror.Mirrored.Config": "is internal to MettaGrid (holds its parent scene)",
}
# The one other ``type`` in a MettaGridConfig: a building distribution's kind (``DistributionConfig.type`` in the
# BiomeArena and UniformExtractorScene scenes), a plain word; load_symbol refuses a name without a dot unread.
DISTRIBUTION_KINDS = frozenset(["uniform", "normal", "exponential", "poisson", "bimodal"])
WHAT = "a game file is data: every type must be in machina.env.mettagrid.game_file.ALLOWED_TYPES"


def game_path(game: str) -> Path:
    """The file ``game`` names: ``SHIPPED/<game>.yaml`` for a plain name, else the path itself."""
    if "/" not in game and "\\" not in game and not game.endswith(SUFFIXES):
        return SHIPPED / f"{game}.yaml"
    return Path(game)


def read_game(game: str) -> "MettaGridConfig":
    """The game named by ``game``: a shipped game's name (``arena``, ...: a file
    machina/env/mettagrid/games/<name>.yaml) or a path to a .yaml / .json file (relative to the current directory),
    read as data, checked, validated by ``MettaGridConfig.model_validate`` and checked by ``check_servable`` (see the
    module docstring).
    ConfigError: one line naming the file and the entry."""
    return load_game(game)[0]


def load_game(game: str, kept: str | None = None) -> tuple["MettaGridConfig", str]:
    """The game ``game`` names (``read_game``) and its content as a run keeps it (``canonical``); with ``kept`` (a
    content a run kept), that content instead, the file ``game`` names left unread."""
    path = game_path(game)
    source = f"env.game={game}" if str(path) == game else f"env.game={game} ({path})"
    if kept is not None:
        source = f"env.game={game} (the copy kept with the run)"
        text, suffix = kept, ".json"
    else:
        if path.suffix.lower() not in SUFFIXES:
            raise ConfigError(f"{source}: a game file ends in .yaml, .yml or .json, not {path.suffix or 'nothing'!r}")
        text, suffix = read_text(path, source), path.suffix
    data = parse_data(text, suffix, source)
    return validate(data, source), canonical(data)


def canonical(data: dict[str, Any]) -> str:
    """A game's data (plain values) as the text a run keeps: JSON with sorted keys and no spaces, so the same game
    gives the same text (and digest) whatever file format or layout it was written in."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest(text: str) -> str:
    """The sha256 of a kept game's text (UTF-8), in hex."""
    return hashlib.sha256(text.encode()).hexdigest()


def is_shipped(game: object) -> bool:
    """Whether ``game`` names a shipped game (a plain name, not a path)."""
    return isinstance(game, str) and game_path(game).parent == SHIPPED


def read_text(path: Path, source: str) -> str:
    """The text of the regular file ``path`` (``bounded.read_regular``); ConfigError for a missing, unreadable,
    oversized or non-regular file (a FIFO or a device is never read)."""
    try:
        data = read_regular(path, MAX_BYTES, source, "a game file")
    except FileNotFoundError:
        shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.yaml")))
        raise ConfigError(f"{source}: no such file (shipped games: {shipped})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: cannot be read (not UTF-8 text)") from None


def parse_data(text: str, suffix: str, source: str) -> dict[str, Any]:
    """The mapping of plain values ``text`` (JSON for a .json ``suffix``, else YAML) holds, with every ``type`` and
    ``_target_`` checked (``check_types``); ConfigError naming ``source`` and the entry otherwise."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source}: {len(text):,} characters, more than a game file may hold ({MAX_BYTES:,})")
    try:
        data = json.loads(text) if suffix.lower() == ".json" else yaml.load(text, Loader=YAML_LOADER)  # noqa: S506
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        problem = getattr(err, "problem", None) or getattr(err, "msg", None) or type(err).__name__
        raise ConfigError(
            f"{source}: not valid {'JSON' if suffix.lower() == '.json' else 'YAML'} ({problem})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a game") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: holds a {type(data).__name__}, not a MettaGridConfig mapping")
    check_plain(data, source)
    check_types(data, source)
    return data


def parse_game(text: str, suffix: str, source: str) -> "MettaGridConfig":
    """The game ``text`` holds (``parse_data``), validated by MettaGrid and checked by ``check_servable``."""
    return validate(parse_data(text, suffix, source), source)


def validate(data: dict[str, Any], source: str) -> "MettaGridConfig":
    """The game ``data`` (checked plain values) describes, validated by MettaGrid and checked by ``check_servable``."""
    try:
        from mettagrid.config.mettagrid_config import MettaGridConfig
        from pydantic import ValidationError
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    try:
        cfg = MettaGridConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: not a valid MettaGridConfig ({validation_problem(err)})") from None
    except (ValueError, TypeError, AssertionError) as err:  # MettaGrid's own validators raise these too; their
        # messages may quote the file's values, so only the kind is told
        raise ConfigError(
            f"{source}: not a valid MettaGridConfig (MettaGrid's checks raised {type(err).__name__})"
        ) from None
    check_servable(cfg, source)
    return cfg


def check_types(data: dict[str, Any], source: str) -> None:
    """Refuse a ``_target_`` key anywhere in ``data`` and every ``type`` key whose value is not in ALLOWED_TYPES."""

    def walk(node: Any, key: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{key}[{i}]")
        elif isinstance(node, dict):
            for name, item in node.items():
                here = join(key, name)
                if name == "_target_":
                    raise ConfigError(f"{source}: {here}={shorten(item)} names code; {WHAT}")
                if name == "type" and not isinstance(item, str):
                    raise ConfigError(f"{source}: {here} is a {type(item).__name__}, not a class name; {WHAT}")
                if name == "type" and item not in ALLOWED_TYPES and item not in DISTRIBUTION_KINDS:
                    # A type names a class: the one value of the file a message quotes.
                    why = REFUSED_SCENES.get(item, "is not one of MettaGrid's map builders or scenes")
                    raise ConfigError(f"{source}: {here}={shorten(item)} {why}; {WHAT}")
                walk(item, here)

    walk(data, "")


def check_servable(cfg: "MettaGridConfig", source: str = "the game") -> None:
    """Refuse a game machina's env and policies cannot serve; ConfigError naming the setting (``game.obs.width``)."""
    game = cfg.game

    def refuse(setting: str, value: Any, why: str) -> ConfigError:
        return ConfigError(f"{source}: game.{setting}={value} {why}")

    obs = game.obs
    if obs.width != obs.height:
        raise refuse("obs.width", obs.width, f"differs from game.obs.height={obs.height}; machina's window is square")
    if not (1 <= obs.width <= MAX_WINDOW and obs.width % 2 == 1):
        raise refuse("obs.width", obs.width, f"must be odd and at most {MAX_WINDOW} (tokens pack row << 4 | col)")
    if not 1 <= obs.num_tokens <= MAX_TOKENS:
        raise refuse("obs.num_tokens", obs.num_tokens, f"must be in 1..{MAX_TOKENS} (tokens per agent)")
    if game.num_agents > MAX_AGENTS:
        raise refuse("num_agents", game.num_agents, f"is more than {MAX_AGENTS} agents per env (MettaGrid's limit)")
    builder = game.map_builder
    width, height = getattr(builder, "width", None), getattr(builder, "height", None)
    if isinstance(width, int) and isinstance(height, int) and width * height > MAX_MAP_CELLS:
        raise refuse("map_builder.width", width, f"x height {height} is more than {MAX_MAP_CELLS:,} map cells per env")
    names, norms = feature_table(cfg, source)
    if len(names) > MAX_FEATURES:
        raise refuse("obs", f"<{len(names)} features>", f"has more than {MAX_FEATURES} features (0xFF is padding)")
    for name, norm in zip(names, norms, strict=True):
        if not norm > 0:
            raise refuse("obs", f"<feature {name}>", f"has normalisation {norm}; machina divides by it")
    names = action_names(cfg)
    if any(name.startswith(VIBE_PREFIX) for name in names):
        # MettaGrid reads vibe changes from a second buffer (``vibe_actions``); machina's policy writes one action.
        raise refuse("actions.change_vibe.enabled", True, "needs a second action per agent; machina emits one")
    if not names:
        raise refuse("actions", "<none>", "enables no action")


def feature_table(cfg: "MettaGridConfig", source: str = "the game") -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Feature names and normalisers indexed by MettaGrid's observation feature id (ids are 0..F-1)."""
    features = sorted(cfg.game.id_map().features(), key=lambda f: f.id)
    if [f.id for f in features] != list(range(len(features))):
        raise ConfigError(f"{source}: MettaGrid's observation feature ids are not 0..{len(features) - 1}")
    return tuple(f.name for f in features), tuple(float(f.normalization) for f in features)


def action_names(cfg: "MettaGridConfig") -> tuple[str, ...]:
    """Action names in MettaGrid's action-id order (for the arena: noop, move_north, move_south, move_west,
    move_east)."""
    return tuple(action.name for action in cfg.game.actions.actions())


def validation_problem(err: Any) -> str:
    """The first problem of pydantic's ``ValidationError`` ``err``: where it is and what is wrong, never the value
    (pydantic's own text quotes the input)."""
    first = err.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the game"
    return f"{where} {' '.join(first['msg'].split())[:200]}; {err.error_count()} problem(s) in all"
