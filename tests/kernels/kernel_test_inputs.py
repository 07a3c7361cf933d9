"""Random inputs for the kernel tests: paged KV caches with shuffled block
tables, poisoned buffers, and the tolerance of each dtype."""
from __future__ import annotations

from typing import NamedTuple

import torch

# (atol, rtol) for a kernel against its torch reference. Float32 is near-exact
# (only summation order differs); the half types allow about one unit in the
# last place of the output, plus bf16/fp16 rounding of the softmax weights.
# Under the interpreter, float32 -> bfloat16 casts truncate instead of rounding
# to nearest, which the bf16 tolerance covers.
TOL = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# Stale cache slots hold this: large enough that a kernel reading past a
# sequence's end (or the wrong page) is far off, small enough not to overflow
# the reference's half-precision scores.
STALE = 100.0


class PagedKV(NamedTuple):
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor


def make_paged_kv(seq_lens: list[int], num_kv_heads: int, head_size: int, block_size: int, dtype: torch.dtype,
                  device: torch.device, gen: torch.Generator, table_dtype=torch.int32) -> PagedKV:
    """Caches whose blocks are handed out in a random permutation; every slot a
    request does not own (the tail of its last block, unused blocks, the block
    table's padding) holds STALE values."""
    need = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(need) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.full(shape, STALE)
    value_cache = torch.full(shape, STALE)
    perm = torch.randperm(num_blocks, generator=gen)
    spare = int(perm[-1])
    table = torch.full((len(seq_lens), max(need) + 2), spare, dtype=torch.int64)
    used = 0
    for b, (s, n) in enumerate(zip(seq_lens, need)):
        blocks = perm[used:used + n]
        used += n
        table[b, :n] = blocks
        flat_k = key_cache[blocks].reshape(n * block_size, num_kv_heads, head_size)
        flat_v = value_cache[blocks].reshape(n * block_size, num_kv_heads, head_size)
        flat_k[:s] = torch.randn(s, num_kv_heads, head_size, generator=gen)
        flat_v[:s] = torch.randn(s, num_kv_heads, head_size, generator=gen)
        key_cache[blocks] = flat_k.reshape(n, block_size, num_kv_heads, head_size)
        value_cache[blocks] = flat_v.reshape(n, block_size, num_kv_heads, head_size)
    return PagedKV(key_cache.to(dtype).to(device), value_cache.to(dtype).to(device),
                   table.to(table_dtype).to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device))


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert not actual.isnan().any(), "kernel left unwritten (NaN) elements"
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol)
