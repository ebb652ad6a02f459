"""Fresh machina_1 episodes as int64 rows (``Episodes``), and the pool that ended envs restart from (``EpisodePool``).

Why a pool: generating a layout (a random permutation of the interior) and the teacher's distance fields (a 2 *
(height + width)-sweep search) takes hundreds of tensor ops. Done inside ``step`` for the few envs that end, it
would cost more than the step itself, and on an accelerator it must run every step at a fixed size whether or not
an env ended. Instead, ``EpisodePool.refill`` (``Machina1Env.prepare_rollout``, called by the trainer before each
rollout) generates fresh episodes in one batch, and ``reset_ended`` copies pool rows into the ended envs with one
fixed-size gather: no layout generation, no search and no random draw inside a step.

Ring order: the k-th env that ends (counting in env order) takes the k-th row after the row taken last (the
cursor, a device tensor). ``refill(steps)`` regenerates the rows that the next ``steps`` steps can take at most,
``capacity * steps`` rows after the cursor (capacity: the most envs that end on one step), at positions computed
on the device: no count is read back. Rows that were not taken stay for later rollouts.

Size: the pool holds ``num_envs`` rows. That covers any rollout of up to ``num_envs / capacity`` steps, about
``max_steps`` steps with staggered starts (the default rollout is 64 steps, max_steps 200). A longer rollout goes
round the ring: envs restart on episodes that earlier resets of the same rollout already played. Still valid,
still deterministic for a seed, and no host read; only less varied.
"""

import torch

from machina.env.machina_1 import layout as layouts
from machina.env.machina_1.grid import ASSEMBLER, CHEST, EMPTY, EXTRACTOR, INVENTORY_SLOTS, WALL, Geometry
from machina.env.machina_1.obs import type_tokens
from machina.env.machina_1.rows import RowFormat
from machina.env.machina_1.teacher import GOAL_SLOTS, INF, distance_fields
from machina.errors import ConfigError
from machina.files import saved_state


