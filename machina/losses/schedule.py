"""Schedules for loss coefficients and proportions, evaluated on the host from the agent step."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Linear:
    """``start`` until ``begin_step``, then linear to ``end`` at ``end_step``, then ``end``.

    YAML: ``teacher_led_proportion: {_target_: machina.losses.schedule.Linear, start: 0.5, end: 0.0,
    end_step: 2_000_000}``.
    """

    start: float
    end: float
    end_step: int
    begin_step: int = 0

    def __post_init__(self):
        if self.end_step <= self.begin_step:
            raise ValueError(f"Linear schedule needs end_step > begin_step, got {self.begin_step}..{self.end_step}")
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ValueError(f"Linear schedule needs finite start and end, got {self.start}, {self.end}")

    def __call__(self, agent_step: int) -> float:
        span = (agent_step - self.begin_step) / (self.end_step - self.begin_step)
        return self.start + (self.end - self.start) * min(max(span, 0.0), 1.0)

    def breakpoints(self) -> tuple[int, int]:
        """The agent steps where the schedule changes slope: checking a piecewise-linear sum there checks it all."""
        return (self.begin_step, self.end_step)


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, agent_step: int) -> float:
        return self.value

    def breakpoints(self) -> tuple[int, ...]:
        return ()


def as_schedule(value: "float | Linear", name: str) -> "Linear | Constant":
    """A schedule from a config value; a constant becomes ``Constant``. ``name`` (``losses.<loss>.<key>``) is
    what a refusal names: non-finite numbers are refused at start-up."""
    if isinstance(value, Linear | Constant):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number or a Linear schedule")
    return Constant(float(value))
