"""Machina1Env step semantics on hand-made maps, auto-reset and stats, determinism, errors, state_dict."""

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.render import render_ascii, render_frame, save_png
from machina.errors import ConfigError

TEACHER = frozenset({keys.TEACHER_ACTIONS})

NOOP, NORTH, EAST, SOUTH, WEST = range(5)
CARBON, HEART = 0, 4
ROOT = Path(__file__).resolve().parents[1]


def hand_env(rows, **kwargs):
    """An env on a hand-made map, no shaping unless asked, long episodes."""
    settings = dict(max_steps=1000, resource_reward=0.0, heart_made_reward=0.0, seed=0)
    return Machina1Env.from_ascii(rows, **{**settings, **kwargs})


def actions(env, moves: dict[int, int]) -> torch.Tensor:
    """int64 [N] actions: noop everywhere except agent index -> action in ``moves``."""
    a = torch.zeros(env.num_agents, dtype=torch.int64)
    for agent, action in moves.items():
        a[agent] = action
    return a


def test_walls_and_obstacles_block_and_free_cells_are_entered():
    rows = ["#######", "#0....#", "#..o..#", "#1.2.3#", "#######"]
    env = hand_env(rows)
    env.step(actions(env, {0: NORTH, 1: WEST, 2: NORTH, 3: EAST}))
    assert render_ascii(env) == "\n".join(rows)
    env.step(actions(env, {0: EAST, 2: EAST}))
    assert render_ascii(env) == "\n".join(["#######", "#.0...#", "#..o..#", "#1..23#", "#######"])


def test_agents_block_each_other_and_lowest_slot_wins_a_contested_cell():
    rows = ["#######", "#0.1..#", "#.....#", "#2.3..#", "#######"]
    env = hand_env(rows)
    env.step(actions(env, {0: EAST, 1: WEST, 2: EAST}))  # 0 and 1 both want (1, 2): slot 0 wins
    assert render_ascii(env) == "\n".join(["#######", "#.01..#", "#.....#", "#.23..#", "#######"])
    env.step(actions(env, {3: WEST, 1: WEST}))  # both cells are occupied at the start of the step
    assert render_ascii(env) == "\n".join(["#######", "#.01..#", "#.....#", "#.23..#", "#######"])


def test_extractor_gives_one_unit_then_cools_down_and_respects_the_cap():
    rows = ["#######", "#0C...#", "#.....#", "#1.2.3#", "#######"]
    env = hand_env(rows, extractor_cooldown=3, inventory_cap=2, resource_reward=0.5)
    carbon, rewards = [], []
    for _ in range(7):
        td = env.step(actions(env, {0: EAST}))
        carbon.append(int(env.state["inv"][0, 0, CARBON]))
        rewards.append(td[keys.REWARDS].tolist())
    assert carbon == [1, 1, 1, 2, 2, 2, 2]  # ready again 3 steps after a use; capped at 2
    assert rewards[0] == [0.5, 0.0, 0.0, 0.0] and rewards[1] == [0.0] * 4 and rewards[3][0] == 0.5
    assert rewards[6] == [0.0] * 4  # at the cap the extractor gives nothing
    assert render_ascii(env) == "\n".join(rows)  # using an object never moves the agent into it


def test_assembler_needs_one_of_each_resource():
    rows = ["#######", "#0&...#", "#.....#", "#1.2.3#", "#######"]
    env = hand_env(rows, heart_made_reward=0.25)
    env.state["inv"][0, 0] = torch.tensor([1, 1, 1, 0, 0])
    td = env.step(actions(env, {0: EAST}))
    assert env.state["inv"][0, 0].tolist() == [1, 1, 1, 0, 0] and td[keys.REWARDS].sum() == 0
    env.state["inv"][0, 0] = torch.tensor([2, 1, 1, 1, 0])
    td = env.step(actions(env, {0: EAST}))
    assert env.state["inv"][0, 0].tolist() == [1, 0, 0, 0, 1]
    assert td[keys.REWARDS].tolist() == [0.25, 0.0, 0.0, 0.0]


def test_chest_deposit_rewards_every_agent_of_the_env_only():
    rows = ["#######", "#0=...#", "#.....#", "#1.2.3#", "#######"]
    env = hand_env(rows, num_envs=2, heart_reward=1.5)
    env.state["inv"][0, 0, HEART] = 2
    env.state["inv"][1, 2, HEART] = 1  # env 1's agent 2 holds a heart but does not deposit
    td = env.step(actions(env, {0: EAST}))
    assert td[keys.REWARDS].tolist() == [3.0] * 4 + [0.0] * 4
    assert env.state["inv"][0, 0, HEART] == 0 and env.state["inv"][1, 2, HEART] == 1


