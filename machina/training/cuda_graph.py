"""CUDA-graph replay of the hot path (``system.cuda_graphs=true``): a rollout step and a minibatch update.

At the batches where a GPU is fastest, a rollout step (about 140 env ops and 190 policy ops) and a minibatch update
(thousands of small kernels of the LSTM's time loop, forward and backward) are bounded by their kernel launches,
not their math. Captured once, each replays as one launch. What makes that sound here:

- fixed shapes and no host sync (``tests/test_gpu.py`` checks both under ``torch.cuda.set_sync_debug_mode``);
- the inputs live at fixed addresses (``CapturedCall.inputs``): the caller writes each call's data into them in
  place, so every replay reads the live step or minibatch;
- parameters and optimizer state only change in place (optimizer steps with ``capturable=True``, ``load_state_dict``)
  and the learning rate is a device tensor, so replays read the current values without a re-capture;
- random numbers (the policy's Gumbel noise, teacher-led draws) come from torch's CUDA generator, whose philox
  offsets advance on every replay; the env draws none in ``step``;
- the graph's outputs are its own static memory, overwritten by the next replay: the rollout and the learner read
  (store, sum, copy) them before the next call and keep nothing else, so nothing is cloned after a replay.

Host values of a captured function are constants of its graph: a graphed update refuses losses whose coefficients
follow a schedule (``graphed_update.check_graphable``), and the env's step counter is passed to ``prepare_rollout``.
Which functions are captured is the ``Execution``'s choice (``execution.py``).
"""

from collections.abc import Callable

import torch
from tensordict import TensorDict


class CudaGraph:
    """Captures a function as a ``torch.cuda.CUDAGraph`` after ``warmup`` eager calls on a side stream (lazy
    initialisation, cuDNN/cuBLAS plans, allocator pools and a compiled function's first compile must not happen
    inside the capture). The warm-up calls have effects (env steps, optimizer steps, random draws): the caller's
    ``snapshot`` saves what they change and returns the function that puts it back before the capture, so the
    first replay computes what one eager call would have."""

    def __init__(self, device: torch.device, warmup: int = 3):
        if device.type != "cuda":
            raise RuntimeError(f"CUDA-graph capture needs a CUDA device, got {device}")
        self.device, self.warmup = device, warmup
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], TensorDict], snapshot: Callable[[], Callable[[], None]]) -> TensorDict:
        """Run ``fn`` ``warmup`` times, undo their effects, capture it and replay it once (a capture records kernels
        without running them); return its outputs (the graph's static memory)."""
        restore = snapshot()
        rng = torch.cuda.get_rng_state(self.device)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        current.wait_stream(side)
        restore()
        torch.cuda.set_rng_state(rng, self.device)
        with torch.cuda.graph(self.graph):
            out = fn()
        self.graph.replay()
        return out

    def replay(self) -> None:
        self.graph.replay()


class CapturedCall:
    """``fn(inputs) -> TensorDict`` replayed from a graph captured at the first call.

    Args:
        fn: reads only ``inputs`` (and parameters, buffers, optimizer state), returns a TensorDict.
        inputs: the static inputs: the caller fills them in place before each call (``inputs.update_(...)``) or
            owns them as its live state; shapes, dtypes and keys never change.
        graph: a ``CudaGraph`` (or, in CPU tests, anything with its ``capture`` / ``replay``).
        snapshot: saves what ``fn`` changes besides its outputs and returns the function that restores it.

    A call returns the static outputs, valid until the next call.
    """

    def __init__(
        self,
        fn: Callable[[TensorDict], TensorDict],
        inputs: TensorDict,
        graph,
        snapshot: Callable[[], Callable[[], None]],
    ):
        self.fn, self.inputs, self.graph, self.snapshot = fn, inputs, graph, snapshot
        self.outputs: TensorDict | None = None

    def __call__(self) -> TensorDict:
        if self.outputs is None:
            self.outputs = self.graph.capture(lambda: self.fn(self.inputs), self.snapshot)
        else:
            self.graph.replay()
        return self.outputs
