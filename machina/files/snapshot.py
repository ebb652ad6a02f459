"""Plain-data snapshots of live training state: RNGs and TensorDicts.

Everything here returns dicts, lists, numbers and tensors only, so a checkpoint made of them loads with
``torch.load(weights_only=True)``; the matching ``restore_*`` / ``unpack`` put it back, ``check_rng`` refuses RNG
states read from a file that ``restore_rng`` could not set, and ``nonfinite`` says whether one is fit to be saved.
"""

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from machina import checks
from machina.errors import ConfigError
from machina.files import saved_state
from machina.files.saved_state import within

MT_WORDS = 624  # words of a Mersenne Twister state (numpy's and python's RNGs)


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


def check_rng(rng: Any) -> None:
    """Refuse, naming the entry, RNG states (as ``capture_rng`` makes them) that ``restore_rng`` could not set: each
    is first set on a throwaway generator of its kind, which checks it without touching the run's own."""
    rng = saved_state.mapping(rng, "rng", ("torch", "cuda", "numpy", "python"))
    with within("rng."):
        cpu = saved_state.tensor(rng, "torch", tuple(torch.get_rng_state().shape), torch.uint8)
        _settable("torch", torch.Generator().set_state, cpu)
        cuda = rng["cuda"]
        if not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
            raise ConfigError(f"cuda is {saved_state.describe(cuda)}, not a list of uint8 tensors")
        if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():  # else restore_rng skips them
            for i, state in enumerate(cuda):
                _settable(f"cuda[{i}]", torch.Generator(f"cuda:{i}").set_state, state)
        _check_numpy(saved_state.mapping(rng["numpy"], "numpy", ("key", "pos", "has_gauss", "gauss")))
        _check_python(saved_state.mapping(rng["python"], "python", ("version", "state", "gauss_next")))


def _check_numpy(n: dict[str, Any]) -> None:
    with within("numpy."):
        key = saved_state.tensor(n, "key", (MT_WORDS,), torch.int64, 0, 2**32 - 1)
        pos = checks.integer("pos", n["pos"], 0, MT_WORDS)
        has_gauss = checks.integer("has_gauss", n["has_gauss"], 0, 1)
        if type(n["gauss"]) is not float:
            raise ConfigError(f"gauss is {saved_state.describe(n['gauss'])}, not a float")
        state = ("MT19937", key.numpy().astype(np.uint32), pos, has_gauss, n["gauss"])
        _settable("key", np.random.RandomState().set_state, state)


def _check_python(p: dict[str, Any]) -> None:
    with within("python."):
        checks.integer("version", p["version"], 3, 3)
        words = p["state"]
        if not isinstance(words, list) or len(words) != MT_WORDS + 1:
            raise ConfigError(f"state is {saved_state.describe(words)}, not a list of {MT_WORDS + 1} integers")
        for i, word in enumerate(words):
            checks.integer(f"state[{i}]", word, 0, 2**32 - 1 if i < MT_WORDS else MT_WORDS)
        if p["gauss_next"] is not None and type(p["gauss_next"]) is not float:
            raise ConfigError(f"gauss_next is {saved_state.describe(p['gauss_next'])}, not a float or None")
        _settable("state", random.Random().setstate, (3, tuple(words), p["gauss_next"]))


def _settable(name: str, set_state: Callable[[Any], Any], state: Any) -> None:
    """``set_state(state)`` on a throwaway generator; its refusal becomes a ConfigError naming ``name``."""
    try:
        set_state(state)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ConfigError(f"{name} is not a valid generator state ({' '.join(str(err).split())[:120]})") from None


def nonfinite(tree: Any, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in a nested dict that hold a NaN or an infinity (read on the host:
    call it at checkpoint time, not in the hot path)."""
    if isinstance(tree, dict):
        return [name for key, value in tree.items() for name in nonfinite(value, f"{prefix}{key}.")]
    if isinstance(tree, torch.Tensor) and tree.is_floating_point() and not bool(tree.isfinite().all()):
        return [prefix.rstrip(".")]
    return []
