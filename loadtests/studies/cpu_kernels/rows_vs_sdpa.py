"""A prompt chunk's attention, one layer: SDPA against decode rows in the native kernel.

    .venv/bin/python loadtests/studies/cpu_kernels/rows_vs_sdpa.py

kernels/cpu_paged_attention.py lets a prompt chunk whose context length times head size is at most
PREFILL_AS_ROWS_MAX_WORK attend as decode rows. This times one layer's attention both ways through
PagedAttentionPlan (the bound lifted for the rows side), for chunks from position 0 and after a
cached prefix, at three head shapes (SmolLM2's 9 query heads over 3 of 64, 12 over 4 of 128, Gemma 3
270M's 4 over 1 of 256), over scattered 16-token blocks, best of 5. One-off measurement, not installed.
"""
from __future__ import annotations

import time

import torch

from kvserve.backend.worker.kv_cache_tensors import allocate_kv_tensor
from kvserve.kernels import cpu_paged_attention

SHAPES = ((9, 3, 64), (12, 4, 128), (4, 1, 256))
CHUNKS = ((256, 0), (512, 0), (768, 0), (1024, 0), (1536, 0), (2048, 0), (256, 256), (256, 1024))  # (tokens, after)


def best_ms(chunk: int, prefix: int, heads: int, kv_heads: int, head_dim: int, block_size: int = 16,
            reps: int = 5) -> dict[str, float]:
    total = prefix + chunk
    blocks = -(-total // block_size)
    shape = (blocks, block_size, kv_heads, head_dim)
    key_cache, value_cache = (allocate_kv_tensor(shape, torch.float32, torch.device("cpu")).copy_(torch.randn(shape))
                              for _ in range(2))
    table = torch.randperm(blocks).to(torch.int32)[None]
    query = torch.randn(chunk, heads, head_dim)
    lens, starts = torch.tensor([total], dtype=torch.int32), torch.tensor([0, chunk])
    best = {}
    for side, rows_head_dim in (("sdpa", None), ("rows", head_dim)):
        plan = cpu_paged_attention.PagedAttentionPlan(table, lens, starts, block_size, False, blocks, None,
                                                      rows_head_dim)
        plan.run(query, key_cache, value_cache, head_dim ** -0.5)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            plan.run(query, key_cache, value_cache, head_dim ** -0.5)
            times.append((time.perf_counter() - started) * 1e3)
        best[side] = min(times)
    return best


def main() -> None:
    torch.manual_seed(0)
    cpu_paged_attention.PREFILL_AS_ROWS_MAX_WORK = 1 << 40  # the rows side takes every chunk
    for heads, kv_heads, head_dim in SHAPES:
        for chunk, prefix in CHUNKS:
            ms = best_ms(chunk, prefix, heads, kv_heads, head_dim)
            print(f"{heads} query heads over {kv_heads} of {head_dim}, {chunk} tokens after {prefix}: "
                  f"SDPA {ms['sdpa']:.2f} ms, rows {ms['rows']:.2f} ms, rows / SDPA {ms['rows'] / ms['sdpa']:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
