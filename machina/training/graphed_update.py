"""The learner's minibatch update replayed from CUDA graphs (``system.cuda_graphs=true``), one per shape of the
stored observations (``experience.compact_tokens`` cuts them to each epoch's widest real observation, so a run sees a
handful of widths).

Each minibatch is copied into the static inputs of its width's graph, which replays the whole update: forward,
losses, backward, gradient clip and the optimizer step (``capturable=True``: its step counts live on the device).
The graph's outputs are the new log-probabilities, the summed ``approx_kl`` and the device metrics; the host
metrics (constant coefficients) are those of the capture. See ``cuda_graph.py`` for what makes a replay sound.
"""

from collections.abc import Callable

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.errors import ConfigError
from machina.losses.base import Loss
from machina.progress import Progress
from machina.training.cuda_graph import CapturedCall

# The outputs of a graphed update that are not metrics.
NEW_LOG_PROB, KL = "new_log_prob", "kl"


class GraphedUpdate:
    """Calls like ``Learner._update``: (stored [S, T], minibatch [S, T], state [S], progress) -> (new act_log_prob
    [S, T], kl, device metrics, host metrics).

    Args:
        update: the learner's eager (or compiled) whole update.
        policy, optimizer: what the update changes; a capture's warm-up updates are undone on them.
        losses: refused when a coefficient follows a schedule (``check_graphable``).
        single_process: False under torchrun, which is refused.
        graph: a factory of graph captures (``cuda_graph.CudaGraph`` bound to the device).
    """

    def __init__(
        self,
        update: Callable,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        losses: dict[str, Loss],
        single_process: bool,
        graph: Callable[[], object],
    ):
        check_graphable(losses, single_process)
        device = next(policy.parameters()).device
        for group in optimizer.param_groups:
            # Step counts on the device, no host read in the step (CUDA; CPU tests capture nothing).
            group["capturable"] = device.type == "cuda"
        self.update, self.policy, self.optimizer, self.graph = update, policy, optimizer, graph
        self.graphs: dict[tuple[int, ...], tuple[CapturedCall, dict[str, float]]] = {}

    def __call__(self, stored: TensorDict, minibatch: TensorDict, state: TensorDict, progress: Progress):
        data = {"stored": stored, "minibatch": minibatch, "state": state}
        shape = tuple(stored[keys.OBS].shape)
        if shape not in self.graphs:
            host: dict[str, float] = {}

            def update(static: TensorDict) -> TensorDict:
                new_log_prob, kl, metrics, values = self.update(
                    static["stored"], static["minibatch"], static["state"], progress
                )
                host.update(values)  # constants of the graph: check_graphable refused scheduled ones
                return TensorDict({NEW_LOG_PROB: new_log_prob, KL: kl, **metrics}, batch_size=[])

            inputs = TensorDict(data, batch_size=state.batch_size).clone()
            self.graphs[shape] = (CapturedCall(update, inputs, self.graph(), self._snapshot), host)
        else:
            self.graphs[shape][0].inputs.update_(data)
        call, host = self.graphs[shape]
        out = call()
        metrics = {name: value for name, value in out.items() if name not in (NEW_LOG_PROB, KL)}
        return out[NEW_LOG_PROB], out[KL], metrics, dict(host)

    def _snapshot(self) -> Callable[[], None]:
        """Save the parameters and the optimizer's state (a capture's warm-up updates change them); return the
        function that writes them back in place. State that the warm-up created is zeroed: a fresh state."""
        params = [p.detach().clone() for p in self.policy.parameters()]
        saved = {
            param: {name: value.clone() for name, value in state.items() if isinstance(value, torch.Tensor)}
            for param, state in self.optimizer.state.items()
        }

        @torch.no_grad()
        def restore() -> None:
            for param, value in zip(self.policy.parameters(), params, strict=True):
                param.copy_(value)
            for param, state in self.optimizer.state.items():
                for name, value in state.items():
                    if isinstance(value, torch.Tensor) and param in saved:
                        value.copy_(saved[param][name])
                    elif isinstance(value, torch.Tensor):
                        value.zero_()
            self.optimizer.zero_grad(set_to_none=True)

        return restore


def check_graphable(losses: dict[str, Loss], single_process: bool) -> None:
    """Refuse what a captured update cannot do: follow a loss coefficient's schedule (a host value is a constant of
    the graph) or average gradients over ranks (DDP's collectives are not captured here)."""
    if not single_process:
        raise ConfigError("system.cuda_graphs=true captures a single process's update; run it without torchrun")
    for name, loss in losses.items():
        scheduled = loss.scheduled()
        if scheduled:
            raise ConfigError(
                f"loss '{name}' follows a schedule ({', '.join(scheduled)}), which a CUDA graph would freeze at its "
                f"capture; make losses.{name}.* constants or set system.cuda_graphs=false"
            )
