"""A/B of decode-step time in one process: two ways of running the same engine, alternated.

    .venv/bin/python loadtests/studies/ab_decode.py --model DIR --batch 16 --context 512 --pairs 8

B token prompts of `--context` tokens are prefilled, then blocks of `--steps`
decode steps alternate between variant A and variant B (ABAB..., or BABA... on
odd pairs, so a drift in machine load falls on both). Prints each pair's
B/A time ratio and their median, min and max: on a shared machine only the
ratios mean anything. Variants (`--a`, `--b`):

- `ref`: the CPU ops as they were (the torch references, every layer derives its own indices)
- `cur`: the engine as it runs (`TorchOps` with its per-step plans, and decode steps as one native call
  where backend/worker/native_decode.py applies)
- `perop`: the same engine with the native decode step off (every layer's operations from Python)
- `unpacked`: an engine of its own with F.linear (KVSERVE_CPU_PACKED_LINEAR=0) and the engine's ops
- `int8`, `int4`: an engine of its own with `quantization` set (same prompts)
- `fp8`, `bf16kv`: an engine of its own with `--kv-cache-dtype fp8_e4m3` or `bfloat16` (same prompts)
- `strips4`: `cur` with the grid strips capped at 4 rows a step, the grid tiles from 5 (the dispatch
  before the AVX2 strips took 5-6 rows in one call; the same as `cur` under AVX-512)
- `lib`: `cur` with cpu_native's entry points swapped to a library built from the kernels of git
  revision `--lib-base` (cpu_kernels/prefill_ab.py's builder). The weights are packed once, so both
  builds must agree on every layout: this compares kernel code, not packing:

    .venv/bin/python loadtests/studies/ab_decode.py --model GGUF --a lib --b cur --lib-base REV

One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import PackedLinear
from kvserve.kernels import cpu_native
from kvserve.kernels.kv_cache_store import store_kv_cache_torch
from kvserve.kernels.paged_attention_ref import paged_decode_attention_torch, paged_prefill_attention_torch
from kvserve.kernels.rms_norm import rms_norm_torch
from kvserve.kernels.rotary import rotary_embedding_torch
from kvserve.kernels.silu_and_mul import gelu_and_mul_torch, silu_and_mul_torch


VARIANTS = ("ref", "cur", "perop", "unpacked", "int8", "int4", "fp8", "bf16kv", "strips4", "lib")
_KV_DTYPE = {"fp8": "fp8_e4m3", "bf16kv": "bfloat16"}


class ReferenceOps:
    """The CPU path before per-step plans: each call derives everything from the metadata again."""
    name = "ref"

    def store_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        store_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping)

    def attention(self, query, key_cache, value_cache, meta, scale):
        if meta.decode_only:
            return paged_decode_attention_torch(query, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale)
        return paged_prefill_attention_torch(query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                                             meta.query_start_loc, scale)

    def rms_norm(self, x, weight, eps, residual=None):
        return rms_norm_torch(x, weight, eps, residual)

    def rotary(self, positions, query, key, cos_sin_cache, is_neox):
        rotary_embedding_torch(positions, query, key, cos_sin_cache, is_neox)

    def silu_and_mul(self, x):
        return silu_and_mul_torch(x)

    def gelu_and_mul(self, x, approximate):
        return gelu_and_mul_torch(x, approximate)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=4, help="decode steps per block")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--a", default="ref", choices=VARIANTS)
    p.add_argument("--b", default="cur", choices=VARIANTS)
    p.add_argument("--threads", type=int, default=None, help="engine num_threads (default: torch's)")
    p.add_argument("--lib-base", help="the git revision whose kernels the `lib` variant runs")
    p.add_argument("--cpu-time", action="store_true",
                   help="measure the process's CPU time instead of wall time (with --threads 1 on a busy "
                        "machine: the work done, without the waits for a core)")
    args = p.parse_args()
    if "lib" in (args.a, args.b) and args.lib_base is None:
        p.error("the lib variant needs --lib-base")
    own_library = cpu_native._library
    scratch = tempfile.TemporaryDirectory()
    libraries = {}
    if args.lib_base:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "cpu_kernels"))
        from attention_ab import kernels_at
        from prefill_ab import configured_library
        libraries["lib"] = configured_library(kernels_at(args.lib_base, Path(scratch.name) / "src"),
                                              Path(scratch.name) / "lib.so")
        own_library.cache_clear()  # the loader cached the revision's library: the engine loads its own
    total_steps = 2 * args.pairs * args.steps + 4
    params = SamplingParams(max_tokens=total_steps + 4, temperature=0, ignore_eos=True)
    engines: dict[str, object] = {}

    def engine_for(name: str):
        # ref, cur and perop share one engine (only its ops differ); a quantized mode has its own.
        key = name if name in ("int8", "int4", "unpacked", *_KV_DTYPE) else "none"
        if key not in engines:
            os.environ["KVSERVE_CPU_PACKED_LINEAR"] = "0" if key == "unpacked" else "1"
            engine = LLM(model=args.model, dtype="float32", max_num_seqs=args.batch, num_threads=args.threads,
                         quantization=key if key in ("int8", "int4") else "none",
                         kv_cache_dtype=_KV_DTYPE.get(key, "auto")).engine
            engine.own_ops = engine.runner.ops
            engine.own_native = engine.runner.model.native_decode
            rng = random.Random(0)
            for i in range(args.batch):
                engine.add_request(f"r{i}", [rng.randrange(100, 20000) for _ in range(args.context)], params)
            while any(len(s.request.output_token_ids) < 2 for s in engine.sequences.values()):
                engine.step()
            engines[key] = engine
        return engines[key]

    def cap_strips(engine, rows: int) -> None:
        capped = False
        for module in engine.runner.model.modules():
            if isinstance(module, PackedLinear) and module.grid is not None:
                capped |= module.strip_max_rows != rows
                module.strip_max_rows = rows
        if capped and engine.own_native is not None:
            engine.own_native._by_rows.clear()  # its per-row-count plans name the kernels picked before

    def block(name: str) -> float:
        engine = engine_for(name)
        engine.runner.ops = ReferenceOps() if name == "ref" else engine.own_ops
        engine.runner.model.native_decode = None if name in ("ref", "perop") else engine.own_native
        cap_strips(engine, min(4, cpu_native.grid_strip_rows()) if name == "strips4" else cpu_native.grid_strip_rows())
        cpu_native._library = (lambda: libraries[name]) if name in libraries else own_library
        t0 = time.process_time() if args.cpu_time else time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        return ((time.process_time() if args.cpu_time else time.perf_counter()) - t0) / args.steps

    engine_for(args.a), engine_for(args.b)
    ratios, times = [], {args.a: [], args.b: []}
    for i in range(args.pairs):
        order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
        t = {name: block(name) for name in order}
        times[args.a].append(t[args.a])
        times[args.b].append(t[args.b])
        ratios.append(t[args.b] / t[args.a])
        print(f"pair {i}: {args.a} {t[args.a] * 1e3:7.1f} ms  {args.b} {t[args.b] * 1e3:7.1f} ms  "
              f"{args.b}/{args.a} {ratios[-1]:.3f}", flush=True)
    cpu_native._library = own_library
    scratch.cleanup()
    print(f"batch {args.batch} context {args.context}: {args.b}/{args.a} step time median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, {args.pairs} pairs); "
          f"median ms {args.a} {statistics.median(times[args.a]) * 1e3:.1f}, "
          f"{args.b} {statistics.median(times[args.b]) * 1e3:.1f}")


if __name__ == "__main__":
    main()
