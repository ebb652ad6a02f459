"""Where training stands, as the parts that follow schedules read it: losses, the learner and the rollout."""

from dataclasses import dataclass


@dataclass
class Progress:
    """Where training stands; losses read it for schedules (host ints, never device tensors)."""

    agent_step: int
    total_timesteps: int

    @property
    def fraction(self) -> float:
        return min(self.agent_step / max(self.total_timesteps, 1), 1.0)
