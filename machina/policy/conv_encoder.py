"""``policy=conv`` encoder: a small CNN over image observations (``ImageObsSpec``: PettingZoo's ``(H, W, C)`` Boxes
such as ``sisl/pursuit-v5``'s (7, 7, 3))."""

from collections.abc import Sequence

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import ImageObsSpec
from machina.keys import ENCODED, OBS
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import layer_init


class ConvEncoder(Component):
    """``OBS`` float32 [N, H * W * C] (an (H, W, C) image, channels last, flattened row-major) -> ``ENCODED``
    float32 [N, hidden].

    The observation is viewed as [N, H, W, C] and permuted to [N, C, H, W], which is channels-last memory for
    PyTorch's convolutions (no copy). Then ``len(channels)`` convolutions (``kernel_size`` square, ``stride``, no
    padding), each followed by ReLU, flattened, and one linear layer of ``hidden`` with ReLU: CleanRL's Atari agent in
    small (orthogonal init, gain sqrt(2), zero bias). Observations are divided by ``scale`` first (255 for 0..255
    pixels; pursuit's counts are small and need none).

    Args:
        channels: output channels of each convolution.
        kernel_size: the convolutions' square kernel.
        stride: the convolutions' stride.
        hidden: width of the linear layer after them.
        scale: what observations are divided by.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(
        self,
        dims: PolicyDims,
        channels: Sequence[int] = (16, 32),
        kernel_size: int = 3,
        stride: int = 1,
        hidden: int = 128,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        image = dims.obs
        if not isinstance(image, ImageObsSpec):
            raise ValueError(
                f"ConvEncoder (policy=conv) reads image observations, but the env gives {image}; use policy=mlp for "
                "vector observations, policy=fast for token observations"
            )
        if not scale > 0:
            raise ValueError(f"ConvEncoder's scale must be > 0, got {scale}")
        self.shape, self.scale = (image.height, image.width, image.channels), float(scale)
        layers: list[nn.Module] = []
        height, width, depth = self.shape
        for out in channels:
            layers += [layer_init(nn.Conv2d(depth, out, kernel_size, stride)), nn.ReLU()]
            height, width, depth = (height - kernel_size) // stride + 1, (width - kernel_size) // stride + 1, out
            if height < 1 or width < 1:
                raise ValueError(
                    f"ConvEncoder: a {image.height} x {image.width} image is too small for {len(channels)} "
                    f"convolutions of kernel {kernel_size}, stride {stride}; use fewer channels or a smaller kernel"
                )
        self.net = nn.Sequential(
            *layers, nn.Flatten(), layer_init(nn.Linear(height * width * depth, hidden)), nn.ReLU()
        )
        self.out_widths = {ENCODED: hidden}
        self.input_spec = {OBS: ((image.size,), torch.float32)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        obs = step[OBS]
        images = obs.reshape(obs.shape[0], *self.shape).permute(0, 3, 1, 2)  # NHWC -> NCHW (channels-last memory)
        step[ENCODED] = self.net(images if self.scale == 1.0 else images / self.scale)
