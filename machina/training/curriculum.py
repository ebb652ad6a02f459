"""A curriculum: env settings scheduled over training (``trainer.curriculum``), evaluated on the default env.

Stages are given in the config as a list, each with the agent step it lasts ``until`` and the ``env`` settings it
changes::

    trainer:
      curriculum:
        - {until: 4_000_000, env: {region_size: 7}}
        - {until: 8_000_000, env: {region_size: 9}}

Training runs stage 0 while agent_step < 4M, stage 1 while < 8M, and then the env's own settings (those it was built
with) to the end. A stage's settings are applied by ``Env.configure`` before the first rollout that starts inside
it, so every episode that starts after that uses them (episodes under way finish on their maps). Like every other
schedule, the stage is a function of the agent step only: a resumed run re-applies the stage it is in. Periodic
evaluation and ``eval.py`` build their envs from ``env``, never from the curriculum.
"""

import logging
from collections.abc import Mapping, Sequence

from machina.env.base import Configurable, Env
from machina.errors import ConfigError

log = logging.getLogger(__name__)


class Curriculum:
    """Applies the stage of ``stages`` that an agent step falls in to ``env``.

    Args:
        stages: ``[{until: int, env: {setting: value}}, ...]``, ``until`` strictly increasing agent steps; each
            setting must be one of ``env.settings()``.
        env: the training env; it must be ``machina.env.base.Configurable``.
    """

    def __init__(self, stages: Sequence[Mapping], env: Env):
        if not isinstance(env, Configurable):
            raise ConfigError(
                f"trainer.curriculum: {type(env).__name__} has no settings a curriculum can change (it is not "
                "machina.env.base.Configurable); remove trainer.curriculum or choose env=machina_1"
            )
        self.env = env
        self.defaults = dict(env.settings())
        self.ends: list[int] = []
        self.stage_settings: list[dict] = []
        # A string is a Sequence too: trainer.curriculum=foo would otherwise be read as the stages 'f', 'o', 'o'.
        if isinstance(stages, str | bytes | Mapping) or not isinstance(stages, Sequence):
            raise ConfigError(
                f"trainer.curriculum must be a list of stages [{{until: STEP, env: {{SETTING: VALUE}}}}, ...], got "
                f"{stages!r}"
            )
        for i, stage in enumerate(stages):
            where = f"trainer.curriculum[{i}]"
            if not isinstance(stage, Mapping) or set(stage) != {"until", "env"}:
                raise ConfigError(f"{where} must be a mapping with exactly the keys 'until' and 'env', got {stage!r}")
            until, settings = stage["until"], stage["env"]
            previous = self.ends[-1] if self.ends else 0
            if isinstance(until, bool) or not isinstance(until, int) or until <= previous:
                raise ConfigError(
                    f"{where}.until={until!r} must be an agent step (an integer) greater than the stage before's "
                    f"({previous})"
                )
            if not isinstance(settings, Mapping) or not settings:
                raise ConfigError(f"{where}.env must be a non-empty mapping of env settings, got {settings!r}")
            unknown = sorted(set(settings) - set(self.defaults))
            if unknown:
                raise ConfigError(
                    f"{where}.env sets {unknown}, which {type(env).__name__} cannot change during training; it can "
                    f"change {sorted(self.defaults)}"
                )
            self.ends.append(until)
            self.stage_settings.append({**self.defaults, **settings})
            self._check_values(where, self.stage_settings[-1])
        self.stage_settings.append(self.defaults)  # after the last stage
        self.applied: dict | None = None

    def _check_values(self, where: str, settings: dict) -> None:
        """Refuse at start-up, before the run writes anything, a stage whose values the env refuses (a region too
        small for the map's objects): configure it, then configure the env's own settings back. Nothing happens in
        between (settings take effect at the next ``prepare_rollout`` and ``configure`` draws no random number)."""
        try:
            self.env.configure(**settings)
        except ConfigError as err:
            # The main job's stages are written for the default map: name the way out on a smaller one.
            raise ConfigError(f"{where}.env: {err} (trainer.curriculum=[] trains without the curriculum)") from None
        finally:
            self.env.configure(**self.defaults)

    def stage(self, agent_step: int) -> int:
        """Index of the stage ``agent_step`` falls in; ``len(stages)`` after the last (the env's own settings)."""
        return next((i for i, end in enumerate(self.ends) if agent_step < end), len(self.ends))

    def settings(self, agent_step: int) -> dict:
        """Every curriculum setting's value at ``agent_step``."""
        return self.stage_settings[self.stage(agent_step)]

    def apply(self, agent_step: int) -> None:
        """Configure the env for ``agent_step`` when its settings differ from those applied last (host only)."""
        settings = self.settings(agent_step)
        if settings != self.applied:
            self.env.configure(**settings)
            log.info("curriculum stage %d from agent step %d: env %s", self.stage(agent_step), agent_step, settings)
            self.applied = settings
