"""A/B of a decode step between two builds of the native CPU kernels, in one process and one engine.

    git -C /work/main archive BASE kernels | tar -x -C /tmp/base      # the older kernel sources
    .venv/bin/python loadtests/studies/cpu_kernels/library_ab.py --model <GGUF or folder> \
        --sources /tmp/base/kernels --sources kernels --pairs 12 [--batch 1] [--quantization int4]

Each `--sources` folder's C files are compiled with kernels/cpu_native.py's flags. One engine runs
its requests; blocks of decode steps alternate between the two libraries (ABAB..., BABA... on odd
pairs, so a drift in the machine's load falls on both), swapped under cpu_native's entry points.
The weights are packed once, so the builds must agree on every layout: this compares kernel code,
not packing. Prints each side's median step and the median B/A ratio. One-off measurement, not
installed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from kvserve.backend import LLM, SamplingParams
from kvserve.kernels import cpu_native


def _compile(sources: Path, out: Path):
    """The library of `sources`' C files, loaded and its entry points declared as cpu_native does."""
    files = [str(sources / path.name) for path in cpu_native._SOURCES]
    subprocess.run(["cc", *cpu_native._FLAGS, "-o", str(out), *files, "-lm"], check=True)
    real_build = cpu_native._build
    cpu_native._build = lambda compiler: out
    try:
        return cpu_native._library.__wrapped__()
    finally:
        cpu_native._build = real_build


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--sources", action="append", required=True, type=Path, help="a kernels folder (twice: A, B)")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--steps", type=int, default=8, help="decode steps per block")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--quantization", default="none")
    args = p.parse_args()
    if len(args.sources) != 2:
        p.error("--sources takes two folders: A, then B")
    with tempfile.TemporaryDirectory() as tmp:
        libs = [_compile(folder, Path(tmp) / f"{side}.so") for side, folder in zip("ab", args.sources)]
        engine = LLM(model=args.model, dtype="float32", max_num_seqs=args.batch,
                     quantization=args.quantization).engine
        rng = random.Random(0)
        params = SamplingParams(max_tokens=args.pairs * 2 * (args.steps + 1) + 16, temperature=0, ignore_eos=True)
        for i in range(args.batch):
            engine.add_request(f"r{i}", [rng.randrange(100, 20000) for _ in range(args.context)], params)
        for _ in range(6):  # the prompts, and the first decode steps
            engine.step()
        real = cpu_native._library
        times: list[list[float]] = [[], []]
        try:
            for i in range(args.pairs):
                for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                    cpu_native._library = lambda lib=libs[side]: lib
                    engine.step()
                    started = time.perf_counter()
                    for _ in range(args.steps):
                        engine.step()
                    times[side].append((time.perf_counter() - started) / args.steps * 1e3)
        finally:
            cpu_native._library = real
    ratios = [b / a for a, b in zip(*times)]
    print(f"batch {args.batch}, {args.quantization}: A {statistics.median(times[0]):.2f} ms, "
          f"B {statistics.median(times[1]):.2f} ms a step; B/A median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {args.pairs} pairs)")


if __name__ == "__main__":
    main()
