"""Token observations: decode them back to the window and compare with the grid; padding; dropping the farthest."""

import torch

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.grid import AGENT, CENTRE_LOC, F_COOLDOWN, F_INV, F_PROGRESS, F_TYPE, F_VIBE, RADIUS
from machina.env.machina_1.obs import HALF, REAL
from machina.env.spec import PAD_TOKEN

NOOP, NORTH, EAST, SOUTH, WEST = range(5)


def decode(tokens: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """uint8 [M, 3] -> sorted (dy, dx, feature, value) of the real tokens; asserts padding comes last."""
    real = tokens[:, 0] != PAD_TOKEN
    n = int(real.sum())
    assert real[:n].all() and (tokens[n:] == PAD_TOKEN).all(), "padding must follow all real tokens"
    return sorted((int(t[0]) >> 4, int(t[0]) & 15, int(t[1]), int(t[2])) for t in tokens[:n])


def expected_tokens(env: Machina1Env, agent: int) -> list[tuple[int, int, int, int]]:
    """What agent ``agent`` should see, computed cell by cell from the state tensors."""
    s, g = env.state, env.geom
    e, slot = divmod(agent, env.agents_per_env)
    grid = s["grid"][e]
    agents_at = {int(p): k for k, p in enumerate(s["pos"][e])}
    cooldown_at = {int(p): int(c) for p, c in zip(s["ext_pos"][e], s["cooldown"][e], strict=False) if p != 0}
    out = [(RADIUS, RADIUS, F_INV + i, int(v)) for i, v in enumerate(s["inv"][e, slot]) if v > 0]
    progress = min(int(s["t"][e]) * 256 // env.max_steps, 255)
    out += [(RADIUS, RADIUS, F_PROGRESS, progress)] if progress else []
    here = int(s["pos"][e, slot])
    for dy in range(-RADIUS, RADIUS + 1):
        for dx in range(-RADIUS, RADIUS + 1):
            cell = here + dy * g.pcols + dx
            y, x = dy + RADIUS, dx + RADIUS
            if cell in agents_at:
                out.append((y, x, F_TYPE, AGENT))
                vibe = int(s["vibe"][e, agents_at[cell]])
                out += [(y, x, F_VIBE, vibe)] if vibe else []
            elif grid[cell] != 0:
                out.append((y, x, F_TYPE, int(grid[cell])))
                if cooldown_at.get(cell, 0) > 0:
                    out.append((y, x, F_COOLDOWN, cooldown_at[cell]))
    return sorted(out)


def test_tokens_decode_back_to_the_grid_for_every_agent():
    env = Machina1Env(num_envs=6, max_steps=50, extractor_cooldown=20, seed=2, outputs={keys.TEACHER_ACTIONS})
    g = torch.Generator().manual_seed(1)
    td = env.reset()
    teacher = td[keys.TEACHER_ACTIONS]
    for _ in range(30):  # teacher moves fill inventories and cool extractors down; random vibes
        vibes = torch.randint(5, env.num_actions, (env.num_agents,), generator=g)
        td = env.step(torch.where(torch.rand(env.num_agents, generator=g) < 0.2, vibes, teacher))
        teacher = td[keys.TEACHER_ACTIONS]
    s = env.state
    assert (s["inv"] > 0).any() and (s["vibe"] > 0).any() and (s["cooldown"] > 0).any()
    for agent in range(env.num_agents):
        assert decode(td[keys.OBS][agent]) == expected_tokens(env, agent), agent


def test_own_inventory_at_centre_and_others_vibe_and_cooldown_visible():
    rows = ["#######", "#0C.1.#", "#.....#", "#2...3#", "#######"]
    env = Machina1Env.from_ascii(rows, max_steps=100, extractor_cooldown=6)
    a = torch.zeros(env.num_agents, dtype=torch.int64)
    a[0], a[1] = EAST, 5 + 3  # agent 0 gathers carbon, agent 1 sets vibe 3
    obs = env.step(a)[keys.OBS]
    toks = decode(obs[0])
    assert (RADIUS, RADIUS, F_INV + 0, 1) in toks  # one carbon, at the centre
    assert (RADIUS, RADIUS + 1, F_COOLDOWN, 6) in toks  # the extractor east of it cools down
    assert (RADIUS, RADIUS + 3, F_TYPE, AGENT) in toks and (RADIUS, RADIUS + 3, F_VIBE, 3) in toks
    assert (RADIUS, RADIUS, F_TYPE, AGENT) in toks  # itself
    assert int(obs[0, 0, 0]) == CENTRE_LOC  # centre tokens come first
    assert (RADIUS, RADIUS, F_VIBE, 3) in decode(obs[1])  # agent 1 sees its own vibe too


def test_when_tokens_overflow_the_farthest_map_tokens_are_dropped():
    settings = dict(num_envs=4, max_steps=40, obstacle_density=0.3, seed=4)
    big, small = Machina1Env(max_tokens=200, **settings), Machina1Env(max_tokens=24, **settings)
    full, cut = big.reset()[keys.OBS], small.reset()[keys.OBS]
    real = full[:, :, 0] != PAD_TOKEN
    assert (real.sum(1) > 24).all()  # every agent has more than 24 tokens
    assert torch.equal(cut, full[:, :24])
    # The static map's type tokens come after the agent / vibe / cooldown tokens, nearest first.
    static = real & (full[:, :, 1] == F_TYPE) & (full[:, :, 2] != AGENT)
    first_static = static.float().argmax(1, keepdim=True)
    position = torch.arange(full.shape[1])
    assert (static == (real & (position >= first_static))).all()
    dist = ((full[:, :, 0] >> 4).long() - RADIUS) ** 2 + ((full[:, :, 0] & 15).long() - RADIUS) ** 2
    dist = torch.where(static, dist, torch.where(position < first_static, -1, 10**6))
    assert (dist[:, 1:] >= dist[:, :-1]).all()
    assert (first_static < 24).all()  # so the cut kept every agent / vibe / cooldown / centre token


def test_compaction_keeps_order_pads_and_cuts_at_max_tokens():
    env = Machina1Env(num_envs=16, max_tokens=22)  # 64 agents, 22 tokens (the smallest allowed)
    n, c = env.encoder.candidates.shape
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 1 << 24, (n, c), generator=g, dtype=torch.int32)  # three random bytes each
    real = torch.rand(n, c, generator=g) < torch.linspace(0, 0.3, n).unsqueeze(1)  # 0 to ~43 real ones per row
    half = torch.rand(n, c, generator=g) < 0.5  # an object out of view, or a location without a token: not real
    obs = env.encoder.compact(tokens | torch.where(real, REAL, torch.where(half, HALF, 0)).int())
    for row, keep, got in zip(tokens, real, obs, strict=True):
        want = [[int(t) & 255, int(t) >> 8 & 255, int(t) >> 16] for t in row[keep]][:22]
        assert got.tolist() == want + [[PAD_TOKEN] * 3] * (22 - len(want))
    assert real.sum(1).min() == 0 and real.sum(1).max() > 22


def test_max_tokens_sets_the_observation_width():
    env = Machina1Env(num_envs=2, max_tokens=30)
    obs = env.reset()[keys.OBS]
    assert obs.shape == (8, 30, 3) and obs.is_contiguous()
