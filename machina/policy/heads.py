"""Actor and critic heads: MLPs on the recurrent core's output."""

from collections.abc import Sequence

from tensordict import TensorDict

from machina.keys import CORE, LOGITS, VALUES
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import mlp


class ActorHead(Component):
    """``CORE`` [N, H] -> ``LOGITS`` [N, A]; output layer init std 0.01: the first policy is near uniform."""

    in_keys = (CORE,)
    out_keys = (LOGITS,)

    def __init__(self, dims: PolicyDims, hidden: Sequence[int] = ()) -> None:
        super().__init__()
        self.net = mlp(dims.widths[CORE], hidden, dims.num_actions, out_std=0.01)
        self.out_widths = {LOGITS: dims.num_actions}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        step[LOGITS] = self.net(step[CORE])


class CriticHead(Component):
    """``CORE`` [N, H] -> ``VALUES`` [N]; output layer initialised with std 1.0."""

    in_keys = (CORE,)
    out_keys = (VALUES,)

    def __init__(self, dims: PolicyDims, hidden: Sequence[int] = ()) -> None:
        super().__init__()
        self.net = mlp(dims.widths[CORE], hidden, 1, out_std=1.0)
        self.out_widths = {VALUES: 1}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        step[VALUES] = self.net(step[CORE]).squeeze(-1)
