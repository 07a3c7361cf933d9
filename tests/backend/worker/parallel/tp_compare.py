"""Run the same greedy requests through two engines and compare them step by step: tokens (the
agreement and the first position where they part) and the logits of every step until then."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.backend import LLM, SamplingParams


@dataclass
class Run:
    tokens: list[list[int]]
    logits: list[torch.Tensor]  # per step, [S, vocab], rows in the runner's order


def greedy_run(llm: LLM, prompts: list, max_tokens: int) -> Run:
    logits: list[torch.Tensor] = []
    runner = llm.engine.runner
    execute = runner.execute

    def recording(out):
        result, ids = execute(out)
        logits.append(result.clone())
        return result, ids

    runner.execute = recording
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        outs = llm.generate(prompts, params)
    finally:
        runner.execute = execute
    return Run([list(o.outputs[0].token_ids) for o in outs], logits)


@dataclass
class Comparison:
    agreeing: int  # requests whose tokens are identical
    first_difference: int | None  # the earliest position where any request's tokens part
    max_logit_diff: float  # over the steps before any token parted


def compare(a: Run, b: Run) -> Comparison:
    firsts = [next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None) for ta, tb in zip(a.tokens, b.tokens)]
    parted = [f for f in firsts if f is not None]
    first = min(parted) if parted else None
    # Step k (0: the prefill) yields token k of every request (same batch, same order in both).
    steps = len(a.logits) if first is None else first + 1
    diff = max(float((x - y).abs().max()) for x, y in zip(a.logits[:steps], b.logits[:steps]))
    return Comparison(sum(f is None for f in firsts), first, diff)
