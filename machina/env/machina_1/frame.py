"""The replay frame of a machina_1 env (``Machina1Env.render``): the map (``render.render_frame``) with a header
(step, return and hearts so far) above it and a legend beside it: one swatch per object kind, then one line per
cog with its inventory. Read on the host; for replays, never inside training steps.
"""

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from machina.env.machina_1.grid import ASSEMBLER, CHEST, EXTRACTOR, HEART, OBSTACLE, RESOURCE_NAMES, WALL
from machina.env.machina_1.render import AGENT_COLOURS, FLOOR, OBJECT_COLOURS, render_frame

LEGEND = [
    ("wall", OBJECT_COLOURS[WALL]),
    ("obstacle", OBJECT_COLOURS[OBSTACLE]),
    *((f"{name} extractor", OBJECT_COLOURS[EXTRACTOR + r]) for r, name in enumerate(RESOURCE_NAMES)),
    ("(darker: cooling down)", tuple(c // 2 for c in OBJECT_COLOURS[EXTRACTOR + 1])),
    ("assembler", OBJECT_COLOURS[ASSEMBLER]),
    ("chest", OBJECT_COLOURS[CHEST]),
]
HEADER, LEGEND_WIDTH, LINE = 18, 190, 14
TEXT, BACKGROUND = (20, 20, 20), (255, 255, 255)


def draw_frame(env, env_index: int = 0, cell: int = 24) -> np.ndarray:
    """The map of env ``env_index`` of a Machina1Env with a header and a legend, as uint8 RGB [H, W, 3]."""
    board = render_frame(env, env_index, cell)
    so_far = env.episode_so_far(env_index)
    inv = env.state["inv"][env_index].tolist()
    height = max(board.shape[0] + HEADER, HEADER + LINE * (len(LEGEND) + len(inv) + 2))
    image = Image.new("RGB", (board.shape[1] + LEGEND_WIDTH, height), BACKGROUND)
    image.paste(Image.fromarray(board), (0, HEADER))
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    t = int(env.state["t"][env_index])
    header = f"step {t}/{env.max_steps}  return {so_far['return']:.2f}  "
    header += f"hearts made {so_far['hearts_made']:.0f}, deposited {so_far['hearts_deposited']:.0f}"
    draw.text((4, 3), header, fill=TEXT, font=font)
    x, y = board.shape[1] + 8, HEADER
    for label, colour in LEGEND:
        _swatch(draw, font, x, y, colour, label)
        y += LINE
    y += LINE // 2
    for slot, held in enumerate(inv):
        items = " ".join(f"{name[0].upper()}{held[r]}" for r, name in enumerate(RESOURCE_NAMES))
        _swatch(draw, font, x, y, AGENT_COLOURS[slot % len(AGENT_COLOURS)], f"cog {slot}: {items} heart {held[HEART]}")
        y += LINE
    return np.asarray(image)


def _swatch(draw: ImageDraw.ImageDraw, font, x: int, y: int, colour: tuple[int, ...], label: str) -> None:
    draw.rectangle((x, y + 2, x + 10, y + 12), fill=tuple(colour), outline=FLOOR)
    draw.text((x + 15, y + 1), label, fill=TEXT, font=font)
