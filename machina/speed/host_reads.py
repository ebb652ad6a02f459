"""Counting host reads: every Python-level read of a tensor's value on the host, which on an accelerator waits for
the device (a sync). The hot path makes none (docs/explanation/architecture.md, "Rules every change keeps"); tests and
benchmarks check it with this."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Every way Python code turns a tensor into a host value: explicit reads, truth tests, numbers and indices.
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
# torch.optim reads its step counters, which live on the host for a non-capturable optimizer: no device sync.
HOST_STATE = ("torch/optim/",)


@contextmanager
def count_host_reads(reads: list[str], exempt: tuple[str, ...] = HOST_STATE) -> Iterator[None]:
    """Append ``"<method> at <file>:<line>"`` to ``reads`` for every host read (``HOST_READS``) made while the block
    runs, except from code under the ``exempt`` paths."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            where = caller.f_code.co_filename.replace("\\", "/")
            if not any(path in where for path in exempt):
                reads.append(f"{name} at {where}:{caller.f_lineno}")
            return saved[name](self, *args, **kwargs)

        return read

    for name in HOST_READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
