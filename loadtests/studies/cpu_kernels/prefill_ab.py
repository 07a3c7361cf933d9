"""A/B of whole prefills in one engine: a git revision's native kernels against the working tree's.

    .venv/bin/python loadtests/studies/cpu_kernels/prefill_ab.py --model /tmp/smollm2-hf --base HEAD \
        [--prompt-len 256] [--prompts 1] [--rounds 8]

Builds kernels/*.c as they are at `--base` and as they are now (attention_ab.py's builder), and
points kvserve.kernels.cpu_native at one library or the other between rounds, in one engine over the
same weights (the weights' packed layouts must be the same in both builds: an A/B of a kernel's
work, not of its format). Each round times three prefills of `--prompts` new prompts of random
tokens (max_tokens 1, no prefix cache) on each side, alternating which side goes first, and prints
each side's median and the ratio. One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from attention_ab import KERNELS, compile_kernels, kernels_at

from kvserve.backend import LLM, SamplingParams
from kvserve.kernels import cpu_native


def configured_library(sources: Path, out: Path):
    """cpu_native's own loader (its argument types) over a library built from `sources`."""
    compile_kernels(sources, out)
    build = cpu_native._build
    cpu_native._library.cache_clear()
    cpu_native._build = lambda compiler: out
    try:
        return cpu_native._library()
    finally:
        cpu_native._build = build


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--base", default="HEAD", help="git revision whose kernels are the baseline")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--prompts", type=int, default=1, help="prompts prefilled together")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    libs = {f"base ({args.base})": configured_library(kernels_at(args.base, tmp / "base"), tmp / "base.so"),
            "working tree": configured_library(KERNELS, tmp / "new.so")}
    current = [next(iter(libs))]
    cpu_native._library = lambda: libs[current[0]]
    engine = LLM(model=args.model, dtype="float32", max_num_seqs=max(args.prompts, 1),
                 enable_prefix_caching=False).engine
    rng = random.Random(0)
    count = [0]

    def prefill() -> float:
        for _ in range(args.prompts):
            count[0] += 1
            engine.add_request(f"p{count[0]}", [rng.randrange(100, 20000) for _ in range(args.prompt_len)],
                               SamplingParams(max_tokens=1, temperature=0))
        started = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return (time.perf_counter() - started) * 1e3

    for name in libs:  # warm: each library's code and the engine's buffers
        current[0] = name
        prefill()
        prefill()
    times: dict[str, list[float]] = {name: [] for name in libs}
    for r in range(args.rounds):
        for name in (list(libs) if r % 2 == 0 else list(libs)[::-1]):
            current[0] = name
            times[name].append(statistics.median(prefill() for _ in range(3)))
    print(f"{args.prompts} x {args.prompt_len}-token prefill, {args.rounds} alternated rounds (median of 3 each):")
    for name, ms in times.items():
        print(f"  {name}: median {statistics.median(ms):.1f} ms, best {min(ms):.1f} ms")
    (_, base_ms), (_, new_ms) = times.items()
    print(f"  working tree / base: {statistics.median(new_ms) / statistics.median(base_ms):.3f} (medians)")


if __name__ == "__main__":
    main()
