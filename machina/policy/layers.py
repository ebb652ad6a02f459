"""Small building blocks shared by the components: CleanRL-style orthogonal init and MLPs."""

import math
from collections.abc import Sequence

from torch import nn

HIDDEN_STD = math.sqrt(2.0)


def layer_init(layer: nn.Linear, std: float = HIDDEN_STD, bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain ``std`` and a constant bias, as in CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, out_std: float) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with ReLU between layers and none after the last; [N, in] -> [N, out]."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.ReLU()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)
