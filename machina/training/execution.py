"""How the hot path runs: eagerly, ``torch.compile``d, or replayed from CUDA graphs (``system.compile``,
``system.cuda_graphs``). One ``Execution`` is built from those settings (``machina.startup.build``) and handed to the
rollout and the learner, which ask it to wrap their functions instead of deciding again from flags.

- ``function(fn)``: ``fn`` compiled, or ``fn`` itself.
- ``capture(fn, inputs, snapshot)``: a ``CapturedCall`` replaying ``fn`` on static ``inputs`` from a CUDA graph, or
  None when not graphing (the caller runs ``fn`` eagerly).
- ``update(fn, ...)``: the learner's whole minibatch update compiled and/or graphed (``GraphedUpdate``), or None when
  eager (the learner then times forward, backward and optimizer step apart).
- ``mark_dynamic(td, dims)``: tells the compiler which dimensions change between epochs.

CUDA graphs need a CUDA device: ``for_device`` refuses them elsewhere with a ConfigError; tests on the CPU pass a
stand-in ``graph`` factory instead.
"""

from collections.abc import Callable
from functools import partial

import torch
from tensordict import TensorDict
from torch import nn

from machina.errors import ConfigError
from machina.losses.base import Loss
from machina.training.cuda_graph import CapturedCall, CudaGraph
from machina.training.graphed_update import GraphedUpdate


class Execution:
    """Eager, compiled or graphed execution of the rollout step and the minibatch update.

    Args:
        compile: ``torch.compile`` the rollout's policy step and the learner's whole update.
        graph: a factory of graph captures (``cuda_graph.CudaGraph`` bound to the device), or None to run eagerly.
            With both, the captured update is the compiled one.
    """

    def __init__(self, compile: bool = False, graph: Callable[[], object] | None = None):
        self.compile, self.graph = bool(compile), graph

    @classmethod
    def for_device(cls, compile: bool, cuda_graphs: bool, device: torch.device) -> "Execution":
        """The execution ``system.compile`` / ``system.cuda_graphs`` ask for on ``device``."""
        if cuda_graphs and device.type != "cuda":
            raise ConfigError(
                f"system.cuda_graphs=true captures CUDA graphs, but the device is {device}; use a CUDA device or "
                "system.cuda_graphs=false"
            )
        return cls(compile, partial(CudaGraph, device) if cuda_graphs else None)

    @property
    def eager(self) -> bool:
        return not self.compile and self.graph is None

    @property
    def graphs(self) -> bool:
        return self.graph is not None

    def function(self, fn: Callable) -> Callable:
        """``fn`` compiled under ``compile``, else ``fn``."""
        return torch.compile(fn) if self.compile else fn

    def capture(
        self, fn: Callable[[dict], dict], inputs: dict, snapshot: Callable[[], Callable[[], None]]
    ) -> CapturedCall | None:
        """``fn(inputs)`` replayed from a graph captured at its first call (``CapturedCall``), or None when not
        graphing. ``inputs`` are static: the caller writes each call's data into them in place."""
        return CapturedCall(fn, inputs, self.graph(), snapshot) if self.graph is not None else None

    def update(
        self,
        fn: Callable,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        losses: dict[str, Loss],
        single_process: bool,
    ) -> Callable | None:
        """The learner's whole minibatch update ``fn`` (stored, minibatch, state, progress) -> (new act_log_prob,
        kl, device metrics, host metrics) compiled and/or graphed; None when eager.

        Compiled or graphed, the optimizer's learning rate moves into a device tensor that the step reads: a Python
        float would be a constant of the graph (recompiled every epoch, or frozen in a CUDA graph). A graph also
        refuses scheduled loss coefficients and torchrun (``graphed_update.check_graphable``)."""
        if self.eager:
            return None
        device = next(policy.parameters()).device
        for group in optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
        update = torch.compile(fn) if self.compile else fn
        if self.graph is None:
            return update
        return GraphedUpdate(update, policy, optimizer, losses, single_process, self.graph)

    def mark_dynamic(self, td: TensorDict, dims: dict[str, int]) -> None:
        """Mark ``td[key]``'s dimension ``dims[key]`` dynamic for the compiler (a size that changes between epochs
        is then one symbol, compiled once); nothing when not compiling."""
        if self.compile:
            for key, dim in dims.items():
                torch._dynamo.maybe_mark_dynamic(td[key], dim)
