"""A curriculum (env settings scheduled over training): machina_1's ``region_size`` layouts, ``Env.configure`` between
rollouts, the ``Curriculum`` stages and their refusals, a real training run that changes stage and logs it, and a
resume inside either stage that continues exactly like the uninterrupted run."""

import re

import pytest
import torch

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.grid import OBSTACLE, WALL, Geometry
from machina.env.machina_1.layout import LayoutSampler
from machina.env.machina_1.pool import Episodes
from machina.errors import ConfigError
from machina.startup.build import build, build_trainer
from machina.training.curriculum import Curriculum
from tests.commands import run_script
from tests.conftest import compose_config
from tests.test_checkpoint import EPOCH, metrics, run, without_timing

GEOM = Geometry(11, 11)


def open_cells(grid: torch.Tensor, geom: Geometry = GEOM) -> torch.Tensor:
    """bool [K, height, width]: the interior cells of each layout that are not walls."""
    interior = geom.interior(grid.device)
    return (grid[:, interior] != WALL).view(-1, geom.height, geom.width)


def sample(region, k=64, seed=0, geom=GEOM):
    sampler = LayoutSampler(geom, agents=4, extractors_per_resource=2, obstacle_density=0.1, device="cpu")
    sampler.set_region(region)
    return sampler.sample(k, torch.Generator().manual_seed(seed))


def test_a_region_layout_puts_everything_in_a_walled_square_at_a_random_place():
    lay = sample(5)
    free = open_cells(lay.grid)
    corners = set()
    for k in range(free.shape[0]):
        rows, cols = free[k].any(1).nonzero().flatten(), free[k].any(0).nonzero().flatten()
        assert free[k].sum() == 25 and len(rows) == 5 and len(cols) == 5  # exactly a 5x5 square is open
        assert (rows.diff() == 1).all() and (cols.diff() == 1).all()
        corners.add((int(rows[0]), int(cols[0])))
    assert len(corners) > 10  # the square moves (7 x 7 places it can take)
    grid = lay.grid
    for cells in (lay.agent_pos, lay.ext_pos):  # agents and extractors stand on open cells
        assert (torch.gather(grid, 1, cells) != WALL).all()
    assert ((grid == OBSTACLE).sum(1) == round(0.1 * 25)).all()  # the interior's obstacle density, in the square


def test_no_region_fills_the_interior_and_draws_what_a_sampler_never_set_to_a_region_draws():
    full = sample(None, seed=3)
    assert ((full.grid == OBSTACLE).sum(1) == round(0.1 * 121)).all()
    assert (open_cells(full.grid).sum((1, 2)) == 121).all()
    sampler = LayoutSampler(GEOM, 4, 2, 0.1, "cpu")
    sampler.set_region(7)
    sampler.set_region(None)
    again = sampler.sample(64, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(full, again, strict=True))


@pytest.mark.parametrize(
    "region, match",
    [(12, "larger than the 11x11 interior"), (3, "do not fit in a 3x3 region"), (0, ">= 1"), (True, ">= 1")],
)
def test_a_region_that_cannot_hold_the_map_is_refused(region, match):
    with pytest.raises(ConfigError, match=match):
        sample(region)
    with pytest.raises(ConfigError, match="env.region_size"):
        Machina1Env(num_envs=2, region_size=region)


def test_configure_changes_the_maps_of_episodes_that_start_after_it_only():
    env = Machina1Env(num_envs=8, max_steps=5, stagger=False, outputs={keys.TEACHER_ACTIONS})
    noop = torch.zeros(env.num_agents, dtype=torch.int64)
    assert env.settings() == {"region_size": None, "inventory_cap": 4}
    env.step(noop)
    env.configure(region_size=6)
    assert env.settings() == {"region_size": 6, "inventory_cap": 4}
    env.prepare_rollout(4)  # as the trainer does before the rollout that follows
    for _ in range(3):  # the episodes under way finish on their full maps
        env.step(noop)
    assert (open_cells(env.state["grid"]).sum((1, 2)) == 121).all()
    env.step(noop)  # step 5: every env ends and starts on a 6x6 region
    assert (open_cells(env.state["grid"]).sum((1, 2)) == 36).all()
    teacher = env.step(noop)[keys.TEACHER_ACTIONS]  # computed on the new maps' distance fields
    assert ((teacher >= 0) & (teacher < 5)).all()
    with pytest.raises(ConfigError, match=r"cannot change \['height'\]"):
        env.configure(height=7)


