"""MettaGrid-style token observations for the machina_1 env, built for all agents at once.

A token is three bytes (location ``dy << 4 | dx`` in the agent's 11x11 window with the agent at (5, 5), feature id,
value). Internally a token is one int32 with those bytes in its low three bytes (little-endian): moving a token moves
one integer, and the observation is a byte view of the int32s.

Tokens an agent gets, in this order:

1. centre: its own inventory (``inv:<item>``, one token per non-zero item), then ``episode_progress``;
2. tokens of the moving and changing things inside the window, in object order: each agent's ``type_id`` (AGENT),
   then each non-zero agent ``vibe`` (its own included), then the ``cooldown`` of each extractor cooling down;
3. one ``type_id`` token per non-empty window cell of the static map (walls, obstacles, extractors, assembler,
   chest), nearest cell first (squared distance from the centre, see ``Geometry.window``).

Real tokens fill the first slots; the rest are padding (``PAD_TOKEN`` bytes). When there are more than
``max_tokens`` tokens, the list is cut at ``max_tokens``: the farthest static ``type_id`` tokens are dropped, while
the tokens of groups 1 and 2 (at most ``never_cut`` = 6 + 2 * agents + extractors) stay.

How, in a fixed number of tensor ops with no branch on data: every candidate token (6 centre + J objects + 121
window cells per agent) is looked up in small constant tables (value -> token) and written into one preallocated
int32 [N, C] buffer; a compaction then moves the real ones to the front. Whether a candidate is real is carried in
bits 24-25, above the three token bytes: a centre or map token has REAL set; an object token and the location of
its object each carry HALF, so their sum has REAL set only when the object has a token *and* is inside the window.
"""

import torch

from machina.env.machina_1.grid import (
    AGENT,
    CENTRE_LOC,
    F_COOLDOWN,
    F_INV,
    F_PROGRESS,
    F_TYPE,
    F_VIBE,
    INVENTORY_SLOTS,
    NUM_FEATURES,
    Geometry,
)
from machina.env.spec import PAD_TOKEN

PAD_INT = PAD_TOKEN | PAD_TOKEN << 8 | PAD_TOKEN << 16  # the three padding bytes as one int32
HALF = 1 << 24  # an object's token, and its location when inside the window: the two halves of a real token
REAL = 2 * HALF  # bit 25: set on every real token, and on no other candidate
CENTRE_TOKENS = INVENTORY_SLOTS + 1  # inventory slots, then episode progress
VALUES = 256  # token values are bytes


def token(feature: int, value: int, location: int = 0) -> int:
    """One token as an int (location, feature, value in bytes 0, 1, 2)."""
    return value << 16 | feature << 8 | location


def type_tokens(grid: torch.Tensor) -> torch.Tensor:
    """The ``type_id`` token (no location) of every cell of ``grid`` (object types, int64), REAL set; 0 if empty."""
    return torch.where(grid != 0, token(F_TYPE, 0) | grid << 16 | REAL, 0)


def never_cut(agents: int, extractors: int) -> int:
    """Tokens that the cut at max_tokens never drops: the centre, every agent's type and vibe, every cooldown."""
    return CENTRE_TOKENS + 2 * agents + extractors


