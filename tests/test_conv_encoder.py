"""``policy=conv`` (``machina.policy.conv_encoder.ConvEncoder``) and the image observations it reads
(``ImageObsSpec``): the component contract (``machina.conformance``), which pixel and channel each value of a row is
(an (H, W, C) image flattened row-major, as the PettingZoo adapter writes it), what it refuses, and the spec as a
policy file stores it."""

import hydra
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch.nn import functional

from machina import keys
from machina.conformance import check_component
from machina.env.spec import ImageObsSpec, VectorObsSpec, obs_spec_from_dict, obs_spec_to_dict
from machina.policy.component import PolicyDims
from machina.policy.conv_encoder import ConvEncoder
from tests.conftest import CONF

PURSUIT = ImageObsSpec(size=147, height=7, width=7, channels=3)
PRESET = OmegaConf.to_container(OmegaConf.load(CONF / "policy" / "conv.yaml"))


def encoder(spec=PURSUIT, **settings) -> ConvEncoder:
    torch.manual_seed(0)
    return ConvEncoder(PolicyDims(obs=spec, num_actions=5, widths={}), **settings)


def encoded(module: ConvEncoder, obs: torch.Tensor) -> torch.Tensor:
    step = TensorDict({keys.OBS: obs}, batch_size=[len(obs)])
    module(step, step)
    return step[keys.ENCODED]


@pytest.mark.parametrize("obs", [PURSUIT, None], ids=["pursuit", "examples"])
def test_the_conv_encoder_meets_the_component_contract(obs):
    """On pursuit's (7, 7, 3) and on the kit's own examples (it builds with their image and refuses the others)."""
    check_component(PRESET["encoder"], obs=obs)


def test_the_conv_preset_passes_the_kit_as_a_whole_policy():
    check_component(PRESET["actor"], policy=PRESET, obs=PURSUIT)


def test_a_row_is_the_image_flattened_row_major_with_channels_last():
    """A row holds image[h, w, c] at (h * W + w) * C + c (numpy's reshape of an (H, W, C) observation): the first
    convolution must see pixel (h, w) of channel c where the row put it."""
    module = encoder()
    images = torch.randn(4, 7, 7, 3)  # [N, H, W, C], as PettingZoo gives each agent's observation
    first = module.net[0]
    expected = functional.relu(functional.conv2d(images.permute(0, 3, 1, 2), first.weight, first.bias))
    seen = {}
    module.net[1].register_forward_hook(lambda _, __, out: seen.setdefault("first", out))
    out = encoded(module, images.reshape(4, -1))
    assert torch.allclose(seen["first"], expected, atol=1e-6)
    assert out.shape == (4, 128) and out.dtype == torch.float32 and (out >= 0).all()


def test_one_lit_pixel_moves_the_output_only_through_its_own_channel_weights():
    """An image lit at one pixel of one channel: the first convolution's output at the window that covers it is
    that channel's kernel weight at that offset (times the value) plus the bias."""
    module = encoder()
    image = torch.zeros(1, 7, 7, 3)
    image[0, 2, 4, 1] = 2.0  # h=2, w=4, channel 1
    seen = {}
    module.net[0].register_forward_hook(lambda _, __, out: seen.setdefault("conv", out))
    encoded(module, image.reshape(1, -1))
    weight, bias = module.net[0].weight, module.net[0].bias  # [out, C, 3, 3]
    # Output position (1, 2) covers rows 1..3 and columns 2..4: the lit pixel is at kernel offset (1, 2).
    assert torch.allclose(seen["conv"][0, :, 1, 2], 2.0 * weight[:, 1, 1, 2] + bias, atol=1e-6)
    assert torch.allclose(seen["conv"][0, :, 4, 0], bias, atol=1e-6)  # a window away from it: the bias alone


def test_scale_divides_the_observation():
    images = torch.rand(3, 147)
    assert torch.allclose(encoded(encoder(scale=255.0), images * 255), encoded(encoder(), images), atol=1e-5)


@pytest.mark.parametrize(
    "spec, settings, message",
    [
        (VectorObsSpec(size=147), {}, "reads image observations.*use policy=mlp for vector observations"),
        (ImageObsSpec(size=48, height=4, width=4, channels=3), {}, "a 4 x 4 image is too small for 2 convolutions"),
        (PURSUIT, {"kernel_size": 9}, "too small"),
        (PURSUIT, {"scale": 0.0}, "scale must be > 0"),
    ],
)
def test_what_it_cannot_read_is_refused_in_one_line(spec, settings, message):
    with pytest.raises(ValueError, match=message) as refused:
        encoder(spec, **settings)
    assert "\n" not in str(refused.value)


def test_policy_conv_and_policy_mlp_both_play_an_image_env():
    """The preset builds on pursuit's spec; policy=mlp reads the same rows as a flat vector."""
    for name in ("conv", "mlp"):
        cfg = OmegaConf.load(CONF / "policy" / f"{name}.yaml")
        cfg.action_probs.emit_full_log_probs = False  # the run derives it from its losses
        policy = hydra.utils.instantiate(cfg, obs_spec=PURSUIT, num_actions=5)
        td = TensorDict({keys.OBS: torch.rand(6, 1, 147), keys.EPISODE_START: torch.ones(6, 1)}, batch_size=[6])
        with torch.no_grad():
            out = policy(td)
        assert out[keys.LOGITS].shape == (6, 1, 5) and out[keys.VALUES].shape == (6, 1)


def test_an_image_spec_is_stored_as_plain_data_and_checked_when_read():
    data = obs_spec_to_dict(PURSUIT)
    assert data == {"kind": "image", "size": 147, "height": 7, "width": 7, "channels": 3}
    assert obs_spec_from_dict(data) == PURSUIT and VectorObsSpec(147) != PURSUIT
    with pytest.raises(ValueError, match="size must be height x width x channels = 7 x 7 x 3, got 148"):
        obs_spec_from_dict({**data, "size": 148})
    with pytest.raises(ValueError, match="must be integers >= 1"):
        obs_spec_from_dict({**data, "height": 7.0})
    with pytest.raises(ValueError, match="must have the fields"):
        obs_spec_from_dict({"kind": "image", "size": 147})
