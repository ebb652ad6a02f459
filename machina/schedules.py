"""Everything that changes over training on a schedule, in two kinds that read different clocks.

Coefficient schedules (``Linear``, ``Constant``): the value of a loss coefficient or proportion at an agent step,
evaluated on the host. YAML, under a loss: ``teacher_led_proportion: {_target_: machina.schedules.Linear, start: 0.5,
end: 0.0, end_step: 2_000_000}``; a plain number is a ``Constant`` (``as_schedule``).

Learning-rate schedules (``ConstantLr``, ``LinearLr``, ``CosineLr``): the multiplier of ``optimizer.lr`` as a
function of the fraction of training done (``Progress.fraction``), chosen by ``learner/lr_schedule=constant|linear|
cosine``; the base rate is the configured ``optimizer.lr`` (the config wins on resume).

Both are pure functions of the agent-step counter, which checkpoints carry, so a resumed run continues the same
schedules.
"""

import math
from dataclasses import dataclass

from machina import checks
from machina.errors import ConfigError

FLOOR = " (a fraction of optimizer.lr)"  # what the floor of an lr schedule is, for its refusal
DECAY_FROM = " (the fraction of training before the learning rate decays)"


@dataclass(frozen=True)
class Linear:
    """A coefficient: ``start`` until ``begin_step``, then linear to ``end`` at ``end_step``, then ``end``."""

    start: float
    end: float
    end_step: int
    begin_step: int = 0

    def __post_init__(self):
        for name in ("start", "end", "begin_step", "end_step"):
            checks.finite(name, getattr(self, name))
        if self.end_step <= self.begin_step:
            raise ConfigError(f"end_step={self.end_step!r} must be above begin_step={self.begin_step!r}")

    def __call__(self, agent_step: int) -> float:
        span = (agent_step - self.begin_step) / (self.end_step - self.begin_step)
        return self.start + (self.end - self.start) * min(max(span, 0.0), 1.0)

    def breakpoints(self) -> tuple[int, int]:
        """The agent steps where the schedule changes slope: checking a piecewise-linear sum there checks it all."""
        return (self.begin_step, self.end_step)


@dataclass(frozen=True)
class Constant:
    """A coefficient that is ``value`` at every agent step."""

    value: float

    def __call__(self, agent_step: int) -> float:
        return self.value

    def breakpoints(self) -> tuple[int, ...]:
        return ()


def as_schedule(value: "float | Linear", name: str) -> "Linear | Constant":
    """A coefficient schedule from a config value; a number becomes ``Constant``. ``name`` (the loss's setting,
    ``action_loss_coef``: machina.startup.build puts the loss's path in front) is what a refusal names: a value that is
    neither a finite number nor a schedule is refused at start-up."""
    if isinstance(value, Linear | Constant):
        return value
    return Constant(float(checks.finite(name, value, why=" or a machina.schedules.Linear schedule")))


class ConstantLr:
    """The learning rate: ``optimizer.lr`` throughout (a multiplier of 1)."""

    def __call__(self, fraction: float) -> float:
        return 1.0


class AnnealedLr:
    """What the annealed learning rates share: a ``floor`` (the multiplier at the end of training) and
    ``decay_from``, the fraction of training that runs at ``optimizer.lr`` before the decay begins (0: the decay spans
    all of training; 0.8: the last fifth, as in a warmup-stable-decay schedule, Hägele et al. 2024)."""

    def __init__(self, floor: float = 0.0, decay_from: float = 0.0):
        self.floor = float(checks.number("floor", floor, 0, 1, FLOOR))
        self.decay_from = float(checks.number("decay_from", decay_from, 0, 1, DECAY_FROM))
        if self.decay_from == 1:
            raise ConfigError(f"decay_from={decay_from!r} must be below 1{DECAY_FROM}")

    def decayed(self, fraction: float) -> float:
        """How far the decay has gone at ``fraction`` of training: 0 up to ``decay_from``, 1 at the end."""
        return min(max((fraction - self.decay_from) / (1.0 - self.decay_from), 0.0), 1.0)


class LinearLr(AnnealedLr):
    """The learning rate: from ``optimizer.lr`` down to ``floor * optimizer.lr`` at the end of training, linearly
    (CleanRL's ``anneal_lr`` is ``floor=0``, ``decay_from=0``)."""

    def __call__(self, fraction: float) -> float:
        return 1.0 - (1.0 - self.floor) * self.decayed(fraction)


class CosineLr(AnnealedLr):
    """The learning rate: from ``optimizer.lr`` down to ``floor * optimizer.lr`` at the end of training along half a
    cosine (Loshchilov & Hutter 2017, no restarts)."""

    def __call__(self, fraction: float) -> float:
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * self.decayed(fraction)))
