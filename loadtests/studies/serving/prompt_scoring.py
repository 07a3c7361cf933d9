"""What prompt logprobs cost: the same prompts with and without `prompt_logprobs`, side by side.

    python -m kvserve.loadtests.studies.serving.prompt_scoring [--model GGUF_OR_DIR] \\
        [--prompts 8] [--prompt-len 400] [--rounds 3]

The offline engine (LLM.generate), prefix caching off, one new token per prompt: the work of an
evaluation harness scoring texts (completions' echo with logprobs). Random token ids, the same
for both sides. After one warm-up of each, the rounds alternate plain and scoring; the best of
each is printed, with their ratio, and the part of the scoring run spent turning the prompt rows'
logits into logprobs, ranks and top-k (the rest of the difference is the vocabulary projection
of every prompt row, which a plain prefill does for the last row only).
"""
from __future__ import annotations

import argparse
import random
import time

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine.engine import LLMEngine
from kvserve.backend.models import DEFAULT_CHAT_MODEL, resolve_model_arg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_CHAT_MODEL)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    llm = LLM(model=resolve_model_arg(args.model), max_model_len=args.prompt_len + 16, enable_prefix_caching=False)
    rng = random.Random(0)
    vocab = llm.engine.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    sides = {"plain": SamplingParams(max_tokens=1, temperature=0),
             "scoring": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)}
    scoring_seconds = _time_scoring()
    for params in sides.values():
        llm.generate(prompts[:2], params)
    best = {name: float("inf") for name in sides}
    best_scoring = float("inf")
    for _ in range(args.rounds):
        for name, params in sides.items():
            scoring_seconds[0] = 0.0
            started = time.perf_counter()
            llm.generate(prompts, params)
            elapsed = time.perf_counter() - started
            best[name] = min(best[name], elapsed)
            if name == "scoring":
                best_scoring = min(best_scoring, scoring_seconds[0])
    print(f"{args.prompts} x {args.prompt_len}-token prompts, 1 new token, {llm.engine.scheduler.max_scored_tokens} "
          f"scored rows per step at most: plain {best['plain']:.2f} s, prompt_logprobs=1 {best['scoring']:.2f} s "
          f"({best['scoring'] / best['plain']:.2f}x), of which {best_scoring:.2f} s logprobs from the logits")


def _time_scoring() -> list[float]:
    """Wrap LLMEngine._score_prompts to add its time into the returned one-element list."""
    total = [0.0]
    original = LLMEngine._score_prompts

    def timed(self, logits, sched):
        started = time.perf_counter()
        try:
            return original(self, logits, sched)
        finally:
            total[0] += time.perf_counter() - started

    LLMEngine._score_prompts = timed
    return total


if __name__ == "__main__":
    main()
