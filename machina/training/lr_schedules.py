"""Learning-rate schedules: the multiplier of ``optimizer.lr`` as a function of the fraction of training done.

Chosen by ``_target_`` (``learner/lr_schedule=constant|linear|cosine``). A schedule is a pure function of the
agent-step counter, which checkpoints carry, so a resumed run continues the same schedule; the base rate is the
configured ``optimizer.lr`` (the config wins on resume).
"""

import math


class Constant:
    """1 throughout."""

    def __call__(self, fraction: float) -> float:
        return 1.0


class Linear:
    """From 1 down to ``floor`` at the end of training (CleanRL's ``anneal_lr`` is ``floor=0``)."""

    def __init__(self, floor: float = 0.0):
        self.floor = check_floor(floor)

    def __call__(self, fraction: float) -> float:
        return 1.0 - (1.0 - self.floor) * min(max(fraction, 0.0), 1.0)


class Cosine:
    """Half a cosine from 1 down to ``floor`` at the end of training (Loshchilov & Hutter 2017, no restarts)."""

    def __init__(self, floor: float = 0.0):
        self.floor = check_floor(floor)

    def __call__(self, fraction: float) -> float:
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * min(max(fraction, 0.0), 1.0)))


def check_floor(floor: float) -> float:
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0.0 <= floor <= 1.0:
        raise ValueError(f"learner.lr_schedule.floor={floor!r} must be a fraction of optimizer.lr in [0, 1]")
    return float(floor)
