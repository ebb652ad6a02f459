"""A forked torch RNG: evaluation samples actions without moving the global RNG that training draws from."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def forked_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block on torch's global RNG (and the device's) seeded with ``seed``; restore both afterwards."""
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    devices = [index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
