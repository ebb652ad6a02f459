"""CUDA-graph capture of the rollout forward (``system.cuda_graphs=true``).

A rollout step's policy forward is a few dozen small kernels over fixed shapes; at the batches a rollout uses,
their launch cost rather than their math bounds it on a GPU. Captured once, the whole forward replays as one launch.
What makes that sound here:

- the forward has fixed shapes and no host sync (the rollout guarantees both; ``tests/test_gpu.py`` checks them);
- the inputs are copied into static buffers before every replay, so the graph always reads the live step;
- parameters are only ever updated in place (optimizer steps, ``load_state_dict``), so every replay reads the
  current weights without a re-capture;
- the Gumbel noise of the action sampling comes from torch's CUDA generator, which graphs replay with fresh offsets.

The graph's outputs live in its static memory and the next replay overwrites them, while the rollout keeps the
recurrent state for the next step and losses may keep a step's actions (the EER kickstarter does): the kept outputs
are cloned out after each replay, a handful of device copies.
"""

import torch
from tensordict import TensorDict
from torch import nn


class GraphedForward:
    """Calls ``policy`` like the rollout does, through a CUDA graph captured at the first call.

    Args:
        policy: the policy, already on its CUDA device; called in place on a TensorDict of batch [N].
        keep: the output keys the caller reads; only these are returned (cloned out of the static memory).
        warmup: eager calls on a side stream before the capture (lazy initialisation, cuDNN/cuBLAS plans and a
            compiled policy's first compile must not happen inside the capture).

    Every call must pass the same keys, shapes and dtypes as the first; the returned TensorDict has batch [N].
    """

    def __init__(self, policy: nn.Module, keep: tuple[str, ...], warmup: int = 3):
        self.policy, self.keep, self.warmup = policy, keep, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: TensorDict | None = None
        self.static_out: TensorDict | None = None

    @torch.no_grad()
    def __call__(self, td: TensorDict) -> TensorDict:
        if self.graph is None:
            self._capture(td)
        self.static_in.update_(td)
        self.graph.replay()
        return self.static_out.select(*self.keep, strict=False).clone()

    def _capture(self, td: TensorDict) -> None:
        device = next(self.policy.parameters()).device  # rollout inputs carry no TensorDict device of their own
        if device.type != "cuda":
            raise RuntimeError(f"CUDA-graph capture needs a policy on a CUDA device, got {device}")
        self.static_in = td.clone()
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                # A shallow copy: the policy writes its outputs into the TensorDict it is given, and the static
                # inputs must keep only the inputs.
                self.policy(self.static_in.copy())
        current.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = self.policy(self.static_in.copy())
