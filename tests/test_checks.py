"""machina.checks, the check of one setting's value, from its definition and what a careless user types: each
refusal is a ConfigError (a ValueError) naming the setting and the value, and a value that passes comes back as is."""

import math
import re

import pytest
import torch

from machina import checks
from machina.errors import ConfigError


def refused(call, message: str):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize("value", [0, 1, 7, 2**40])
def test_integer_passes_integers_in_range(value):
    assert checks.integer("trainer.eval_interval", value, low=0) is value
    assert checks.integer("x", value) is value


@pytest.mark.parametrize(
    "value, low, high, why, message",
    [
        (0, 1, None, "", "trainer.total_timesteps=0 must be an integer >= 1"),
        (True, 1, None, "", "trainer.total_timesteps=True must be an integer >= 1"),
        (2.0, 1, None, "", "trainer.total_timesteps=2.0 must be an integer >= 1"),
        ("abc", 1, None, "", "trainer.total_timesteps='abc' must be an integer >= 1"),
        (None, 1, None, "", "trainer.total_timesteps=None must be an integer >= 1"),
        (11, 1, 10, " (digits)", "trainer.total_timesteps=11 must be an integer in 1..10 (digits)"),
        (6, None, 5, "", "trainer.total_timesteps=6 must be an integer <= 5"),
        (math.nan, None, None, "", "trainer.total_timesteps=nan must be an integer"),
    ],
)
def test_integer_refuses_naming_the_setting(value, low, high, why, message):
    refused(lambda: checks.integer("trainer.total_timesteps", value, low, high, why), message)


def test_number_takes_closed_ranges_and_infinity_only_where_a_bound_is_infinite():
    assert checks.number("learner.gamma", 0, 0, 1) == 0 and checks.number("learner.gamma", 1.0, 0, 1) == 1.0
    assert checks.number("learner.max_grad_norm", math.inf, 0, math.inf) == math.inf
    for bad in (1.5, -0.1, math.nan, math.inf, True, "0.5", None):
        refused(
            lambda bad=bad: checks.number("learner.gamma", bad, 0, 1),
            f"learner.gamma={bad!r} must be a number in [0, 1]",
        )
    refused(
        lambda: checks.number("learner.target_kl", -1, 0, math.inf), "learner.target_kl=-1 must be a number in [0, inf]"
    )


def test_finite_refuses_infinity_nan_and_values_below_low():
    assert checks.finite("losses.ppo.ent_coef", 0, low=0) == 0 and checks.finite("env.heart_reward", -3.5) == -3.5
    for bad in (math.inf, -math.inf, math.nan, False, "1"):
        refused(
            lambda bad=bad: checks.finite("env.heart_reward", bad), f"env.heart_reward={bad!r} must be a finite number"
        )
    refused(lambda: checks.finite("optimizer.lr", -0.001, low=0), "optimizer.lr=-0.001 must be a finite number >= 0")


def test_flag_takes_only_true_and_false():
    assert checks.flag("greedy", True) is True and checks.flag("greedy", False) is False
    for bad in (0, 1, "true", None):
        refused(lambda bad=bad: checks.flag("greedy", bad), f"greedy={bad!r} must be true or false")


def test_device_names_the_setting_it_refuses():
    assert checks.device("system.device", "cpu") == torch.device("cpu")
    assert checks.device("system.device", "auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    refused(lambda: checks.device("device", "tpu"), "device='tpu' is not a device; use auto, cpu, cuda or cuda:N")
    refused(
        lambda: checks.device("system.device", "meta"),
        "system.device='meta' is not supported; use auto, cpu, cuda or cuda:N",
    )
    if not torch.cuda.is_available():
        refused(
            lambda: checks.device("system.device", "cuda"),
            "system.device='cuda' but CUDA is not available here; set it to cpu or auto",
        )
    else:
        count = torch.cuda.device_count()
        refused(
            lambda: checks.device("system.device", f"cuda:{count}"),
            f"system.device='cuda:{count}' but only {count} CUDA devices exist",
        )


def test_a_refusal_is_a_value_error_so_hydra_instantiation_unwraps_it():
    with pytest.raises(ValueError):
        checks.integer("x", -1, low=0)
