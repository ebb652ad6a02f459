"""The scripted teacher of MettaGrid's arena game (``env=mettagrid_arena``): each agent's action computed from its
own observation tokens alone, batched in numpy over every agent a ``Sims`` steps (in the process or worker that
steps them, right after the step, so it costs no extra copy).

The arena's chain (``game.arena_config``): moving into a ``mine`` gives one ``ore``; moving into a ``converter`` with
``ore_per_heart`` ore turns them into a ``heart``, the reward. So each agent heads for a converter when it holds at
least ``ore_per_heart`` ore, else for a mine, along a shortest path inside its window:

- the window becomes bit rows (one uint16 per row, bit c = column c): cells holding any object (walls, mines,
  converters, other agents) are blocked, the goal kind's cells are the sources;
- a breadth-first search from the goals, one shift-and-or sweep over all agents at once per distance, until each
  agent's first neighbour (north, south, west, east: the move ids) is reached; the agent moves there (into the goal
  itself when it is next to it: that is using it);
- an agent that sees no reachable goal explores: the first free move in the order north, south, west, east rotated
  by its slot and the episode's progress, so that agents spread out and change heading as the episode goes on.

It uses only what the policy sees (the ``tag`` tokens of objects, the agent's ``inv:ore`` token at the window centre
and the episode-progress token), so it is a fair teacher for a learner with the same window. It ignores how many
hearts an agent holds (the inventory cap) and ore counts of 256 or more (the ``inv:ore:p1`` token).
"""

import numpy as np

from machina.env.mettagrid import game_file
from machina.errors import ConfigError

MOVES = ("move_north", "move_south", "move_west", "move_east")  # the neighbour order of the search
NEED = "a mine, a converter taking ore, the tokens tag / inv:ore / episode_completion_pct and the four moves"


