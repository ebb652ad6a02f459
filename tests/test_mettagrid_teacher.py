"""The scripted arena teacher of the MettaGrid env (``teacher_actions``): shortest paths on a hand-made map, offered
only to arena-like games and only when asked, the same actions from worker processes, far better than random, and
the teacher losses training on ``env=mettagrid_arena``. A game without the arena's chain refuses those losses:
tests/test_mettagrid.py."""

import json

import pytest
import torch

from machina import keys
from machina.errors import ConfigError
from machina.startup.build import build
from tests.commands import run_script
from tests.conftest import compose_config

pytest.importorskip("mettagrid")

from machina.env.factory import env_factory  # noqa: E402
from machina.env.mettagrid import MettaGridEnv  # noqa: E402
from machina.env.mettagrid.game import arena_config, write_game  # noqa: E402
from machina.evaluation.evaluator import Evaluator  # noqa: E402

TEACHER = frozenset({keys.TEACHER_ACTIONS})
NOOP, NORTH, SOUTH, WEST, EAST = range(5)  # MettaGrid's action ids in the arena
TINY = ["env=mettagrid_arena", "env.num_envs=4", "env.max_steps=30", "env.workers=0", "env.overlap=false"]
TINY += ["experience.batch_size=256", "experience.bptt_horizon=16", "experience.minibatch_size=128", "policy=fast"]
TINY += ["wandb=disabled"]


