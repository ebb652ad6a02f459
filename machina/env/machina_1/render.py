"""Pictures of one env of a Machina1Env: an ASCII map and an RGB frame (both pure functions of the env state).

ASCII legend (the same characters ``Machina1Env.from_ascii`` reads): ``#`` wall, ``o`` obstacle, ``.`` empty,
``C O G S`` extractors of carbon / oxygen / germanium / silicon, ``&`` assembler, ``=`` chest, digits = agent slots.

RGB frame: one ``cell x cell`` square per map cell, coloured by object; an extractor on cooldown is drawn darker;
an agent is a square in its slot's colour with its inventory underneath as pips: one pip per resource kind in the
resource's colour (grey when none is held; its height grows with the amount) and a red pip when it holds hearts.
"""

import numpy as np

from machina.env.machina_1.grid import (
    AGENT_CHARS,
    ASSEMBLER,
    CHARS,
    CHEST,
    EXTRACTOR,
    HEART,
    NUM_RESOURCES,
    OBSTACLE,
    RADIUS,
    WALL,
)

# Okabe & Ito's colour-blind-safe palette (jfly.uni-koeln.de/color): each object type has its own hue or
# lightness, also under protanopia, deuteranopia and tritanopia (every pair at least 16 CIELAB units apart in
# simulations of each); walls are black, obstacles dark grey.
OBJECT_COLOURS = {
    WALL: (0, 0, 0),
    OBSTACLE: (95, 95, 95),
    EXTRACTOR + 0: (230, 159, 0),  # carbon: orange
    EXTRACTOR + 1: (86, 180, 233),  # oxygen: sky blue
    EXTRACTOR + 2: (0, 158, 115),  # germanium: bluish green
    EXTRACTOR + 3: (240, 228, 66),  # silicon: yellow
    ASSEMBLER: (213, 94, 0),  # vermillion
    CHEST: (0, 114, 178),  # blue
}
FLOOR = (242, 242, 236)
# Cogs: the palette's reddish purple, one lightness per slot, so slots differ without a hue of their own.
AGENT_COLOURS = [(204, 121, 167), (110, 40, 95), (240, 185, 215), (160, 70, 130), (255, 225, 240)]
EMPTY_PIP, HEART_PIP = (190, 190, 190), (230, 20, 60)


def _board(env, env_index: int) -> np.ndarray:
    """Object types of env ``env_index`` as a numpy uint8 [rows, cols] array (margin cropped)."""
    g = env.geom
    grid = env.state["grid"][env_index].view(g.rows + 2 * RADIUS, g.pcols).cpu().numpy()
    return grid[RADIUS : RADIUS + g.rows, RADIUS : RADIUS + g.cols]


def _agent_cells(env, env_index: int) -> list[tuple[int, int]]:
    pos = env.state["pos"][env_index].cpu().tolist()
    return [(p // env.geom.pcols - RADIUS, p % env.geom.pcols - RADIUS) for p in pos]


def render_ascii(env, env_index: int = 0) -> str:
    """The map of env ``env_index`` as ``rows`` lines of text (agents drawn as their slot digit)."""
    rows = [[CHARS[int(t)] for t in line] for line in _board(env, env_index)]
    for slot, (y, x) in enumerate(_agent_cells(env, env_index)):
        rows[y][x] = AGENT_CHARS[slot]
    return "\n".join("".join(r) for r in rows)


def render_frame(env, env_index: int = 0, cell: int = 16) -> np.ndarray:
    """An RGB picture uint8 [rows * cell, cols * cell, 3] of env ``env_index`` (see the module docstring)."""
    board = _board(env, env_index)
    rows, cols = board.shape
    frame = np.empty((rows, cols, 3), dtype=np.uint8)
    frame[:] = FLOOR
    for kind, colour in OBJECT_COLOURS.items():
        frame[board == kind] = colour
    frame = frame.repeat(cell, 0).repeat(cell, 1)

    pos = env.state["ext_pos"][env_index].cpu().numpy()
    cooling = env.state["cooldown"][env_index, : len(pos)].cpu().numpy() > 0
    m = max(cell // 8, 1)
    for p in pos[cooling & (pos != 0)]:
        y, x = p // env.geom.pcols - RADIUS, p % env.geom.pcols - RADIUS
        frame[y * cell + m : (y + 1) * cell - m, x * cell + m : (x + 1) * cell - m] //= 2

    inv = env.state["inv"][env_index].cpu().numpy()
    pip = max(cell // (NUM_RESOURCES + 1), 1)
    for slot, (y, x) in enumerate(_agent_cells(env, env_index)):
        y0, x0 = y * cell, x * cell
        frame[y0 + m : y0 + cell - 2 * pip, x0 + m : x0 + cell - m] = AGENT_COLOURS[slot % len(AGENT_COLOURS)]
        for r in range(NUM_RESOURCES + 1):
            held = int(inv[slot, r])
            colour = (HEART_PIP if r == HEART else OBJECT_COLOURS[EXTRACTOR + r]) if held else EMPTY_PIP
            height = min(pip * (1 + held), 2 * pip) if held else pip
            frame[y0 + cell - height : y0 + cell, x0 + r * pip : x0 + (r + 1) * pip] = colour
    return frame


def save_png(frame: np.ndarray, path: str) -> None:
    """Write an RGB frame (uint8 [H, W, 3]) to ``path`` as PNG."""
    from PIL import Image

    Image.fromarray(frame).save(path)
