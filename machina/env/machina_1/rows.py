"""Per-env state as int64 rows, so that resetting an env is copying rows.

The machina_1 env keeps its per-env tensors (map, agents, episode counters, teacher distance fields) as named
slices of ``int64 [E, width]`` tensors, one per block of fields (``pool.Episodes``). Resetting ended envs from a
pool of fresh rows is then one fixed-size gather per block, whatever the state holds, and the named views stay
valid as long as the rows tensors live (every write goes into them in place).
"""

import math

import torch


class RowFormat:
    """Named fields of a row, in order: ``fields`` maps a name to the shape of that field in one env (``()`` for one
    number). ``width`` is the row length in int64 words."""

    def __init__(self, fields: dict[str, tuple[int, ...]]):
        self.fields = dict(fields)
        self.start: dict[str, int] = {}
        offset = 0
        for name, shape in self.fields.items():
            self.start[name] = offset
            offset += math.prod(shape)
        self.width = offset

    def span(self, first: str, last: str) -> slice:
        """The columns from field ``first`` through field ``last`` (adjacent fields read as one view)."""
        end = self.start[last] + math.prod(self.fields[last])
        return slice(self.start[first], end)

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view ``[K, *shape]`` of ``rows`` int64 [K, width] (``[K]`` for a one-number field)."""
        out = {}
        for name, shape in self.fields.items():
            cols = rows[:, self.span(name, name)]
            out[name] = cols.view(rows.shape[0], *shape) if shape else cols.squeeze(1)
        return out
