"""Map layouts of the machina_1 env: random ones generated batched on device, and hand-made ones parsed from ASCII.

A layout is a ``Layout`` of tensors for K envs (all on the env's device, flat padded cell indices, see grid.py):

- ``grid`` int64 [K, cells]: object type per cell (walls, obstacles, extractors, assembler, chest);
- ``agent_pos`` int64 [K, agents]: cell of each agent slot;
- ``ext_pos`` int64 [K, X]: cell of each extractor (X = 4 * extractors_per_resource); unused slots point at cell 0,
  a margin cell that holds nothing.
"""

from typing import NamedTuple

import torch

from machina.env.machina_1.grid import (
    AGENT_CHARS,
    ASSEMBLER,
    CHARS,
    CHEST,
    EMPTY,
    EXTRACTOR,
    OBSTACLE,
    TYPE_OF_CHAR,
    WALL,
    Geometry,
)
from machina.errors import ConfigError


class Layout(NamedTuple):
    grid: torch.Tensor
    agent_pos: torch.Tensor
    ext_pos: torch.Tensor


def extractor_slots(ext_pos: torch.Tensor, cells: int) -> torch.Tensor:
    """int64 [K, cells]: the inverse of ``ext_pos`` [K, X], X (no extractor) everywhere else."""
    k, x = ext_pos.shape
    slots = torch.full((k, cells), x, dtype=torch.int64, device=ext_pos.device)
    slots.scatter_(1, ext_pos, torch.arange(x, device=ext_pos.device).expand(k, x))
    slots[:, 0] = x  # unused extractor slots point at margin cell 0; it must stay "no extractor"
    return slots


class LayoutSampler:
    """Draws random layouts: every object on a distinct interior cell, uniformly at random.

    Placement order on one shuffled list of interior cells: agents, extractors (``extractors_per_resource`` of each
    resource kind), the assembler, the chest, then ``num_obstacles`` obstacles. Obstacles may wall off a cell; the
    teacher then treats what it cannot reach as absent, and policies simply cannot use it.

    ``region`` (``set_region``; None: the whole interior): each layout puts everything in a ``region x region``
    square at a random place in the interior and walls off the rest, a smaller map on the same board (same shapes,
    so a curriculum can change it between rollouts). Obstacles keep the interior's density: ``obstacle_density *
    region**2`` of them. With None a layout is one random permutation of the interior and nothing else.
    """

    def __init__(self, geom: Geometry, agents: int, extractors_per_resource: int, obstacle_density: float, device):
        self.geom, self.agents, self.density = geom, agents, obstacle_density
        self.interior = geom.interior(device)
        self.template = geom.template(device)
        kinds = torch.arange(4, device=device).repeat_interleave(extractors_per_resource)
        self.fixed_types = torch.cat([kinds + EXTRACTOR, torch.tensor([ASSEMBLER, CHEST], device=device)])
        self.num_extractors = kinds.numel()
        # Row and column (0-based, interior) of each interior cell: where a region's square lies.
        self.cell_row = torch.arange(geom.height, device=device).repeat_interleave(geom.width).unsqueeze(0)
        self.cell_col = torch.arange(geom.width, device=device).repeat(geom.height).unsqueeze(0)
        self.set_region(None)

    def set_region(self, region: int | None) -> None:
        """Draw later layouts in a random ``region x region`` square of the interior (None: the whole interior);
        ConfigError if it is larger than the interior or too small for the agents and objects."""
        geom = self.geom
        if region is not None and (not isinstance(region, int) or isinstance(region, bool) or region < 1):
            raise ConfigError(f"env.region_size={region!r} must be null or an integer >= 1")
        if region is not None and region > min(geom.height, geom.width):
            raise ConfigError(
                f"env.region_size={region} is larger than the {geom.height}x{geom.width} interior; use at most "
                f"{min(geom.height, geom.width)}, or null for the whole interior"
            )
        cells = geom.height * geom.width if region is None else region * region
        device = self.interior.device
        obstacles = torch.full((round(self.density * cells),), OBSTACLE, device=device)
        object_types = torch.cat([self.fixed_types, obstacles])  # int64 [objects]
        needed = self.agents + object_types.numel()
        if needed > cells:
            where = f"a {geom.height}x{geom.width} interior" if region is None else f"a {region}x{region} region"
            raise ConfigError(
                f"{needed} agents and objects do not fit in {where} ({cells} cells): lower env.obstacle_density or "
                "env.extractors_per_resource, or raise env.height / env.width"
                + ("" if region is None else " / env.region_size")
            )
        self.region, self.object_types = region, object_types

    def sample(self, k: int, generator: torch.Generator) -> Layout:
        """``k`` fresh random layouts."""
        device = self.interior.device
        keys = torch.rand(k, self.interior.numel(), generator=generator, device=device)
        s = self.region
        if s is not None:
            # The square's cells sort first (keys in [0, 1)), the rest of the interior last (keys in [2, 3)).
            top = torch.randint(0, self.geom.height - s + 1, (k, 1), generator=generator, device=device)
            left = torch.randint(0, self.geom.width - s + 1, (k, 1), generator=generator, device=device)
            row, col = self.cell_row - top, self.cell_col - left
            outside = (row < 0) | (row >= s) | (col < 0) | (col >= s)
            keys.add_(outside.to(keys.dtype), alpha=2.0)
        cells = self.interior[keys.argsort(dim=1)]  # [k, interior]: a random permutation of the interior per env
        a, x = self.agents, self.num_extractors
        objects = cells[:, a : a + self.object_types.numel()]
        grid = self.template.expand(k, -1).clone()
        if s is not None:
            grid.scatter_(1, cells[:, s * s :], WALL)
        grid.scatter_(1, objects, self.object_types.expand(k, -1))
        ext_pos = cells[:, a : a + x].contiguous()
        return Layout(grid, cells[:, :a].contiguous(), ext_pos)


