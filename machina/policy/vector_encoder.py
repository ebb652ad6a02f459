"""``policy=mlp`` encoder: an MLP over flat vector observations (Gymnasium ``Box`` spaces; images flattened)."""

from collections.abc import Sequence

import torch
from tensordict import TensorDict
from torch import nn

from machina.env.spec import VectorObsSpec
from machina.keys import ENCODED, OBS
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import hidden_layers


class VectorEncoder(Component):
    """``OBS`` float32 [N, D] -> ``ENCODED`` float32 [N, hidden[-1]] (or [N, D] with ``hidden=[]``).

    Linear layers initialised as CleanRL's (orthogonal, gain sqrt(2), zero bias), each followed by ``activation``
    (tanh, as CleanRL's classic-control agent). ``hidden=[]`` passes the observation through unchanged, for
    policies whose heads are whole MLPs (CleanRL's separate actor and critic networks: ``conf/policy/mlp.yaml``).

    Args:
        hidden: widths of the linear layers; empty: the observation passes through.
        activation: tanh or relu, after each layer.
    """

    in_keys = (OBS,)
    out_keys = (ENCODED,)

    def __init__(self, dims: PolicyDims, hidden: Sequence[int] = (64, 64), activation: str = "tanh") -> None:
        super().__init__()
        if not isinstance(dims.obs, VectorObsSpec):
            raise ValueError(
                f"VectorEncoder (policy=mlp) reads vector observations, but the env gives {dims.obs}; "
                "use policy=fast for token observations"
            )
        size = dims.obs.size
        self.net = nn.Sequential(*hidden_layers(size, hidden, activation))
        self.out_widths = {ENCODED: hidden[-1] if hidden else size}
        self.input_spec = {OBS: ((size,), torch.float32)}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        step[ENCODED] = self.net(step[OBS])
