"""``policy=vit`` encoder: token embedding, then a Perceiver-style latent cross-attention stack with mean pooling."""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from machina.env.spec import PAD_TOKEN, ObsSpec
from machina.keys import ENCODED, OBS
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import layer_init
from machina.policy.tokens import BYTE_VALUES, is_real_token, scaled_value_table


class TokenEmbedding(nn.Module):
    """uint8 [N, M, 3] -> float32 [N, M, E], E = feature_dim + 4 * len(frequencies) + 1; zero at padding tokens.

    Per token: a learned embedding of the feature id, Fourier features (cos, sin of y and x scaled to [-1, 1]) of its
    location, and its value divided by the feature's norm. The last two depend on one or two bytes only, so they are
    tables built once (rows of the location byte; entries of the (feature, value) pair): three lookups per token
    instead of about sixty small ops, the same numbers.
    """

    def __init__(self, spec: ObsSpec, feature_dim: int, frequencies: Sequence[float]) -> None:
        super().__init__()
        self.feature = nn.Embedding(BYTE_VALUES, feature_dim, padding_idx=PAD_TOKEN)
        with torch.no_grad():
            nn.init.trunc_normal_(self.feature.weight, std=0.02)
            self.feature.weight[PAD_TOKEN].zero_()
        byte = torch.arange(BYTE_VALUES)
        yx = torch.stack((byte >> 4, byte & 0xF), -1).float() * (2.0 / (spec.window - 1)) - 1.0
        angles = (yx.unsqueeze(-1) * (math.pi * torch.tensor(frequencies, dtype=torch.float32))).flatten(-2)
        # Derived from the spec and the settings, so not saved in checkpoints.
        fourier = torch.cat((angles.cos(), angles.sin()), -1)  # float32 [256, 4F]: location byte -> its features
        self.register_buffer("fourier_of", fourier, persistent=False)
        self.register_buffer("scaled_of", scaled_value_table(spec).flatten(), persistent=False)  # float32 [256 * 256]
        self.dim = feature_dim + 4 * len(frequencies) + 1

    def forward(self, obs: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        tokens = obs.long()  # one copy of [N, M, 3]; the three bytes are views of it
        feature = tokens[..., 1]
        value = torch.take(self.scaled_of, feature * BYTE_VALUES + tokens[..., 2]).unsqueeze(-1)
        embedded = torch.cat((self.feature(feature), F.embedding(tokens[..., 0], self.fourier_of), value), -1)
        return embedded * real.unsqueeze(-1)


class CrossAttentionLayer(nn.Module):
    """Latents [N, L, D] attend to the tokens' keys / values (pre-LN query, masked), then a pre-LN MLP; residuals."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query_norm = nn.LayerNorm(dim)
        self.query = layer_init(nn.Linear(dim, dim, bias=False), std=1.0)
        self.out = layer_init(nn.Linear(dim, dim), std=1.0)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            layer_init(nn.Linear(dim, mlp_ratio * dim)), nn.GELU(), layer_init(nn.Linear(mlp_ratio * dim, dim), std=1.0)
        )

    def forward(self, latents: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """``k``, ``v`` [N, heads, M, D / heads]; ``attend`` bool [N, 1, 1, M]: True where a token may be attended."""
        n, num_latents, dim = latents.shape
        q = self.query(self.query_norm(latents)).view(n, num_latents, self.num_heads, -1).transpose(1, 2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        latents = latents + self.out(attended.transpose(1, 2).reshape(n, num_latents, dim))
        return latents + self.mlp(self.mlp_norm(latents))


class PerceiverEncoder(Component):
    """``OBS`` uint8 [N, M, 3] -> ``ENCODED`` float32 [N, latent_dim].

    Learned latents [num_latents, latent_dim] cross-attend to the layer-normed token embeddings in ``num_layers``
    layers (no latent self-attention). The layers share one key / value projection of the tokens, computed once: it
    is the largest cost, proportional to N x M. A final LayerNorm and a mean over the latents give the encoding.
    Padding tokens are masked out of the attention, so neither their number nor their position changes the output.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(
        self,
        dims: PolicyDims,
        latent_dim: int = 64,
        num_latents: int = 12,
        num_heads: int = 4,
        num_layers: int = 2,
        feature_dim: int = 8,
        frequencies: Sequence[float] = (1.0, 2.0, 4.0),
    ) -> None:
        super().__init__()
        assert latent_dim % num_heads == 0, f"latent_dim {latent_dim} must be divisible by num_heads {num_heads}"
        self.embed = TokenEmbedding(dims.obs, feature_dim, frequencies)
        self.token_norm = nn.LayerNorm(self.embed.dim)
        self.num_heads = num_heads
        self.key_value = layer_init(nn.Linear(self.embed.dim, 2 * latent_dim, bias=False), std=1.0)
        self.latents = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_latents, latent_dim), std=0.02))
        self.layers = nn.ModuleList(CrossAttentionLayer(latent_dim, num_heads) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(latent_dim)
        self.out_widths = {ENCODED: latent_dim}
        self.input_spec = {OBS: ((dims.obs.max_tokens, 3), torch.uint8)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        obs = step[OBS]
        real = is_real_token(obs)
        tokens = self.token_norm(self.embed(obs, real))
        # A row of padding only would attend to nothing and give NaN; let it attend to its first (zeroed) slot.
        empty = ~real.any(-1, keepdim=True)
        attend = torch.cat((real[:, :1] | empty, real[:, 1:]), -1)[:, None, None, :]
        n, m = real.shape
        k, v = self.key_value(tokens).view(n, m, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        latents = self.latents.expand(n, -1, -1)
        for layer in self.layers:
            latents = layer(latents, k, v, attend)
        step[ENCODED] = self.final_norm(latents).mean(1)
