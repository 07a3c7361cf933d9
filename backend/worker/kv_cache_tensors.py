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
The mapping is private: a shared one (mmap's default) is shmem, whose first write to a page costs
more (a fresh 256-token write into one layer's K: 82-90 us shared, 56-57 us private, all 4 KiB pages).
Transparent huge pages (MADV_HUGEPAGE) were measured and not kept: they made the attention of a
16-request step over scattered blocks ~1.1x faster, but each first write into a 2 MiB page waited on the
kernel's compaction (252-332 us for the same write), and a fresh server writes fresh pages on most of
its tokens until the whole cache has been used once (BENCHMARKS §7, twelfth point).
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
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: see above
    # The tensor keeps the mapping alive (frombuffer holds a reference); it unmaps when both go.
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)
