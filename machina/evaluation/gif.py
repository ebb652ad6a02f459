"""An episode as an animated GIF: the frames come from ``Evaluator.episode_frames`` (``Env.render``)."""

import numpy as np
from PIL import Image


def save_gif(frames: list[np.ndarray], path, fps: float = 8) -> None:
    """Write RGB frames (uint8 [H, W, 3]) to ``path`` as a looping animated GIF."""
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