def test_truncation_resets_in_place_and_accumulates_stats():
    rows = ["#######", "#0=...#", "#.....#", "#1.2.3#", "#######"]
    env = hand_env(rows, num_envs=2, max_steps=3, obstacle_density=0.2, extractors_per_resource=1, resource_reward=0.1)
    env.state["inv"][0, 0, HEART] = 2
    outs = [env.step(actions(env, {0: EAST}))] + [env.step(actions(env, {})) for _ in range(2)]
    assert [bool(o[keys.TRUNCATED].any()) for o in outs] == [False, False, True]
    assert outs[-1][keys.TRUNCATED].all() and not outs[-1][keys.TERMINATED].any()
    # The returned observation already belongs to the new episode: a fresh random layout at step 0.
    assert env.state["t"].tolist() == [0, 0] and env.state["inv"].sum() == 0
    assert render_ascii(env, 0) != "\n".join(rows)
    assert torch.equal(outs[-1][keys.OBS], env.observe()[keys.OBS])
    stats = {k: float(v) for k, v in env.episode_stats().items()}
    assert stats == {
        "episodes": 2.0,
        "return": 2.0,  # env 0: each agent got 2.0; env 1: 0
        "length": 6.0,
        "hearts_made": 0.0,
        "hearts_deposited": 2.0,
        "resources_gathered": 0.0,
    }
    assert all(float(v) == 0 for v in env.episode_stats().values())  # the call reset the sums


def test_first_episodes_are_staggered_and_resets_per_step_are_bounded():
    env = Machina1Env(num_envs=64, max_steps=20, seed=3)
    env.reset()
    ends = []
    for _ in range(40):
        td = env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        ends.append(td[keys.TRUNCATED].view(64, 4)[:, 0])
    ends = torch.stack(ends)  # [40, 64]
    first = ends.float().argmax(0) + 1  # step at which each env's first episode ended
    assert ends[:20].sum(0).tolist() == [1] * 64  # one end per env within the first max_steps steps
    assert len(set(first.tolist())) == 20  # spread over every possible length
    assert int(ends.sum(1).max()) <= math.ceil(64 / 20)
    assert torch.equal(ends[20:], ends[:20])  # afterwards every episode lasts max_steps
    stats = env.episode_stats()
    assert stats["episodes"] == 128 and stats["length"] == float(first.sum()) + 64 * 20


def test_reset_path_resets_exactly_the_ended_envs():
    env = Machina1Env(num_envs=40, max_steps=10, outputs=TEACHER, seed=5)
    env.reset()
    for _ in range(25):
        before = {k: v.clone() for k, v in env.state.items()}
        td = env.step(torch.randint(0, env.num_actions, (env.num_agents,)))
        ended = td[keys.TRUNCATED].view(40, 4)[:, 0]
        assert torch.equal(ended, before["t"] == 9)
        assert (env.state["t"][ended] == 0).all() and (env.state["t"][~ended] == before["t"][~ended] + 1).all()
        assert torch.equal(env.state["grid"][~ended], before["grid"][~ended])
        assert (env.state["inv"][ended] == 0).all()
    # First ends at steps 1..10, four envs each (balanced stagger), then every 10 steps: within 25 steps the 20
    # envs that first ended by step 5 ended three times, the other 20 twice.
    assert env.episode_stats()["episodes"] == 100


def random_rollout(env, steps, seed=123):
    g = torch.Generator().manual_seed(seed)
    obs = [env.reset()[keys.OBS]]
    for _ in range(steps):
        obs.append(env.step(torch.randint(0, env.num_actions, (env.num_agents,), generator=g))[keys.OBS])
    return torch.stack(obs)


