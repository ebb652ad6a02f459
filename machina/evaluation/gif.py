"""An episode as an animated GIF: the frames come from ``Evaluator.episode_frames`` (``Env.render``)."""

from pathlib import Path

import numpy as np
from PIL import Image

from machina.files.atomic import atomic_write


def save_gif(frames: list[np.ndarray], path: str | Path, fps: float = 8) -> None:
    """Write RGB frames (uint8 [H, W, 3]) to ``path`` as a looping animated GIF, whole or not at all (a kill or a
    full disk leaves the old file or none, never half of one)."""
    images = [Image.fromarray(frame) for frame in frames]
    duration = round(1000 / fps)
    atomic_write(
        Path(path),
        lambda f: images[0].save(f, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0),
    )
