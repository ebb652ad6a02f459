"""MettaGrid-style token observations for the machina_1 env, built for all agents with one gather and one scatter.

A token is three bytes (location ``dy << 4 | dx`` in the agent's 11x11 window with the agent at (5, 5), feature id,
value). Internally a token is one int32 with those bytes in its low three bytes (little-endian), so that moving
tokens around moves one integer, and the final observation is a byte view of the int32s.

Tokens an agent gets, in this order of priority:

1. at the centre: its own inventory (``inv:<item>``, one token per non-zero item) and ``episode_progress``;
2. for each window cell, nearest first (squared distance, see ``Geometry.window``): the cell's ``type_id`` token
   (walls, obstacles, extractors, assembler, chest, agents) and, where non-zero, its second token: the remaining
   ``cooldown`` of an extractor or the ``vibe`` of an agent.

Zero-valued tokens are not emitted. Real tokens fill the first slots; the rest are padding (``PAD_TOKEN`` bytes).
When more than ``max_tokens`` tokens exist, the farthest are dropped (the order above is cut at ``max_tokens``).
"""

import torch

from machina.env.grid import CENTRE_LOC, F_INV, F_PROGRESS, INVENTORY_SLOTS, Geometry
from machina.env.spec import PAD_TOKEN

PAD_INT = PAD_TOKEN | PAD_TOKEN << 8 | PAD_TOKEN << 16  # the three padding bytes as one int32


def cell_token(feature: int | torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A token without its location byte: ``feature << 8 | value << 16`` (same dtype as ``value``)."""
    return (value << 16) | (feature << 8)


class TokenEncoder:
    """Turns per-cell tokens and inventories into ``uint8 [N, max_tokens, 3]`` observations.

    The caller provides, per env, an int64 per padded cell holding the cell's first token in its low 32 bits and
    its second token in its high 32 bits (0 = no token); see ``Machina1Env._cell_tokens``.
    """

    def __init__(self, geom: Geometry, max_tokens: int, device: torch.device):
        self.max_tokens = max_tokens
        self.offsets, locs = geom.window(device)  # [121] nearest first
        features = torch.arange(F_INV, F_INV + INVENTORY_SLOTS, dtype=torch.int32, device=device)
        self.centre_heads = cell_token(torch.cat([features, features.new_tensor([F_PROGRESS])]), 0)  # int32 [6]
        # int32 [6 + 242]: the location byte of every token slot; each cell's two tokens share its location
        centre_locs = torch.full((self.centre_heads.numel(),), CENTRE_LOC, dtype=torch.int32, device=device)
        self.locs = torch.cat([centre_locs, locs.repeat_interleave(2)])

    def encode(self, cell_tokens: torch.Tensor, agent_cells: torch.Tensor, centre_values: torch.Tensor) -> torch.Tensor:
        """Observations uint8 [N, max_tokens, 3].

        cell_tokens: int64 [E, cells]; agent_cells: int64 [N] flat index of each agent into ``cell_tokens``
        (env * cells + cell); centre_values: int32 [N, 6] values 0..255 of the centre tokens (5 inventory slots,
        episode progress).
        """
        window = cell_tokens.view(-1).take(agent_cells.unsqueeze(1) + self.offsets)  # int64 [N, 121]
        window = window.view(torch.int32)  # [N, 242]: little-endian, so each cell's first token comes first
        centre = torch.where(centre_values != 0, (centre_values << 16) | self.centre_heads, 0)
        tokens = torch.cat([centre, window], 1)  # [N, C] int32, 0 = no token; locations not yet set
        compact = self.compact_nonzero if tokens.device.type == "cpu" else self.compact_cumsum
        out = compact(tokens)  # int32 [N, max_tokens + 1]; the last column is scratch
        n = tokens.shape[0]
        return out.view(torch.uint8).view(n, self.max_tokens + 1, 4)[:, : self.max_tokens, :3].contiguous()

    def compact_cumsum(self, tokens: torch.Tensor) -> torch.Tensor:
        """Move each row's non-zero tokens (with their locations) to its front, in order; fixed shapes, no sync.

        tokens: int32 [N, C]. Returns int32 [N, max_tokens + 1], padded with PAD_INT; column max_tokens is scratch.
        """
        valid = tokens != 0
        rank = valid.cumsum(1)
        slot = torch.where(valid & (rank <= self.max_tokens), rank - 1, self.max_tokens)  # the rest -> scratch
        out = torch.full((tokens.shape[0], self.max_tokens + 1), PAD_INT, dtype=torch.int32, device=tokens.device)
        return out.scatter_(1, slot, tokens | self.locs)

    def compact_nonzero(self, tokens: torch.Tensor) -> torch.Tensor:
        """Same result as ``compact_cumsum``, touching only the real tokens (about a quarter of the slots).

        Faster on CPU, where there is no device to sync with; nonzero() would sync an accelerator.
        """
        n, c = tokens.shape
        flat = tokens.view(-1).nonzero().squeeze(1)  # row-major, so each row's tokens keep their order
        row = flat // c
        count = (tokens != 0).sum(1)
        rank = torch.arange(flat.numel(), device=tokens.device) - (count.cumsum(0) - count)[row]
        slot = row * (self.max_tokens + 1) + rank.clamp_(max=self.max_tokens)
        out = torch.full((n * (self.max_tokens + 1),), PAD_INT, dtype=torch.int32, device=tokens.device)
        out[slot] = tokens.view(-1)[flat] | self.locs[flat - row * c]
        return out.view(n, self.max_tokens + 1)
