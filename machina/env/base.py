"""The interface every machina env implements: a small required core (``Env``: spec, reset, step, episode statistics)
and opt-in capabilities, each a class the env also subclasses. The trainer, the rollout, the curriculum and the
evaluation ask for a capability with ``isinstance(env, Capability)``, once, when they are built, never per step;
an env without one still trains, checkpoints and is evaluated. ``machina.conformance.env.check_env`` checks an env
against all of it.

==================  ==========================================  ===========================================
capability          members                                     asked for by
==================  ==========================================  ===========================================
``Resumable``       ``state_dict``, ``load_state_dict``,        checkpoints (``Trainer.local_state_dict``), the
                    ``observe``, ``continues_episodes``         rollout's restore
``Configurable``    ``settings``, ``configure``                 the curriculum (``trainer.curriculum``)
``Grouped``         ``groups``, ``send``, ``recv``,             the rollout (steps one group while the policy
                    ``host_processes``                          acts on the other; fewer torch threads)
``Capturable``      (a ``Resumable`` whose ``step`` a CUDA      the rollout under ``system.cuda_graphs``
                    graph can replay)
``Renderable``      ``render``                                  replays (``trainer.replay_interval``, eval.py)
==================  ==========================================  ===========================================

``last_episodes`` is core: every evaluation (periodic, ``eval.py``) reads each env's first episode from it, and an
env that cannot say how its episodes went cannot be evaluated. ``observe`` is not: only a restore needs the current
observation without a step; an env that is not ``Resumable`` starts its episodes anew on resume, from ``reset``.

Constructor convention (the env factory, ``machina.env.factory``, passes the last five; the others come from
``conf/env/<name>.yaml``): ``Env(<settings>..., num_envs, seed, device, outputs, stagger)``. ``outputs`` is the set of
optional outputs to return with every step: keys the env declares in ``spec.outputs`` (the builder asks for no
other), empty unless a loss or the evaluation reads one. ``stagger`` spreads the first episodes' ends over time
(training) or starts every env at step 0 (evaluation, ``stagger=False``).
"""

import numpy as np
import torch
from tensordict import TensorDict

from machina.env.spec import EnvSpec


class Env:
    """Batched envs: N = ``spec.num_agents`` agents over E = ``spec.num_envs`` envs, agent index = env * A + slot.

    ``step`` returns a TensorDict, batch [N], on ``device``: ``OBS``, ``REWARDS`` float32 (the reward of the action
    just taken), ``TERMINATED`` / ``TRUNCATED`` bool (the episode ended after that action), each key of ``outputs``
    it was built with (``spec.outputs``), and ``FINAL_OBS`` only when ``spec.observes_time`` is False and some agent
    was truncated on this step (the observation it would have seen next). Ended envs reset in place: ``OBS`` is already
    the new episode's first observation. The four methods that raise here are the whole required core.
    """

    spec: EnvSpec
    device: torch.device

    def reset(self) -> TensorDict:
        """Start every env afresh; return the first observations (zero rewards, no episode ends)."""
        raise NotImplementedError

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Act with int64 ``actions`` [N]; see the class docstring for what comes back."""
        raise NotImplementedError

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the episodes that ended since the last call, as 0-d float32 device tensors: ``episodes`` (how
        many), ``return`` (sum over those episodes of the per-agent mean return), ``length``, and env-specific
        stats; resets the sums. No host sync."""
        raise NotImplementedError

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per env, float32 [E]: ``episodes`` (episodes ended since ``reset``) and, for every other name of
        ``episode_stats``, that stat of the env's most recently ended episode (0 before its first end)."""
        raise NotImplementedError

    def prepare_rollout(self, steps: int | None = None) -> None:
        """Called at each epoch boundary, before a rollout of ``steps`` steps (None: as many as the last one): work
        that must stay out of the steps (refilling pools of pre-generated layouts, for example). Nothing by
        default."""

    def close(self) -> None:
        """Release what the env holds outside this process (worker processes, shared memory); nothing by default.
        Called once training or evaluation is over, also after a failure."""


class Resumable:
    """Capability: the env's state goes into checkpoints. ``continues_episodes`` True: ``state_dict`` holds the live
    episodes and a restored env continues them exactly (same actions, same outputs). False (an engine whose state
    cannot be saved, e.g. MettaGrid's): ``state_dict`` holds what can be kept (episode counters, stat sums) and
    ``load_state_dict`` starts new episodes from it, so a restored rollout acts on ``observe()`` with fresh
    recurrent state."""

    continues_episodes: bool = True

    def observe(self) -> TensorDict:
        """The current observations as ``reset`` returns them (zero rewards, no episode ends), changing nothing:
        what a restored rollout acts on next."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors (no objects) from which ``load_state_dict`` continues the envs where they are."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from a ``state_dict`` of an env built with the same settings. ``state`` may come from an edited
        checkpoint: every entry is checked (shape, dtype, value range; ``machina.files.saved_state``) before anything
        changes, and a bad one raises a ConfigError naming it, so a refused resume never reaches a step."""
        raise NotImplementedError


class Configurable:
    """Capability: settings a curriculum (``trainer.curriculum``) may change between rollouts."""

    def settings(self) -> dict[str, object]:
        """The settings a curriculum may change, with their current values."""
        raise NotImplementedError

    def configure(self, **settings: object) -> None:
        """Change settings of ``settings()`` between rollouts: the episodes that start in the rollouts after the call
        use them. A value the env cannot use raises a ConfigError naming ``env.<key>``; no random number is drawn."""
        raise NotImplementedError


class Grouped:
    """Capability: the agents split into ``groups`` equal, contiguous slices (of whole envs) that step apart, through
    ``send`` and ``recv``, in ``host_processes`` processes besides this one: the rollout then steps one group while
    the policy acts on the other (when ``groups`` is 2), with one torch thread fewer per such process on the CPU.
    ``step`` still steps every group."""

    groups: int = 1
    host_processes: int = 0

    def send(self, group: int, actions: torch.Tensor) -> None:
        """Start stepping group ``group`` (agents ``[group * N / groups, (group + 1) * N / groups)``) with its int64
        ``actions`` [N / groups]; ``recv(group)`` returns the step."""
        raise NotImplementedError

    def recv(self, group: int) -> TensorDict:
        """The step ``send(group, ...)`` started: what ``step`` returns, for that group's agents (batch [N /
        groups]). Raises ``machina.errors.EnvFailed`` if the engine died."""
        raise NotImplementedError


class Capturable(Resumable):
    """Capability: ``step`` can be captured in a CUDA graph (fixed shapes and keys, buffers allocated once, no host
    read, no random draw, no Python state a replay would skip but the step counter ``prepare_rollout`` is told). A
    graphed rollout (``system.cuda_graphs``) then replays the policy forward and the env step as one graph. The
    capture's warm-up steps advance the env and its state is put back from ``state_dict``: a capturable env is
    resumable."""


class Renderable:
    """Capability: pictures of the envs, for replays."""

    def render(self, env_index: int = 0, **options: object) -> np.ndarray:
        """A picture of env ``env_index`` as uint8 RGB [H, W, 3] (an env may take drawing options as keyword
        arguments, e.g. machina_1's ``cell`` size; an env ignores the options it does not know)."""
        raise NotImplementedError


# Each capability and the methods that implement it (an env that subclasses the capability overrides them).
CAPABILITIES: dict[type, tuple[str, ...]] = {
    Resumable: ("observe", "state_dict", "load_state_dict"),
    Configurable: ("settings", "configure"),
    Grouped: ("send", "recv"),
    Capturable: (),
    Renderable: ("render",),
}