class Episodes:
    """The layout of one env's state, and fresh episodes (step 0, empty inventories) in that layout.

    An env's state is one row in each of two blocks (``rows.py``): ``episode`` (the agents, the extractors' cells and
    cooldowns, the step counter, this episode's counts: about 50 numbers) and ``map`` (per cell: the object type,
    its type token, its extractor slot and, with the teacher, the distance fields). Apart, the small fields of all
    envs sit together in memory, which every step reads many times; the maps are read once per step.
    A ``Rows`` value maps each block's name to its int64 [K, width] tensor.

    ``COUNTS``: columns of the ``ep`` field, this episode's counts. ``episodes`` is always 1 (the episode itself),
    so that summing the ``ep`` rows of ended envs counts them too.
    """

    COUNTS = ("length", "episodes", "hearts_made", "hearts_deposited", "resources_gathered")
    DYNAMIC = ("pos", "inv", "vibe", "cooldown", "t", "ep")  # what changes within an episode (saved as is)

    def __init__(
        self,
        geom: Geometry,
        sampler: layouts.LayoutSampler,
        max_steps: int,
        teacher: bool,
        generator: torch.Generator,
    ):
        self.geom, self.sampler, self.max_steps, self.teacher = geom, sampler, max_steps, teacher
        self.generator = generator
        p, a, x = geom.cells, sampler.agents, sampler.num_extractors
        episode = {"ext_pos": (x,), "pos": (a,), "inv": (a, INVENTORY_SLOTS), "vibe": (a,), "cooldown": (x + 1,)}
        episode |= {"t": (), "ep": (len(self.COUNTS),)}
        # The type tokens are int32, two per int64 word: half the memory that every step reads the windows from.
        board = {"type_token_words": ((p + 1) // 2,), "grid": (p,), "ext_of_cell": (p,)}
        if teacher:
            board["dist_words"] = (p * GOAL_SLOTS // 4,)  # int16 [cells, GOAL_SLOTS] as int64 words
        self.formats = {"episode": RowFormat(episode), "map": RowFormat(board)}
        start = self.formats["episode"].start["t"]
        assert self.COUNTS[0] == "length" and self.formats["episode"].start["ep"] == start + 1
        self.clock = slice(start, start + 2)  # the step counter and the episode's length, side by side
        self.map_cells = geom.map_cells(sampler.interior.device)
        self.sweeps = 2 * (geom.height + geom.width)  # paths longer than this count as unreachable for the teacher

    def empty(self, count: int) -> dict[str, torch.Tensor]:
        """Rows of ``count`` envs, zero."""
        device = self.map_cells.device
        return {b: torch.zeros(count, f.width, dtype=torch.int64, device=device) for b, f in self.formats.items()}

    def views(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named views of ``rows`` (``RowFormat.views``), plus ``type_tokens`` int32 [K, cells] and, with the teacher,
        ``dist`` int16 [K, cells, 8]."""
        views = {name: v for block, f in self.formats.items() for name, v in f.views(rows[block]).items()}
        views["type_tokens"] = views["type_token_words"].view(torch.int32)[:, : self.geom.cells]
        if self.teacher:
            views["dist"] = views["dist_words"].view(torch.int16).view(-1, self.geom.cells, GOAL_SLOTS)
        return views

    def fresh(self, lay: layouts.Layout) -> dict[str, torch.Tensor]:
        """The first state of an episode on each of K layouts."""
        rows = self.empty(lay.grid.shape[0])
        v = self.views(rows)
        v["grid"].copy_(lay.grid)
        v["type_tokens"].copy_(type_tokens(lay.grid))
        v["ext_of_cell"].copy_(layouts.extractor_slots(lay.ext_pos, self.geom.cells))
        v["ext_pos"].copy_(lay.ext_pos)
        v["pos"].copy_(lay.agent_pos)
        v["cooldown"][:, -1] = 1  # the slot of "no extractor": never ready, so using a non-extractor gains nothing
        v["ep"][:, self.COUNTS.index("episodes")] = 1
        if self.teacher:
            v["dist"].fill_(INF)
            v["dist"][:, self.map_cells] = distance_fields(lay.grid[:, self.map_cells], self.geom.cols, self.sweeps)
        return rows

    def save(self, rows: dict[str, torch.Tensor], prefix: str = "", dynamic: bool = True) -> dict[str, torch.Tensor]:
        """What resume needs of ``rows``: the bordered maps' object types (uint8), the extractors' cells and, with
        ``dynamic``, the fields that change within an episode (else only the agents' start cells)."""
        v = self.views(rows)
        maps = v["grid"][:, self.map_cells].to(torch.uint8).view(-1, self.geom.rows, self.geom.cols)
        saved = {"map": maps, "ext_pos": v["ext_pos"].clone()}
        saved |= {k: v[k].clone() for k in (self.DYNAMIC if dynamic else ("pos",))}
        return {prefix + k: value for k, value in saved.items()}

    def load(
        self, d: dict[str, torch.Tensor], count: int, prefix: str = "", dynamic: bool = True
    ) -> dict[str, torch.Tensor]:
        """``count`` envs' rows rebuilt from ``save``'s entries in ``d`` (derived fields recomputed), once they are
        checked (``check``)."""
        grid = self.check(d, count, prefix, dynamic)
        lay = layouts.Layout(grid, d[prefix + "pos"].to(grid.device), d[prefix + "ext_pos"].to(grid.device))
        rows = self.fresh(lay)
        if dynamic:
            v = self.views(rows)
            for name in self.DYNAMIC:
                v[name].copy_(d[prefix + name])
        return rows

    def check(self, d: dict[str, torch.Tensor], count: int, prefix: str = "", dynamic: bool = True) -> torch.Tensor:
        """Refuse entries of ``save`` that would not be a valid state (ConfigError naming the entry): shapes and
        dtypes; maps of object types (no agents: they are not stored in the grid) inside a wall border; agents on
        distinct empty interior cells; each extractor slot on an interior extractor cell, its own, or unused (margin
        cell 0); with ``dynamic``, the step counter and episode length below ``max_steps`` and one episode per row.
        The ranges that are env settings (inventories, vibes, cooldowns) are the env's to check. Returns the boards
        of the maps, int64 [count, cells] on this env's device."""
        geom, fields, device = self.geom, self.formats["episode"].fields, self.map_cells.device
        entry = {name: (count, *fields[name]) for name in (*self.DYNAMIC, "ext_pos")}
        maps = saved_state.tensor(d, prefix + "map", (count, geom.rows, geom.cols), torch.uint8, 0, CHEST)
        border = torch.ones(geom.rows, geom.cols, dtype=torch.bool, device=maps.device)
        border[1:-1, 1:-1] = False
        saved_state.refuse_any((maps != WALL) & border, maps, prefix + "map", f"{WALL} (a wall) on the border")
        grid = geom.template(device).repeat(count, 1)
        grid[:, self.map_cells] = maps.to(device).view(count, -1).long()
        interior = torch.zeros(geom.cells, dtype=torch.bool, device=device)
        interior[geom.interior(device)] = True

        def kind_at(cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """Whether each cell is an interior one, and its object type (EMPTY where it is not)."""
            inside = (cells >= 0) & (cells < geom.cells)
            cells = torch.where(inside, cells, 0)
            return inside & interior[cells], torch.where(inside, grid.gather(1, cells), EMPTY)

        pos = saved_state.tensor(d, prefix + "pos", entry["pos"], torch.int64).to(device)
        on_interior, kind = kind_at(pos)
        saved_state.refuse_any(~on_interior | (kind != EMPTY), pos, prefix + "pos", "an empty interior cell")
        _refuse_shared(pos, prefix + "pos", "two agents")
        ext_pos = saved_state.tensor(d, prefix + "ext_pos", entry["ext_pos"], torch.int64).to(device)
        on_interior, kind = kind_at(ext_pos)
        extractor = on_interior & (kind >= EXTRACTOR) & (kind < ASSEMBLER)
        saved_state.refuse_any(~extractor & (ext_pos != 0), ext_pos, prefix + "ext_pos", "an extractor's cell or 0")
        unused = -torch.arange(ext_pos.shape[1], device=device)  # unused slots all hold cell 0: a stand-in each
        _refuse_shared(torch.where(ext_pos == 0, unused, ext_pos), prefix + "ext_pos", "two extractors")
        if dynamic:
            for name in ("inv", "vibe", "cooldown"):
                saved_state.tensor(d, prefix + name, entry[name], torch.int64)
            saved_state.tensor(d, prefix + "t", entry["t"], torch.int64, 0, self.max_steps - 1)
            ep = saved_state.tensor(d, prefix + "ep", entry["ep"], torch.int64, 0)
            length, episodes = (self.COUNTS.index(name) for name in ("length", "episodes"))
            saved_state.values(ep[:, length], f"{prefix}ep[:, {length}] (length)", 0, self.max_steps - 1)
            saved_state.values(ep[:, episodes], f"{prefix}ep[:, {episodes}] (episodes)", 1, 1)
        return grid


def _refuse_shared(cells: torch.Tensor, name: str, what: str) -> None:
    """Refuse a row of ``cells`` [K, M] that holds a cell twice, naming the row."""
    ordered = cells.sort(1).values
    shared = (ordered[:, 1:] == ordered[:, :-1]).any(1)
    if bool(shared.any()):
        raise ConfigError(f"{name}[{int(shared.nonzero()[0])}] puts {what} on one cell")


class EpisodePool:
    """``size`` fresh episodes taken in ring order; see the module docstring.

    ``capacity``: the most envs that can end on one step (ceil(num_envs / max_steps) with staggered starts,
    num_envs otherwise). Below num_envs, ``reset_ended`` copies exactly ``capacity`` rows per block each step (the
    ended envs and, to keep the shape fixed, others that copy their own row back); at num_envs it selects over all.
    """

    def __init__(self, episodes: Episodes, size: int, num_envs: int):
        self.episodes, self.size, self.num_envs = episodes, size, num_envs
        self.rows = episodes.empty(size)
        dev = episodes.map_cells.device
        self.cursor = torch.full((1,), -1, dtype=torch.int64, device=dev)  # ring index of the row taken last
        self.rank, self.row = (torch.empty(num_envs, dtype=torch.int64, device=dev) for _ in range(2))
        self.ended_so_far = self.rank[num_envs - 1 :]
        self.set_capacity(num_envs)

    def set_capacity(self, capacity: int) -> None:
        """Allocate the fixed-size buffers of ``reset_ended`` for ``capacity`` envs ending per step."""
        self.capacity = k = min(capacity, self.num_envs)
        dev = self.cursor.device
        self.fresh, self.current, self.pool_rows, self.env_rows = {}, {}, {}, {}
        if k < self.num_envs:
            self.top, self.env, self.env_row = (torch.empty(k, dtype=torch.int64, device=dev) for _ in range(3))
            self.take = torch.empty(k, 1, dtype=torch.bool, device=dev)
            self.top1 = self.top.view(k, 1)
        for block, rows in self.rows.items():
            width = rows.shape[1]
            self.fresh[block] = torch.empty(k, width, dtype=torch.int64, device=dev)
            # gather / scatter indices of whole rows
            self.pool_rows[block] = (self.row if k == self.num_envs else self.env_row).view(k, 1).expand(k, width)
            if k < self.num_envs:
                self.current[block] = torch.empty_like(self.fresh[block])
                self.env_rows[block] = self.env.view(k, 1).expand(k, width)

    def refill(self, steps: int | None = None) -> None:
        """Regenerate the rows that ``steps`` steps can take at most (every row when ``steps`` is None), from the
        generator: layouts, and distance fields with the teacher."""
        count = self.size if steps is None else min(self.size, self.capacity * steps)
        if count == 0:
            return
        episodes = self.episodes
        fresh = episodes.fresh(episodes.sampler.sample(count, episodes.generator))
        ahead = (self.cursor + 1 + torch.arange(count, device=self.cursor.device)) % self.size
        for block, rows in self.rows.items():
            if count == self.size:
                rows.copy_(fresh[block])
            else:
                rows.index_copy_(0, ahead, fresh[block])

    def reset_ended(self, rows: dict[str, torch.Tensor], done: torch.Tensor, done_col: torch.Tensor) -> None:
        """Overwrite the rows of the ended envs with the next pool rows, one fixed-size gather per block.
        done: int64 [E] 1 where an env ended; done_col: bool [E, 1], the same."""
        torch.cumsum(done, 0, out=self.rank)  # the k-th ended env (in env order) takes the k-th row after the cursor
        torch.add(self.rank, self.cursor, out=self.row).remainder_(self.size)
        self.cursor.add_(self.ended_so_far)
        if self.capacity == self.num_envs:
            for block, state in rows.items():
                torch.gather(self.rows[block], 0, self.pool_rows[block], out=self.fresh[block])
                torch.where(done_col, self.fresh[block], state, out=state)
            return
        torch._assert_async(self.ended_so_far <= self.capacity, "more envs ended in one step than the reset capacity")
        # The ended envs are among the `capacity` largest of `done`, whichever order topk returns them in.
        torch.topk(done, self.capacity, sorted=False, out=(self.top, self.env))
        torch.take(self.row, self.env, out=self.env_row)
        torch.gt(self.top1, 0, out=self.take)
        for block, state in rows.items():
            fresh, current = self.fresh[block], self.current[block]
            torch.gather(self.rows[block], 0, self.pool_rows[block], out=fresh)
            torch.gather(state, 0, self.env_rows[block], out=current)
            state.scatter_(0, self.env_rows[block], torch.where(self.take, fresh, current, out=fresh))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The pool's layouts (its derived fields are recomputed on load), the cursor and the capacity."""
        saved = self.episodes.save(self.rows, prefix="pool_", dynamic=False)
        return {**saved, "pool_cursor": self.cursor.clone(), "reset_capacity": torch.tensor(self.capacity)}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of a pool of the same size, once checked (ConfigError naming the entry): valid
        layouts (``Episodes.check``), a cursor >= -1 (it counts the rows taken, never wrapped) and a capacity in [1,
        num_envs]; the env checks that no more of its envs end on one step than that capacity."""
        cursor = saved_state.tensor(d, "pool_cursor", (1,), torch.int64, -1)
        capacity = saved_state.tensor(d, "reset_capacity", (), torch.int64, 1, self.num_envs)
        for block, rows in self.episodes.load(d, self.size, prefix="pool_", dynamic=False).items():
            self.rows[block].copy_(rows)
        self.cursor.copy_(cursor)
        self.set_capacity(int(capacity))
