"""The scripted teacher of the machina_1 env, batched in torch.

Objects never move within an episode, so the teacher computes, once per generated layout (when the env's pool of
fresh layouts is filled, never inside a step), one distance field per goal kind (extractors of each of the 4
resources, the assembler, the chest): for every walkable cell, the number of steps to *use* the nearest object of
that kind (walk next to it, then move into it). Fields are built by iterative min-relaxation (a breadth-first
search written as ``sweeps`` tensor sweeps over all layouts at once).

Each step, every agent picks its goal from its inventory and moves to the neighbour with the smallest distance:

- holding a heart -> the chest (deposit);
- holding one unit of every resource -> the assembler (craft);
- otherwise -> the nearest extractor of any resource it lacks. An extractor on cooldown is waited out by bumping
  into it (the teacher ignores cooldowns).

Neighbour cells occupied by another agent count as blocked, so agents step around each other; where no neighbour
leads to the goal (blocked in, or the goal is walled off) the teacher plays noop.
"""

import torch

from machina.env.machina_1.grid import (
    ASSEMBLER,
    CHEST,
    EMPTY,
    EXTRACTOR,
    HEART,
    INVENTORY_SLOTS,
    NUM_GOALS,
    NUM_RESOURCES,
)

INF = 30000  # "unreachable" in the int16 distance fields; INF + sweeps must stay below the int16 max
NOT_WANTED = 0x7FFF  # or-ed into the distances of goals an agent does not head for: above INF, whatever the distance
GOAL_SLOTS = 8  # goals per cell padded to 8 int16 = two int64 words, so that fields pack into the env's int64 rows

# Goal g is the object kind EXTRACTOR + g: the 4 resources' extractors, then the assembler, then the chest.
assert (ASSEMBLER, CHEST) == (EXTRACTOR + NUM_RESOURCES, EXTRACTOR + NUM_RESOURCES + 1)


def distance_fields(grid: torch.Tensor, cols: int, sweeps: int) -> torch.Tensor:
    """Distance fields int16 [K, cells, GOAL_SLOTS] of K bordered maps (goal-minor: one cell's goals are adjacent).

    grid: int64 [K, cells] object types of bordered maps (``rows x cols``, walls around, row-major). Distance 0
    marks the goal objects themselves; distance d >= 1 on a walkable cell means d moves to use the nearest goal
    object; unreachable cells (or farther than ``sweeps`` moves), walls, objects and the padding goals hold INF.
    """
    k, cells = grid.shape
    goal_kinds = torch.arange(EXTRACTOR, EXTRACTOR + NUM_GOALS, device=grid.device)
    targets = grid.unsqueeze(1) == goal_kinds.view(1, -1, 1)  # [K, G, cells]
    walk = (grid == EMPTY).unsqueeze(1).expand(k, NUM_GOALS, cells).reshape(-1)
    dist = torch.full(targets.shape, INF, dtype=torch.int16, device=grid.device).masked_fill_(targets, 0).view(-1)
    # One flat vector for all K * G maps: a shift by +-1 or +-cols that leaves a walkable cell's map lands on the
    # wall border, which is never walkable, so the maps do not leak into each other.
    for _ in range(sweeps):
        nb = dist.clone()
        torch.minimum(nb[cols:], dist[:-cols], out=nb[cols:])
        torch.minimum(nb[:-cols], dist[cols:], out=nb[:-cols])
        torch.minimum(nb[1:], dist[:-1], out=nb[1:])
        torch.minimum(nb[:-1], dist[1:], out=nb[:-1])
        nb += 1
        dist = torch.where(walk, nb, dist)
    fields = torch.full((k, cells, GOAL_SLOTS), INF, dtype=torch.int16, device=grid.device)
    fields[..., :NUM_GOALS] = dist.clamp_(max=INF).view(k, NUM_GOALS, cells).transpose(1, 2)
    return fields


def goal_masks() -> torch.Tensor:
    """int16 [32, GOAL_SLOTS]: row ``code`` is 0 for the goals an agent heads for and NOT_WANTED for the others,
    where bit i of ``code`` is set when inventory slot i is empty (slots 0-3: resources, slot 4: hearts)."""
    rows = []
    for code in range(1 << INVENTORY_SLOTS):
        lacking = [bool(code >> r & 1) for r in range(NUM_RESOURCES)]
        has_heart = not code >> HEART & 1
        wanted = [lack and not has_heart for lack in lacking] + [not any(lacking) and not has_heart, has_heart]
        rows.append([0 if w else NOT_WANTED for w in wanted] + [NOT_WANTED] * (GOAL_SLOTS - NUM_GOALS))
    return torch.tensor(rows, dtype=torch.int16)


