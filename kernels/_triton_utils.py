"""Plumbing shared by the Triton kernel launchers: lazy kernels, checks, sizes.

Importing a kernel module never imports triton. The torch references live in
the same files and the CPU engine imports them; triton is optional there, and
on a machine without a GPU the kernels can only run in Triton's interpreter,
which must be switched on (`TRITON_INTERPRET=1`) *before triton is first
imported*: the interpreter also swaps triton's own library functions (tl.sum,
tl.max, ...) when they are defined. So `@jit` here only records the function;
the first launch of any kernel of a module imports triton, binds the module's
`tl` to triton.language and jit-compiles all of that module's kernels (nested
jit helpers must be real jit functions by the time their caller compiles).
"""
from __future__ import annotations

import importlib.util
import math

import torch

# Bound to triton.language in each kernel module when its kernels are first
# launched; kernel bodies (and string annotations) read it only from then on.
tl = None

LOG2_E = 1.4426950408889634


class LazyKernel:
    """A kernel function, jit-compiled by triton on first use (see the module doc)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.kernel = None

    def get(self):
        if self.kernel is None:
            _bind_module(self.fn.__globals__)
        return self.kernel

    def __getitem__(self, grid):
        return self.get()[grid]


def jit(fn) -> LazyKernel:
    return LazyKernel(fn)


def _bind_module(module_globals: dict) -> None:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("the Triton kernels need the triton package (pip install 'kvserve[triton]')")
    import triton
    import triton.language

    module_globals["tl"] = triton.language
    for name, obj in list(module_globals.items()):
        if isinstance(obj, LazyKernel):
            if obj.kernel is None:
                # A helper imported from another module reads `tl` from its own module.
                obj.fn.__globals__["tl"] = triton.language
                obj.kernel = triton.jit(obj.fn)
            module_globals[name] = obj.kernel  # what a calling kernel resolves when it compiles


def materialize(kernel):
    """The triton kernel behind a `@jit` function (compiling its module's kernels if needed)."""
    return kernel.get() if isinstance(kernel, LazyKernel) else kernel


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_interpreted(kernel) -> bool:
    return type(materialize(kernel)).__name__ == "InterpretedFunction"


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_launch(kernel, *tensors: torch.Tensor) -> bool:
    """Checks that a launch can run where its tensors live; returns True under the interpreter."""
    device = tensors[0].device
    for t in tensors:
        check(t.device == device, f"all tensors must be on one device, got {t.device} and {device}")
    interpreted = is_interpreted(materialize(kernel))
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
