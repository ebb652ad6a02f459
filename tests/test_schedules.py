"""machina.schedules from their definitions: coefficient schedules over agent steps, learning-rate multipliers over
the fraction of training, the refusals a careless config meets, and every ``_target_`` the configs name (schedules
included) pointing at something that exists."""

import math
import re

import pytest
import yaml
from hydra.utils import get_object, instantiate

from machina.errors import ConfigError
from machina.schedules import Constant, ConstantLr, CosineLr, Linear, LinearLr, as_schedule
from tests.conftest import CONF, ROOT, compose_config


def test_linear_holds_start_then_ramps_then_holds_end():
    schedule = Linear(start=0.5, end=0.0, end_step=300, begin_step=100)
    assert [schedule(step) for step in (0, 100, 200, 300, 10**9)] == [0.5, 0.5, 0.25, 0.0, 0.0]
    assert schedule(150) == pytest.approx(0.375)
    rising = Linear(start=-1.0, end=3.0, end_step=4)
    assert [rising(step) for step in (-5, 0, 1, 4, 5)] == [-1.0, -1.0, 0.0, 3.0, 3.0]
    assert schedule.breakpoints() == (100, 300) and Constant(2.0).breakpoints() == ()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"start": 1.0, "end": 0.0, "end_step": 0}, "^end_step=0 must be above begin_step=0$"),
        ({"start": 1.0, "end": 0.0, "end_step": 10, "begin_step": 10}, "^end_step=10 must be above begin_step=10$"),
        ({"start": math.nan, "end": 0.0, "end_step": 10}, "^start=nan must be a finite number$"),
        ({"start": 1.0, "end": math.inf, "end_step": 10}, "^end=inf must be a finite number$"),
    ],
)
def test_linear_refuses_an_empty_ramp_or_infinite_ends(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Linear(**kwargs)


def test_as_schedule_makes_numbers_constant_and_keeps_schedules():
    assert as_schedule(3, "losses.x.coef") == Constant(3.0) and isinstance(as_schedule(3, "x").value, float)
    assert as_schedule(0.25, "x")(10**9) == 0.25
    linear = Linear(start=1.0, end=0.0, end_step=10)
    assert as_schedule(linear, "x") is linear


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, True, "0.5", None, [0.5]])
def test_as_schedule_refuses_what_is_not_a_finite_number_naming_the_setting(bad):
    with pytest.raises(ConfigError, match=re.escape(f"losses.supervisor.action_loss_coef={bad!r} must be a finite")):
        as_schedule(bad, "losses.supervisor.action_loss_coef")


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("floor", [0.0, 0.2, 1.0])
def test_lr_schedules_follow_their_definitions(fraction, floor):
    """Multipliers of optimizer.lr: 1 at the start, ``floor`` at the end; linear is CleanRL's ``anneal_lr``
    (``frac = 1 - done``) at floor 0, cosine is half a cosine from 1 to ``floor``."""
    assert ConstantLr()(fraction) == 1.0
    assert LinearLr(floor)(fraction) == pytest.approx(1.0 - (1.0 - floor) * fraction)
    assert CosineLr(floor)(fraction) == pytest.approx(
        floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * fraction))
    )


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.75, 0.8, 0.9, 0.95, 1.0])
def test_a_decay_from_holds_the_rate_then_decays_over_the_rest(fraction):
    """Warmup-stable-decay without the warmup (Hägele et al. 2024): optimizer.lr until 80% of training, then the
    same curve as a whole-run schedule, squeezed into the last fifth."""
    rest = max(fraction - 0.8, 0.0) / 0.2
    assert LinearLr(0.0, decay_from=0.8)(fraction) == pytest.approx(1.0 - rest)
    assert CosineLr(0.1, decay_from=0.8)(fraction) == pytest.approx(0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * rest)))
    if fraction <= 0.8:
        assert LinearLr(0.3, decay_from=0.8)(fraction) == 1.0


