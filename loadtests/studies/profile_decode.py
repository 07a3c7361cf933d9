"""Profile the engine's decode steps: torch.profiler over `LLMEngine.step()` at a given batch and context.

    .venv/bin/python loadtests/studies/profile_decode.py --model DIR --batch 16 --context 512

B token prompts of `--context` tokens are prefilled first (not profiled), then
`--steps` decode steps run under the profiler; prints the ops by self CPU time
and the mean wall time per step. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kvserve.backend import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rows", type=int, default=25, help="profile table rows")
    p.add_argument("--no-profile", action="store_true", help="time steps only")
    p.add_argument("--engine-arg", action="append", default=[], metavar="K=V")
    args = p.parse_args()
    extra = {k: (int(v) if v.isdigit() else v) for k, v in (kv.split("=", 1) for kv in args.engine_arg)}
    llm = LLM(model=args.model, dtype="float32", max_num_seqs=max(args.batch, 1), **extra)
    engine = llm.engine
    rng = random.Random(0)
    params = SamplingParams(max_tokens=args.steps * 3 + 8, temperature=0, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"r{i}", [rng.randrange(100, 20000) for _ in range(args.context)], params)
    # Prefill (and a few decodes to warm up) outside the measurement.
    while any(len(s.request.output_token_ids) < 3 for s in engine.sequences.values()):
        engine.step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    dt = (time.perf_counter() - t0) / args.steps
    print(f"batch {args.batch} context ~{args.context}: {dt * 1e3:.1f} ms per decode step (unprofiled)")
    if args.no_profile:
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
