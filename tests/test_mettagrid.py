"""env=mettagrid / env=mettagrid_arena: the real MettaGrid env behind machina's env interface (needs the mettagrid
extra), the install message without it, and the start-up refusal of losses that need teacher actions. Worker
processes: tests/test_mettagrid_workers.py."""

import json
import sys

import pytest
import torch

from machina import keys
from machina.env.spec import PAD_TOKEN
from machina.errors import ConfigError
from machina.startup.build import build
from tests.commands import run_script
from tests.conftest import compose_config

TINY = ["env.num_envs=4", "env.max_steps=30", "experience.batch_size=256", "experience.bptt_horizon=16"]
TINY += ["experience.minibatch_size=128", "trainer.total_timesteps=512", "policy=fast"]


ARENA_STATS = {"hearts_made": "heart.made", "resources_gathered": "ore.mined"}


def test_without_the_extra_the_env_says_how_to_install_it(monkeypatch):
    # `import mettagrid...` raises ImportError once the package is None and no submodule is cached.
    import machina.env.mettagrid

    needs_it = ("game", "sims", "workers")
    ours = tuple(f"machina.env.mettagrid.{name}" for name in needs_it)
    for name in [m for m in sys.modules if m.startswith("mettagrid.") or m in ours]:
        monkeypatch.delitem(sys.modules, name)
    for name in needs_it:  # `from machina.env.mettagrid import x` finds an imported submodule on the package
        monkeypatch.delattr(machina.env.mettagrid, name, raising=False)
    monkeypatch.setitem(sys.modules, "mettagrid", None)
    from machina.env.mettagrid import MettaGridEnv

    hint = r"env=mettagrid needs the mettagrid extra: pip install -e '\.\[mettagrid\]'"
    with pytest.raises(ConfigError, match=hint):
        MettaGridEnv(num_envs=1)


def test_random_actions_give_well_formed_tokens_and_episodes_reset():
    pytest.importorskip("mettagrid")
    from machina.env.mettagrid import MettaGridEnv

    env = MettaGridEnv(num_envs=4, max_steps=10, seed=1, stats=ARENA_STATS)
    spec, n = env.spec, env.spec.num_agents
    assert spec.outputs == frozenset({keys.TEACHER_ACTIONS}) and spec.num_actions == 5
    gen = torch.Generator().manual_seed(0)
    td = env.reset()
    truncations = torch.zeros(n)
    for _ in range(25):
        obs = td[keys.OBS]
        assert obs.shape == (n, spec.obs.max_tokens, 3) and obs.dtype == torch.uint8
        pad = obs[..., 1] == PAD_TOKEN
        assert (obs[pad] == PAD_TOKEN).all(), "a padding token has all three bytes 0xFF"
        loc, feature = obs[~pad][:, 0].long(), obs[~pad][:, 1].long()
        assert ((loc >> 4) < spec.obs.window).all() and ((loc & 15) < spec.obs.window).all()
        assert (feature < spec.obs.num_features).all()
        outcome = {keys.OBS, keys.REWARDS, keys.TERMINATED, keys.TRUNCATED}
        # The time limit is not observed, so a step that truncates hands the final observations for bootstrapping.
        assert set(td.keys()) == outcome | ({keys.FINAL_OBS} if td[keys.TRUNCATED].any() else set())
        td = env.step(torch.randint(0, spec.num_actions, (n,), generator=gen))
        assert td[keys.REWARDS].dtype == torch.float32 and td[keys.TRUNCATED].dtype == torch.bool
        truncations += td[keys.TRUNCATED]
    # Staggered first episodes end in [1, 10] steps, later ones at 10: every env reset at least twice in 25 steps.
    assert (truncations >= 2).all()
    stats = env.episode_stats()
    assert stats["episodes"] == truncations.sum() / env.agents_per_env
    assert set(stats) == {"episodes", "return", "length", "hearts_made", "resources_gathered"}


