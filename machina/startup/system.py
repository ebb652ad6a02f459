"""Process-wide torch settings: seeding, device choice, determinism, threads, matmul precision and compilation."""

import importlib.util
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from machina import checks
from machina.errors import ConfigError
from machina.precision import set_matmul_precision
from machina.startup import threads as thread_policy
from machina.startup.allocator import keep_freed_memory

log = logging.getLogger(__name__)


class System:
    """Applies ``system.*`` settings to this process and exposes the chosen device.

    Args:
        seed: seeds python, numpy and torch (plus ``rank`` under torchrun, so ranks differ).
        device: "auto" (cuda when present, else cpu), "cpu", "cuda" or "cuda:N".
        torch_deterministic: true turns on deterministic algorithms, cudnn.deterministic, no cudnn benchmark and
            a fixed CUBLAS workspace; false turns cudnn benchmark on (faster kernels, run-to-run noise).
        threads: torch's intra-op threads. "auto" (the default): the cores this process may run on, divided among
            the jobs that run at once on the machine (a Hydra joblib launcher's ``hydra.launcher.n_jobs``, -1 meaning
            all cores, times torchrun's local ranks), at most ``OMP_NUM_THREADS`` where that is set; then, on a CPU
            device and unless ``torch_deterministic`` (a thread count can change a sum's order), before each epoch
            (``adapt_threads``) and each minibatch of the update (``follow_load``), reading the load at most once
            a second, one thread fewer for each core other processes kept busy since the last reading (at least
            1), and back up when they stop: a quiet run keeps every core, and one busy process beside a 2-core run
            costs it one thread instead of most of its speed (docs/how-to/shared_machines.md). A compiled run takes
            the share halved until it fits (``machina.startup.threads.compiled_threads``): ``torch.compile``
            specialises its code to the thread count and compiles it once for each count it meets. N: exactly N
            threads, never changed; 0: torch's default (all cores), never changed.
            How the OpenMP threads wait is libgomp's default (3 ms spins) unless ``OMP_WAIT_POLICY`` or
            ``GOMP_SPINCOUNT`` is in the environment (``machina.startup.threads``: a shorter spin cost a quiet run
            about 4%).
        tf32: allow TF32 matmuls and convolutions on Ampere+ GPUs.
        bf16_matmuls: reduced-precision inputs for float32 matrix products, summed in float32
            (``torch.set_float32_matmul_precision("medium")``; ``machina.precision.set_matmul_precision``). On a CPU
            with AMX or AVX512-BF16 the inputs are rounded to bfloat16 and oneDNN runs the products 2-6x faster
            (docs/reference/benchmarks.md); on a CPU without bf16 units nothing changes. On a CUDA GPU the products
            are TF32, not
            bfloat16, even with ``tf32`` false (logged at start-up then). The weights, activations, optimizer state
            and every other op stay float32.
        compile: ``torch.compile`` the policy in place and the learner's whole minibatch update: true, false, or
            "auto": on for runs of at least ``compile_min_timesteps`` agent steps (``total_timesteps``) where a
            compiler for the device is present (a C++ compiler on a CPU, Triton on a GPU). The first epoch pays the
            compilation (about a minute cold on a 2-core CPU, about 10 s from the cache, which is kept
            in ``~/.cache/machina/inductor`` across runs unless ``TORCHINDUCTOR_CACHE_DIR`` is set); then training
            runs about 1.12x faster there (docs/reference/benchmarks.md).
        compile_min_timesteps: the run length from which "auto" compiles.
        total_timesteps: the run's length (``trainer.total_timesteps``), for "auto".
        cuda_graphs: replay each rollout step (the policy forward and, where the env allows, its step) and each
            minibatch update as CUDA graphs (``machina/training/cuda_graph.py``); needs a CUDA device.
        rank: the distributed rank, added to the seed.
    """

    def __init__(
        self,
        seed: int = 0,
        device: str = "auto",
        torch_deterministic: bool = False,
        threads: int | str = "auto",
        tf32: bool = True,
        bf16_matmuls: bool = False,
        compile: bool | str = False,
        compile_min_timesteps: int = 50_000_000,
        total_timesteps: int = 0,
        cuda_graphs: bool = False,
        rank: int = 0,
    ):
        # Settings are named relative to this node (``seed``); machina.startup.build puts ``system.`` in front.
        # numpy's generator takes seeds below 2**32; the rank is added under torchrun.
        checks.integer("seed", seed, 0, 2**32 - 1 - rank, " (numpy's seeds are below 2**32; the rank is added)")
        if threads != "auto":
            checks.integer("threads", threads, 0, why=" or auto (0: torch's default)")
        self.seed = seed + rank
        self.device = checks.device("device", device)
        self.torch_deterministic = bool(torch_deterministic)
        self.threads = threads
        # The cores and jobs are read once: a job's share stays the same for the whole run.
        self.cores = thread_policy.cores()
        jobs = thread_policy.jobs_at_once(launcher_jobs(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), self.cores)
        self.share = thread_policy.share(self.cores, jobs, os.environ.get("OMP_NUM_THREADS"))
        self.tf32 = bool(tf32)
        self.bf16_matmuls = checks.flag("bf16_matmuls", bf16_matmuls)
        if compile not in (True, False, "auto"):
            raise ConfigError(f"compile={compile!r:.80} must be true, false or auto")
        if compile == "auto":
            compile = total_timesteps >= compile_min_timesteps and compiler_present(self.device)
        self.compile = compile
        self.decided = self.share  # what auto last decided; adapt_threads changes it
        governed = threads == "auto" and not self.torch_deterministic and self.device.type == "cpu"
        self.others = thread_policy.OthersLoad() if governed else None
        self.cuda_graphs = bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ConfigError(
                f"cuda_graphs=true captures CUDA graphs, but device resolved to {self.device}; use a CUDA device or "
                "cuda_graphs=false"
            )

    def apply(self) -> torch.device:
        """Seed every generator, set torch's flags and the allocator's (``machina.startup.allocator``); return the
        device."""
        log.info("%s", keep_freed_memory())
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)
        self.apply_flags()
        log.info("%s", self.describe_threads())
        return self.device

    def apply_flags(self) -> None:
        """Set the process-wide torch flags only (benchmarks switch between configurations with it)."""
        if self.threads:
            torch.set_num_threads(self.decided if self.threads == "auto" else self.threads)
        if self.torch_deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; it reads the variable at first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(self.torch_deterministic)
        torch.backends.cudnn.deterministic = self.torch_deterministic
        torch.backends.cudnn.benchmark = not self.torch_deterministic
        set_matmul_precision(self.bf16_matmuls, self.tf32)
        if self.bf16_matmuls and not self.tf32 and self.device.type == "cuda":
            log.warning(
                "system.bf16_matmuls=true on %s: float32 matrix products run in TF32 although system.tf32=false "
                "(torch has no bfloat16 path for them on a GPU); set system.bf16_matmuls=false for full float32",
                self.device,
            )
        torch.backends.cudnn.allow_tf32 = self.tf32
        if self.compile:
            # Compiled kernels are cached by graph: a later run of the same shapes loads them instead of compiling.
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "machina" / "inductor"))

    def adapt_threads(self) -> None:
        """Before each epoch, under ``threads: auto`` on a CPU: torch's threads set to this job's share less the
        cores other processes kept busy since the last reading (``machina.startup.threads.threads_for``; a reading
        at most once a second), and set back to that where a benchmark or the overlapped rollout changed them."""
        if self.others is None:
            return
        self._decide()
        if torch.get_num_threads() != self.decided:
            torch.set_num_threads(self.decided)

    def follow_load(self) -> None:
        """Before each minibatch of the update: ``adapt_threads``' reading, but torch's threads are set only when
        it changes the decision, so a count that a benchmark set for its own measurement stays while the load
        does."""
        if self.others is not None and self._decide():
            torch.set_num_threads(self.decided)

    def _decide(self) -> bool:
        """Read the other processes' load (too soon since the last reading: no reading) and decide the count; True
        when the decision changed."""
        if (busy := self.others.read()) is None:
            return False
        decided = thread_policy.threads_for(self.cores, self.share, busy)
        if self.compile:  # a new count compiles the policy and the update again: few counts, each compiled once
            decided = thread_policy.compiled_threads(self.share, decided)
        changed = decided != self.decided
        if changed:
            log.info("torch threads %d -> %d: other processes kept %.1f cores busy", self.decided, decided, busy)
        self.decided = decided
        return changed

    def describe_threads(self) -> str:
        """The thread decision in words, for the start-up log."""
        how = {"auto": f"auto, {self.share} of {self.cores} cores", 0: "torch's default"}.get(self.threads, "fixed")
        return f"{torch.get_num_threads()} torch threads ({how}); OpenMP wait: {thread_policy.wait_policy()}"


def launcher_jobs() -> int | None:
    """``hydra.launcher.n_jobs`` of the multirun this process is a job of (a joblib launcher's), else None."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    n_jobs = HydraConfig.get().launcher.get("n_jobs")
    return n_jobs if isinstance(n_jobs, int) else None


def compiler_present(device: torch.device) -> bool:
    """Whether ``torch.compile``'s default backend can build kernels for ``device`` here."""
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return any(shutil.which(name) for name in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))