@pytest.mark.parametrize("schedule", [LinearLr, CosineLr])
@pytest.mark.parametrize("decay_from", [-0.1, 1, 1.0, math.nan, True, "0.5"])
def test_lr_schedules_refuse_a_decay_start_outside_zero_to_below_one(schedule, decay_from):
    """At 1 the decay would span no training at all (and divide by zero)."""
    with pytest.raises(ConfigError, match="^" + re.escape(f"decay_from={decay_from!r} must be")):
        schedule(0.0, decay_from)


def test_a_decay_start_from_the_command_line_builds():
    cfg = compose_config(["learner/lr_schedule=linear", "learner.lr_schedule.decay_from=0.8"])
    schedule = instantiate(cfg.learner.lr_schedule)
    assert type(schedule) is LinearLr and schedule(0.5) == 1.0 and schedule(0.9) == pytest.approx(0.5)


@pytest.mark.parametrize("schedule", [LinearLr, CosineLr])
def test_lr_schedules_hold_their_ends_outside_training_and_never_rise(schedule):
    multiplier = schedule(0.1)
    assert multiplier(-0.5) == pytest.approx(1.0) and multiplier(1.5) == pytest.approx(0.1)
    values = [multiplier(i / 100) for i in range(101)]
    assert all(later <= earlier for earlier, later in zip(values, values[1:], strict=False))


@pytest.mark.parametrize("schedule", [LinearLr, CosineLr])
@pytest.mark.parametrize("floor", [-0.1, 1.5, math.nan, math.inf, True, "0"])
def test_lr_schedules_refuse_a_floor_outside_zero_to_one(schedule, floor):
    with pytest.raises(ConfigError, match="^" + re.escape(f"floor={floor!r} must be a number in [0, 1]")):
        schedule(floor)


@pytest.mark.parametrize(
    "option, kind", [("constant", ConstantLr), ("linear", LinearLr), ("cosine", CosineLr), ("linear_tail", LinearLr)]
)
def test_each_lr_schedule_option_builds_its_schedule(option, kind):
    assert type(instantiate(compose_config([f"learner/lr_schedule={option}"]).learner.lr_schedule)) is kind


def test_the_main_job_holds_its_rate_for_four_fifths_then_decays_it_to_zero():
    """linear_tail, the main job's: optimizer.lr until 80% of its agent steps, half of it at 90%, none at the end;
    the presets measured with a constant rate keep it."""
    schedule = instantiate(compose_config([]).learner.lr_schedule)
    assert [schedule(f) for f in (0.0, 0.5, 0.8)] == [1.0, 1.0, 1.0]
    assert schedule(0.9) == pytest.approx(0.5) and schedule(1.0) == 0.0
    for preset in ("machina_1_ppo_curriculum", "machina_1_ppo_wide", "machina_1_ppo_tuned"):
        cfg = compose_config([f"experiment={preset}"])
        assert type(instantiate(cfg.learner.lr_schedule)) is ConstantLr and cfg.system.bf16_matmuls is False


def test_a_coefficient_schedule_from_the_command_line_builds():
    override = "+losses.supervisor.teacher_led_proportion={_target_: machina.schedules.Linear, start: 0.5, end: 0.0, "
    cfg = compose_config(["losses=[ppo,supervisor]", override + "end_step: 100}"])
    assert instantiate(cfg.losses.supervisor.teacher_led_proportion) == Linear(start=0.5, end=0.0, end_step=100)


def targets(node, where: str):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield where, value
            yield from targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from targets(value, f"{where}[{i}]")


def test_every_target_in_the_configs_exists():
    """A renamed or deleted class leaves no config pointing at it: every ``_target_`` of conf/ and experiments/ (read
    as plain YAML, so presets of every option count, not only the default ones) names an importable object."""
    files = sorted({path.resolve() for path in (*CONF.rglob("*.yaml"), *(ROOT / "experiments").glob("*.yaml"))})
    found = [
        (f"{path.relative_to(ROOT)}:{where}", target)
        for path in files
        for where, target in targets(yaml.safe_load(path.read_text()), "")
    ]
    assert len(found) > 20
    missing = []
    for where, target in found:
        try:
            get_object(target)
        except Exception:  # noqa: BLE001 - whatever stops the lookup, the config points at nothing
            missing.append(f"{where} = {target}")
    assert missing == []