def test_same_seed_same_trajectories_and_different_seed_differs():
    make = lambda seed: Machina1Env(num_envs=8, max_steps=30, seed=seed)  # noqa: E731
    a, b, c = random_rollout(make(5), 80), random_rollout(make(5), 80), random_rollout(make(6), 80)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], c[0]) and (a != c).float().mean() > 0.05


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(8, dtype=torch.float32), "int64"),
        (torch.zeros(7, dtype=torch.int64), r"shape \[8\]"),
        (torch.zeros(2, 4, dtype=torch.int64), r"shape \[8\]"),
        (torch.full((8,), 21, dtype=torch.int64), r"\[0, 21\)"),
        (torch.full((8,), -1, dtype=torch.int32), r"\[0, 21\)"),
        ([0] * 8, "torch.Tensor"),
    ],
)
def test_invalid_actions_raise_value_error(bad, match):
    env = Machina1Env(num_envs=2)
    with pytest.raises(ValueError, match=match):
        env.step(bad)


def test_int32_actions_are_accepted():
    env = Machina1Env(num_envs=2)
    assert env.step(torch.ones(8, dtype=torch.int32))[keys.OBS].shape == (8, 128, 3)


def test_state_dict_round_trip_resumes_identically(tmp_path):
    env = Machina1Env(num_envs=6, max_steps=15, seed=1, outputs=TEACHER)
    g = torch.Generator().manual_seed(0)
    acts = [torch.randint(0, env.num_actions, (env.num_agents,), generator=g) for _ in range(40)]
    env.reset()
    for a in acts[:10]:
        env.step(a)
    torch.save(env.state_dict(), tmp_path / "env.pt")
    expected = [env.step(a) for a in acts[10:]]
    resumed = Machina1Env(num_envs=6, max_steps=15, seed=99, outputs=TEACHER)
    resumed.load_state_dict(torch.load(tmp_path / "env.pt", weights_only=True))
    for a, want in zip(acts[10:], expected, strict=True):
        got = resumed.step(a)
        for k in (keys.OBS, keys.REWARDS, keys.TRUNCATED, keys.TEACHER_ACTIONS):
            assert torch.equal(got[k], want[k]), k
    got_stats, want_stats = resumed.episode_stats(), env.episode_stats()
    assert want_stats["episodes"] > 0 and all(torch.equal(got_stats[k], v) for k, v in want_stats.items())


def test_reset_output_keys_shapes_and_spec():
    env = Machina1Env(num_envs=3, outputs=TEACHER)
    td = env.reset()
    assert td.batch_size == (12,) and env.num_agents == 12 and env.device == torch.device("cpu")
    assert td[keys.OBS].dtype == torch.uint8 and td[keys.OBS].shape == (12, 128, 3)
    assert td[keys.REWARDS].dtype == torch.float32 and not td[keys.REWARDS].any()
    assert td[keys.TEACHER_ACTIONS].dtype == torch.int64 and td[keys.TEACHER_ACTIONS].shape == (12,)
    spec = env.spec
    assert spec.num_actions == 21 and spec.outputs == TEACHER
    assert spec.obs.window == 11 and spec.obs.num_features == len(spec.obs.feature_norms) == 9
    assert int(td[keys.OBS][:, :, 1][td[keys.OBS][:, :, 0] != 0xFF].max()) < spec.obs.num_features
    assert keys.TEACHER_ACTIONS not in Machina1Env(num_envs=3).reset().keys()  # asked for nothing: not computed


def test_hydra_config_instantiates_the_env():
    cfg = OmegaConf.load(ROOT / "conf" / "env" / "machina_1.yaml")
    env = instantiate(cfg, num_envs=2)
    assert isinstance(env, Machina1Env) and env.num_agents == 8 and env.spec.num_actions == 21


