"""MettaGrid-style token observations for the machina_1 env, built for all agents at once.

A token is three bytes (location ``dy << 4 | dx`` in the agent's 11x11 window with the agent at (5, 5), feature id,
value). Internally a token is one int32 with those bytes in its low three bytes (little-endian): moving a token moves
one integer, and the observation is a byte view of the int32s. An int32 of 0 means "no token" (every real token has
a non-zero value byte).

Tokens an agent gets, in this order:

1. centre: its own inventory (``inv:<item>``, one token per non-zero item), then ``episode_progress``;
2. tokens of the moving and changing things inside the window, in object order: each agent's ``type_id`` (AGENT),
   then each non-zero agent ``vibe`` (its own included), then the ``cooldown`` of each extractor cooling down;
3. one ``type_id`` token per non-empty window cell of the static map (walls, obstacles, extractors, assembler,
   chest), nearest cell first (squared distance from the centre, see ``Geometry.window``).

Real tokens fill the first slots; the rest are padding (``PAD_TOKEN`` bytes). When there are more than
``max_tokens`` tokens, the list is cut at ``max_tokens``: the farthest static ``type_id`` tokens are dropped, while
the few tokens of groups 1 and 2 (at most 6 + 2 * agents + extractors) stay.

How: group 3 is gathered from one int32 per padded cell (static within an episode) with a single precomputed offset
tensor; group 2 comes from the positions of a handful of objects per env, which is cheaper than keeping a dynamic
per-cell grid; the list is then compacted so that real tokens come first.
"""

import torch

from machina.env.grid import CENTRE_LOC, F_INV, F_PROGRESS, INVENTORY_SLOTS, Geometry
from machina.env.spec import PAD_TOKEN

PAD_INT = PAD_TOKEN | PAD_TOKEN << 8 | PAD_TOKEN << 16  # the three padding bytes as one int32


def cell_token(feature: int | torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A token without its location byte: ``feature << 8 | value << 16`` (same dtype as ``value``)."""
    return (value << 16) | (feature << 8)


class TokenEncoder:
    """Turns the env state into ``uint8 [N, max_tokens, 3]`` observations (see the module docstring).

    The large per-step temporaries ([N, C] with C = 6 + J + 121 candidate tokens per agent) live in buffers
    allocated once; only the returned observation is new memory each step.
    """

    def __init__(self, geom: Geometry, max_tokens: int, num_objects: int, num_envs: int, agents_per_env: int, device):
        n = num_envs * agents_per_env
        self.max_tokens, self.cells = max_tokens, geom.cells
        self.offsets, window_locs = geom.window(device)  # [121] nearest first
        self.location_table = geom.location_table(device)
        self.env_base = torch.arange(num_envs, device=device).view(-1, 1) * geom.cells  # [E, 1]
        features = torch.arange(F_INV, F_INV + INVENTORY_SLOTS, dtype=torch.int32, device=device)
        features = torch.cat([features, features.new_tensor([F_PROGRESS])])
        self.centre_heads = cell_token(features, 0) | CENTRE_LOC  # int32 [6]
        self.window_start = features.numel() + num_objects  # candidate columns: centre, objects, window
        # Location byte of every candidate column; centre and object tokens carry theirs already.
        self.locs = torch.cat([torch.zeros(self.window_start, dtype=torch.int32, device=device), window_locs])
        c = self.locs.numel()
        self._index = torch.empty(n, self.offsets.numel(), dtype=torch.int64, device=device)
        self._tokens = torch.empty(n, c, dtype=torch.int32, device=device)
        self._real = torch.empty(n, c, dtype=torch.int32, device=device)
        self._rank = torch.empty(n, c, dtype=torch.int32, device=device)
        self._slot = torch.empty(n, c, dtype=torch.int64, device=device)
        self._out = torch.empty(n, max_tokens + 2, dtype=torch.int32, device=device)

    def encode(
        self,
        cell_types: torch.Tensor,
        agent_pos: torch.Tensor,
        centre_values: torch.Tensor,
        obj_pos: torch.Tensor,
        obj_tokens: torch.Tensor,
    ) -> torch.Tensor:
        """Observations uint8 [N, max_tokens, 3].

        cell_types: int32 [E, cells] static ``type_id`` token (no location) of every cell, 0 if empty;
        agent_pos: int64 [E, A] agent cells; centre_values: int32 [N, 6] values 0..255 of the centre tokens
        (5 inventory slots, episode progress); obj_pos: int64 [E, J] cells of the group-2 tokens;
        obj_tokens: int32 [E, J] those tokens (no location), 0 where none.
        """
        tokens, k = self._tokens, self.window_start  # int32 [N, C]; window tokens lack their location byte
        torch.add((agent_pos + self.env_base).view(-1, 1), self.offsets, out=self._index)
        torch.take(cell_types.view(-1), self._index, out=tokens[:, k:])
        centre = torch.where(centre_values != 0, (centre_values << 16) | self.centre_heads, 0)
        tokens[:, : centre.shape[1]] = centre
        tokens[:, centre.shape[1] : k] = self._object_tokens(agent_pos, obj_pos, obj_tokens)
        out = self.compact(tokens)  # int32 [N, max_tokens]: the token bytes are its low 3 bytes (little-endian)
        return out.view(torch.uint8).view(*out.shape, 4)[..., :3].contiguous()

    def _object_tokens(self, agent_pos, obj_pos, obj_tokens) -> torch.Tensor:
        """int32 [N, J]: each object's token, located in each agent's window; 0 if it has none or is out of view."""
        delta = obj_pos.unsqueeze(1) - agent_pos.unsqueeze(2) + (self.cells - 1)  # [E, A, J], always >= 0
        loc = self.location_table[delta]
        tokens = obj_tokens.unsqueeze(1).expand_as(loc)
        return torch.where((loc >= 0) & (tokens != 0), tokens | loc, 0).flatten(0, 1)

    def compact(self, tokens: torch.Tensor) -> torch.Tensor:
        """Move each row's real tokens (with their locations) to its front, in order, cut at max_tokens.

        tokens: int32 [N, C], 0 = none (overwritten: locations are or-ed in). Returns int32 [N, max_tokens] padded
        with PAD_INT, a view of an internal buffer. Fixed shapes and no host sync: a real token's rank (1, 2, ...)
        within its row is its output column + 1; non-tokens and ranks past max_tokens go to a scratch column.
        Integer arithmetic instead of boolean masks: on CPU, where / masked_fill on bools are several times slower.
        """
        real, rank, slot, out = self._real, self._rank, self._slot, self._out
        scratch = self.max_tokens + 1
        torch.clamp(tokens, max=1, out=real)  # 1 for a token, 0 for none (tokens are >= 0)
        torch.cumsum(real, 1, out=rank)
        rank.clamp_(max=scratch).sub_(scratch).mul_(real).add_(scratch)  # real: min(rank, scratch); else scratch
        slot.copy_(rank)  # scatter wants int64 indices
        tokens |= self.locs
        out.fill_(PAD_INT).scatter_(1, slot, tokens)
        return out[:, 1:scratch]
