"""Time the native CPU decode attention (kernels/cpu_decode_attention.c) over one decode step's layers.

    .venv/bin/python loadtests/studies/decode_attention_bench.py --batch 16 --context 320 [--resident] \
        [--kv-dtype float32|bfloat16|fp8_e4m3|fp8_e5m2] [--verify-rows R]

Every layer has its own cache blocks, placed at random through the cache as a long-running
server's free list leaves them; --resident gives every layer the same blocks, so that the K/V
stays in the CPU's caches and the time is the kernel's arithmetic. SmolLM2-135M's shapes by
default (9 query heads, 3 kv heads of 64, 30 layers). Prints ms per step (best of --rounds)
and the K/V bytes over that time, beside `torch.sum` over as many bytes (what this machine
streams). --kv-dtype stores the caches in that dtype (the kernel widens them as it loads them).
--verify-rows R gives each request R query rows over its one block table, lengths context ..
context + R - 1, as a step that verifies R - 1 proposals brings them (the kernel attends such rows
together). To compare kernels, run it on two commits. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import time

import torch

from kvserve.backend.worker.kv_cache_tensors import allocate_kv_tensor
from kvserve.kernels import cpu_native
from kvserve.kernels.kv_quant import KV_DTYPES, quantize


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=320)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--resident", action="store_true", help="every layer reads the same blocks")
    p.add_argument("--kv-dtype", default="float32", choices=("float32", "bfloat16", "fp8_e4m3", "fp8_e5m2"))
    p.add_argument("--verify-rows", type=int, default=1, help="query rows per request (1 + proposals)")
    args = p.parse_args()
    if not cpu_native.available():
        raise SystemExit("the native kernels are not built here (no C compiler)")
    gen = torch.Generator().manual_seed(0)
    per_request = -(-(args.context + args.verify_rows - 1) // args.block_size)
    per_layer = args.batch * per_request
    num_blocks = per_layer * (1 if args.resident else args.layers)
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    kv_dtype = KV_DTYPES[args.kv_dtype]

    def cache() -> torch.Tensor:  # random values in memory allocated as the engine's (kv_cache_tensors.py)
        values = quantize(torch.randn(shape, generator=gen), kv_dtype)
        return allocate_kv_tensor(shape, kv_dtype, torch.device("cpu")).copy_(values)

    key_cache, value_cache = cache(), cache()
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = [order[(0 if args.resident else layer) * per_layer:][:per_layer].view(args.batch, per_request).contiguous()
              for layer in range(args.layers)]
    rows = args.verify_rows
    seq_lens = (torch.arange(rows, dtype=torch.int32) + args.context).repeat(args.batch)
    tables = [table.repeat_interleave(rows, dim=0).contiguous() for table in tables]
    query = torch.randn(args.batch * rows, args.heads, args.head_dim, generator=gen)
    scale = args.head_dim ** -0.5

    def step() -> None:
        for table in tables:
            cpu_native.paged_decode(query, key_cache, value_cache, table, seq_lens, scale)

    step()
    best = float("inf")
    for _ in range(args.rounds):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    kv_bytes = 2 * args.batch * args.context * args.kv_heads * args.head_dim * key_cache.element_size() * args.layers
    stream = torch.randn(kv_bytes // 4, generator=gen)
    stream.sum()
    started = time.perf_counter()
    stream.sum()
    summed = time.perf_counter() - started
    print(f"{args.kv_dtype} KV, batch {args.batch} x {rows} rows, context {args.context} "
          f"({'resident' if args.resident else 'scattered'} blocks): "
          f"{best * 1e3:.2f} ms per step, {kv_bytes / 1e6:.0f} MB of K/V at {kv_bytes / best / 1e9:.1f} GB/s; "
          f"torch.sum over as many bytes {summed * 1e3:.2f} ms ({kv_bytes / summed / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