def test_a_lowered_inventory_cap_stops_gathering_and_crafting_at_it_from_the_next_step():
    """The rules (machina/env/machina_1/env.py): an extractor gives a unit only below the cap, the assembler crafts only
    while hearts are below it. A curriculum's cap applies to every agent from the next step, the observation keeps
    the built cap's norms, and a cap above the built one (or not an integer) is refused."""
    rows = ["#######", "#0C&=.#", "#..1..#", "#2...3#", "#######"]
    east, north = 2, 1
    env = Machina1Env.from_ascii(rows, max_steps=1000, extractor_cooldown=0, seed=0)
    spec = env.spec
    env.configure(inventory_cap=1)
    assert env.settings() == {"region_size": None, "inventory_cap": 1}
    assert env.spec == spec  # the observation's inventory norms stay those of the built cap (4)
    for _ in range(3):  # agent 0 into the carbon extractor (no cooldown) three times: one unit, then the cap
        env.step(torch.tensor([east, 0, 0, 0]))
    assert env.state["inv"][0, 0].tolist() == [1, 0, 0, 0, 0]
    env.state["inv"][0, 1] = torch.tensor([1, 1, 1, 1, 1])  # agent 1, below the assembler, already holds a heart
    env.step(torch.tensor([0, north, 0, 0]))
    assert env.state["inv"][0, 1].tolist() == [1, 1, 1, 1, 1]  # no room for a second heart
    env.state["inv"][0, 1, 4] = 0
    env.step(torch.tensor([0, north, 0, 0]))
    assert env.state["inv"][0, 1].tolist() == [0, 0, 0, 0, 1]
    env.configure(inventory_cap=4)
    env.step(torch.tensor([east, 0, 0, 0]))
    assert env.state["inv"][0, 0].tolist() == [2, 0, 0, 0, 0]
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ConfigError, match=r"env.inventory_cap=.* must be an integer in 1..4"):
            env.configure(inventory_cap=bad)
    assert env.settings()["inventory_cap"] == 4


def test_curriculum_stages_are_a_function_of_the_agent_step():
    env = Machina1Env(num_envs=2)
    stages = [{"until": 100, "env": {"region_size": 5}}, {"until": 300, "env": {"region_size": 8}}]
    curriculum = Curriculum(stages, env)
    assert [curriculum.stage(s) for s in (0, 99, 100, 299, 300, 10**9)] == [0, 0, 1, 1, 2, 2]
    assert [curriculum.settings(s)["region_size"] for s in (0, 150, 300)] == [5, 8, None]
    for step, region in ((0, 5), (50, 5), (150, 8), (400, None), (0, 5)):  # a resume may go back: it re-applies
        curriculum.apply(step)
        assert env.settings() == {"region_size": region, "inventory_cap": 4}


@pytest.mark.parametrize(
    "stages, match",
    [
        ([{"until": 100}], "exactly the keys 'until' and 'env'"),
        ([{"until": 100, "env": {"region_size": 5}, "extra": 1}], "exactly the keys"),
        ([{"until": 0, "env": {"region_size": 5}}], r"until=0 must be an agent step"),
        ([{"until": 1.5, "env": {"region_size": 5}}], "until=1.5"),
        ([{"until": 200, "env": {"region_size": 5}}, {"until": 200, "env": {"region_size": 6}}], r"\[1\].until=200"),
        ([{"until": 100, "env": {}}], "non-empty mapping"),
        ([{"until": 100, "env": {"max_steps": 50}}], r"sets \['max_steps'\].*\['inventory_cap', 'region_size'\]"),
        ([{"until": 100, "env": {"region_size": 7}}, {"until": 200, "env": {"region_size": 3}}], r"\[1\].env: .*3x3"),
    ],
)
def test_curriculum_refuses_malformed_stages(stages, match):
    with pytest.raises(ConfigError, match=match):
        Curriculum(stages, Machina1Env(num_envs=2))