def test_mining_and_converting_yield_a_heart_and_its_reward(tmp_path):
    pytest.importorskip("mettagrid")
    from machina.env.mettagrid import MettaGridEnv
    from machina.env.mettagrid.game import arena_config, write_game

    rows = ["#######", "#m@.c.#", "#.....#", "#######"]  # mine west of the agent, converter two cells east
    game = write_game(arena_config(agents_per_env=1, map_rows=rows, max_steps=20, ore_per_heart=2), tmp_path / "g.json")
    env = MettaGridEnv(game=str(game), num_envs=2, stats=ARENA_STATS)
    west, east = 3, 4  # MettaGrid's action ids: noop, move_north, move_south, move_west, move_east
    env.reset()
    rewards = [env.step(torch.full((2,), a))[keys.REWARDS] for a in (west, west, east, east)]
    # Two uses of the mine (the agent stays put), one step east, then using the converter makes a heart.
    assert all((r == 0).all() for r in rewards[:3]) and (rewards[3] == 1.0).all()
    steps = [env.step(torch.zeros(2, dtype=torch.int64)) for _ in range(16)]
    before, td = steps[-2:]
    assert td[keys.TRUNCATED].all() and not before[keys.TRUNCATED].any() and keys.FINAL_OBS not in before.keys()
    # Standing still, the final observation shows the same cells as the step before (the agent one cell east of its
    # start); the new episode's first observation has it back at the start, so the cells it sees differ.
    centre = env.centre

    def cells(obs):
        return obs[0][obs[0, :, 0] != centre]

    assert torch.equal(cells(td[keys.FINAL_OBS]), cells(before[keys.OBS]))
    assert not torch.equal(cells(td[keys.OBS]), cells(before[keys.OBS]))
    stats = {k: float(v) for k, v in env.episode_stats().items()}
    assert stats == {"episodes": 2, "return": 2.0, "length": 40, "hearts_made": 2, "resources_gathered": 4}
    last = env.last_episodes()
    assert (
        last["episodes"].tolist() == [1, 1]
        and last["return"].tolist() == [1, 1]
        and last["length"].tolist() == [20, 20]
    )


@pytest.mark.parametrize("loss", ["supervisor", "sliced_scripted_cloner", "eer_cloner"])
def test_losses_that_need_teacher_actions_are_refused(loss):
    pytest.importorskip("mettagrid")
    cfg = compose_config(["env=mettagrid_arena", "env.game=dungeon", f"losses=[ppo,{loss}]", *TINY])  # no teacher
    with pytest.raises(ConfigError, match=f"loss '{loss}' reads the env output teacher_actions.*MettaGridEnv"):
        build(cfg)


def test_a_restored_rollout_acts_on_the_new_episodes_the_env_started():
    """MettaGrid's engine state is not saved, so a restored env starts new episodes: the rollout must act on their
    first observations with fresh recurrent state, not on the saved observation of an episode that is gone."""
    pytest.importorskip("mettagrid")
    from machina.startup.build import build_trainer

    cfg = compose_config(["env=mettagrid_arena", *TINY, "wandb=disabled"])
    first = build_trainer(cfg, build(cfg), sinks=[])
    first.rollout.run(first.progress)
    saved = first.local_state_dict()
    restored = build_trainer(cfg, build(cfg), sinks=[])
    restored.load_local_state_dict(saved)
    step = restored.rollout.step_td
    assert not torch.equal(first.rollout.step_td[keys.OBS], restored.rollout.env.observe()[keys.OBS])  # what was saved
    assert (
        torch.equal(step[keys.OBS], restored.rollout.env.observe()[keys.OBS]) and (step[keys.EPISODE_START] == 1).all()
    )
    assert all((value == 0).all() for value in restored.rollout.state.values())
    restored.rollout.run(restored.progress)  # and it trains on from there


@pytest.mark.slow
def test_short_training_run_writes_metrics(tmp_path):
    pytest.importorskip("mettagrid")
    run_dir = tmp_path / "run"
    result = run_script("train.py", "env=mettagrid_arena", *TINY, "wandb=disabled", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.output[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/agent_step"] for r in rows] == [256, 512]
    assert all(r["overview/sps"] > 0 and "env/hearts_made" in r for r in rows)
