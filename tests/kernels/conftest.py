"""Kernel tests run the Triton kernels against their torch references.

Without a GPU the kernels run in Triton's interpreter, which must be switched
on before triton is first imported: hence the environment is set here, at
collection time, before any test module imports kvserve.kernels.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """CUDA when there is a GPU (and the interpreter is off), else the CPU interpreter."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.device("cuda")
    from kvserve.kernels._triton_utils import is_interpreted
    from kvserve.kernels.rms_norm import _rms_norm_kernel
    if not is_interpreted(_rms_norm_kernel):
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; run the kernel tests in their own "
                    "process or set TRITON_INTERPRET=1 in the environment")
    return torch.device("cpu")


@pytest.fixture(params=["torch", "native"])
def decode_path(request, monkeypatch):
    """The CPU attention's decode path: the torch one (native kernel hidden) or the native C kernel."""
    from kvserve.kernels import cpu_native
    if request.param == "torch":
        monkeypatch.setattr(cpu_native, "available", lambda: False)
    elif not cpu_native.available():
        pytest.skip("no C compiler: the native kernel is not built")
    return request.param