def test_a_stage_the_env_refuses_stops_the_run_before_it_writes_anything(tmp_path):
    run_dir = tmp_path / "run"
    stages = "trainer.curriculum=[{until:100000,env:{region_size:9}},{until:200000,env:{region_size:3}}]"
    result = run_script("train.py", "debug=tiny", stages, f"hydra.run.dir={run_dir}", "wandb=disabled")
    assert result.returncode == 2
    assert re.search(
        r"trainer\.curriculum\[1\]\.env: \d+ agents and objects do not fit in a 3x3 region",
        result.stdout + result.stderr,
    )
    assert "Traceback" not in result.stderr
    assert not run_dir.exists()  # a refused command leaves no folder behind
    env = Machina1Env(num_envs=2)
    Curriculum([{"until": 100, "env": {"region_size": 7}}], env)
    assert env.settings() == {"region_size": None, "inventory_cap": 4}  # checking the stages leaves the env's own


def test_an_env_without_schedulable_settings_refuses_a_curriculum():
    from machina.env.gymnasium import GymnasiumEnv

    env = GymnasiumEnv(id="CartPole-v1", num_envs=2)
    with pytest.raises(ConfigError, match="^trainer.curriculum: GymnasiumEnv has no settings a curriculum can change"):
        Curriculum([{"until": 10, "env": {"region_size": 5}}], env)


class Rows:
    def __init__(self):
        self.rows = []

    def log(self, metrics):
        self.rows.append(metrics)

    def close(self):
        pass


def test_training_runs_each_stage_on_its_maps_logs_the_stage_and_ends_on_the_default_env():
    """debug=tiny: 3 epochs of 1,024 agent steps; stage 0 (region 5) for the first epoch only."""
    cfg = compose_config(["debug=tiny", "trainer.curriculum=[{until:1024,env:{region_size:5}}]"])
    trainer = build_trainer(cfg, build(cfg), sinks=[])
    sink = Rows()
    trainer.sinks = [sink]
    pool = trainer.rollout.env.pool
    pool_maps = []
    run_epoch = trainer.run_epoch

    def recording_epoch():
        steps = run_epoch()
        pool_maps.append(open_cells(Episodes.views(pool.episodes, pool.rows)["grid"]).sum((1, 2)))
        return steps

    trainer.run_epoch = recording_epoch
    trainer.train()
    assert [row["curriculum/stage"] for row in sink.rows] == [0, 1, 1]
    assert (pool_maps[0] == 25).all()  # the episodes the first epoch's resets started from
    assert (pool_maps[1] == 121).all() and (pool_maps[2] == 121).all()
    assert trainer.rollout.env.settings() == {"region_size": None, "inventory_cap": 4}


@pytest.mark.parametrize("resume_after", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_resume_inside_a_stage_continues_like_the_uninterrupted_run(tmp_path, resume_after):
    """Stage 0 (region 5) for epochs 1-2, the default map from epoch 3: a resume after epoch 1 re-applies stage 0, one
    after epoch 2 starts stage 1; either must draw the layouts the uninterrupted run drew."""
    stages = f"trainer.curriculum=[{{until:{2 * EPOCH},env:{{region_size:5}}}}]"
    straight = tmp_path / "straight"
    run(straight, stages, epochs=4)
    resumed = tmp_path / "resumed"
    run(resumed, stages, epochs=2)
    resume = f"resume={resumed / 'checkpoints' / f'checkpoint_{resume_after:06d}.pt'}"
    run(resumed, stages, resume, epochs=4)
    rows = metrics(resumed)
    assert [r["curriculum/stage"] for r in rows] == [0, 0, 1, 1]
    assert without_timing(rows) == without_timing(metrics(straight))
