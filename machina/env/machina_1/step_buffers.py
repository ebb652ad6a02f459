"""Scratch tensors of one machina_1 step (``Machina1Env.step``): allocated once, so that a step keeps every shape
and allocates nothing but the copies it hands out, which a CUDA graph capture needs."""

import torch


class StepBuffers:
    """Scratch tensors of one step for E envs x A agents (int64 unless said), allocated once, with the views the
    step reads them through made once too (a view made per step is one more op per step)."""

    def __init__(self, e: int, a: int, dev: torch.device):
        def ints(*shape: int, dtype=torch.int64) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=dev)

        self.check, self.delta, self.kind, self.walk, self.free = (ints(e, a) for _ in range(5))
        self.claims = ints(e, 2 * a)  # this step's targets, then the cells the agents start the step on
        self.target, self.start = self.claims[:, :a], self.claims[:, a:]
        self.target3, self.claims3 = self.target.view(e, a, 1), self.claims.view(e, 1, 2 * a)
        self.clash = ints(e, a, 2 * a)
        self.slot, self.resource, self.cool, self.has_all = (ints(e, a) for _ in range(4))
        self.resource3 = self.resource.view(e, a, 1)
        self.room3 = ints(e, a, 1)
        self.room = self.room3.view(e, a)
        # What each agent did this step, and per env: hearts made, hearts deposited, resources gathered.
        self.events = ints(e, a, 3)
        self.craft, self.deposit, self.gain = self.events.unbind(2)
        self.craft3, self.gain3 = self.craft.unsqueeze(2), self.gain.unsqueeze(2)
        self.env_events = ints(e, 3)
        self.env_deposited = self.env_events[:, 1:2]
        self.reward_index = ints(e, a)
        self.done = ints(e, dtype=torch.bool)
        self.done1, self.done_ea = self.done.view(e, 1), self.done.view(e, 1).expand(e, a)
        self.done_i = ints(e)
        self.done_i1 = self.done_i.view(e, 1)
        self.ended = ints(e, 5)
