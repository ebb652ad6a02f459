"""Content checksums of the files machina writes (checkpoints, policy files), so a damaged file is refused on load.

The checksum is a sha256 over a canonical walk of the saved data, not over the file's bytes: the same data always
gives the same digest, whatever ``torch.save`` did with storages and zip layout. The walk feeds the hash
- a tensor as its dtype, shape and raw bytes (contiguous, on the CPU),
- a dict as its items in the order of their sorted keys' ``repr``,
- a list or tuple as its items in order,
- any other value (numbers, strings, bools, None) as its type name and ``repr``,
each prefixed with a tag and a length, so two different structures never feed the same bytes.
"""

import hashlib
from typing import Any

import torch

KEY = "checksum"


def digest(data: Any) -> str:
    """The hex sha256 of ``data``'s canonical walk."""
    hasher = hashlib.sha256()
    _feed(hasher, data)
    return hasher.hexdigest()


def seal(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its checksum under ``"checksum"`` (computed over every other entry)."""
    body = {k: v for k, v in data.items() if k != KEY}
    return {**body, KEY: digest(body)}


def problem(data: dict[str, Any]) -> str | None:
    """Why ``data`` (as read from a file) fails its checksum, or None when it matches."""
    if KEY not in data:
        return "it has no checksum: it predates checksums (written by an older machina) or was not written by machina"
    if data[KEY] != digest({k: v for k, v in data.items() if k != KEY}):
        return "its content does not match its checksum: the file is damaged (flipped bytes) or was edited"
    return None


def _feed(hasher, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        hasher.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        hasher.update(flat.view(torch.uint8).numpy())
    elif isinstance(value, dict):
        hasher.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            _feed(hasher, key)
            _feed(hasher, value[key])
    elif isinstance(value, list | tuple):
        hasher.update(f"L{len(value)}".encode())
        for item in value:
            _feed(hasher, item)
    else:
        text = f"{type(value).__name__}:{value!r}"
        hasher.update(f"V{len(text)}:{text}".encode())
