"""Process-wide torch settings: seeding, device choice, determinism, threads and TF32."""

import os
import random

import numpy as np
import torch

from machina.errors import ConfigError


class System:
    """Applies ``system.*`` settings to this process and exposes the chosen device.

    Args:
        seed: seeds python, numpy and torch (plus ``rank`` under torchrun, so ranks differ).
        device: "auto" (cuda when present, else cpu), "cpu", "cuda" or "cuda:N".
        torch_deterministic: true turns on deterministic algorithms, cudnn.deterministic, no cudnn benchmark and
            a fixed CUBLAS workspace; false turns cudnn benchmark on (faster kernels, run-to-run noise).
        threads: torch intra-op threads; 0 keeps torch's default.
        tf32: allow TF32 matmuls and convolutions on Ampere+ GPUs.
        compile: ``torch.compile`` the policy in place (the first epoch pays the compilation, tens of seconds).
            On a 2-core CPU it made ``policy=fast`` training 1.2x faster side by side (BENCHMARKS.md).
        cuda_graphs: capture the rollout's policy forward as a CUDA graph and replay it every step
            (``machina/training/cuda_graph.py``); needs a CUDA device.
        rank: the distributed rank, added to the seed.
    """

    def __init__(
        self,
        seed: int = 0,
        device: str = "auto",
        torch_deterministic: bool = False,
        threads: int = 0,
        tf32: bool = True,
        compile: bool = False,
        cuda_graphs: bool = False,
        rank: int = 0,
    ):
        if not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"system.seed must be a non-negative integer, got {seed!r}")
        if not isinstance(threads, int) or threads < 0:
            raise ConfigError(f"system.threads must be a non-negative integer (0 = torch default), got {threads!r}")
        self.seed = seed + rank
        self.device = resolve_device(device)
        self.torch_deterministic = bool(torch_deterministic)
        self.threads = threads
        self.tf32 = bool(tf32)
        self.compile = bool(compile)
        self.cuda_graphs = bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ConfigError(
                f"system.cuda_graphs=true captures CUDA graphs, but system.device resolved to {self.device}; "
                "use a CUDA device or system.cuda_graphs=false"
            )

    def apply(self) -> torch.device:
        """Seed every generator and set torch's flags; return the device."""
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)
        self.apply_flags()
        return self.device

    def apply_flags(self) -> None:
        """Set the process-wide torch flags only (benchmarks switch between configurations with it)."""
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.torch_deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; it reads the variable at first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(self.torch_deterministic)
        torch.backends.cudnn.deterministic = self.torch_deterministic
        torch.backends.cudnn.benchmark = not self.torch_deterministic
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32


def resolve_device(name: str) -> torch.device:
    """Turn ``system.device`` into a torch.device, with a clear error for unknown or absent devices."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"system.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"system.device={name!r} but CUDA is not available here; use system.device=cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"system.device={name!r} but only {torch.cuda.device_count()} CUDA devices exist")
    elif device.type != "cpu":
        raise ConfigError(f"system.device={name!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device
