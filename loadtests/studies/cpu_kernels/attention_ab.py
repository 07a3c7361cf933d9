"""A/B of the native decode attention: a git revision's kernels against the working tree's, in one process.

    .venv/bin/python loadtests/studies/cpu_kernels/attention_ab.py --base HEAD --batch 1 --context 1000 \
        [--verify-rows R] [--prompt-rows N] [--rounds 30] [--stream-mb 2]

Builds kernels/*.c as they are at `--base` and as they are now (cpu_native's compiler and flags),
loads both libraries, and alternates them over one decode step's 30 layers of SmolLM2-135M's shapes
(9 query heads, 3 kv heads of 64): every layer's cache blocks at random places in one float32 cache,
as a long-running server's free list leaves them. `--prompt-rows` puts a prompt chunk of that many
tokens (rows of lengths 1..N, over blocks of their own) before the requests, as a step that prefills
one prompt beside the decodes attends it. `decode_attention_bench.py` times one build per
process, whose spread from run to run on this 2-core VM (3.1-4.1 ms at batch 1 and 1,000 tokens,
the same build) hides a 10 % change; alternated in one process over the same blocks, the medians
move by ~1 %. `--stream-mb` reads that many MB of a 96 MB buffer before each layer's attention, as a
decode step streams its weights between them (~2 MB a layer for SmolLM2): without it, a short
context's K/V stays in the L3 from one step to the next, as it does not in a served step. Prints
each side's median and best ms per step (the streaming included), the ratio, and whether the two
outputs have the same bits. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from kvserve.backend.worker.kv_cache_tensors import allocate_kv_tensor
from kvserve.kernels import cpu_native

KERNELS = Path(cpu_native.__file__).resolve().parent
_ARGTYPES = ([ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_void_p] + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int])


def compile_kernels(sources: Path, out: Path) -> Path:
    """kernels/*.c from `sources` built into the library `out`, with cpu_native's compiler and flags."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler")
    files = [str(sources / path.name) for path in cpu_native._SOURCES]
    subprocess.run([compiler, *cpu_native._FLAGS, "-o", str(out), *files, "-lm"], check=True)
    return out


def build(sources: Path, out: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(compile_kernels(sources, out)))
    lib.kvserve_paged_decode.restype = ctypes.c_int
    lib.kvserve_paged_decode.argtypes = _ARGTYPES
    return lib


def kernels_at(revision: str, into: Path) -> Path:
    into.mkdir()
    for path in (*cpu_native._SOURCES, *cpu_native._HEADERS):
        text = subprocess.run(["git", "show", f"{revision}:kernels/{path.name}"], cwd=KERNELS, check=True,
                              capture_output=True).stdout
        (into / path.name).write_bytes(text)
    return into


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", default="HEAD", help="git revision whose kernels are the baseline")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--verify-rows", type=int, default=1, help="query rows per request (1 + proposals)")
    p.add_argument("--prompt-rows", type=int, default=0, help="a prompt chunk's rows (lengths 1..N) before the batch")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--stream-mb", type=float, default=0.0, help="MB read before each layer (the weights' stream)")
    args = p.parse_args()
    heads, kv_heads, head_dim, block_size, layers = 9, 3, 64, 16, 30
    rows = args.verify_rows
    gen = torch.Generator().manual_seed(0)
    per_request = -(-max(args.context + rows - 1, args.prompt_rows) // block_size)
    counts = ([args.prompt_rows] if args.prompt_rows else []) + [rows] * args.batch  # rows of each table
    per_layer = len(counts) * per_request
    shape = (per_layer * layers, block_size, kv_heads, head_dim)

    def cache() -> torch.Tensor:
        return allocate_kv_tensor(shape, torch.float32, torch.device("cpu")).copy_(torch.randn(shape, generator=gen))

    key_cache, value_cache = cache(), cache()
    order = torch.randperm(shape[0], generator=gen).to(torch.int32)
    tables = [order[layer * per_layer:][:per_layer].view(len(counts), per_request)
              .repeat_interleave(torch.tensor(counts), dim=0).contiguous() for layer in range(layers)]
    lens = torch.cat([torch.arange(1, args.prompt_rows + 1, dtype=torch.int32),
                      (torch.arange(rows, dtype=torch.int32) + args.context).repeat(args.batch)])
    query = torch.randn(sum(counts), heads, head_dim, generator=gen)
    weights = torch.randn(96 * 2**20 // 4, generator=gen) if args.stream_mb else None
    stream_at = 0

    def stream() -> None:
        nonlocal stream_at
        count = int(args.stream_mb * 2**20) // 4
        if stream_at + count > weights.numel():
            stream_at = 0
        weights[stream_at:stream_at + count].sum()
        stream_at += count

    def step(lib: ctypes.CDLL) -> torch.Tensor:
        out = torch.empty_like(query)
        for table in tables:
            if weights is not None:
                stream()
            status = lib.kvserve_paged_decode(
                query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), 0, None, table.data_ptr(),
                table.stride(0), lens.data_ptr(), out.data_ptr(), query.shape[0], heads, kv_heads, head_dim,
                block_size, 0, head_dim ** -0.5, torch.get_num_threads())
            if status:
                raise SystemExit(f"the kernel refused the shapes ({status})")
        return out

    with tempfile.TemporaryDirectory() as tmp:
        sides = {f"base ({args.base})": build(kernels_at(args.base, Path(tmp) / "base"), Path(tmp) / "base.so"),
                 "working tree": build(KERNELS, Path(tmp) / "new.so")}
        outputs = {name: step(lib) for name, lib in sides.items()}  # warm: pages touched, code loaded
        times: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name, lib in (list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]):
                started = time.perf_counter()
                step(lib)
                times[name].append((time.perf_counter() - started) * 1e3)
    (base, base_ms), (new, new_ms) = times.items()
    prompt = f"a {args.prompt_rows}-token prompt chunk and " if args.prompt_rows else ""
    print(f"{prompt}batch {args.batch} x {rows} rows, context {args.context}, {layers} layers, scattered blocks, "
          f"{args.stream_mb:g} MB streamed a layer, {args.rounds} alternated rounds:")
    for name, ms in times.items():
        print(f"  {name}: median {statistics.median(ms):.3f} ms, best {min(ms):.3f} ms")
    same = torch.equal(outputs[base], outputs[new])
    print(f"  working tree / base: {statistics.median(new_ms) / statistics.median(base_ms):.3f} (medians); "
          f"same bits: {same}")


if __name__ == "__main__":
    main()
