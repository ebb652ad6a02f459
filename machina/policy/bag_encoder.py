"""``policy=fast`` encoder: a bag of token embeddings (one ``nn.EmbeddingBag`` call), then a small MLP."""

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import PAD_TOKEN
from machina.keys import ENCODED, OBS
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import layer_init
from machina.policy.tokens import BYTE_VALUES, cell_index_table, inverse_norm_table


class TokenBagEncoder(Component):
    """``OBS`` uint8 [N, M, 3] -> ``ENCODED`` float32 [N, hidden].

    An observation is the sum of one embedding row per token: linear in the tokens, one ``nn.EmbeddingBag`` call.
    A feature with a small range (``feature_norm <= categorical_max``: object types, vibes, inventory counts,
    cooldowns) owns a row per (value, window cell), weighted 1, so a wall and an extractor on one cell get unrelated
    rows rather than one row at two scales. A feature with a wide range (episode progress) owns a row per window
    cell, weighted by value / feature_norm. Padding tokens (and unknown feature ids) get weight 0.
    A LayerNorm, ReLU and Linear + ReLU follow.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(self, dims: PolicyDims, embed_dim: int = 128, hidden: int = 128, categorical_max: int = 16) -> None:
        super().__init__()
        spec = dims.obs
        assert spec.num_features <= PAD_TOKEN, "feature id 0xFF is reserved for padding"
        cells = spec.window * spec.window
        norms = torch.tensor(spec.feature_norms, dtype=torch.float32)
        categorical = norms <= categorical_max
        # Values a categorical feature can take (0..norm, larger ones clamped); 1 level for a scaled feature.
        levels = torch.where(categorical, norms.long() + 1, 1)
        offsets = torch.cumsum(levels * cells, 0) - levels * cells
        self.bag = nn.EmbeddingBag(int((levels * cells).sum()), embed_dim, mode="sum")
        row_offset = torch.zeros(BYTE_VALUES, dtype=torch.int64)
        row_offset[: spec.num_features] = offsets
        max_level = torch.zeros(BYTE_VALUES, dtype=torch.int64)
        max_level[: spec.num_features] = levels - 1
        inv_norm = inverse_norm_table(spec)
        inv_norm[: spec.num_features] = torch.where(categorical, 1.0, inv_norm[: spec.num_features])
        # Derived from the spec, so not saved in checkpoints.
        self.register_buffer("row_offset", row_offset, persistent=False)
        self.register_buffer("max_level", max_level, persistent=False)
        self.register_buffer("cell_index", cell_index_table(spec.window), persistent=False)
        self.register_buffer("inv_norm", inv_norm, persistent=False)
        self.cells = cells
        self.mlp = nn.Sequential(
            nn.LayerNorm(embed_dim), nn.ReLU(), layer_init(nn.Linear(embed_dim, hidden)), nn.ReLU()
        )
        self.out_widths = {ENCODED: hidden}
        self.input_spec = {OBS: ((spec.max_tokens, 3), torch.uint8)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        obs = step[OBS]
        location, feature = obs[..., 0].long(), obs[..., 1].long()
        value = obs[..., 2].long()
        level = torch.minimum(value, self.max_level[feature])
        rows = self.row_offset[feature] + level * self.cells + self.cell_index[location]
        # Categorical rows weigh 1, scaled rows value / norm, padding 0 (its inv_norm entry is 0).
        weights = torch.where(self.max_level[feature] > 0, 1.0, value.float()) * self.inv_norm[feature]
        step[ENCODED] = self.mlp(self.bag(rows, per_sample_weights=weights))
