"""Plumbing shared by the Triton kernel launchers: optional import, checks, sizes.

Triton is an optional dependency: the torch references in this package must
import without it, so kernel modules decorate with `jit` from here (a no-op
when triton is missing; the kernels then simply cannot be launched).

On a machine without a GPU the kernels run in Triton's interpreter. It must be
switched on with `TRITON_INTERPRET=1` *before triton is first imported*: the
interpreter also swaps triton's own library functions (tl.sum, tl.max, ...)
at their definition, so wrapping a kernel after the fact is not enough.
"""
from __future__ import annotations

import math

import torch

try:  # pragma: no cover - exercised by whichever environment runs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

HAS_TRITON = triton is not None

LOG2_E = 1.4426950408889634


def jit(fn):
    """`triton.jit`, or the bare function when triton is not installed."""
    return triton.jit(fn) if HAS_TRITON else fn


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_launch(kernel, *tensors: torch.Tensor) -> bool:
    """Checks that a launch can run where its tensors live; returns True under the interpreter."""
    if not HAS_TRITON:
        raise RuntimeError("the Triton kernels need the triton package (pip install 'kvserve[triton]')")
    device = tensors[0].device
    for t in tensors:
        check(t.device == device, f"all tensors must be on one device, got {t.device} and {device}")
    interpreted = is_interpreted(kernel)
    if device.type != "cuda" and not interpreted:
        raise RuntimeError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 in the environment "
                           "before triton is first imported")
    return interpreted


def dot_options(dtype: torch.dtype, interpreted: bool) -> tuple[bool, str]:
    """(upcast, input_precision) for the tl.dot calls of attention kernels.

    The interpreter multiplies bfloat16 raw bits as integers, so under it bf16
    operands are upcast to float32 first. On a GPU float32 operands would go
    through TF32 by default; "ieee" keeps float32 attention as exact as the
    torch reference.
    """
    upcast = interpreted and dtype == torch.bfloat16
    precision = "ieee" if dtype == torch.float32 else "tf32"
    return upcast, precision


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill; a small nominal count off-GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8
