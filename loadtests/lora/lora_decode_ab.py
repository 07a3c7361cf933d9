"""A/B of decode-step time with LoRA adapters, offline, in one process (issue #33).

    .venv/bin/python -m kvserve.loadtests.lora.lora_decode_ab --batch 16 --context 128 --pairs 8 --a base --b lora8

Engines on the same model (SmolLM2-135M-Instruct by default), each with `--batch` requests of
`--context` random prompt tokens prefilled; blocks of `--steps` decode steps then alternate
between variant A and variant B (ABAB.., BABA.. on odd pairs, so a drift in machine load falls on
both). Variants:

- `base`: an engine without --enable-lora (the base model alone)
- `lora0`: the LoRA engine's base-model requests (what the wrapping alone costs)
- `lora8`: the LoRA engine, request i runs adapter i % 8 (8 rank-`--rank` adapters, all seven
  projections, written as loadtests/lora/lora_ab.py writes them)
- `lora8-perop`: `lora8` with the native decode step off (the layer-by-layer path)

Wall time per step, or the process's CPU time with --cpu-time (best with --threads 1 on a busy
machine); `--profile` prints a cProfile of a few steps of variant B.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.lora import LoRARequest
from kvserve.loadtests.lora.lora_ab import write_adapter

VARIANTS = ("base", "lora0", "lora8", "lora8-perop")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="decode steps per block")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--a", default="base", choices=VARIANTS)
    p.add_argument("--b", default="lora8", choices=VARIANTS)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None, help="engine num_threads (default: torch's)")
    p.add_argument("--cpu-time", action="store_true",
                   help="the process's CPU time instead of wall time (with --threads 1 on a busy machine: the "
                        "work done, without the waits for a core)")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    if args.model is None:
        from kvserve.backend.models.fetch import DEFAULT_CHAT_MODEL, ensure_known_model
        args.model = str(ensure_known_model(DEFAULT_CHAT_MODEL))
    tmp = tempfile.TemporaryDirectory(prefix="kvserve-lora-decode-ab-")
    adapters = [LoRARequest(f"a{i}", i + 1, str(write_adapter(Path(tmp.name) / f"a{i}", args.model, args.rank, 100 + i)))
                for i in range(8)]
    total_steps = 2 * args.pairs * args.steps + 8 + (8 if args.profile else 0)
    params = SamplingParams(max_tokens=total_steps + 4, temperature=0, ignore_eos=True)
    engines: dict[str, object] = {}

    def engine_for(name: str):
        if name not in engines:
            lora = name != "base"
            extra = dict(enable_lora=True, max_loras=8, max_lora_rank=args.rank) if lora else {}
            engine = LLM(model=args.model, dtype=args.dtype, max_num_seqs=args.batch, enable_prefix_caching=False,
                         num_threads=args.threads, **extra).engine
            engine.own_native = engine.runner.model.native_decode
            rng = random.Random(0)
            for i in range(args.batch):
                lr = adapters[i % 8] if name.startswith("lora8") else None
                if lr is not None:
                    engine.add_lora(lr)
                engine.add_request(f"r{i}", [rng.randrange(100, 20000) for _ in range(args.context)], params,
                                   lora_request=lr)
            while any(len(s.request.output_token_ids) < 2 for s in engine.sequences.values()):
                engine.step()
            engines[name] = engine
        return engines[name]

    def clock() -> float:
        return time.process_time() if args.cpu_time else time.perf_counter()

    def block(name: str, steps: int) -> float:
        engine = engine_for(name)
        engine.runner.model.native_decode = None if name.endswith("perop") else engine.own_native
        t0 = clock()
        for _ in range(steps):
            engine.step()
        return (clock() - t0) / steps

    engine_for(args.a), engine_for(args.b)
    block(args.a, 2), block(args.b, 2)  # warm: per-row-count descriptors built, slots filled
    ratios, times = [], {args.a: [], args.b: []}
    for i in range(args.pairs):
        order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
        t = {name: block(name, args.steps) for name in order}
        times[args.a].append(t[args.a])
        times[args.b].append(t[args.b])
        ratios.append(t[args.a] / t[args.b])
        print(f"pair {i}: {args.a} {t[args.a] * 1e3:7.1f} ms  {args.b} {t[args.b] * 1e3:7.1f} ms  "
              f"throughput {args.b}/{args.a} {ratios[-1]:.3f}", flush=True)
    print(f"batch {args.batch} context {args.context} rank {args.rank}: throughput {args.b}/{args.a} (step time "
          f"{args.a}/{args.b}) median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
          f"{args.pairs} pairs); median ms per step {args.a} {statistics.median(times[args.a]) * 1e3:.1f}, "
          f"{args.b} {statistics.median(times[args.b]) * 1e3:.1f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(block, args.b, 6)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