def parse_ascii(rows: list[str], geom: Geometry, agents: int, num_extractors: int, device) -> Layout:
    """One layout (K = 1) from a bordered ASCII map.

    ``rows`` are ``height + 2`` strings of ``width + 2`` characters: ``#`` wall, ``o`` obstacle, ``.`` empty,
    ``C O G S`` extractors of carbon / oxygen / germanium / silicon, ``&`` assembler, ``=`` chest, and the digits
    ``0 .. agents-1`` for the agent slots (each exactly once). The outer ring must be walls.
    """
    if len(rows) != geom.rows or any(len(r) != geom.cols for r in rows):
        raise ValueError(f"expected {geom.rows} rows of {geom.cols} characters (height/width + border)")
    grid = geom.template("cpu")
    agent_pos: dict[int, int] = {}
    ext_pos: list[int] = []
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            border = y in (0, geom.rows - 1) or x in (0, geom.cols - 1)
            if border and ch != CHARS[1]:
                raise ValueError(f"border cell ({y}, {x}) must be a wall '#', got {ch!r}")
            cell = geom.index(y, x)
            if ch in AGENT_CHARS[:agents]:
                if int(ch) in agent_pos:
                    raise ValueError(f"agent {ch} appears twice in the map")
                agent_pos[int(ch)] = cell
                continue
            if ch not in TYPE_OF_CHAR:
                raise ValueError(f"unknown map character {ch!r} at ({y}, {x}); legend: {CHARS} and agent digits")
            grid[cell] = TYPE_OF_CHAR[ch]
            if EXTRACTOR <= TYPE_OF_CHAR[ch] < ASSEMBLER:
                ext_pos.append(cell)
    if sorted(agent_pos) != list(range(agents)):
        raise ValueError(f"the map must place each agent digit 0..{agents - 1} exactly once, got {sorted(agent_pos)}")
    if len(ext_pos) > num_extractors:
        raise ValueError(f"the map has {len(ext_pos)} extractors; this env holds at most {num_extractors}")
    assert grid[0] == EMPTY  # unused extractor slots rely on cell 0 being empty margin
    ext = torch.tensor(ext_pos + [0] * (num_extractors - len(ext_pos)), dtype=torch.int64).unsqueeze(0)
    pos = torch.tensor([agent_pos[i] for i in range(agents)], dtype=torch.int64).unsqueeze(0)
    return Layout(grid.unsqueeze(0).to(device), pos.to(device), ext.to(device))