class ArenaTeacher:
    """Teacher actions for the arena game ``cfg`` (a ``MettaGridConfig``); ConfigError (one line, naming what is
    missing) for a game without the arena's chain: ``supports`` says which games it plays."""

    def __init__(self, cfg):
        game = cfg.game
        problem = missing(cfg)
        if problem:
            raise ConfigError(f"the arena teacher (teacher_actions) needs {NEED}; this game has no {problem}")
        names, _ = game_file.feature_table(cfg)
        self.tag, self.ore, self.progress = (names.index(n) for n in ("tag", "inv:ore", "episode_completion_pct"))
        tags = game.id_map().tag_names()
        self.mine, self.converter = tags.index("type:mine"), tags.index("type:converter")
        self.ore_per_heart = converter_cost(cfg)
        actions = game_file.action_names(cfg)
        self.move_ids = np.array([actions.index(m) for m in MOVES], dtype=np.int64)
        self.noop = actions.index("noop") if "noop" in actions else int(self.move_ids[0])
        self.agents = game.num_agents
        self.rows, self.cols = game.obs.height, game.obs.width
        self.cr, self.cc = self.rows // 2, self.cols // 2  # the agent's own cell (where global tokens are moved too)
        self.full = np.uint16((1 << self.cols) - 1)
        self.sweeps = 2 * (self.rows + self.cols)  # more than any shortest path inside the window

    def actions(self, obs: np.ndarray, out: np.ndarray) -> None:
        """Write into ``out`` (int64 [n]) the teacher's action for each of ``obs`` (uint8 [n, M, 3], rows of whole
        envs: row i is slot ``i % agents_per_env``)."""
        n = obs.shape[0]
        loc, feat, val = obs[:, :, 0], obs[:, :, 1], obs[:, :, 2]
        centre = self.cr << 4 | self.cc
        own = loc == centre
        ore = np.where(own & (feat == self.ore), val, 0).max(1)
        progress = np.where(own & (feat == self.progress), val, 0).max(1)
        agent, token = np.nonzero((feat == self.tag) & ~own)
        row, col, kind = loc[agent, token] >> 4, loc[agent, token] & 15, val[agent, token]
        bit = np.left_shift(1, col, dtype=np.uint16)
        blocked = np.zeros((n, self.rows + 2), dtype=np.uint16)  # a padding row above and below: never passable
        np.bitwise_or.at(blocked, (agent, row + 1), bit)
        goal_kind = np.where(ore >= self.ore_per_heart, self.converter, self.mine)
        is_goal = kind == goal_kind[agent]
        goal = np.zeros_like(blocked)
        np.bitwise_or.at(goal, (agent[is_goal], row[is_goal] + 1), bit[is_goal])
        passable = ~blocked & self.full
        passable[:, [0, -1]] = 0
        choice = self.search(goal, passable)
        explore = choice < 0
        if explore.any():
            free = self.neighbours(passable | goal)[explore]  # bool [k, 4]
            start = (np.flatnonzero(explore) % self.agents + progress[explore] // 16) % 4
            order = (start[:, None] + np.arange(4)) % 4
            ranked = np.take_along_axis(free, order, 1)
            first = ranked.argmax(1)
            choice[explore] = np.where(ranked.any(1), order[np.arange(len(first)), first], -1)
        np.copyto(out, np.where(choice >= 0, self.move_ids[choice], self.noop))

    def search(self, goal: np.ndarray, passable: np.ndarray) -> np.ndarray:
        """int64 [n]: per agent, the index (in ``MOVES``) of the neighbour nearest a goal (ties: the earlier in
        ``MOVES``), -1 where no goal is reachable inside the window. Each sweep works on the agents still searching
        only (those that see a goal, can move, and whose search still grows)."""
        choice = np.full(goal.shape[0], -1, dtype=np.int64)
        rows = np.flatnonzero(goal.any(1) & self.neighbours(passable | goal).any(1))
        reach, passable = goal[rows], passable[rows]
        for _ in range(self.sweeps):
            if not rows.size:
                break
            hit = self.neighbours(reach)
            found = hit.any(1)
            choice[rows[found]] = hit[found].argmax(1)
            grown = reach | (reach << 1) | (reach >> 1)
            grown[:, 1:-1] |= reach[:, :-2] | reach[:, 2:]
            grown &= passable
            grown |= reach
            searching = ~found & (grown != reach).any(1)
            rows, reach, passable = rows[searching], grown[searching], passable[searching]
        return choice

    def neighbours(self, bits: np.ndarray) -> np.ndarray:
        """bool [n, 4]: whether each agent's north, south, west and east neighbour is set in ``bits``."""
        r, c = self.cr + 1, self.cc
        return np.stack(
            [bits[:, r - 1] >> c & 1, bits[:, r + 1] >> c & 1, bits[:, r] >> (c - 1) & 1, bits[:, r] >> (c + 1) & 1],
            axis=1,
        ).astype(bool)


def converter_cost(cfg) -> int | None:
    """The ore a converter takes per heart (its handler's ``actorHas`` ore filter), None if it has none."""
    handler = getattr(cfg.game.objects.get("converter"), "on_use_handler", None)
    for rule in getattr(handler, "filters", None) or ():
        amount = (getattr(rule, "resources", None) or {}).get("ore")
        if amount:
            return int(amount)
    return None


def missing(cfg) -> str:
    """What of the arena's chain the game ``cfg`` lacks (a short phrase), "" when the teacher can play it."""
    game = cfg.game
    names, _ = game_file.feature_table(cfg)
    tags = game.id_map().tag_names()
    needs = {
        "mine object": "type:mine" in tags,
        "converter taking ore": "type:converter" in tags and converter_cost(cfg) is not None,
        "tag / inv:ore / episode_completion_pct tokens": all(
            n in names for n in ("tag", "inv:ore", "episode_completion_pct")
        ),
        "move actions": set(MOVES) <= set(game_file.action_names(cfg)),
        "window of at most 15 x 15 cells": max(game.obs.height, game.obs.width) <= 15,
    }
    return ", ".join(what for what, ok in needs.items() if not ok)
