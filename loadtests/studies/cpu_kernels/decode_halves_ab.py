"""A/B of the native decode step's two halves (cpu_decode_step.c) against one pass over the rows, in one engine.

    .venv/bin/python loadtests/studies/cpu_kernels/decode_halves_ab.py --model /tmp/smollm2-hf \
        [--batch 16] [--context 256] [--steps 128] [--rounds 3]

Each round prefills `--batch` prompts of `--context` random tokens (the same ones every round, no
prefix cache), then times the `--steps` greedy decode steps that follow, once with the halves
policy as it ships (backend/worker/native_decode.py: two halves, one a thread, where a step of 8
rows or more reads at least twice its weights' bytes in K/V) and once with the halves off, the side
that goes first alternating round by round. Prints each side's median ms per step, the ratio, how
many of the policy side's steps took the halves, and whether both sides' tokens are the same (they
must be: the same kernels on the same rows). Needs two threads (the halves' condition). One-off
measurement, not installed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.worker import native_decode
from kvserve.kernels import cpu_native


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if torch.get_num_threads() != 2:
        raise SystemExit(f"the halves need two threads; this process has {torch.get_num_threads()}")
    llm = LLM(model=args.model, dtype="float32", max_num_seqs=args.batch, enable_prefix_caching=False)
    engine = llm.engine
    split_rows: list[int] = []
    real_step = cpu_native.decode_step

    def counted_step(shape, *rest):
        split_rows.append(shape._obj.split_row)
        return real_step(shape, *rest)

    cpu_native.decode_step = counted_step
    sides = {"one pass": 10**9, "halves policy": native_decode.HALVES_MIN_ROWS}  # HALVES_MIN_ROWS per side
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list[list[int]]] = {}
    taken = native_steps = 0  # the policy side's last round: native steps in halves, of all
    for r in range(args.rounds + 1):  # the first round warms up
        for name, min_rows in (list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]):
            native_decode.HALVES_MIN_ROWS = min_rows
            rng = random.Random(0)
            ids = [f"{name}-{r}-{b}" for b in range(args.batch)]
            for rid in ids:
                engine.add_request(rid, [rng.randrange(100, 20000) for _ in range(args.context)],
                                   SamplingParams(max_tokens=args.steps + 1, temperature=0, ignore_eos=True))
            out: dict[str, list[int]] = {rid: [] for rid in ids}
            while any(not s.request.output_token_ids for s in engine.sequences.values()):
                for o in engine.step():  # the prefill and its first token
                    out[o.request_id] += o.outputs[0].token_ids
            split_rows.clear()
            started, steps = time.perf_counter(), 0
            while engine.has_unfinished():
                for o in engine.step():
                    out[o.request_id] += o.outputs[0].token_ids
                steps += 1
            ms = (time.perf_counter() - started) / steps * 1e3
            if name == "halves policy":
                taken, native_steps = sum(1 for row in split_rows if row), len(split_rows)
            if r:
                times[name].append(ms)
            tokens.setdefault(name, [out[rid] for rid in ids])
            print(f"round {r}{' (warm-up)' if not r else ''}: {name} {ms:.2f} ms a step", flush=True)
    native_decode.HALVES_MIN_ROWS = sides["halves policy"]
    (_, base), (_, new) = times.items()
    print(f"batch {args.batch}, context {args.context}, {args.steps} steps, {args.rounds} rounds: one pass "
          f"{statistics.median(base):.2f} ms, halves policy {statistics.median(new):.2f} ms a step (medians); "
          f"policy / one pass {statistics.median(new) / statistics.median(base):.3f}; halves in {taken} of "
          f"the policy's last {native_steps} native steps; same tokens: "
          f"{tokens['one pass'] == tokens['halves policy']}")


if __name__ == "__main__":
    main()
