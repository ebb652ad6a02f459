"""Team spirit: each agent learns from a mix of its own reward and the mean reward of its env's agents.

The agents of one env are one team when an evaluation scores the team: machina_1's return per agent, averaged over
the env's agents, counts every heart deposited once per agent (each agent of the env gets ``heart_reward``) but a
resource gathered (``resource_reward``) or a heart made (``heart_made_reward``) only for the agent that did it, so
in the team's mean it weighs ``1 / agents_per_env`` as much. An agent that learns from its own reward weighs what it
gains itself ``agents_per_env`` times as much as the team does. Team spirit tau (OpenAI Five, Berner et al. 2019)
trains each agent on

    r_i <- (1 - tau) * r_i + tau * mean_j r_j        (j over the agents of i's env)

tau = 0 is the env's own rewards; tau = 1 makes every agent of an env learn the team's mean. The sum over an env's
agents is the same for every tau, so the team's return, and every evaluation, is unchanged: only what each agent is
credited with moves. OpenAI Five raised tau over training, since an agent first learns what pays itself (here the
shaping that starts the gather-craft-carry chain) and a team-wide reward credits it more slowly: a
``machina.schedules.Linear`` of the agent step does that here.

Applied once per epoch to the buffer's ``REWARDS`` before the advantages are computed (``Learner.run``); where the
env stores ``ACTIVE``, the mean is over the agents that acted at that step, and rows of agents that did not keep 0.
"""

from machina import checks, keys
from machina.errors import ConfigError
from machina.schedules import Constant, Linear, as_schedule
from machina.training.experience import Experience


class TeamSpirit:
    """Mixes each agent's stored reward with its team's mean (module docstring).

    Args:
        tau: a number in [0, 1] or a ``machina.schedules.Linear`` of the agent step whose values stay in [0, 1].
        agents_per_env: A, the agents of one team; agent index = env index * A + slot, as every machina env lays
            out its agents (``machina.env.base``).
    """

    def __init__(self, tau: float | Linear | Constant, agents_per_env: int):
        self.tau = as_schedule(tau, "learner.team_spirit")
        for step in (0, *self.tau.breakpoints()):  # a piecewise-linear schedule's extremes lie at its breakpoints
            if not 0.0 <= self.tau(step) <= 1.0:
                raise ConfigError(
                    f"learner.team_spirit is {self.tau(step)!r} at agent step {step}: team spirit is a share in [0, 1]"
                )
        self.agents_per_env = checks.integer("agents_per_env", agents_per_env, 1)

    def __call__(self, experience: Experience, agent_step: int) -> float:
        """Mix ``experience``'s stored rewards in place with tau at ``agent_step``; return that tau. One read of the
        rewards and one write, no host read (a tau of 0 touches nothing)."""
        tau = float(self.tau(agent_step))
        if tau == 0.0 or self.agents_per_env == 1:
            return tau
        own = experience.trajectories(keys.REWARDS)  # [N, L], agent-major
        n, length = own.shape
        if n % self.agents_per_env:
            raise ConfigError(f"{n} agents do not make teams of agents_per_env={self.agents_per_env}")
        teams = own.view(n // self.agents_per_env, self.agents_per_env, length)
        if experience.stores(keys.ACTIVE):
            acted = experience.trajectories(keys.ACTIVE).view_as(teams).to(own.dtype)
            team_mean = (teams * acted).sum(1, keepdim=True) / acted.sum(1, keepdim=True).clamp(min=1.0)
            mixed = ((1.0 - tau) * teams + tau * team_mean) * acted
        else:
            mixed = (1.0 - tau) * teams + tau * teams.mean(1, keepdim=True)
        experience.write_trajectories(keys.REWARDS, mixed.view(n, length))
        return tau
