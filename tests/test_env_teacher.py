"""The scripted teacher: shortest paths around walls, goal choice, and far better returns than random play."""

from collections import deque

import torch

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.grid import GOAL_ASSEMBLER, GOAL_CHEST
from machina.env.machina_1.teacher import INF

TEACHER = frozenset({keys.TEACHER_ACTIONS})

NOOP, NORTH, EAST, SOUTH, WEST = range(5)
MAZE = [
    "#########",
    "#0.#....#",
    "#..#.##.#",
    "#..#..#C#",
    "#.....#.#",
    "#1&=23#.#",
    "#########",
]


def bfs_use_distance(rows: list[str], target: str) -> dict[tuple[int, int], int]:
    """Moves needed from each free cell to use the nearest ``target`` object (plain BFS; agents ignored)."""
    free = {(y, x) for y, r in enumerate(rows) for x, c in enumerate(r) if c == "." or c.isdigit()}
    queue = deque((y, x) for y, r in enumerate(rows) for x, c in enumerate(r) if c == target)
    dist = dict.fromkeys(queue, 0)
    while queue:
        y, x = queue.popleft()
        for n in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
            if n in free and n not in dist:
                dist[n] = dist[(y, x)] + 1
                queue.append(n)
    return dist


def test_distance_fields_match_a_plain_bfs():
    env = Machina1Env.from_ascii(MAZE, max_steps=500, extractors_per_resource=1, outputs=TEACHER)
    g = env.geom
    for kind, char in ((0, "C"), (GOAL_ASSEMBLER, "&"), (GOAL_CHEST, "=")):
        want = bfs_use_distance(MAZE, char)
        field = env.state["dist"][0, :, kind]
        for y, row in enumerate(MAZE):
            for x, c in enumerate(row):
                if c == "." or c.isdigit():
                    assert int(field[g.index(y, x)]) == want.get((y, x), INF), (kind, y, x)
    assert int(env.state["dist"][0, :, 1].min()) == INF  # no oxygen extractor on this map


def test_teacher_walks_the_shortest_path_then_crafts_and_deposits():
    env = Machina1Env.from_ascii(
        MAZE, max_steps=500, extractors_per_resource=1, heart_made_reward=0, resource_reward=0, outputs=TEACHER
    )
    start = bfs_use_distance(MAZE, "C")[(1, 1)]
    td = env.observe()
    for _ in range(start):
        a = td[keys.TEACHER_ACTIONS].clone()
        a[1:] = NOOP  # only agent 0 plays
        td = env.step(a)
    assert env.state["inv"][0, 0].tolist() == [1, 0, 0, 0, 0]
    # Holding a full recipe it heads for the assembler; holding a heart, for the chest.
    env.state["inv"][0, 0] = torch.tensor([1, 1, 1, 1, 0])
    for _ in range(40):
        a = env.observe()[keys.TEACHER_ACTIONS].clone()
        a[1:] = NOOP
        td = env.step(a)
        if td[keys.REWARDS][0] > 0:  # deposited
            break
    assert td[keys.REWARDS].tolist() == [1.0] * 4 and env.state["inv"][0, 0].sum() == 0


def mean_return(env: Machina1Env, steps: int, policy) -> float:
    td = env.reset()
    total = torch.zeros(())
    for _ in range(steps):
        td = env.step(policy(td))
        total += td[keys.REWARDS].sum()
    return float(total) / env.num_agents


def test_teacher_scores_many_times_random_play():
    make = lambda: Machina1Env(num_envs=16, max_steps=100, seed=11, outputs=TEACHER)  # noqa: E731
    g = torch.Generator().manual_seed(0)
    teacher = mean_return(make(), 300, lambda td: td[keys.TEACHER_ACTIONS])
    random = mean_return(make(), 300, lambda td: torch.randint(0, 21, (64,), generator=g))
    assert teacher > 5.0  # several hearts deposited per agent over 300 steps
    assert teacher > 20 * max(random, 0.05), (teacher, random)
