"""``policy=vit``'s encoder against its definition, written out one observation, head and token at a time in
float64: the token embedding, then learned latents that cross-attend to the layer-normed tokens (pre-LN query,
padding masked out; a row of padding only attends to its first slot), a pre-LN GELU MLP, residuals, and the mean
of the final LayerNorm over the latents. Values and every parameter's gradient."""

import copy
import math

import pytest
import torch

from machina.env.spec import PAD_TOKEN, ObsSpec
from machina.keys import ENCODED, OBS
from machina.policy.component import PolicyDims
from machina.policy.perceiver import PerceiverEncoder, TokenEmbedding
from machina.policy.token_tables import token_bytes
from tests.test_fast_policy_parts import SPEC, tokens

FREQUENCIES = (1.0, 2.0, 4.0)


def embedding_by_definition(embed: TokenEmbedding, token: list[int]) -> torch.Tensor:
    """One token's embedding: the feature's learned row, cos then sin of pi * f * y and pi * f * x for each
    frequency f (y and x, the location's nibbles, scaled from [0, window - 1] to [-1, 1]), and the value over the
    feature's norm (0 for unknown ids); all zero for padding."""
    location, feature, value = token
    weight = embed.feature.weight
    if feature == PAD_TOKEN:
        return torch.zeros(embed.dim, dtype=weight.dtype)
    y, x = (c * 2.0 / (SPEC.window - 1) - 1.0 for c in (location >> 4, location & 0xF))
    angles = torch.tensor([math.pi * f * c for c in (y, x) for f in FREQUENCIES], dtype=weight.dtype)
    norm = SPEC.feature_norms[feature] if feature < SPEC.num_features else None
    scaled = torch.tensor([value / norm if norm else 0.0], dtype=weight.dtype)
    return torch.cat((weight[feature], angles.cos(), angles.sin(), scaled))


def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def encode_by_definition(encoder: PerceiverEncoder, observation: list[list[int]]) -> torch.Tensor:
    """One observation [M, 3] -> its encoding [D]."""
    heads = encoder.num_heads
    x = layer_norm(torch.stack([embedding_by_definition(encoder.embed, t) for t in observation]), encoder.token_norm)
    keys, values = (x @ encoder.key_value.weight.T).chunk(2, -1)  # [M, D] each; head h owns columns h*d:(h+1)*d
    real = [j for j, t in enumerate(observation) if t[1] != PAD_TOKEN]
    attended = real or [0]  # a row of padding only attends to its first (zero-embedded) slot
    latents = encoder.latents
    for layer in encoder.layers:
        query = layer_norm(latents, layer.query_norm) @ layer.query.weight.T
        d = query.shape[1] // heads
        out = []
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            scores = query[:, cols] @ keys[attended, cols].T / math.sqrt(d)
            out.append(torch.softmax(scores, -1) @ values[attended, cols])
        latents = latents + torch.cat(out, -1) @ layer.out.weight.T + layer.out.bias
        first, _, second = layer.mlp
        hidden = gelu(layer_norm(latents, layer.mlp_norm) @ first.weight.T + first.bias)
        latents = latents + hidden @ second.weight.T + second.bias
    return layer_norm(latents, encoder.final_norm).mean(0)


def observations() -> torch.Tensor:
    """uint8 [7, M, 3]: random rows with padding after their tokens, one of padding only, one whose tokens sit
    among padding (padding in the first slot), and one full row."""
    obs = tokens(7, seed=5)
    obs[4] = PAD_TOKEN
    obs[5] = obs[0][torch.randperm(SPEC.max_tokens, generator=torch.Generator().manual_seed(1))]
    obs[5, 0] = PAD_TOKEN
    g = torch.Generator().manual_seed(9)
    dy, dx = torch.randint(0, SPEC.window, (2, SPEC.max_tokens), generator=g)
    feature = torch.randint(0, SPEC.num_features, (SPEC.max_tokens,), generator=g)
    obs[6] = torch.stack((dy << 4 | dx, feature, torch.randint(0, 256, (SPEC.max_tokens,), generator=g)), -1)
    return obs


def test_perceiver_encoder_follows_its_definition_values_and_gradients():
    torch.manual_seed(0)
    encoder = PerceiverEncoder(
        PolicyDims(obs=SPEC, num_actions=3, widths={}),
        latent_dim=16,
        num_latents=3,
        num_heads=2,
        num_layers=2,
        feature_dim=4,
        frequencies=FREQUENCIES,
    )
    reference = copy.deepcopy(encoder).double()
    obs = observations()
    real = obs[..., 1] != PAD_TOKEN
    assert (~real).all(1).any() and real.all(1).any() and (~real[:, 0] & real.any(1)).any()

    step = {OBS: obs}
    encoder(step, None)
    got = step[ENCODED]
    want = torch.stack([encode_by_definition(reference, row) for row in obs.tolist()])
    assert got.shape == (7, 16) and got.isfinite().all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)

    weights = torch.randn(7, 16, generator=torch.Generator().manual_seed(2))
    (got * weights).sum().backward()
    (want * weights.double()).sum().backward()
    for (name, mine), (_, theirs) in zip(encoder.named_parameters(), reference.named_parameters(), strict=True):
        assert mine.grad is not None and mine.grad.isfinite().all(), name
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert not encoder.embed.feature.weight.grad[PAD_TOKEN].any()  # the padding row stays zero


def test_perceiver_token_embedding_follows_its_definition():
    embed = TokenEmbedding(SPEC, feature_dim=6, frequencies=FREQUENCIES)
    obs = tokens(5, seed=3)
    real = obs[..., 1] != PAD_TOKEN
    assert real.any() and not real.all()
    got = embed(*token_bytes(obs)).view(5, SPEC.max_tokens, -1)
    assert got.shape == (5, SPEC.max_tokens, embed.dim) and embed.dim == 6 + 4 * 3 + 1
    for i, row in enumerate(obs.tolist()):
        for j, token in enumerate(row):
            torch.testing.assert_close(got[i, j], embedding_by_definition(embed, token), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [16, 0])
def test_a_window_the_location_byte_cannot_hold_is_refused(window):
    spec = ObsSpec(max_tokens=4, window=window, feature_names=("wall",), feature_norms=(1.0,))
    with pytest.raises(ValueError, match="window of 1..15"):
        TokenEmbedding(spec, feature_dim=4, frequencies=FREQUENCIES)