class TokenEncoder:
    """Writes ``uint8 [N, max_tokens, 3]`` observations of the env state into ``self.obs`` (see the module docstring).

    Bound at construction to the env's state views (all int64, updated in place by the env): ``pos`` [E, A] agent
    cells, ``things`` [E, X + A] cells of the extractors then the agents, ``inv`` [E, A, 5], ``vibe`` [E, A],
    ``cooldown`` [E, X] and ``t`` [E]; and to ``rows``, the env's int64 [E, width] map rows, whose words from
    ``type_tokens_column`` on hold the int32 ``type_id`` token of every cell (``type_tokens()``), two per word.
    ``encode()`` returns a new observation tensor.
    """

    def __init__(
        self,
        geom: Geometry,
        max_tokens: int,
        max_steps: int,
        state: dict[str, torch.Tensor],
        rows: torch.Tensor,
        type_tokens_column: int,
    ):
        pos, inv, cooldown, t = (state[k] for k in ("pos", "inv", "cooldown", "t"))
        e, a = pos.shape
        x = cooldown.shape[1]
        n, dev = e * a, pos.device
        self.cells, self.max_tokens = geom.cells, max_tokens
        self.inv, self.vibe, self.cooldown = inv, state["vibe"], cooldown
        offsets, window_locs = geom.window(dev)  # [121] nearest first
        self.tables(geom, max_steps, dev)

        # Candidate columns per agent: centre (6), agent types (A), vibes (A), cooldowns (X), window cells (121).
        objects = CENTRE_TOKENS + 2 * a + x
        c = objects + offsets.numel()
        self.candidates = torch.empty(n, c, dtype=torch.int32, device=dev)
        per_env = self.candidates.view(e, a, c)
        self.centre_inv = per_env[:, :, :INVENTORY_SLOTS]
        self.centre_progress = per_env[:, :, INVENTORY_SLOTS]
        self.agent_types = per_env[:, :, CENTRE_TOKENS : CENTRE_TOKENS + a]
        self.agent_vibes = per_env[:, :, CENTRE_TOKENS + a : CENTRE_TOKENS + 2 * a]
        self.cooldowns = per_env[:, :, CENTRE_TOKENS + 2 * a : objects]
        self.window = self.candidates[:, objects:]
        self.window_locs = window_locs

        # Inputs of the lookups, and their index buffers. The map's tokens are read straight into the candidates
        # from ``rows`` seen as int32s.
        self.pos, self.pos3 = pos, pos.view(e, a, 1)
        self.row_words = rows.view(torch.int32).view(-1)
        self.first_word = 2 * (torch.arange(e, device=dev) * rows.shape[1] + type_tokens_column).view(e, 1)
        self.agent_word = torch.empty(e, a, dtype=torch.int64, device=dev)  # int32 of the token of its cell
        self.agent_word_n = self.agent_word.view(n, 1)
        self.window_words = offsets
        self.window_index = torch.empty(n, offsets.numel(), dtype=torch.int64, device=dev)
        self.inventory_index = torch.empty(e, a, INVENTORY_SLOTS, dtype=torch.int64, device=dev)
        self.inventory_rows = torch.arange(INVENTORY_SLOTS, device=dev) * VALUES
        self.progress_index = t.view(e, 1).expand(e, a)
        self.things3 = state["things"].view(e, 1, x + a)
        self.delta = torch.empty(e, a, x + a, dtype=torch.int64, device=dev)
        self.loc = torch.empty(e, a, x + a, dtype=torch.int32, device=dev)
        self.loc_ext, self.loc_agents = self.loc[:, :, :x], self.loc[:, :, x:]
        self.vibe_tokens = torch.empty(e, 1, a, dtype=torch.int32, device=dev)
        self.cooldown_tokens = torch.empty(e, 1, x, dtype=torch.int32, device=dev)
        self.vibe_tokens2, self.cooldown_tokens2 = self.vibe_tokens.view(e, a), self.cooldown_tokens.view(e, x)

        # Compaction: rank of each real token in its row; column 0 of ``compacted`` is scratch for the others.
        self.real = torch.empty(n, c, dtype=torch.int32, device=dev)
        self.rank = torch.empty_like(self.real)
        self.column = torch.empty(n, c, dtype=torch.int64, device=dev)
        self.compacted = torch.empty(n, max(c, max_tokens) + 1, dtype=torch.int32, device=dev)
        token_bytes = self.compacted.view(torch.uint8).view(n, -1, 4)
        self.compacted_bytes = token_bytes[:, 1 : max_tokens + 1, :3]

    def tables(self, geom: Geometry, max_steps: int, dev: torch.device) -> None:
        """Constant value -> token tables (0 where a value gives no token)."""

        def table(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=dev)

        self.centre_tokens = table(
            [token(F_INV + i, v, CENTRE_LOC) | REAL if v else 0 for i in range(INVENTORY_SLOTS) for v in range(VALUES)]
        )
        progress = [min(t * 256 // max_steps, 255) for t in range(max_steps + 1)]
        self.progress_tokens = table([token(F_PROGRESS, p, CENTRE_LOC) | REAL if p else 0 for p in progress])
        self.vibe_table = table([token(F_VIBE, v) | HALF if v else 0 for v in range(VALUES)])
        self.cooldown_table = table([token(F_COOLDOWN, v) | HALF if v else 0 for v in range(VALUES)])
        self.agent_token = torch.tensor(token(F_TYPE, AGENT) | HALF, dtype=torch.int32, device=dev)
        self.real_bit = torch.tensor(25, dtype=torch.int32, device=dev)  # 0-d int32: no conversion per call
        # Location byte (plus HALF) of a cell at flat offset d from the agent, at index d + cells - 1; 0 outside.
        locations = geom.location_table(dev)
        self.location_table = torch.where(locations >= 0, locations | HALF, 0).int()
        assert NUM_FEATURES < 256 and max_steps >= 1

    def encode(self) -> torch.Tensor:
        """Observations uint8 [N, max_tokens, 3] of the current state, a new tensor."""
        # 3. the static map: the type token of every window cell, with the cell's location.
        torch.add(self.first_word, self.pos, out=self.agent_word)
        torch.add(self.agent_word_n, self.window_words, out=self.window_index)
        torch.take(self.row_words, self.window_index, out=self.window).bitwise_or_(self.window_locs)
        # 1. the centre: inventory values and the episode's progress.
        torch.add(self.inv, self.inventory_rows, out=self.inventory_index)
        torch.take(self.centre_tokens, self.inventory_index, out=self.centre_inv)
        torch.take(self.progress_tokens, self.progress_index, out=self.centre_progress)
        # 2. objects: the location of every extractor and agent in every agent's window, plus their tokens.
        torch.sub(self.things3, self.pos3, out=self.delta)
        torch.take(self.location_table, self.delta.add_(self.cells - 1), out=self.loc)
        torch.add(self.loc_agents, self.agent_token, out=self.agent_types)
        torch.take(self.vibe_table, self.vibe, out=self.vibe_tokens2)
        torch.add(self.loc_agents, self.vibe_tokens, out=self.agent_vibes)
        torch.take(self.cooldown_table, self.cooldown, out=self.cooldown_tokens2)
        torch.add(self.loc_ext, self.cooldown_tokens, out=self.cooldowns)
        return self.compact(self.candidates)

    def compact(self, candidates: torch.Tensor) -> torch.Tensor:
        """Move each row's real tokens (REAL set) to its front, in order, cut at max_tokens: uint8 [N, M, 3], new.

        candidates: int32 [N, C]. A real token's rank (1, 2, ...) within its row is its column in ``compacted``
        (column 0 takes every other candidate, and ranks past max_tokens land past what is read), so one scatter
        compacts every row: fixed shapes, no host read.
        """
        torch.bitwise_right_shift(candidates, self.real_bit, out=self.real)  # 1 for a real token, 0 for the others
        torch.cumsum(self.real, 1, out=self.rank)
        self.column.copy_(self.rank.mul_(self.real))  # scatter takes int64 indices
        self.compacted.fill_(PAD_INT).scatter_(1, self.column, candidates)
        return self.compacted_bytes.contiguous()
