"""The scripted teacher of the machina_1 env, batched in torch.

Objects never move within an episode, so the teacher computes, once per (re)generated layout, one distance field
per goal kind (extractors of each of the 4 resources, the assembler, the chest): for every walkable cell, the number
of steps to *use* the nearest object of that kind (walk next to it, then move into it). Fields are built by
iterative min-relaxation (a breadth-first search written as ``sweeps`` tensor sweeps over all envs at once).

Each step, every agent picks its goal from its inventory and moves to the neighbour with the smallest distance:

- holding a heart -> the chest (deposit);
- holding one unit of every resource -> the assembler (craft);
- otherwise -> the nearest extractor of any resource it lacks. An extractor on cooldown is waited out by bumping
  into it (the teacher ignores cooldowns).

Neighbour cells occupied by another agent count as blocked, so agents step around each other; where no neighbour
leads to the goal (blocked in, or the goal is walled off) the teacher plays noop.
"""

import torch

from machina.env.grid import ASSEMBLER, CHEST, EMPTY, EXTRACTOR, HEART, NUM_GOALS, NUM_RESOURCES

INF = 30000  # "unreachable" in the int16 distance fields; INF + sweeps must stay below the int16 max


def distance_fields(grid: torch.Tensor, inside: torch.Tensor, pcols: int, sweeps: int) -> torch.Tensor:
    """Distance fields int16 [K, cells, NUM_GOALS] of K layouts (goal-minor, so that one gather per neighbour cell
    reads all goals from one cache line).

    grid: uint8 [K, cells] object types; inside: bool [cells], True on the bordered map (False on the margin).
    Distance 0 marks the goal objects themselves; distance d >= 1 on a walkable cell means d moves to use the
    nearest goal object; unreachable cells (or farther than ``sweeps`` moves) hold INF.
    """
    k, cells = grid.shape
    goal_types = torch.tensor([EXTRACTOR + r for r in range(NUM_RESOURCES)] + [ASSEMBLER, CHEST], device=grid.device)
    targets = grid.unsqueeze(1) == goal_types.view(1, -1, 1).to(grid.dtype)  # [K, G, cells]
    walk = ((grid == EMPTY) & inside).unsqueeze(1).expand(k, NUM_GOALS, cells).reshape(-1)
    dist = torch.full(targets.shape, INF, dtype=torch.int16, device=grid.device).masked_fill_(targets, 0).view(-1)
    # One flat vector for all K * G boards: a shift by +-1 or +-pcols that crosses from one board into the next
    # lands on margin cells, which are never walkable, so the boards do not leak into each other.
    for _ in range(sweeps):
        nb = dist.clone()
        torch.minimum(nb[pcols:], dist[:-pcols], out=nb[pcols:])
        torch.minimum(nb[:-pcols], dist[pcols:], out=nb[:-pcols])
        torch.minimum(nb[1:], dist[:-1], out=nb[1:])
        torch.minimum(nb[:-1], dist[1:], out=nb[:-1])
        nb += 1
        dist = torch.where(walk, nb, dist)
    return dist.clamp_(max=INF).view(k, NUM_GOALS, cells).transpose(1, 2).contiguous()


def teacher_actions(dist: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """The teacher's action int64 [E * A] for every agent.

    dist: int16 [E, cells, NUM_GOALS] distance fields; pos: int64 [E, A] agent cells; inv: int16 [E, A, 5]
    inventories (4 resources, hearts); deltas: int64 [5] flat move offsets of noop, N, E, S, W.
    """
    e, a = pos.shape
    nbr = pos.unsqueeze(-1) + deltas[1:]  # [E, A, 4] neighbour cells in action order N, E, S, W
    goal = torch.arange(NUM_GOALS, device=pos.device)
    idx = (nbr.unsqueeze(-1) * NUM_GOALS + goal).view(e, -1)  # [E, A * 4 * G] into dist viewed as [E, cells * G]
    nd = dist.view(e, -1).gather(1, idx).view(e, a, 4, NUM_GOALS)

    has_heart = inv[..., HEART] > 0
    lacking = inv[..., :NUM_RESOURCES] == 0
    complete = ~lacking.any(-1)
    goals = torch.cat([lacking & ~has_heart.unsqueeze(-1), (complete & ~has_heart).unsqueeze(-1)], -1)
    goals = torch.cat([goals, has_heart.unsqueeze(-1)], -1)  # [E, A, G]: the goal kinds this agent heads for
    cost = nd.masked_fill(~goals.unsqueeze(2), INF).amin(-1)  # [E, A, 4]
    occupied = (nbr.unsqueeze(-1) == pos.view(e, 1, 1, a)).any(-1)
    cost = cost.masked_fill(occupied, INF)
    best, move = cost.min(-1)  # first minimum on ties: N before E before S before W
    return torch.where(best < INF, move + 1, 0).view(-1)
