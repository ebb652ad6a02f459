"""Actor and critic heads: MLPs on the recurrent core's output."""

from collections.abc import Sequence

from tensordict import TensorDict

from machina.keys import CORE, HORIZON_VALUES, LOGITS, VALUES
from machina.policy.component import Component, PolicyDims
from machina.policy.layers import mlp


class ActorHead(Component):
    """``CORE`` [N, H] -> ``LOGITS`` [N, A]; the output layer is initialised orthogonal with gain ``out_std``.

    Why 1.0 and not CleanRL's 0.01: behind an LSTM, a 0.01 head passes the core gradients 100x smaller than its own,
    and Adam scales every parameter's step to the learning rate regardless, so the many core parameters move
    together to express the action marginal (cloning the teacher first learns "never vibe") by saturating the LSTM
    gates, before the head's weights have grown. A saturated core outputs the same vector for every observation and
    passes no gradient: cloning then stalled at the teacher's action marginal (agreement 0.28, loss 1.45 nats, even
    on one fixed buffer). With 1.0 agreement climbs past 0.56 in 1M agent steps, and PPO alone learns as fast.
    Feed-forward policies (``policy=mlp``) take CleanRL's 0.01. ``activation`` (relu | tanh) follows each hidden
    layer.

    Args:
        hidden: widths of the hidden layers between ``CORE`` and the logits; empty: one linear layer.
        out_std: gain of the output layer's orthogonal initialisation.
        activation: relu or tanh, after each hidden layer.
    """

    in_keys = (CORE,)
    out_keys = (LOGITS,)

    def __init__(
        self, dims: PolicyDims, hidden: Sequence[int] = (), out_std: float = 1.0, activation: str = "relu"
    ) -> None:
        super().__init__()
        self.net = mlp(dims.widths[CORE], hidden, dims.num_actions, out_std=out_std, act=activation)
        self.out_widths = {LOGITS: dims.num_actions}

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        step[LOGITS] = self.net(step[CORE])


class CriticHead(Component):
    """``CORE`` [N, H] -> ``VALUES`` [N], and with ``horizons`` K > 0 also ``HORIZON_VALUES`` [N, K]: the values at
    the K other discounts of the horizon-values loss (machina/losses/horizon_values.py), from the same output layer
    (one more row each). The output layer is initialised orthogonal with gain ``out_std`` (1.0, as CleanRL's);
    ``activation`` (relu | tanh) follows each hidden layer.

    Args:
        hidden: widths of the hidden layers between ``CORE`` and the value; empty: one linear layer.
        out_std: gain of the output layer's orthogonal initialisation.
        activation: relu or tanh, after each hidden layer.
        horizons: how many values at other discounts to output besides ``VALUES`` (the horizon-values loss's
            ``gammas``); 0: none.
    """

    in_keys = (CORE,)
    out_keys = (VALUES,)

    def __init__(
        self,
        dims: PolicyDims,
        hidden: Sequence[int] = (),
        out_std: float = 1.0,
        activation: str = "relu",
        horizons: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(horizons, bool) or not isinstance(horizons, int) or horizons < 0:
            raise ValueError(f"policy.critic.horizons must be an integer >= 0, got {horizons!r}")
        self.horizons = horizons
        self.net = mlp(dims.widths[CORE], hidden, 1 + horizons, out_std=out_std, act=activation)
        self.out_widths = {VALUES: 1}
        if horizons:
            self.out_keys = (VALUES, HORIZON_VALUES)
            self.out_widths[HORIZON_VALUES] = horizons

    def forward(self, step: TensorDict, seq: TensorDict) -> None:
        out = self.net(step[CORE])
        step[VALUES] = out[:, 0]
        if self.horizons:
            step[HORIZON_VALUES] = out[:, 1:]
