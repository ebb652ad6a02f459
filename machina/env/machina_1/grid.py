"""Object types, observation features and the padded-grid geometry shared by the machina_1 env modules.

Every grid in the env is stored flat on a *padded* board: the ``height x width`` interior, a one-cell wall border,
and then a margin of ``RADIUS`` (5) empty cells on every side. The margin lets every agent gather its 11x11
egocentric window with one precomputed offset tensor and no bounds checks: margin cells hold no object and produce
no tokens, so the view past the border is simply empty. Cell indices below are flat indices into that padded board.
"""

from dataclasses import dataclass

import torch

# Object types stored in the uint8 grid. Agents are not stored in the grid (they move every step); they only get
# the AGENT type when observation tokens are built.
EMPTY, WALL, OBSTACLE = 0, 1, 2
EXTRACTOR = 3  # extractor of resource r has type EXTRACTOR + r
NUM_RESOURCES = 4
ASSEMBLER = EXTRACTOR + NUM_RESOURCES  # 7
CHEST = ASSEMBLER + 1  # 8
AGENT = CHEST + 1  # 9

RESOURCE_NAMES = ("carbon", "oxygen", "germanium", "silicon")
HEART = NUM_RESOURCES  # inventory slot of hearts; slots 0..3 are the resources
INVENTORY_SLOTS = NUM_RESOURCES + 1

# Characters of hand-made maps (Machina1Env.from_ascii / set_layout) and of render_ascii.
CHARS = {
    EMPTY: ".",
    WALL: "#",
    OBSTACLE: "o",
    EXTRACTOR + 0: "C",
    EXTRACTOR + 1: "O",
    EXTRACTOR + 2: "G",
    EXTRACTOR + 3: "S",
    ASSEMBLER: "&",
    CHEST: "=",
}
TYPE_OF_CHAR = {c: t for t, c in CHARS.items()}
AGENT_CHARS = "0123456789"  # agent slot k is drawn as str(k)

# Observation features: id -> (name, normalisation). The ids are the second byte of each token.
F_TYPE, F_COOLDOWN, F_VIBE = 0, 1, 2
F_INV = 3  # inventory slot i has feature F_INV + i (4 resources, then hearts)
F_PROGRESS = F_INV + INVENTORY_SLOTS  # 8: episode progress, 0..255 over max_steps
NUM_FEATURES = F_PROGRESS + 1

# Teacher distance-field kinds: one per resource's extractors, then the assembler, then the chest.
GOAL_ASSEMBLER, GOAL_CHEST = NUM_RESOURCES, NUM_RESOURCES + 1
NUM_GOALS = NUM_RESOURCES + 2

RADIUS = 5  # the observation window is (2 * RADIUS + 1) squared = 11x11, the agent at (5, 5)
WINDOW = 2 * RADIUS + 1
CENTRE_LOC = RADIUS << 4 | RADIUS


def feature_table(extractor_cooldown: int, num_vibes: int, inventory_cap: int) -> tuple[tuple[str, ...], tuple]:
    """Names and normalisations of the feature ids, in id order."""
    names = ["type_id", "cooldown", "vibe"] + [f"inv:{r}" for r in RESOURCE_NAMES] + ["inv:heart", "episode_progress"]
    norms = [float(AGENT), float(max(extractor_cooldown, 1)), float(max(num_vibes - 1, 1))]
    norms += [float(inventory_cap)] * INVENTORY_SLOTS + [255.0]
    assert len(names) == NUM_FEATURES
    return tuple(names), tuple(norms)


@dataclass(frozen=True)
class Geometry:
    """Sizes and precomputed index tensors of the padded board of one env.

    ``rows x cols`` is the bordered map (interior + walls); ``prows x pcols`` adds the margin; ``cells`` is the flat
    size of one padded board.
    """

    height: int
    width: int

    @property
    def rows(self) -> int:
        return self.height + 2

    @property
    def cols(self) -> int:
        return self.width + 2

    @property
    def pcols(self) -> int:
        return self.cols + 2 * RADIUS

    @property
    def cells(self) -> int:
        return (self.rows + 2 * RADIUS) * self.pcols

    def index(self, row: int, col: int) -> int:
        """Flat padded index of bordered-map cell (row, col); row 0 / col 0 is the top / left wall."""
        return (row + RADIUS) * self.pcols + col + RADIUS

    def move_deltas(self, device: torch.device) -> torch.Tensor:
        """int64 [5]: flat index change of actions noop, north, east, south, west."""
        return torch.tensor([0, -self.pcols, 1, self.pcols, -1], dtype=torch.int64, device=device)

    def interior(self, device: torch.device) -> torch.Tensor:
        """int64 [height * width]: flat indices of the interior cells, row-major."""
        return self._cells(1, self.rows - 1, 1, self.cols - 1, device)

    def map_cells(self, device: torch.device) -> torch.Tensor:
        """int64 [rows * cols]: flat indices of the bordered map's cells (interior and walls), row-major."""
        return self._cells(0, self.rows, 0, self.cols, device)

    def _cells(self, row0: int, row1: int, col0: int, col1: int, device: torch.device) -> torch.Tensor:
        r, c = torch.meshgrid(torch.arange(row0, row1), torch.arange(col0, col1), indexing="ij")
        return ((r + RADIUS) * self.pcols + c + RADIUS).flatten().to(device)

    def template(self, device: torch.device) -> torch.Tensor:
        """int64 [cells]: an empty board with its wall border (margin cells are EMPTY)."""
        board = torch.zeros(self.rows + 2 * RADIUS, self.pcols, dtype=torch.int64)
        board[RADIUS : RADIUS + self.rows, RADIUS : RADIUS + self.cols] = WALL
        board[RADIUS + 1 : RADIUS + self.rows - 1, RADIUS + 1 : RADIUS + self.cols - 1] = EMPTY
        return board.flatten().to(device)

    def window(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The 11x11 window cells ordered nearest first: flat offsets int64 [121] and location bytes int32 [121].

        Order is by squared Euclidean distance from the centre, ties row-major, so that keeping a prefix of the
        tokens keeps the nearest ones (see tokens.py).
        """
        cells = [(dy, dx) for dy in range(-RADIUS, RADIUS + 1) for dx in range(-RADIUS, RADIUS + 1)]
        cells.sort(key=lambda d: (d[0] ** 2 + d[1] ** 2, d[0], d[1]))
        offsets = torch.tensor([dy * self.pcols + dx for dy, dx in cells], dtype=torch.int64, device=device)
        locs = torch.tensor([(dy + RADIUS) << 4 | (dx + RADIUS) for dy, dx in cells], dtype=torch.int32, device=device)
        return offsets, locs

    def location_table(self, device: torch.device) -> torch.Tensor:
        """int32 [2 * cells - 1]: entry ``d + cells - 1`` is the window location byte of a cell at flat offset d from
        the agent, or -1 outside the window. Offsets are unique because the margin is wider than the view radius.
        """
        table = torch.full((2 * self.cells - 1,), -1, dtype=torch.int32)
        offsets, locs = self.window("cpu")
        table[offsets + self.cells - 1] = locs
        return table.to(device)
