"""Replays: an animated GIF of one env's episode, each frame drawn from the env's state with a legend.

A frame (uint8 RGB [H, W, 3]) is ``render.render_frame`` of the map with a header (step, return and hearts so far)
above it and a legend beside it: one swatch per object kind, then one line per cog with its inventory.
"""

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import nn

from machina.env.grid import ASSEMBLER, CHEST, EXTRACTOR, HEART, NUM_RESOURCES, OBSTACLE, WALL
from machina.env.render import AGENT_COLOURS, FLOOR, OBJECT_COLOURS, render_frame
from machina.evaluation import PolicyActor, forked_rng, play, teacher_actor

RESOURCES = ("carbon", "oxygen", "germanium", "silicon")
LEGEND = [
    ("wall", OBJECT_COLOURS[WALL]),
    ("obstacle", OBJECT_COLOURS[OBSTACLE]),
    *((f"{name} extractor", OBJECT_COLOURS[EXTRACTOR + r]) for r, name in enumerate(RESOURCES)),
    ("(darker: cooling down)", tuple(c // 2 for c in OBJECT_COLOURS[EXTRACTOR + 1])),
    ("assembler", OBJECT_COLOURS[ASSEMBLER]),
    ("chest", OBJECT_COLOURS[CHEST]),
]
HEADER, LEGEND_WIDTH, LINE = 18, 190, 14
TEXT, BACKGROUND = (20, 20, 20), (255, 255, 255)


def draw_frame(env, env_index: int = 0, cell: int = 24) -> np.ndarray:
    """The map of env ``env_index`` with a header and a legend, as uint8 RGB [H, W, 3]."""
    board = render_frame(env, env_index, cell)
    ep = env.state["ep"][env_index].tolist()  # this episode's sums so far: return (all agents), length, made, deposited
    inv = env.state["inv"][env_index].tolist()
    agents = len(inv)
    height = max(board.shape[0] + HEADER, HEADER + LINE * (len(LEGEND) + agents + 2))
    image = Image.new("RGB", (board.shape[1] + LEGEND_WIDTH, height), BACKGROUND)
    image.paste(Image.fromarray(board), (0, HEADER))
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    t = int(env.state["t"][env_index])
    draw.text(
        (4, 3),
        f"step {t}/{env.max_steps}  return {ep[0] / agents:.2f}  hearts made {ep[2]:.0f}, deposited {ep[3]:.0f}",
        fill=TEXT,
        font=font,
    )
    x, y = board.shape[1] + 8, HEADER
    for label, colour in LEGEND:
        _swatch(draw, font, x, y, colour, label)
        y += LINE
    y += LINE // 2
    for slot, held in enumerate(inv):
        items = " ".join(f"{name[0].upper()}{held[r]}" for r, name in enumerate(RESOURCES[:NUM_RESOURCES]))
        _swatch(draw, font, x, y, AGENT_COLOURS[slot % len(AGENT_COLOURS)], f"cog {slot}: {items} heart {held[HEART]}")
        y += LINE
    return np.asarray(image)


def _swatch(draw: ImageDraw.ImageDraw, font, x: int, y: int, colour: tuple[int, ...], label: str) -> None:
    draw.rectangle((x, y + 2, x + 10, y + 12), fill=tuple(colour), outline=FLOOR)
    draw.text((x + 15, y + 1), label, fill=TEXT, font=font)


@torch.no_grad()
def record_replay(
    env_factory: Callable[[], object],
    policy: nn.Module | None,
    steps: int,
    greedy: bool = False,
    seed: int = 0,
    env_index: int = 0,
    cell: int = 24,
) -> list[np.ndarray]:
    """Play ``steps`` steps on a fresh env from ``env_factory`` with ``policy`` (None: the env's teacher, which
    needs ``teacher=True``) and return ``steps`` frames of env ``env_index`` (``draw_frame``), the first at the
    env's current state. Use ``Evaluator.make_env`` (e.g. ``functools.partial(evaluator.make_env, num_envs=1)``)
    for episodes that start at step 0. Sampling runs on a forked RNG seeded with ``seed``."""
    env = env_factory()
    actor = teacher_actor if policy is None else PolicyActor(policy, env.spec.num_agents, greedy)
    with forked_rng(seed, env.device):
        return [draw_frame(env, env_index, cell) for _ in play(env, actor, steps)]


def save_gif(frames: list[np.ndarray], path, fps: float = 8) -> None:
    """Write RGB frames (uint8 [H, W, 3]) to ``path`` as a looping animated GIF."""
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
