"""machina's built-in env, ``Machina1Env`` (``env=machina_1``), and the pieces only it uses: its grid, layouts,
episode pool, tokens, teacher, settings and pictures. ``machina.env.machina_1.Machina1Env`` is the ``_target_`` that
``conf/env/machina_1.yaml`` and every stored run's config name."""

from machina.env.machina_1.env import Machina1Env

__all__ = ["Machina1Env"]
