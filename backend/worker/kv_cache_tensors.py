"""The KV cache's tensors: their dtype from `--kv-cache-dtype`, and on the CPU memory that costs
nothing until it is written.

The CPU cache's default size is a share of the machine's RAM (kv_cache/kv_budget.py), many GiB.
`torch.zeros` would write every byte at start-up: seconds before the first request, the whole size
resident at once, and as much again in every engine a test suite starts. An anonymous memory
mapping reads as zeros by the kernel's guarantee and takes a page only when it is first written, so
an engine holds the pages of the blocks its requests have used, and a block never written (the null
block 0, the tail of a context's last block) reads as zeros, as a zeroed tensor would. The price:
RAM is committed as the cache fills, not at start-up, so memory that another process takes meanwhile
is not there later (the start-up log says how much the cache may grow to).
On CUDA the tensors are zeroed as before: the profile step has measured what is left for them.
"""
from __future__ import annotations

import math
import mmap

import torch

from kvserve.kernels.kv_quant import KV_DTYPES


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """`--kv-cache-dtype` as a torch dtype: auto is the model's (EngineConfig has checked the name)."""
    return model_dtype if name == "auto" else KV_DTYPES[name]


def kv_element_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def allocate_kv_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor for one layer's K or V: lazily backed by anonymous memory on the CPU."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * kv_element_bytes(dtype)
    # The tensor keeps the mapping alive (frombuffer holds a reference); it unmaps when both go.
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)
