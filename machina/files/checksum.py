"""Content checksums of the files machina writes (checkpoints, policy files), so a damaged file is refused on load.

What it guards: accidental damage. A flipped byte, a truncated or partly overwritten file, a copy cut short: the data
no longer matches the digest sealed with it, and the file is refused before anything in it is used. What it does not
guard: a deliberate edit. The digest is an unkeyed sha256 that anyone can recompute and seal into an edited file, so
a matching checksum says only "this is what the writer meant to write", not who wrote it or that its values make
sense. That is why everything a file holds is validated on load as if it could be anything: bounded plain data
(``machina.files.torch_file``), the checkpoint's structure and types (``machina.training.checkpoint_schema``), finite
weights, and shapes, dtypes and value ranges where a part restores its state (the ``load_state_dict`` methods).

The checksum is a sha256 over a canonical walk of the saved data, not over the file's bytes: the same data always
gives the same digest, whatever ``torch.save`` did with storages and zip layout. The walk feeds the hash
- a tensor as its dtype, shape and raw bytes (contiguous, on the CPU),
- a dict as its items in the order of their sorted keys' ``repr``,
- a list or tuple as its items in order,
- any other value (numbers, strings, bools, None) as its type name and ``repr``,
each prefixed with a tag and a length, so two different structures never feed the same bytes. The walk keeps its own
stack (no recursion), so deeply nested data cannot exhaust Python's; a file's data reaches it only after
``machina.files.torch_file`` has bounded its depth, size and kinds of values.
"""

import hashlib
from typing import Any

import torch

KEY = "checksum"


def digest(data: Any) -> str:
    """The hex sha256 of ``data``'s canonical walk."""
    hasher = hashlib.sha256()
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            hasher.update(f"T{value.dtype}{tuple(value.shape)}".encode())
            hasher.update(flat.view(torch.uint8).numpy())
        elif isinstance(value, dict):
            hasher.update(f"D{len(value)}".encode())
            # Pushed in reverse, so that the first key and then its value are fed next.
            for key in reversed(sorted(value, key=repr)):
                pending += [value[key], key]
        elif isinstance(value, list | tuple):
            hasher.update(f"L{len(value)}".encode())
            pending += reversed(value)
        else:
            text = f"{type(value).__name__}:{value!r}"
            hasher.update(f"V{len(text)}:{text}".encode())
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
