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
The mapping asks for transparent huge pages (2 MiB; where the kernel grants them to madvised
memory, as Debian's and most distributions' default does): a step reads every running request's
blocks, scattered through the cache, and with 4 KiB pages the hardware prefetcher stops at each page
boundary and the TLB misses on most blocks. The attention of a 16-request decode step at 320 tokens
of context (`decode_attention_bench.py`, its blocks scattered as a long-running server's free list
leaves them) ran ~1.1x faster; with the blocks in order (a fresh engine) the step measured the same.
A first write then takes 2 MiB, not 4 KiB: a few MiB per layer, against a cache of GiBs.
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
    # Private: the kernel's huge pages apply to private anonymous memory, and mmap's default, a shared
    # mapping, is shmem, whose huge pages are off by default.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux only; a kernel without THP refuses it, and 4 KiB pages serve
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    # The tensor keeps the mapping alive (frombuffer holds a reference); it unmaps when both go.
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)
