"""Kernel micro-benchmark: each Triton kernel beside its torch path, on CUDA.

    python -m kvserve.loadtests.gpu.kernel_bench [--json out.json]

Times are medians of `triton.testing.do_bench` (L2 flushed between runs).
Everything is reported as a ratio against something measured in the same run:

- decode attention: achieved memory bandwidth (K/V bytes read plus query and
  output) as a fraction of a device-to-device copy's bandwidth, and the paged
  kernel's time over the same kernel reading contiguous KV (one block per
  request, i.e. no page indirection), plus torch SDPA on contiguous KV;
- the other kernels: torch reference time over Triton time (speedup).

Absolute times are printed for the record only. Without CUDA it says so and
exits 0 (the kernels' correctness is covered by tests/kernels on the CPU);
`--smoke` instead runs every case on tiny shapes in Triton's interpreter on the
CPU (set TRITON_INTERPRET=1), to prove the harness end to end where no GPU is:
its times and fractions mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F

BATCHES = (1, 8, 64)
CONTEXTS = (1024, 8192, 32768)


@dataclass(frozen=True, slots=True)
class Shapes:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    tokens: int = 4096           # a Llama-3-8B-sized prefill step ...
    hidden: int = 4096
    intermediate: int = 14336
    prefill_batch: int = 4       # ... and extend attention over a cached prefix
    prefill_new: int = 1024
    prefill_prefix: int = 1024
    rotary_positions: int = 32768
    copy_bytes: int = 1 << 30


# --smoke: the same cases, small enough for the interpreter.
SMOKE = Shapes(num_heads=4, num_kv_heads=2, head_size=16, block_size=4, tokens=8, hidden=32, intermediate=32,
               prefill_batch=2, prefill_new=4, prefill_prefix=4, rotary_positions=64, copy_bytes=1 << 20)
SMOKE_BATCHES, SMOKE_CONTEXTS = (1, 2), (8, 20)

Timer = Callable[[Callable[[], object]], float]  # seconds per call


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.gpu.kernel_bench", description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes on the CPU under TRITON_INTERPRET=1 (harness check; times mean nothing)")
    return p.parse_args(argv)


def _copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write both counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src))


def _decode_case(device, timer, dtype, shapes: Shapes, batch, context, copy_bw, kv_dtype=None) -> dict:
    from kvserve.kernels.paged_decode_attention import choose_num_splits, paged_decode_attention_triton
    from kvserve.kernels._triton_utils import num_sms

    num_heads, num_kv_heads, head_size, block_size = (shapes.num_heads, shapes.num_kv_heads, shapes.head_size,
                                                      shapes.block_size)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    kv_dtype = kv_dtype or dtype  # fp8 caches hold randn's values rounded (scale 1.0, as kv_quant.py stores them)
    key_cache = torch.randn(shape, dtype=dtype, device=device).to(kv_dtype)
    value_cache = torch.randn(shape, dtype=dtype, device=device).to(kv_dtype)
    query = torch.randn(batch, num_heads, head_size, dtype=dtype, device=device)
    out = torch.empty_like(query)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    scale = head_size ** -0.5
    # paged: every request's pages scattered over the whole cache
    paged_table = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
    # contiguous: the same memory seen as one block per request
    padded = blocks_per_seq * block_size
    flat_k = key_cache.view(batch, padded, num_kv_heads, head_size)
    flat_v = value_cache.view(batch, padded, num_kv_heads, head_size)
    flat_table = torch.arange(batch, dtype=torch.int32, device=device).view(batch, 1)

    t_paged = timer(lambda: paged_decode_attention_triton(query, key_cache, value_cache, paged_table, seq_lens,
                                                          scale, max_seq_len=context, out=out))
    t_flat = timer(lambda: paged_decode_attention_triton(query, flat_k, flat_v, flat_table, seq_lens, scale,
                                                         max_seq_len=context, out=out))
    q4 = query[:, :, None, :]
    k4 = flat_k[:, :context].transpose(1, 2)
    v4 = flat_v[:, :context].transpose(1, 2)
    try:
        t_sdpa = timer(lambda: F.scaled_dot_product_attention(q4, k4, v4, scale=scale, enable_gqa=True))
    except RuntimeError as exc:  # no SDPA backend for these strides/sizes, or out of memory
        print(f"  (sdpa skipped for batch={batch} context={context}: {exc})", file=sys.stderr)
        t_sdpa = float("nan")

    elt = query.element_size()
    nbytes = 2 * batch * context * num_kv_heads * head_size * key_cache.element_size() + 2 * query.numel() * elt
    bw = nbytes / t_paged
    return {
        "batch": batch, "context": context, "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "num_splits": choose_num_splits(batch, num_kv_heads, context, num_sms(device)),
        "paged_us": t_paged * 1e6, "contiguous_us": t_flat * 1e6, "sdpa_contiguous_us": t_sdpa * 1e6,
        "paged_over_contiguous": t_paged / t_flat, "paged_over_sdpa": t_paged / t_sdpa,
        "bandwidth_GBps": bw / 1e9, "fraction_of_copy": bw / copy_bw,
    }


def _other_kernels(device, timer, dtype, shapes: Shapes) -> list[dict]:
    from kvserve.kernels.kv_cache_store import store_kv_cache_torch, store_kv_cache_triton
    from kvserve.kernels.paged_prefill_attention import (paged_prefill_attention_torch,
                                                         paged_prefill_attention_triton)
    from kvserve.kernels.rms_norm import rms_norm_torch, rms_norm_triton
    from kvserve.kernels.rotary import rotary_embedding_torch, rotary_embedding_triton
    from kvserve.kernels.silu_and_mul import silu_and_mul_torch, silu_and_mul_triton

    num_heads, num_kv_heads, head_size, block_size = (shapes.num_heads, shapes.num_kv_heads, shapes.head_size,
                                                      shapes.block_size)
    tokens, hidden, positions = shapes.tokens, shapes.hidden, shapes.rotary_positions
    rows = []

    def row(name, triton_fn, torch_fn):
        t_tri, t_ref = timer(triton_fn), timer(torch_fn)
        rows.append({"kernel": name, "triton_us": t_tri * 1e6, "torch_us": t_ref * 1e6, "speedup": t_ref / t_tri})

    # KV store: one prefill batch of `tokens` into scattered slots
    num_blocks = 4 * tokens // block_size
    kc = torch.zeros(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, num_kv_heads, head_size, dtype=dtype, device=device)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    row("store_kv", lambda: store_kv_cache_triton(k, v, kc, vc, slots),
        lambda: store_kv_cache_torch(k, v, kc, vc, slots))

    x = torch.randn(tokens, hidden, dtype=dtype, device=device)
    res = torch.randn_like(x)
    w = torch.randn(hidden, dtype=dtype, device=device)
    row("rms_norm", lambda: rms_norm_triton(x, w, 1e-6), lambda: rms_norm_torch(x, w, 1e-6))
    row("rms_norm+residual", lambda: rms_norm_triton(x, w, 1e-6, res), lambda: rms_norm_torch(x, w, 1e-6, res))

    q = torch.randn(tokens, num_heads, head_size, dtype=dtype, device=device)
    kk = torch.randn(tokens, num_kv_heads, head_size, dtype=dtype, device=device)
    cos_sin = torch.randn(positions, head_size, dtype=torch.float32, device=device)
    pos = torch.randint(0, positions, (tokens,), device=device)
    row("rotary (neox)", lambda: rotary_embedding_triton(pos, q, kk, cos_sin, True),
        lambda: rotary_embedding_torch(pos, q, kk, cos_sin, True))

    gate_up = torch.randn(tokens, 2 * shapes.intermediate, dtype=dtype, device=device)
    row("silu_and_mul", lambda: silu_and_mul_triton(gate_up), lambda: silu_and_mul_torch(gate_up))

    # extend attention: 4 requests, 1024 new tokens each over a 1024-token cached prefix
    batch, new, prefix = shapes.prefill_batch, shapes.prefill_new, shapes.prefill_prefix
    seq = new + prefix
    per_seq = -(-seq // block_size)
    kc = torch.randn(batch * per_seq, block_size, num_kv_heads, head_size, dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    table = torch.randperm(batch * per_seq, device=device).to(torch.int32).view(batch, per_seq)
    seq_lens = torch.full((batch,), seq, dtype=torch.int32, device=device)
    qsl = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32, device=device)
    qp = torch.randn(batch * new, num_heads, head_size, dtype=dtype, device=device)
    scale = head_size ** -0.5
    row("prefill attention", lambda: paged_prefill_attention_triton(qp, kc, vc, table, seq_lens, qsl, scale,
                                                                    max_query_len=new),
        lambda: paged_prefill_attention_torch(qp, kc, vc, table, seq_lens, qsl, scale))
    return rows


def run(device: torch.device, timer: Timer, dtype: torch.dtype, batches, contexts,
        shapes: Shapes = Shapes()) -> dict:
    copy_bw = _copy_bandwidth(device, timer, shapes.copy_bytes)
    decode = []
    for batch in batches:
        for context in contexts:
            decode.append(_decode_case(device, timer, dtype, shapes, batch, context, copy_bw))
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the 64 x 32k case alone holds ~8.6 GB of KV
    return {"shapes": asdict(shapes), "copy_GBps": copy_bw / 1e9, "decode": decode,
            "kv_dtypes": _kv_dtype_cases(device, timer, dtype, shapes, decode, copy_bw),
            "kernels": _other_kernels(device, timer, dtype, shapes)}


KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float32)
OVER_QUERY_DTYPE_KV = "paged_over_query_dtype_kv"  # a row's time over the same case with a cache of the queries' dtype


def _kv_dtype_cases(device, timer, dtype, shapes: Shapes, decode: list[dict], copy_bw) -> list[dict]:
    """--kv-cache-dtype on the Triton decode kernel: the same cases at the longest contexts over fp8 and
    float32 caches, each timed against the `dtype` (bf16) cache of the same case. Memory-bound decode
    should take about the bytes' ratio: 0.5x for fp8 against bf16."""
    longest = sorted({row["context"] for row in decode})[-2:]
    rows = []
    for base in (row for row in decode if row["context"] in longest):
        for kv_dtype in KV_DTYPES:
            try:
                row = _decode_case(device, timer, dtype, shapes, base["batch"], base["context"], copy_bw, kv_dtype)
            except Exception as exc:  # noqa: BLE001 - a cache dtype the kernel refuses is a finding to report
                rows.append({"batch": base["batch"], "context": base["context"],
                             "kv_dtype": str(kv_dtype).removeprefix("torch."), "error": f"{type(exc).__name__}: {exc}"})
                continue
            row[OVER_QUERY_DTYPE_KV] = row["paged_us"] / base["paged_us"]
            rows.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _wall_timer(fn) -> float:
    """The interpreter's timer (--smoke): median wall time of a few calls after one warm-up."""
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _print(results: dict, device_name: str, dtype: torch.dtype) -> None:
    sh = results["shapes"]
    print(f"device: {device_name}   dtype: {dtype}   heads: {sh['num_heads']} q / {sh['num_kv_heads']} kv, "
          f"head size {sh['head_size']}, block size {sh['block_size']}")
    print(f"device-to-device copy: {results['copy_GBps']:.0f} GB/s (the bandwidth ceiling below)\n")
    print("decode attention    splits  paged us  contig us  sdpa us  paged/contig  paged/sdpa   GB/s  of copy")
    for r in results["decode"]:
        print(f"  B={r['batch']:<3} ctx={r['context']:<6} {r['num_splits']:>4} {r['paged_us']:>9.1f} "
              f"{r['contiguous_us']:>10.1f} {r['sdpa_contiguous_us']:>8.1f} {r['paged_over_contiguous']:>13.2f} "
              f"{r['paged_over_sdpa']:>11.2f} {r['bandwidth_GBps']:>6.0f} {r['fraction_of_copy']:>8.0%}")
    print(f"\nKV cache dtype         paged us   GB/s  of copy  over {str(dtype).removeprefix('torch.')} KV")
    for r in results.get("kv_dtypes", []):
        head = f"  B={r['batch']:<3} ctx={r['context']:<6} {r['kv_dtype']:<14}"
        print(head + (f" {r['error'][:80]}" if "error" in r else
                      f" {r['paged_us']:>9.1f} {r['bandwidth_GBps']:>6.0f} {r['fraction_of_copy']:>8.0%}"
                      f" {r[OVER_QUERY_DTYPE_KV]:>8.2f}x"))
    print("\nkernel               triton us   torch us   speedup")
    for r in results["kernels"]:
        print(f"  {r['kernel']:<18} {r['triton_us']:>9.1f} {r['torch_us']:>10.1f} {r['speedup']:>8.2f}x")


def main(argv=None) -> int:
    args = _parse(argv)
    dtype = getattr(torch, args.dtype)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("kernel_bench --smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1",
                  file=sys.stderr)
            return 2
        results = run(torch.device("cpu"), _wall_timer, dtype, SMOKE_BATCHES, SMOKE_CONTEXTS, SMOKE)
        results["smoke"] = True
        _print(results, "cpu (Triton interpreter, --smoke: times mean nothing)", dtype)
    elif not torch.cuda.is_available():
        print("kernel_bench needs a CUDA GPU (the Triton kernels are benchmarked on device); nothing to do here.")
        return 0
    else:
        from triton.testing import do_bench

        def timer(fn) -> float:
            return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3

        device = torch.device("cuda")
        results = run(device, timer, dtype, args.batches, args.contexts)
        results.update(device=torch.cuda.get_device_name(device), dtype=args.dtype, smoke=False)
        _print(results, results["device"], dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