def test_render_ascii_frame_and_png(tmp_path):
    rows = ["#######", "#0C.O.#", "#.o&..#", "#1=2S3#", "#######"]
    env = hand_env(rows)
    env.state["inv"][0, 0] = torch.tensor([1, 0, 2, 0, 1])
    assert render_ascii(env) == "\n".join(rows)
    frame = render_frame(env, cell=8)
    assert frame.shape == (5 * 8, 7 * 8, 3) and frame.dtype.name == "uint8"
    assert (frame[0, 0] != frame[8 + 4, 8 * 5 + 4]).any()  # wall and floor differ
    save_png(frame, str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 0


def test_obs_specs_round_trip_through_plain_data_and_refuse_anything_else():
    from machina.env.spec import ObsSpec, VectorObsSpec, obs_spec_from_dict, obs_spec_to_dict

    tokens = ObsSpec(max_tokens=8, window=11, feature_names=("a", "b"), feature_norms=(1.0, 2.0))
    for spec in (tokens, VectorObsSpec(size=4)):
        assert obs_spec_from_dict(obs_spec_to_dict(spec)) == spec
    for bad in (
        {"kind": "pickle", "size": 4},
        {"kind": "vector", "size": 4, "extra": 1},
        {"kind": "vector", "size": {"_target_": "os.system"}},
        {"kind": "tokens", "max_tokens": 8, "window": 11, "feature_names": [["x"]], "feature_norms": [1.0]},
    ):
        with pytest.raises(ValueError, match="obs_spec"):
            obs_spec_from_dict(bad)


def test_without_stagger_every_env_plays_whole_episodes_and_last_episodes_holds_each_env_s_stats():
    env = Machina1Env(num_envs=5, max_steps=12, seed=2, stagger=False, outputs=TEACHER)
    assert env.state["t"].tolist() == [0] * 5
    returns = torch.zeros(5)
    for step in range(12):
        assert env.last_episodes()["episodes"].tolist() == [0.0] * 5
        td = env.step(env.observe()[keys.TEACHER_ACTIONS])
        returns += td[keys.REWARDS].view(5, 4).sum(1)
        assert td[keys.TRUNCATED].all() == (step == 11)
    last = env.last_episodes()
    assert last["episodes"].tolist() == [1.0] * 5 and last["length"].tolist() == [12.0] * 5
    torch.testing.assert_close(last["return"], returns / 4)  # per-agent return, summed from the rewards
    assert (last["hearts_made"] >= last["hearts_deposited"]).all() and last["resources_gathered"].sum() > 0
    stats = env.episode_stats()
    assert stats["episodes"] == 5 and torch.isclose(stats["return"], returns.sum() / 4)
    assert stats["hearts_made"] == last["hearts_made"].sum() and stats["length"] == 60


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("num_envs", 0, "env.num_envs=0 must be an integer >= 1"),
        ("agents_per_env", 11, "env.agents_per_env=11 must be an integer in 1..10"),
        ("height", 2.5, "env.height=2.5 must be an integer >= 1"),
        ("max_steps", True, "env.max_steps=True must be an integer >= 1"),
        ("num_vibes", 300, "env.num_vibes=300 must be an integer in 0..256"),
        ("extractor_cooldown", -1, "env.extractor_cooldown=-1 must be an integer in 0..255"),
        ("inventory_cap", 0, "env.inventory_cap=0 must be an integer in 1..255"),
        ("extractors_per_resource", 0, "env.extractors_per_resource=0 must be an integer >= 1"),
        ("obstacle_density", 1.0, "env.obstacle_density=1.0 must be a number in [0, 1)"),
        ("heart_reward", float("nan"), "env.heart_reward=nan must be a finite number"),
        ("stagger", "yes", "env.stagger='yes' must be true or false"),
        ("width", 499, "env.height=11 plus env.width=499 must be at most 500"),
        ("max_tokens", 21, "env.max_tokens=21 is too small: every observation must hold 22 tokens"),
        ("obstacle_density", 0.9, "do not fit in a 11x11 interior"),
    ],
)
def test_invalid_settings_are_refused_naming_the_setting_and_value(setting, value, message):
    with pytest.raises(ConfigError) as refused:
        Machina1Env(**{"num_envs": 2, setting: value})
    assert message in str(refused.value)


def test_max_tokens_at_the_minimum_keeps_every_uncut_token():
    # 6 centre + 2 per agent + 1 per extractor = 6 + 8 + 4 with one extractor per resource.
    env = Machina1Env(
        num_envs=3, extractors_per_resource=1, max_tokens=18, extractor_cooldown=50, seed=1, outputs=TEACHER
    )
    big = Machina1Env(num_envs=3, extractors_per_resource=1, max_tokens=200, extractor_cooldown=50, seed=1)
    for _ in range(30):
        a = env.observe()[keys.TEACHER_ACTIONS]
        small, full = env.step(a)[keys.OBS], big.step(a)[keys.OBS]
        assert torch.equal(small, full[:, :18])
    with pytest.raises(ConfigError, match="set env.max_tokens >= 18"):
        Machina1Env(num_envs=3, extractors_per_resource=1, max_tokens=17)


def play(env, steps, seed=0):
    """Outputs of ``steps`` random steps, then the episode stats."""
    g = torch.Generator().manual_seed(seed)
    outs = [env.step(torch.randint(0, env.num_actions, (env.num_agents,), generator=g)) for _ in range(steps)]
    return outs, env.episode_stats()


