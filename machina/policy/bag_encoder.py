"""``policy=fast`` encoder: a bag of (feature, location) embeddings weighted by the token values, then a small MLP."""

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

    Every (feature id, window cell) pair owns an embedding row; an observation is the sum of its tokens' rows, each
    weighted by value / feature_norm. That sum is linear in the tokens and costs one ``nn.EmbeddingBag`` call.
    Padding tokens (and unknown feature ids) get weight 0, so they add nothing whatever their position.
    A LayerNorm, ReLU and Linear + ReLU follow.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(self, dims: PolicyDims, embed_dim: int = 128, hidden: int = 128) -> None:
        super().__init__()
        spec = dims.obs
        assert spec.num_features <= PAD_TOKEN, "feature id 0xFF is reserved for padding"
        cells = spec.window * spec.window
        self.bag = nn.EmbeddingBag(spec.num_features * cells, embed_dim, mode="sum")
        row_offset = torch.zeros(BYTE_VALUES, dtype=torch.int64)
        row_offset[: spec.num_features] = torch.arange(spec.num_features) * cells
        # Derived from the spec, so not saved in checkpoints.
        self.register_buffer("row_offset", row_offset, persistent=False)
        self.register_buffer("cell_index", cell_index_table(spec.window), persistent=False)
        self.register_buffer("inv_norm", inverse_norm_table(spec), persistent=False)
        self.mlp = nn.Sequential(
            nn.LayerNorm(embed_dim), nn.ReLU(), layer_init(nn.Linear(embed_dim, hidden)), nn.ReLU()
        )
        self.out_widths = {ENCODED: hidden}
        self.input_spec = {OBS: ((spec.max_tokens, 3), torch.uint8)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        obs = step[OBS]
        location, feature = obs[..., 0].long(), obs[..., 1].long()
        rows = self.row_offset[feature] + self.cell_index[location]
        weights = obs[..., 2].float() * self.inv_norm[feature]
        step[ENCODED] = self.mlp(self.bag(rows, per_sample_weights=weights))