class Teacher:
    """The teacher's action for every agent of E envs, written into one preallocated buffer per call.

    Bound to the env's state views at construction: ``fields`` int64 [E, 2 * cells] (the distance fields, int16
    [cells, GOAL_SLOTS] per env viewed as int64 words), ``pos`` int64 [E, A] agent cells, ``inv`` int64 [E, A, 5]
    inventories; ``deltas`` int64 [5] flat move offsets of noop, N, E, S, W. ``actions()`` reads them and returns
    int64 [E * A], a view of a buffer that the next call overwrites. Fixed shapes, no host reads.
    """

    def __init__(self, fields: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, deltas: torch.Tensor):
        e, a = pos.shape
        dev = pos.device
        self.fields, self.inv = fields, inv
        moves = deltas[1:]  # N, E, S, W
        self.pos3, self.pos4 = pos.view(e, a, 1), pos.view(e, a, 1, 1)
        self.others = pos.view(e, 1, 1, a)
        self.moves = moves
        self.word_offsets = 2 * moves.view(4, 1) + torch.arange(2, device=dev)  # [4, 2] words of a neighbour
        self.inventory_bits = 1 << torch.arange(INVENTORY_SLOTS, device=dev)
        # A neighbour's GOAL_SLOTS int16 distances are two int64 words; so is an agent's goal mask, so that or-ing
        # the mask into the distances works on four goals per integer.
        self.masks = goal_masks().to(dev).view(torch.int64).view(-1)  # [32 * 2]
        self.word_pair = torch.arange(2, device=dev)

        self.words = torch.empty(e, a * 4 * 2, dtype=torch.int64, device=dev)
        self.word_index = torch.empty_like(self.words)
        self.near = self.words.view(e, a, 4, 2)  # neighbours' distance words
        self.empty_slots = torch.empty(e, a, INVENTORY_SLOTS, dtype=torch.int64, device=dev)
        self.code = torch.empty(e, a, dtype=torch.int64, device=dev)
        self.mask_index = torch.empty(e, a, 2, dtype=torch.int64, device=dev)
        self.mask = torch.empty(e, a, 2, dtype=torch.int64, device=dev)
        self.cost_words = torch.empty(e, a, 4, 2, dtype=torch.int64, device=dev)
        self.cost = self.cost_words.view(torch.int16).view(e, a, 4, GOAL_SLOTS)
        # Column 0 is noop at INF: argmin picks it only when no move leads anywhere (first minimum on ties).
        self.choice = torch.full((e, a, 5), INF, dtype=torch.int16, device=dev)
        self.neighbour = torch.empty(e, a, 4, dtype=torch.int64, device=dev)
        self.occupied = torch.empty(e, a, 4, a, dtype=torch.bool, device=dev)
        self.blocked = torch.empty(e, a, 4, dtype=torch.bool, device=dev)
        self.out = torch.empty(e, a, dtype=torch.int64, device=dev)
        # Views made once: a view made in every call would be one more op per call.
        self.word_index4 = self.word_index.view(e, a, 4, 2)
        self.code3 = self.code.view(e, a, 1)
        self.mask4 = self.mask.view(e, a, 1, 2)
        self.move_cost = self.choice[..., 1:]
        self.neighbour4 = self.neighbour.view(e, a, 4, 1)
        self.flat_out = self.out.view(-1)

    def actions(self) -> torch.Tensor:
        torch.add(self.word_offsets, self.pos4, alpha=2, out=self.word_index4)
        torch.gather(self.fields, 1, self.word_index, out=self.words)
        # The goal kinds each agent heads for, from which inventory slots are empty.
        torch.eq(self.inv, 0, out=self.empty_slots)
        torch.sum(self.empty_slots.mul_(self.inventory_bits), -1, out=self.code)
        torch.add(self.word_pair, self.code3, alpha=2, out=self.mask_index)
        torch.take(self.masks, self.mask_index, out=self.mask)
        torch.bitwise_or(self.near, self.mask4, out=self.cost_words)
        torch.amin(self.cost, -1, out=self.move_cost)
        torch.add(self.pos3, self.moves, out=self.neighbour)
        torch.eq(self.neighbour4, self.others, out=self.occupied)
        torch.any(self.occupied, -1, out=self.blocked)
        self.move_cost.masked_fill_(self.blocked, INF)
        torch.argmin(self.choice, -1, out=self.out)  # first minimum on ties: N before E before S before W
        return self.flat_out
