"""The precision of float32 matrix products, process-wide: one owner for torch's flags of it.

Training may run its products with bfloat16 inputs (``system.bf16_matmuls``) or TF32 (``system.tf32``, GPUs) for
speed; evaluation never rounds them to bfloat16 (``float32_products``), so on a CPU a policy scores the same in a
run's periodic evaluation as in ``eval.py`` of its files, whatever the run's speed settings.

torch keeps the setting in two APIs that refuse to be mixed (a precision set backend by backend cannot be read back
as one, and ``torch.compile`` reads it), so only the process-wide setting and the legacy TF32 switch are used here.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def set_matmul_precision(bf16: bool, tf32: bool) -> None:
    """bf16: products of bf16-rounded inputs summed in float32 where the hardware has bf16 units (CPU: AMX or
    AVX512-BF16 through oneDNN; GPU: TF32 at least); else full float32, with TF32 on GPUs where ``tf32``."""
    torch.set_float32_matmul_precision("medium" if bf16 else "highest")
    if not bf16:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@contextmanager
def float32_products() -> Iterator[None]:
    """No bf16-rounded inputs in the block's matrix products; the setting before it restored after. TF32 on GPUs
    stays as the run set it: torch.compile guards a compiled policy on that switch (turning it off would recompile
    the policy for every evaluation), while the bf16 setting is read when each product runs."""
    bf16 = torch.get_float32_matmul_precision() == "medium"
    tf32 = torch.backends.cuda.matmul.allow_tf32
    set_matmul_precision(bf16=False, tf32=tf32)
    try:
        yield
    finally:
        set_matmul_precision(bf16, tf32)