def trained_rows(tmp_path, *args):
    """The metrics.jsonl rows of ``python train.py ARGS`` in a fresh run folder, after checking that it succeeded."""
    run_dir = tmp_path / "run"
    result = run_script("train.py", *args, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.output[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def walled_game(tmp_path):
    """One agent top left, a wall between it and the mine, the converter in the far corner (not in its first view).
    Shortest routes: 6 moves to the cell below the mine (south or east first; north and west are walls), 2 uses
    (ore_per_heart=2), 3 moves to the converter, 1 use: the first heart on step 12; then 3 moves, 2 uses, 3 moves
    and 1 use per heart: steps 21, 30, 39."""
    rows = ["#########", "#@.#m...#", "#..#....#", "#......c#", "#########"]
    cfg = arena_config(agents_per_env=1, map_rows=rows, max_steps=40, ore_per_heart=2)
    return str(write_game(cfg, tmp_path / "walled.json"))


def test_the_teacher_takes_shortest_routes_round_walls_to_the_mine_and_the_converter(tmp_path):
    env = MettaGridEnv(game=walled_game(tmp_path), num_envs=2, outputs=TEACHER)
    td = env.reset()
    assert env.spec.outputs == TEACHER and td[keys.TEACHER_ACTIONS].dtype == torch.int64
    assert td[keys.TEACHER_ACTIONS][0].item() in (SOUTH, EAST)
    rewards = []
    for _ in range(39):
        td = env.step(td[keys.TEACHER_ACTIONS])
        rewards.append(td[keys.REWARDS][0].item())
    hearts = [step for step, reward in enumerate(rewards, 1) if reward > 0]
    assert hearts == [12, 21, 30, 39], rewards


def test_the_teacher_is_offered_to_arena_games_only_and_returned_only_when_asked():
    asked = MettaGridEnv(num_envs=2, outputs=TEACHER)
    plain = MettaGridEnv(num_envs=2)
    dungeon = MettaGridEnv(game="dungeon", num_envs=2, outputs=TEACHER)
    assert asked.spec.outputs == plain.spec.outputs == TEACHER and dungeon.spec.outputs == frozenset()
    moves = torch.zeros(asked.num_agents, dtype=torch.int64)
    for env, has in ((asked, True), (plain, False), (dungeon, False)):
        for td in (env.reset(), env.observe(), env.step(moves[: env.num_agents])):
            assert (keys.TEACHER_ACTIONS in td.keys()) == has
    actions = asked.step(moves)[keys.TEACHER_ACTIONS]
    assert actions.shape == (asked.num_agents,) and ((actions >= 0) & (actions < asked.spec.num_actions)).all()


def test_the_teacher_names_what_a_game_without_the_arena_chain_lacks():
    from machina.env.mettagrid import game_file
    from machina.env.mettagrid.teacher import ArenaTeacher

    lacks = "this game has no mine object, converter taking ore, tag / inv:ore / episode_completion_pct tokens$"
    with pytest.raises(ConfigError, match=f"the arena teacher \\(teacher_actions\\) needs .*; {lacks}"):
        ArenaTeacher(game_file.read_game("dungeon"))


def test_worker_processes_give_the_teacher_actions_of_the_in_process_env():
    local = MettaGridEnv(num_envs=4, seed=3, outputs=TEACHER)
    workers = MettaGridEnv(num_envs=4, seed=3, workers=2, overlap=True, outputs=TEACHER)
    try:
        expected, got = local.reset(), workers.reset()
        half = local.num_agents // 2
        for _ in range(60):  # past the first staggered episode ends: restarted envs' teacher actions too
            assert torch.equal(expected[keys.TEACHER_ACTIONS], got[keys.TEACHER_ACTIONS])
            actions = expected[keys.TEACHER_ACTIONS]
            expected = local.step(actions)
            for group in (0, 1):
                workers.send(group, actions[group * half : (group + 1) * half])
            got = torch.cat([workers.recv(group)[keys.TEACHER_ACTIONS] for group in (0, 1)])
            got = {keys.TEACHER_ACTIONS: got}
        assert local.episode_stats()["episodes"] > 0
    finally:
        workers.close()


def test_the_evaluation_s_teacher_row_returns_several_times_the_random_row():
    parts = build(compose_config(TINY))
    parts.env.close()
    cfg = compose_config(["env=mettagrid_arena", "env.workers=0", "env.overlap=false", "env.max_steps=80"])
    rows = Evaluator(env_factory(cfg.env, "cpu"), episodes=8, seed=1).compare(parts.policy)
    teacher, random = rows["teacher"]["return"], rows["random"]["return"]
    assert teacher > 3 * random and teacher > 2.0, rows
    assert 0.0 <= rows["policy"]["teacher_agreement"] <= 1.0


@pytest.mark.parametrize(
    "loss",
    ["supervisor", *(pytest.param(loss, marks=pytest.mark.slow) for loss in ("sliced_scripted_cloner", "eer_cloner"))],
)
def test_the_teacher_losses_train_on_the_arena(tmp_path, loss):
    rows = trained_rows(tmp_path, *TINY, f"losses=[ppo,{loss}]", "trainer.total_timesteps=768")
    assert len(rows) == 3
    values = [value for key, value in rows[-1].items() if key.startswith(f"losses/{loss}/")]
    assert values and all(torch.isfinite(torch.tensor(values))), rows[-1]


@pytest.mark.slow
def test_cloning_the_arena_teacher_raises_agreement(tmp_path):
    args = ["env=mettagrid_arena", "env.num_envs=32", "env.workers=0", "env.overlap=false", "wandb=disabled"]
    args += ["losses=[supervisor]", "losses.supervisor.teacher_led_proportion=1.0", "experience.batch_size=2048"]
    args += ["experience.bptt_horizon=16", "experience.minibatch_size=512", "trainer.total_timesteps=40960"]
    rows = trained_rows(tmp_path, *args)
    agreement = [r["losses/supervisor/teacher_agreement"] for r in rows]
    assert sum(agreement[-3:]) / 3 > agreement[0] + 0.2, agreement  # measured: 0.26 -> 0.55


@pytest.mark.slow
def test_the_arena_dagger_preset_plays_near_the_teacher_after_three_epochs(tmp_path):
    """experiment=mettagrid_arena_dagger's first 3 epochs (197k agent steps, the teacher leading half of them): the
    student's own periodic evaluation (eval/return, 32 held-out episodes, per agent) passes 1.5. Measured on the
    2-core CPU: seeds 1 / 2 2.75 / 3.05; at the same steps PPO alone (the preset's settings without the supervisor
    loss) 0.64 / 0.56 and the preset with optimizer.lr=0 0.50 (seed 1); the teacher returns 3.52 and random 0.48.
    The training return is no guard: it counts the teacher-led steps (3.91 with optimizer.lr=0)."""
    args = ["experiment=mettagrid_arena_dagger", "trainer.total_timesteps=196608", "system.seed=1", "wandb=disabled"]
    rows = trained_rows(tmp_path, *args)
    assert rows[-1]["metric/agent_step"] == 196608
    assert rows[-1]["eval/return"] > 1.5, [row.get("eval/return") for row in rows]
