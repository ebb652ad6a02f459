"""The settings of ``Machina1Env`` that it refuses, each with a message naming ``env.<key>`` and its value."""

import math
from typing import Any

from machina import checks
from machina.env.machina_1.obs import never_cut
from machina.errors import ConfigError

# Integer settings: (smallest, largest or None) allowed, and why where it is not obvious.
INTEGERS = {
    "num_envs": (1, None, ""),
    "agents_per_env": (1, 10, " (agent slots are drawn as digits 0-9)"),
    "height": (1, None, ""),
    "width": (1, None, ""),
    "extractors_per_resource": (1, None, ""),
    "max_steps": (1, None, ""),
    "num_vibes": (0, 256, " (a vibe is a token value: one byte)"),
    "max_tokens": (1, None, ""),
    "extractor_cooldown": (0, 255, " (a cooldown is a token value: one byte)"),
    "inventory_cap": (1, 255, " (an inventory count is a token value: one byte)"),
    "seed": (None, None, ""),
}
FLOATS = ("heart_reward", "heart_made_reward", "resource_reward")
BOOLEANS = ("stagger",)


def check_settings(settings: dict[str, Any]) -> None:
    """Raise ConfigError (a ValueError) for the first invalid setting in ``settings`` (the constructor's arguments)."""
    for key, (low, high, why) in INTEGERS.items():
        value = settings[key]
        in_range = (low is None or value >= low) if checks.is_integer(value) else False
        in_range = in_range and (high is None or value <= high)
        if not in_range:
            bounds = f"in {low}..{high}" if high is not None else (f">= {low}" if low is not None else "")
            refuse(key, value, f"must be an integer {bounds}".rstrip() + why)
    density = settings["obstacle_density"]
    if not checks.is_number(density) or not 0 <= density < 1:
        refuse("obstacle_density", density, "must be a number in [0, 1)")
    for key in FLOATS:
        if not checks.is_number(settings[key]) or not math.isfinite(settings[key]):
            refuse(key, settings[key], "must be a finite number")
    for key in BOOLEANS:
        if not isinstance(settings[key], bool):
            refuse(key, settings[key], "must be true or false")
    if settings["height"] + settings["width"] > 500:
        refuse("height", settings["height"], f"plus env.width={settings['width']} must be at most 500")
    # The map's capacity comes first: a count of extractors too large for it is that count's fault, not the
    # observation's (it would otherwise be reported as a max_tokens problem, the next check).
    objects = settings["agents_per_env"] + 4 * settings["extractors_per_resource"] + 2
    cells = settings["height"] * settings["width"]
    if objects > cells:
        refuse(
            "extractors_per_resource",
            settings["extractors_per_resource"],
            f"is too many: {settings['agents_per_env']} agents, 4 x {settings['extractors_per_resource']} extractors, "
            f"an assembler and a chest ({objects}) do not fit in the {settings['height']}x{settings['width']} "
            "interior; lower it or raise env.height / env.width",
        )
    minimum = never_cut(settings["agents_per_env"], 4 * settings["extractors_per_resource"])
    if settings["max_tokens"] < minimum:
        refuse(
            "max_tokens",
            settings["max_tokens"],
            f"is too small: every observation must hold {minimum} tokens that are never cut (6 centre tokens, 2 per "
            f"agent, 1 per extractor); set env.max_tokens >= {minimum}",
        )


def refuse(key: str, value: Any, problem: str) -> None:
    raise ConfigError(f"env.{key}={value!r} {problem}")
