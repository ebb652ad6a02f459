"""Decoding token observations: lookup tables indexed by the raw token bytes.

A token is (packed location ``dy << 4 | dx``, feature id, value), all uint8; padding tokens are ``PAD_TOKEN`` in
every byte. Tables indexed by a byte turn decoding into gathers with fixed shapes: no data-dependent selection.
"""

import torch

from machina.env.spec import ObsSpec

BYTE_VALUES = 256


def token_bytes(obs: torch.Tensor) -> torch.Tensor:
    """uint8 [N, M, 3] -> int64 [3, N * M]: the location, feature and value bytes of every token, one contiguous row
    each (a row indexes a table with no copy)."""
    return obs.reshape(-1, 3).t().to(torch.int64, memory_format=torch.contiguous_format)


def cell_index_table(window: int) -> torch.Tensor:
    """int64 [256]: location byte -> ``dy * window + dx``; bytes outside the window (padding) map to cell 0."""
    byte = torch.arange(BYTE_VALUES)
    dy, dx = byte >> 4, byte & 0xF
    inside = (dy < window) & (dx < window)
    return torch.where(inside, dy * window + dx, 0)


def inverse_norm_table(spec: ObsSpec) -> torch.Tensor:
    """float32 [256]: feature id -> 1 / feature_norm; unknown ids and padding map to 0, so they weigh nothing."""
    table = torch.zeros(BYTE_VALUES)
    table[: spec.num_features] = 1.0 / torch.tensor(spec.feature_norms, dtype=torch.float32)
    return table


def scaled_value_table(spec: ObsSpec) -> torch.Tensor:
    """float32 [256, 256]: [feature id, value byte] -> value / feature_norm (0 for unknown ids and padding); a token's
    entry is at ``feature * 256 + value`` of the flattened table."""
    return torch.arange(BYTE_VALUES).float().view(1, -1) * inverse_norm_table(spec).view(-1, 1)


def line_membership(window: int) -> torch.Tensor:
    """float32 [window * window, 2 * window]: window cell ``dy * window + dx`` -> one-hot of its row ``dy``, then
    one-hot of its column ``dx``."""
    line = torch.arange(window)
    return torch.cat((one_hot(line.repeat_interleave(window), window), one_hot(line.repeat(window), window)), 1)


def direction_membership(window: int) -> torch.Tensor:
    """float32 [window * window, 9]: window cell ``dy * window + dx`` -> one-hot of its direction from the centre,
    ``3 * (sign(dy - c) + 1) + sign(dx - c) + 1`` with ``c = window // 2`` (0: up-left, 4: centre, 8: down-right)."""
    side = (torch.arange(window) - window // 2).sign() + 1
    return one_hot((3 * side.view(-1, 1) + side.view(1, -1)).flatten(), 9)


def distance_membership(window: int) -> torch.Tensor:
    """float32 [window * window, 2 * (window // 2) + 1]: window cell ``dy * window + dx`` -> one-hot of its Manhattan
    distance from the centre, ``|dy - c| + |dx - c|``."""
    offset = (torch.arange(window) - window // 2).abs()
    return one_hot((offset.view(-1, 1) + offset.view(1, -1)).flatten(), 2 * (window // 2) + 1)


def one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
    """float32 [len(index), classes]; a comparison rather than ``F.one_hot``, which reads the indices (so that a policy
    can be built on the meta device)."""
    return (index.view(-1, 1) == torch.arange(classes)).float()
