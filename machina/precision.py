"""The precision of float32 matrix products, process-wide: one owner for torch's flags of it.

Training may run its products with reduced-precision inputs for speed, and what ``system.bf16_matmuls=true`` does
depends on the device (``set_matmul_precision``): on a CPU with bf16 units, bfloat16 inputs; on a CUDA GPU, TF32
inputs (torch has no bfloat16 path for float32 products there), whatever ``system.tf32`` says. Evaluation never
rounds them to bfloat16 (``float32_products``), so on a CPU a policy scores the same in a run's periodic evaluation
as in ``eval.py`` of its files, whatever the run's speed settings.

torch keeps the setting in two APIs that refuse to be mixed (a precision set backend by backend cannot be read back
as one, and ``torch.compile`` reads it), so only the process-wide setting and the legacy TF32 switch are used here.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def set_matmul_precision(bf16: bool, tf32: bool) -> None:
    """The precision of float32 matrix products (``torch.matmul``, ``nn.Linear`` forward and backward), by device:

    - ``bf16`` on a CPU with bf16 units (AMX or AVX512-BF16, through oneDNN): the inputs rounded to bfloat16 (8 bits
      of mantissa), the sum in float32. On a CPU without them: full float32, as if ``bf16`` were off.
    - ``bf16`` on a CUDA GPU: TF32 products (inputs rounded to 10 bits of mantissa, the sum in float32), also when
      ``tf32`` is off: torch's "medium" precision is TF32 on CUDA (``torch.backends.cuda.matmul.allow_tf32`` reads
      true).
    - without ``bf16``: full float32 on a CPU; on a GPU TF32 where ``tf32``, else full float32.

    Convolutions (cuDNN's TF32) follow ``system.tf32`` alone (``machina.startup.system``)."""
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
