"""Plain-data snapshots of live training state: RNGs and TensorDicts.

Everything here returns dicts, lists, numbers and tensors only, so a checkpoint made of them loads with
``torch.load(weights_only=True)``; the matching ``restore_*`` / ``unpack`` put it back, and ``nonfinite`` says whether
one is fit to be saved.
"""

import random
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def pack(td: TensorDict) -> dict[str, Any]:
    """A TensorDict as ``{"tensors": {key: tensor}, "batch_size": [..]}`` (cloned: compact and detached)."""
    return {"tensors": td.detach().clone().to_dict(), "batch_size": list(td.batch_size)}


def unpack(packed: dict[str, Any], device: torch.device) -> TensorDict:
    return TensorDict(packed["tensors"], batch_size=packed["batch_size"]).to(device)


def capture_rng() -> dict[str, Any]:
    """torch (CPU and, when in use, CUDA), numpy and python RNG states as tensors and plain values."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss},
        "python": {"version": version, "state": list(mt), "gauss_next": gauss_next},
    }


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    n = rng["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = rng["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def nonfinite(tree: Any, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in a nested dict that hold a NaN or an infinity (read on the host:
    call it at checkpoint time, not in the hot path)."""
    if isinstance(tree, dict):
        return [name for key, value in tree.items() for name in nonfinite(value, f"{prefix}{key}.")]
    if isinstance(tree, torch.Tensor) and tree.is_floating_point() and not bool(tree.isfinite().all()):
        return [prefix.rstrip(".")]
    return []
