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
from machina.policy.token_tables import BYTE_VALUES, scaled_value_table, token_bytes

# The attention bias of a padding token in the first slot instead of -inf: exp() of it is 0 next to any real token's
# score, and a row of padding only (whose other slots are -inf) attends to that slot alone instead of giving NaN.
FIRST_SLOT_MASKED = -1e9


class TokenEmbedding(nn.Module):
    """int64 [K] location, feature and value bytes (``tokens.token_bytes``) -> float32 [K, E],
    E = feature_dim + 4 * len(frequencies) + 1.

    Per token: a learned embedding of the feature id, Fourier features (cos, sin of y and x scaled to [-1, 1]) of its
    location, and its value divided by the feature's norm. The last two depend on one or two bytes only, so they are
    tables built once (rows of the location byte; entries of the (feature, value) pair). A padding token embeds to
    zero with no mask: its feature row is the embedding's padding row, its location byte 0xFF lies outside every
    window (at most 15 x 15) and has a zero Fourier row, and its feature's norm entry is 0.
    """

    def __init__(self, spec: ObsSpec, feature_dim: int, frequencies: Sequence[float]) -> None:
        super().__init__()
        if not 1 <= spec.window <= 15:
            raise ValueError(
                f"policy=vit needs a window of 1..15 (location byte 0xFF marks padding), got {spec.window}"
            )
        self.feature = nn.Embedding(BYTE_VALUES, feature_dim, padding_idx=PAD_TOKEN)
        with torch.no_grad():
            nn.init.trunc_normal_(self.feature.weight, std=0.02)
            self.feature.weight[PAD_TOKEN].zero_()
        byte = torch.arange(BYTE_VALUES)
        y, x = byte >> 4, byte & 0xF
        yx = torch.stack((y, x), -1).float() * (2.0 / max(spec.window - 1, 1)) - 1.0
        angles = (yx.unsqueeze(-1) * (math.pi * torch.tensor(frequencies, dtype=torch.float32))).flatten(-2)
        inside = ((y < spec.window) & (x < spec.window)).unsqueeze(-1)
        # Derived from the spec and the settings, so not saved in checkpoints.
        fourier = torch.cat((angles.cos(), angles.sin()), -1) * inside  # float32 [256, 4F]: location byte -> features
        self.register_buffer("fourier_of", fourier, persistent=False)
        self.register_buffer("scaled_of", scaled_value_table(spec).flatten(), persistent=False)  # float32 [256 * 256]
        self.dim = feature_dim + 4 * len(frequencies) + 1

    def forward(self, location: torch.Tensor, feature: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        scaled = torch.take(self.scaled_of, (feature * BYTE_VALUES + value).view(-1, 1))
        features = F.embedding(feature, self.feature.weight, PAD_TOKEN)
        return torch.cat((features, self.fourier_of.index_select(0, location), scaled), -1)


class CrossAttentionLayer(nn.Module):
    """Latents attend to the tokens' keys / values (pre-LN query, masked), then a pre-LN MLP; residuals.

    Latents are flat rows, [B * L, D] in and [N * L, D] out: B = 1 for the learned latents of the first layer, whose
    query is the same for all N observations (computed once, then broadcast), B = N after it. Flat rows make every
    projection one 2-D matrix product. The forward calls the functions of its parts (``F.linear`` with their
    parameters, ``norm``) rather than the modules: at a small batch a module call costs more host time than its op.
    """

    def __init__(self, dim: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.query_norm = nn.LayerNorm(dim)
        self.query = layer_init(nn.Linear(dim, dim, bias=False), std=1.0)
        self.out = layer_init(nn.Linear(dim, dim), std=1.0)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            layer_init(nn.Linear(dim, mlp_ratio * dim)), nn.GELU(), layer_init(nn.Linear(mlp_ratio * dim, dim), std=1.0)
        )

    def forward(
        self, latents: torch.Tensor, num_latents: int, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """``k``, ``v`` [N, heads, M, D / heads] (the layer takes its heads from them); ``bias`` float32
        [N, 1, 1, M]: 0 for a token, -inf for padding (``FIRST_SLOT_MASKED`` in the first slot)."""
        n, heads, _, head_dim = k.shape
        q = F.linear(norm(self.query_norm, latents), self.query.weight)
        q = q.view(-1, num_latents, heads, head_dim).transpose(1, 2)
        if q.shape[0] != n:  # the first layer's shared query; an explicit batch keeps the fused attention kernels
            q = q.expand(n, -1, -1, -1)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(n * num_latents, -1)
        out = F.linear(attended, self.out.weight, self.out.bias)
        if latents.shape[0] == out.shape[0]:
            latents = latents + out
        else:  # the first layer's [L, D] latents, the same for every observation
            latents = (out.view(n, num_latents, -1) + latents).view(n * num_latents, -1)
        first, _, second = self.mlp
        hidden = F.gelu(F.linear(norm(self.mlp_norm, latents), first.weight, first.bias))
        return latents + F.linear(hidden, second.weight, second.bias)


def norm(layer: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` without the module call."""
    return torch.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)


class PerceiverEncoder(Component):
    """``OBS`` uint8 [N, M, 3] -> ``ENCODED`` float32 [N, latent_dim].

    Learned latents [num_latents, latent_dim] cross-attend to the layer-normed token embeddings in ``num_layers``
    layers (no latent self-attention). The layers share one key / value projection of the tokens, computed once: it
    is the largest cost, proportional to N x M. A final LayerNorm and a mean over the latents give the encoding.
    Padding tokens are masked out of the attention, so neither their number nor their position changes the output.

    Args:
        latent_dim: the width of each latent and of ``ENCODED``.
        num_latents: how many learned latents attend to the tokens.
        num_heads: attention heads per layer (``latent_dim`` must divide by it).
        num_layers: cross-attention layers.
        feature_dim: the width of a token's learned feature embedding.
        frequencies: the sine / cosine frequencies that encode a token's window position.
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
        self.layers = nn.ModuleList(CrossAttentionLayer(latent_dim) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(latent_dim)
        bias_of = torch.zeros(BYTE_VALUES)
        bias_of[PAD_TOKEN] = -math.inf
        self.register_buffer("bias_of", bias_of, persistent=False)  # float32 [256]: feature byte -> attention bias
        # A 0-dim tensor, not a Python float: scaling by it is one op, with no scalar-to-tensor conversion.
        self.register_buffer("mean_scale", torch.tensor(1.0 / num_latents), persistent=False)
        self.out_widths = {ENCODED: latent_dim}
        self.input_spec = {OBS: ((dims.obs.max_tokens, 3), torch.uint8)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        obs = step[OBS]
        n, m, _ = obs.shape
        location, feature, value = token_bytes(obs)
        tokens = norm(self.token_norm, self.embed(location, feature, value))
        k, v = F.linear(tokens, self.key_value.weight).view(n, m, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        bias = torch.take(self.bias_of, feature.view(n, 1, 1, m))
        bias.select(-1, 0).clamp_(min=FIRST_SLOT_MASKED)
        latents, num_latents = self.latents, self.latents.shape[0]
        for layer in self.layers:
            latents = layer(latents, num_latents, k, v, bias)
        step[ENCODED] = norm(self.final_norm, latents).view(n, num_latents, -1).sum(1).mul_(self.mean_scale)
