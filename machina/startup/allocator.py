"""glibc's malloc kept from handing each large tensor's memory back to the kernel and faulting it in again.

On a CPU every activation and gradient of a minibatch is a fresh tensor of a few MB ([8192, 128] float32 is 4 MiB).
glibc serves a block that size with its own ``mmap`` once the block is above its mmap threshold, and returns it with
``munmap`` when the tensor is freed; heap memory above ``M_TRIM_THRESHOLD`` at the top of the heap goes back too.
The next minibatch's tensor of the same size then page-faults every 4 KiB page in again, zero-filled by the kernel
(``sys`` time in ``time``'s output): 20 forward and backward passes on [8192, 128] activations faulted about 30,000
pages with glibc's settings and 1,200 with those below (``tests/test_allocator.py``); the main job's update of 16
minibatches took 1.09-1.14 s with them against 1.13-1.25 s without, on a 2-core AMD EPYC (avx512_bf16 avx512f).
PyTorch's CUDA allocator caches for the same reason; torch's CPU allocator does not.

``keep_freed_memory`` sets, through ``mallopt`` (it acts on every later allocation, so it can be called after the
interpreter starts): blocks up to 32 MiB (the most glibc allows) come from the heap, freed memory stays in the
process, and the heap grows by 64 MiB at a time. The process's resident memory is then its peak, not its current
use. A variable of glibc's own (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``) in the
environment is the user's choice and wins: nothing is set. Elsewhere than glibc (macOS, musl, a preloaded jemalloc)
there is nothing to set, or the call changes an allocator nobody uses.
"""

import ctypes
import ctypes.util
import os

# mallopt's parameters (glibc's malloc.h) and the values set.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = {
    M_MMAP_THRESHOLD: 32 << 20,  # glibc refuses more (half its 64 MiB heap size)
    M_TRIM_THRESHOLD: (1 << 31) - 1,  # never trim: the largest int mallopt takes
    M_TOP_PAD: 64 << 20,
}
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory(environ: dict | None = None) -> str:
    """Apply ``SETTINGS`` to glibc's malloc in this process; returns what was done, for the start-up log."""
    environ = os.environ if environ is None else environ
    chosen = [name for name in USER_VARIABLES if name in environ]
    if chosen:
        return f"malloc: {' '.join(chosen)} from the environment"
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # no C library by that name, or one without mallopt
        return "malloc: the C library's own settings (no mallopt)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    refused = [param for param, value in SETTINGS.items() if mallopt(param, value) != 1]
    if refused:
        return f"malloc: mallopt refused {refused}"
    return "malloc: freed memory kept for reuse (mmap threshold 32 MiB, no trim)"
