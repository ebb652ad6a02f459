"""Small building blocks shared by the components: CleanRL-style orthogonal init and MLPs."""

import math
from collections.abc import Sequence

from torch import nn

HIDDEN_STD = math.sqrt(2.0)
# Activations a config may name between hidden layers (plain strings, so policy files stay data).
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def layer_init(layer: nn.Linear, std: float = HIDDEN_STD, bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain ``std`` and a constant bias, as in CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


def activation(name: str) -> type[nn.Module]:
    """The activation class ``name`` (a key of ``ACTIVATIONS``); ValueError naming the choices otherwise."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} must be one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def hidden_layers(in_dim: int, hidden: Sequence[int], act: str = "relu") -> list[nn.Module]:
    """``in_dim -> hidden...``, each Linear (orthogonal, gain sqrt(2)) followed by the activation ``act``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), activation(act)()]
        in_dim = width
    return layers


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, out_std: float, act: str = "relu") -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with ``act`` between layers and none after the last; [N, in] -> [N, out].
    The output layer is orthogonal with gain ``out_std``."""
    last = hidden[-1] if hidden else in_dim
    return nn.Sequential(*hidden_layers(in_dim, hidden, act), layer_init(nn.Linear(last, out_dim), std=out_std))
