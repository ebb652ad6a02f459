"""Data-parallel training on torch.distributed: one process per GPU (or per CPU slot), launched by ``torchrun``.

Each rank owns its envs (seeded with the rank), its experience buffer and its rollout. The learner calls the policy
through DistributedDataParallel, which averages the gradients during backward, so every rank takes the same
optimizer step and the parameters stay identical. Rank 0 alone logs and writes checkpoints. A plain
``python train.py`` (no ``WORLD_SIZE`` in the environment) joins no process group, and every helper here is then a
no-op. Launching, and which settings are per rank: docs/tutorials/distributed.md.
"""

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from machina import checks
from machina.errors import ConfigError, TrainingStopped

# Seconds a rank waits for its peers in init or in a collective before failing: the guard against a peer that hangs.
# A peer that dies is caught sooner: torchrun stops the whole job as soon as one rank exits with an error.
TIMEOUT_ENV = "MACHINA_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600
WORKER_DRAIN_S = 0.2  # see leave_group: many times the interpreter's 5 ms GIL switch interval


@contextmanager
def process_group(device_name: str) -> Iterator[None]:
    """Join the process group that torchrun's environment variables describe (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) for the block: nccl when ``system.device`` is a GPU, else gloo.
    Ranks other than 0 log warnings and errors only. Without ``WORLD_SIZE`` > 1 it does nothing."""
    ranks_from_slurm()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield
        return
    cuda = checks.device("system.device", device_name).type == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank())  # nccl's object collectives use the current device
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    if dist.get_rank() != 0:
        logging.getLogger().setLevel(logging.WARNING)
    yield
    # Only on success: after a failure the peers may be gone, and the process is exiting anyway.
    leave_group()


def leave_group() -> None:
    """Destroy the process group just before the process exits.

    gloo runs each collective on a worker thread that, once the collective is done, drops its tensors, which takes
    the GIL. A run's last collective ends a few milliseconds before the interpreter exits; a worker still waiting
    for the GIL then is stopped by the interpreter's finalization, and the C++ frames it unwinds through abort the
    process ("terminate called without an active exception", about one run in ten on two CPU ranks). Releasing the
    GIL for a moment lets the workers finish first."""
    dist.destroy_process_group()
    time.sleep(WORKER_DRAIN_S)


def ranks_from_slurm() -> None:
    """Under ``srun`` with several tasks and no torchrun (e.g. ``hydra/launcher=submitit_slurm`` with
    ``tasks_per_node`` > 1), each task is a rank: take ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from Slurm's
    per-task variables. ``MASTER_ADDR`` and ``MASTER_PORT`` must be exported by the job
    (docs/tutorials/distributed.md)."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device: torch.device) -> torch.device:
    """Under torchrun each rank of a node uses its own GPU: ``cuda`` becomes ``cuda:LOCAL_RANK``."""
    if device.type == "cuda" and dist.is_initialized():
        return torch.device("cuda", local_rank())
    return device


def wrap(policy: nn.Module) -> nn.Module:
    """What the learner calls: DDP over ``policy`` in a process group, else ``policy`` itself.

    DDP copies rank 0's parameters (and buffers) to every rank here. The buffers are constant lookup tables, hence
    no buffer sync per forward. ``find_unused_parameters=False`` (no graph walk per step) needs every parameter in
    each backward: the learner adds ``zero_term`` for that."""
    if not dist.is_initialized():
        return policy
    device = next(policy.parameters()).device
    device_ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(policy, device_ids=device_ids, forward_sync_buffers=False)


def zero_term(module: nn.Module) -> torch.Tensor:
    """0 times one element of every parameter: a loss term that puts each parameter in the backward graph (with a
    zero gradient), so DDP's gradient reduction completes even when the enabled losses leave a head unused."""
    return torch.stack([p.view(-1)[0] for p in module.parameters()]).sum() * 0.0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over the ranks in place and return it (unchanged alone). On GPU it is queued on the stream
    like any kernel: no host sync."""
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def reduce_epoch(
    means: dict[str, torch.Tensor], sums: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One all-reduce for the epoch's 0-d device metrics: ``means`` averaged over the ranks, ``sums`` summed."""
    if not dist.is_initialized() or not (means or sums):
        return means, sums
    values = torch.stack([v.float() for v in (*means.values(), *sums.values())])
    dist.all_reduce(values)
    values[: len(means)] /= world_size()
    reduced = dict(zip([*means, *sums], values.unbind(), strict=True))
    return {k: reduced[k] for k in means}, {k: reduced[k] for k in sums}


def agree_max(value: int) -> int:
    """The largest ``value`` over the ranks: a decision one rank cannot take alone (stop after this epoch because a
    signal reached some rank) is taken by all of them in the same epoch."""
    if not dist.is_initialized():
        return value
    device = torch.device("cuda", local_rank()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (plain data): a decision only rank 0 may take, e.g. the run folder, which
    each rank would otherwise resolve from its own clock (``outputs/<date>/<time>``). ``obj`` alone."""
    if not dist.is_initialized():
        return obj
    box = [obj if rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def decided_by_main(decide: Callable[[], Any]) -> Any:
    """``decide()`` on rank 0 and its result on every rank; a ConfigError it raises is raised on every rank, with
    the same message. A refusal only rank 0 can see (the run folder's lock is held, a resume is refused) then stops
    every rank with that one line, instead of rank 0 exiting while the others wait for it in a collective (which they
    would report as a lost connection)."""
    if not dist.is_initialized():
        return decide()
    box: list[Any] = [None]
    if rank() == 0:
        try:
            box = [("decided", decide())]
        except ConfigError as err:
            box = [("refused", str(err))]
    dist.broadcast_object_list(box, src=0)
    outcome, value = box[0]
    if outcome == "refused":
        # Every rank stops here: leave the group together, so no rank sees its peer vanish mid-collective.
        dist.barrier()
        leave_group()
        raise ConfigError(value)
    return value


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` (tensors moved to the CPU) in rank order on rank 0, None on the others; ``[obj]`` alone."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * world_size() if rank() == 0 else None
    dist.gather_object(to_cpu(obj), gathered, dst=0)
    return gathered


def to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def check_in_sync(module: nn.Module) -> str:
    """The parameters' digest; raise when the ranks' parameters differ (a silent DDP desync, e.g. a rank that
    skipped an optimizer step, would otherwise go unnoticed until the results looked wrong)."""
    digest = param_digest(module)
    if dist.is_initialized():
        digests = [None] * world_size()
        dist.all_gather_object(digests, digest)
        if len(set(digests)) > 1:
            raise TrainingStopped(f"the ranks' policy parameters differ after training (digest per rank: {digests})")
    return digest


def param_digest(module: nn.Module) -> str:
    """sha256 of the parameters' bytes, in ``parameters()`` order (bit-exact, any dtype)."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