@pytest.mark.parametrize("saved_with, resumed_with", [(False, True), (True, False)])
def test_state_dict_resumes_across_teacher_on_and_off(saved_with, resumed_with):
    settings = dict(num_envs=6, max_steps=9, seed=4)
    env = Machina1Env(outputs=TEACHER if saved_with else (), **settings)
    play(env, 13)
    state = env.state_dict()
    reference = Machina1Env(outputs=TEACHER, **settings)  # the uninterrupted run, with the teacher for comparison
    play(reference, 13)
    want, want_stats = play(reference, 20)
    resumed = Machina1Env(outputs=TEACHER if resumed_with else (), **{**settings, "seed": 99})
    resumed.load_state_dict(state)
    got, got_stats = play(resumed, 20)
    for g, w in zip(got, want, strict=True):
        for key in (keys.OBS, keys.REWARDS, keys.TRUNCATED):
            assert torch.equal(g[key], w[key]), key
        assert (keys.TEACHER_ACTIONS in g.keys()) == resumed_with
        if resumed_with:  # the distance fields were recomputed on load
            assert torch.equal(g[keys.TEACHER_ACTIONS], w[keys.TEACHER_ACTIONS])
    assert all(torch.equal(got_stats[k], v) for k, v in want_stats.items())


def test_state_dict_holds_what_resume_needs_not_derived_fields():
    env = Machina1Env(num_envs=256)
    state = env.state_dict()
    assert not {"dist", "dist_words", "type_tokens", "ext_of_cell", "grid"} & state.keys()
    assert state["map"].dtype == torch.uint8 and state["map"].shape == (256, 13, 13)
    size = sum(v.numel() * v.element_size() for v in state.values())
    assert size < 300_000, size  # about 240 KB at 256 envs: maps, agents, stats, the pool's layouts, two RNG states
    with pytest.raises(ValueError, match="is missing or has the wrong shape"):
        Machina1Env(num_envs=8).load_state_dict(state)


def test_ended_envs_restart_from_the_pool_in_ring_order_and_the_step_draws_no_random_numbers():
    env = Machina1Env(num_envs=8, max_steps=4, seed=6)
    grids = env.episodes.views(env.pool.rows)["grid"].clone()
    rng = env.generator.get_state()
    taken = []
    for _ in range(4):
        before = env.state["t"].clone()
        env.step(torch.zeros(env.num_agents, dtype=torch.int64))
        ended = (before == env.max_steps - 1).nonzero().flatten().tolist()
        taken += [(e, env.state["grid"][e].clone()) for e in ended]
    assert torch.equal(env.generator.get_state(), rng)  # steps use the pool only
    assert len(taken) == 8  # 4-step episodes: every env ended once, in ring order of the pool's rows
    for row, (_, grid) in enumerate(taken):
        assert torch.equal(grid, grids[row])
    env.prepare_rollout()  # refills the rows the last 4 steps could take: capacity 2 x 4 steps = all 8
    assert not torch.equal(env.episodes.views(env.pool.rows)["grid"], grids)


def test_a_rollout_longer_than_the_pool_reuses_its_rows_deterministically():
    def run():
        env = Machina1Env(num_envs=4, max_steps=3, seed=8)
        grids = []
        for _ in range(30):  # 10 ends per env, 40 restarts from a pool of 4 rows with no refill
            env.step(torch.ones(env.num_agents, dtype=torch.int64))
            grids.append(env.state["grid"].clone())
        return env, torch.stack(grids)

    env, first = run()
    _, second = run()
    assert torch.equal(first, second)
    pool = env.episodes.views(env.pool.rows)["grid"]
    assert all(any(torch.equal(g, p) for p in pool) for g in first[-1])  # every env plays one of the pool's maps


def test_resume_between_rollouts_refills_the_pool_as_the_uninterrupted_run_does():
    def rollout(env):
        env.prepare_rollout()
        return play(env, 11)[0]

    env = Machina1Env(num_envs=12, max_steps=6, seed=3)
    rollout(env)
    state = env.state_dict()
    want = rollout(env) + rollout(env)
    resumed = Machina1Env(num_envs=12, max_steps=6, seed=0)
    resumed.load_state_dict(state)
    got = rollout(resumed) + rollout(resumed)
    assert all(torch.equal(g[keys.OBS], w[keys.OBS]) for g, w in zip(got, want, strict=True))
