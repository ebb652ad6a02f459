"""The interface every machina env implements: batched reset / step on TensorDicts, plus what training, evaluation,
checkpoints and replays ask of an env. One file per env implements it (``machina_1.py``, ``mettagrid.py``,
``gymnasium.py``).

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
from machina.errors import ConfigError


class Env:
    """Batched envs: N = ``spec.num_agents`` agents over E = ``spec.num_envs`` envs, agent index = env * A + slot.

    ``step`` returns a TensorDict, batch [N], on ``device``: ``OBS``, ``REWARDS`` float32 (the reward of the action
    just taken), ``TERMINATED`` / ``TRUNCATED`` bool (the episode ended after that action), each key of ``outputs``
    it was built with (``spec.outputs``), and ``FINAL_OBS`` only when ``spec.observes_time`` is False and some agent
    was truncated on this step (the observation it would have seen next). Ended envs reset in place: ``OBS`` is already
    the new episode's first observation.
    """

    spec: EnvSpec
    device: torch.device
    # True: ``state_dict`` holds the live episodes and a restored env continues them. False (an env whose engine's
    # state cannot be saved): ``load_state_dict`` starts new episodes, so a restored rollout acts on ``observe()``
    # with fresh recurrent state instead of its saved observation.
    continues_episodes: bool = True
    # True: ``step`` can be captured in a CUDA graph (fixed shapes and keys, buffers allocated once, no host read,
    # no random draw, no Python state a replay would skip but the step counter ``prepare_rollout`` is told): a
    # graphed rollout (``system.cuda_graphs``) then replays the policy forward and the env step as one graph.
    capturable: bool = False
    # Agents split into ``groups`` equal, contiguous slices (of whole envs) that step apart, through ``send`` and
    # ``recv``: an env whose engine steps in other processes then steps one group while the policy acts on another
    # (the rollout overlaps them when ``groups`` is 2). ``step`` still steps every group.
    groups: int = 1
    # Processes besides this one that step the env on this host's cores (worker processes): while they step one
    # group, a rollout on the CPU leaves them their cores (fewer torch threads for the policy acting on the other).
    host_processes: int = 0

    def reset(self) -> TensorDict:
        """Start every env afresh; return the first observations (zero rewards, no episode ends)."""
        raise NotImplementedError

    def observe(self) -> TensorDict:
        """The current observations as ``reset`` returns them (zero rewards, no episode ends), changing nothing:
        what a restored rollout acts on next when the env's live state was not in its checkpoint."""
        raise NotImplementedError

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Act with int64 ``actions`` [N]; see the class docstring for what comes back."""
        raise NotImplementedError

    def send(self, group: int, actions: torch.Tensor) -> None:
        """Start stepping group ``group`` (agents ``[group * N / groups, (group + 1) * N / groups)``) with its int64
        ``actions`` [N / groups]; ``recv(group)`` returns the step. By default (one group) the step runs in
        ``recv``."""
        if group != 0 or self.groups != 1:
            raise NotImplementedError(f"{type(self).__name__} declares {self.groups} groups but no send / recv")
        self._sent = actions

    def recv(self, group: int) -> TensorDict:
        """The step ``send(group, ...)`` started: what ``step`` returns, for that group's agents (batch [N /
        groups]). Raises ``machina.errors.EnvFailed`` if the engine died."""
        actions, self._sent = self._sent, None
        return self.step(actions)

    def close(self) -> None:
        """Release what the env holds outside this process (worker processes, shared memory); nothing by default.
        Called once training or evaluation is over, also after a failure."""

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the episodes that ended since the last call, as 0-d float32 device tensors: ``episodes`` (how
        many), ``return`` (sum over those episodes of the per-agent mean return), ``length``, and env-specific
        stats; resets the sums. No host sync."""
        raise NotImplementedError

    def last_episodes(self) -> dict[str, torch.Tensor]:
        """Per env, float32 [E]: ``episodes`` (episodes ended since ``reset``) and, for every other name of
        ``episode_stats``, that stat of the env's most recently ended episode (0 before its first end)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors (no objects) from which ``load_state_dict`` continues the envs where they are."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from a ``state_dict`` of an env built with the same settings. ``state`` may come from an edited
        checkpoint: every entry is checked (shape, dtype, value range; ``machina.files.saved_state``) before anything
        changes, and a bad one raises a ConfigError naming it, so a refused resume never reaches a step."""
        raise NotImplementedError

    def prepare_rollout(self, steps: int | None = None) -> None:
        """Called at each epoch boundary, before a rollout of ``steps`` steps (None: as many as the last one): work
        that must stay out of the steps (refilling pools of pre-generated layouts, for example). Nothing by
        default."""

    def settings(self) -> dict[str, object]:
        """The settings a curriculum may change between rollouts (``configure``), with their current values; none by
        default."""
        return {}

    def configure(self, **settings: object) -> None:
        """Change settings of ``settings()`` between rollouts (``trainer.curriculum``): the episodes that start in the
        rollouts after the call use them. An env without such settings refuses any."""
        raise ConfigError(
            f"{type(self).__name__} has no settings a curriculum can change (asked for {sorted(settings)}); remove "
            "trainer.curriculum or choose env=machina_1"
        )

    def render(self, env_index: int = 0) -> np.ndarray:
        """A picture of env ``env_index`` as uint8 RGB [H, W, 3], for replays (an env may take drawing options as
        keyword arguments, e.g. machina_1's ``cell`` size)."""
        raise NotImplementedError(f"{type(self).__name__} cannot render frames, so it has no replays")
