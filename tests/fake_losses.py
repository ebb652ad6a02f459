"""A loss used only by tests: it consumes full_log_probs, proving the resolver reads the class attribute."""

from machina import keys
from machina.losses.base import Loss


class ConsumesFullLogProbs(Loss):
    consumes = frozenset({keys.FULL_LOG_PROBS})

    def __init__(self, coef: float = 1.0):
        super().__init__()
        self.coef = coef

    def forward(self, minibatch, policy_out, progress):
        return {"loss_mean_log_prob": -self.coef * policy_out[keys.FULL_LOG_PROBS].mean()}
