"""``policy=fast`` encoder: a bag of token embeddings (one weighted embedding-bag sum, ``bag_sum.py``), then a small
MLP."""

import torch
from tensordict import TensorDict
from torch import nn

from machina import checks
from machina.env.spec import PAD_TOKEN
from machina.errors import ConfigError
from machina.keys import ENCODED, OBS
from machina.policy.bag_sum import bag_sum
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import layer_init
from machina.policy.token_tables import (
    BYTE_VALUES,
    cell_index_table,
    direction_membership,
    distance_membership,
    inverse_norm_table,
    line_membership,
    scaled_value_table,
)


class TokenBagEncoder(Component):
    """``OBS`` uint8 [N, M, 3] -> ``ENCODED`` float32 [N, hidden].

    An observation is the sum of one embedding row per token: linear in the tokens, one embedding-bag sum.
    A feature with a small range (``feature_norm <= categorical_max``: object types, vibes, inventory counts,
    cooldowns) owns a row per (value, window cell), weighted 1, so a wall and an extractor on one cell get unrelated
    rows rather than one row at two scales. A feature with a wide range (episode progress) owns a row per window
    cell, weighted by value / feature_norm. Padding tokens (and unknown feature ids) get weight 0.
    A LayerNorm, ReLU and Linear + ReLU follow.

    With ``axis_embeddings``, each (feature, value) also owns one row per window row and one per window column,
    ``row_rows`` [blocks, window, 1, embed_dim] and ``column_rows`` [blocks, 1, window, embed_dim] (a block: the cell
    rows of one (feature, value)), added to its cell rows: a token at cell (dy, dx) adds cell + row dy + column dx.
    What is learned about something dy rows from the agent (the chest is up) is then shared by the window's cells on
    that row, while the cell rows keep each cell's own meaning (a wall just there). They start at zero, so the first
    policy is the one without them. Numbers on machina_1 in docs/explanation/lab_notebook.md.

    With ``direction_embeddings``, each (feature, value) also owns one row per direction from the agent (up-left, up,
    up-right, left, its own cell, ..., down-right: the signs of dy and dx), ``direction_rows`` [blocks, 9, embed_dim];
    with ``distance_embeddings``, one row per Manhattan distance from the agent (0 to 2 * (window // 2)),
    ``distance_rows`` [blocks, 2 * (window // 2) + 1, embed_dim]. Both are added the same way: "the chest is up and to
    the left" and "the chest is 3 steps away" are then one row each, shared by every cell in that direction or at
    that distance. Zero at the start as well.

    With ``self_film``, the tokens on the agent's own cell (its inventory, the episode's progress: what it is, rather
    than what is around it) also scale and shift every unit of ``ENCODED`` (FiLM, Perez et al. 2018): ``ENCODED * (1
    + gamma) + beta``, with ``[gamma, beta]`` the sum of one row of ``self_rows`` [levels, 2 * hidden] per such token
    (a row per (feature, value), weighted as in the bag; a wide-range feature's row by value / norm). In the sum of
    the bag, "I hold a heart" is one row among some sixty; here it multiplies what the others mean. Zero at the start,
    so the first policy is the one without it. Numbers on machina_1 in docs/explanation/lab_notebook.md. Only the
    first ``self_tokens`` tokens are read: token envs put the agent's own cell first (machina_1 its inventory and
    progress, at most 6 tokens; MettaGrid its global tokens, then the nearest cell, its own), and reading all of
    them cost about 5% more of an epoch on the 2-core CPU.

    Args:
        embed_dim: the width of each embedding row (of the bag's sum).
        hidden: the width of ``ENCODED``, after the Linear layer that follows the sum.
        categorical_max: features with ``feature_norm`` up to this get a row per value; wider ones a weighted row.
        axis_embeddings, direction_embeddings, distance_embeddings: the shared rows above.
        self_film, self_tokens: the modulation by the agent's own cell above, and the leading tokens it reads.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(
        self,
        dims: PolicyDims,
        embed_dim: int = 128,
        hidden: int = 128,
        categorical_max: int = 16,
        axis_embeddings: bool = False,
        direction_embeddings: bool = False,
        distance_embeddings: bool = False,
        self_film: bool = False,
        self_tokens: int = 16,
    ) -> None:
        super().__init__()
        spec = dims.obs
        assert spec.num_features <= PAD_TOKEN, "feature id 0xFF is reserved for padding"
        cells = spec.window * spec.window
        norms = torch.tensor(spec.feature_norms, dtype=torch.float32)
        categorical = norms <= categorical_max
        # Values a categorical feature can take (0..norm, larger ones clamped); 1 level for a scaled feature.
        levels = torch.where(categorical, norms.long() + 1, 1)
        offsets = torch.cumsum(levels * cells, 0) - levels * cells
        # The table's size from the spec's plain numbers (the same sum as levels * cells), so that the policy can be
        # built on the meta device, reading no tensor (machina.policy.allowlist checks a file's sizes that way).
        table_rows = sum((int(norm) + 1 if norm <= categorical_max else 1) * cells for norm in spec.feature_norms)
        self.bag = nn.EmbeddingBag(table_rows, embed_dim, mode="sum")
        blocks, window = table_rows // cells, spec.window  # one block of cell rows per (feature, value)
        # The shared-row parameters, in the order of the membership's column groups: a [cells, groups] one-hot, so
        # that adding every cell's shared rows is one batched matrix product (its gradient another; a gather's is a
        # scatter).
        self.shared: list[str] = []
        memberships = []
        if axis_embeddings:
            self.row_rows = nn.Parameter(torch.zeros(blocks, window, 1, embed_dim))
            self.column_rows = nn.Parameter(torch.zeros(blocks, 1, window, embed_dim))
            self.shared += ["row_rows", "column_rows"]
            memberships.append(line_membership(window))
        if direction_embeddings:
            memberships.append(direction_membership(window))
            self.direction_rows = nn.Parameter(torch.zeros(blocks, memberships[-1].shape[1], embed_dim))
            self.shared.append("direction_rows")
        if distance_embeddings:
            memberships.append(distance_membership(window))
            self.distance_rows = nn.Parameter(torch.zeros(blocks, memberships[-1].shape[1], embed_dim))
            self.shared.append("distance_rows")
        if memberships:
            self.register_buffer("membership", torch.cat(memberships, 1), persistent=False)
        row_offset = torch.zeros(BYTE_VALUES, dtype=torch.int64)
        row_offset[: spec.num_features] = offsets
        max_level = torch.zeros(BYTE_VALUES, dtype=torch.int64)
        max_level[: spec.num_features] = levels - 1
        inv_norm = inverse_norm_table(spec)
        # One table entry per (feature byte, value byte), so a token's row and weight are two gathers: the row
        # offset of its feature and level (the value, clamped to the feature's range; 0 for a scaled feature), and
        # its weight (1 for a categorical row, value / norm for a scaled one, 0 for padding and unknown ids).
        value = torch.arange(BYTE_VALUES)
        row_of = row_offset.view(-1, 1) + torch.minimum(value.view(1, -1), max_level.view(-1, 1)) * cells
        weight_of = torch.where(max_level.view(-1, 1) > 0, inv_norm.view(-1, 1).gt(0).float(), scaled_value_table(spec))
        # Derived from the spec, so not saved in checkpoints.
        self.register_buffer("row_of", row_of.flatten(), persistent=False)  # int64 [256 * 256]
        self.register_buffer("weight_of", weight_of.flatten(), persistent=False)  # float32 [256 * 256]
        self.register_buffer("cell_index", cell_index_table(spec.window), persistent=False)
        self.mlp = nn.Sequential(
            nn.LayerNorm(embed_dim), nn.ReLU(), layer_init(nn.Linear(embed_dim, hidden)), nn.ReLU()
        )
        self.centre = (spec.window // 2) << 4 | (spec.window // 2)  # location byte of the agent's own cell
        self.self_rows: nn.Parameter | None = None
        if not checks.is_integer(self_tokens) or self_tokens < 1:
            raise ConfigError(f"policy.encoder.self_tokens={self_tokens!r} must be an integer >= 1 (tokens FiLM reads)")
        self.self_tokens = self_tokens
        if self_film:
            # One row per (feature, level), no cells: the tokens it reads all sit on one cell.
            self_row_of = torch.zeros(BYTE_VALUES, dtype=torch.int64)
            self_row_of[: spec.num_features] = torch.cumsum(levels, 0) - levels
            self_row_of = self_row_of.view(-1, 1) + torch.minimum(value.view(1, -1), max_level.view(-1, 1))
            self.register_buffer("self_row_of", self_row_of.flatten(), persistent=False)  # int64 [256 * 256]
            levels_total = sum(int(norm) + 1 if norm <= categorical_max else 1 for norm in spec.feature_norms)
            self.self_rows = nn.Parameter(torch.zeros(levels_total, 2 * hidden))
        self.out_widths = {ENCODED: hidden}
        self.input_spec = {OBS: ((spec.max_tokens, 3), torch.uint8)}
        self.kept_table: torch.Tensor | None = None  # ``table()`` inside ``ComponentPolicy.weights_fixed``

    def token_rows(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 [N, M, 3] tokens -> (int64 rows [N, M] into the bag's table, float32 weights [N, M])."""
        rows, weights, _, _ = self.token_lookup(obs)
        return rows, weights

    def token_lookup(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``token_rows``' rows and weights, and each token's (feature * 256 + value) and location byte [N, M]."""
        tokens = obs.long()  # one copy of [N, M, 3]; the three bytes are views of it
        feature_value = tokens[..., 1] * BYTE_VALUES + tokens[..., 2]
        rows = torch.take(self.row_of, feature_value).add_(torch.take(self.cell_index, tokens[..., 0]))
        return rows, torch.take(self.weight_of, feature_value), feature_value, tokens[..., 0]

    def modulation(self, feature_value: torch.Tensor, weights: torch.Tensor, location: torch.Tensor) -> torch.Tensor:
        """float32 [N, 2 * hidden]: ``[gamma, beta]``, the weighted sum of the ``self_rows`` of the tokens on the
        agent's own cell. A dense [N, levels] count times the rows: one small matrix product and its transpose in
        the backward, where the embedding bag's would sort indices."""
        own = weights * (location == self.centre)
        counts = own.new_zeros(*own.shape[:-1], self.self_rows.shape[0])
        counts.scatter_add_(-1, torch.take(self.self_row_of, feature_value), own)
        return counts @ self.self_rows

    def keep_derived(self, keep: bool) -> None:
        self.kept_table = None
        if keep:
            with torch.no_grad():
                self.kept_table = self.table()

    def table(self) -> torch.Tensor:
        """float32 [rows, embed_dim]: the embedding row of every (feature, value, window cell), its shared rows
        (axis, direction, distance) added. The kept one where there is one, in a forward without gradients."""
        if not torch.compiler.is_compiling() and self.kept_table is not None and not torch.is_grad_enabled():
            return self.kept_table
        if not self.shared:
            return self.bag.weight
        cells, dim = self.membership.shape[0], self.bag.weight.shape[1]
        blocks = self.bag.weight.shape[0] // cells
        shared = torch.cat([getattr(self, name).reshape(blocks, -1, dim) for name in self.shared], 1)
        # [blocks, cells, dim] + [cells, groups] @ [blocks, groups, dim]
        table = torch.baddbmm(self.bag.weight.view(blocks, cells, dim), self.membership.expand(blocks, -1, -1), shared)
        return table.view(-1, dim)

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        rows, weights, feature_value, location = self.token_lookup(step[OBS])
        encoded = self.mlp(bag_sum(self.table(), rows, weights))
        if self.self_rows is not None:
            lead = slice(0, self.self_tokens)
            gamma, beta = self.modulation(feature_value[:, lead], weights[:, lead], location[:, lead]).chunk(2, -1)
            encoded = encoded * (1 + gamma) + beta
        step[ENCODED] = encoded
