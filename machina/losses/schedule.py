"""Schedules for loss coefficients and proportions, evaluated on the host from the agent step."""

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

    def __call__(self, agent_step: int) -> float:
        span = (agent_step - self.begin_step) / (self.end_step - self.begin_step)
        return self.start + (self.end - self.start) * min(max(span, 0.0), 1.0)


def as_schedule(value: "float | Linear"):
    """A constant becomes a schedule that always returns it."""
    if callable(value):
        return value
    constant = float(value)
    return lambda agent_step: constant
