"""Where a decode step's time goes outside the native kernels: the Python share of a step.

    .venv/bin/python loadtests/studies/step_overhead.py --model DIR [--batch 1] [--context 256] [--rounds 4] [--quantization int4]

Each round prefills `--batch` prompts of `--context` random tokens, then times the
128 decode steps that follow (greedy, ignore_eos). It reports, per step, the wall
time of `LLMEngine.step()`, the time inside the native decode step (every layer,
kernels/cpu_decode_step.c) and inside the logits projection (one native linear
call), and the rest: the scheduler, the runner's inputs, the embedding lookup,
the final norm, the sampler, detokenizing, all of it Python or small torch
operations that the cores spend while the kernels wait. The native time moves
with the machine's load; the rest is the figure to compare between two
versions of the code (alternate them: `git stash`, run, `git stash pop`, run).
One-off measurement, not installed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict

# The step's calls outside the native decode step that project onto the vocabulary (the decode step
# calls its own kernels from C). A prefill step calls these too, and no decode_step.
LOGITS_KERNELS = ("grid_linear_strips", "linear_grid", "linear", "linear_i4")


def _timed(store: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            store[key] += time.perf_counter() - start
    return wrapper


def wrap_step_kernels(cpu_native, spent: dict) -> None:
    """Add the time inside cpu_native's decode step to spent["native"] and inside the logits kernels to
    spent["logits"] (serving/step_hook/step_timers.py splits served steps with it too)."""
    cpu_native.decode_step = _timed(spent, "native", cpu_native.decode_step)
    for name in LOGITS_KERNELS:
        setattr(cpu_native, name, _timed(spent, "logits", getattr(cpu_native, name)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--quantization", default="none", choices=("none", "int8", "int4"))
    args = p.parse_args()
    # Imported here: serving/step_hook/step_timers.py imports this module inside a served host.
    from kvserve.backend import LLM, SamplingParams
    from kvserve.kernels import cpu_native

    llm = LLM(model=args.model, dtype="float32", max_num_seqs=max(args.batch, 1), quantization=args.quantization)
    engine = llm.engine
    spent: dict[str, float] = defaultdict(float)
    wrap_step_kernels(cpu_native, spent)
    rng = random.Random(0)
    rest = []
    for r in range(args.rounds + 1):  # the first round warms up
        for b in range(args.batch):
            prompt = [rng.randrange(100, 20000) for _ in range(args.context)]
            engine.add_request(f"r{r}-{b}", prompt,
                               SamplingParams(max_tokens=args.steps + 1, temperature=0, ignore_eos=True))
        while any(not s.request.output_token_ids for s in engine.sequences.values()):
            engine.step()  # the prefill
        spent.clear()
        start, steps = time.perf_counter(), 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        wall = (time.perf_counter() - start) / steps * 1e3
        native, logits = spent["native"] / steps * 1e3, spent["logits"] / steps * 1e3
        if r:
            rest.append(wall - native - logits)
        print(f"{'warm-up' if not r else f'round {r}'}: step {wall:.3f} ms = native step {native:.3f} "
              f"+ logits {logits:.3f} + the rest {wall - native - logits:.3f} ms")
    print(f"the rest, median of {len(rest)} rounds: {statistics.median(rest):.3f} ms per step")


if __name__ == "__main__":
    main()
