"""Run the same greedy requests through two engines and compare them step by step: tokens (the
agreement and the first position where they part) and the logits of every step until then."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.backend import LLM, SamplingParams


@dataclass
class Run:
    tokens: list[list[int]]  # per prompt, in order
    logits: dict[tuple[str, int], torch.Tensor]  # (request id, k) -> the logits its k-th token came from


def greedy_run(llm: LLM, prompts: list, max_tokens: int) -> Run:
    logits: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}
    runner = llm.engine.runner
    execute = runner.execute

    def recording(out):
        result, ids = execute(out)
        for row, rid in zip(result, ids):
            k = counts.get(rid, 0)
            logits[(rid, k)], counts[rid] = row.clone(), k + 1
        return result, ids

    runner.execute = recording
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        outs = llm.generate(prompts, params)
    finally:
        runner.execute = execute
    # Request ids restart per engine as "0", "1", ...: key the logits by the prompt's index instead.
    order = {o.request_id: i for i, o in enumerate(outs)}
    return Run([list(o.outputs[0].token_ids) for o in outs], {(order[r], k): v for (r, k), v in logits.items()})


@dataclass
class Comparison:
    agreeing: int  # requests whose tokens are identical
    first_difference: int | None  # the earliest position where any request's tokens part
    max_logit_diff: float  # over each request's tokens up to (and with) the first that parted
    max_abs_logit: float  # the scale the difference is measured against (float32: eps times this)


def first_differences(a: Run, b: Run) -> list[int | None]:
    """Per prompt, the first position where the two runs' tokens part (None: identical)."""
    return [next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None) for ta, tb in zip(a.tokens, b.tokens)]


def compare(a: Run, b: Run) -> Comparison:
    firsts = first_differences(a, b)
    parted = [f for f in firsts if f is not None]
    first = min(parted) if parted else None
    # After a token parts, the two runs continue from different contexts: nothing to compare.
    diff = max(float((a.logits[(i, k)] - b.logits[(i, k)]).abs().max())
               for i, f in enumerate(firsts) for k in range(len(a.tokens[i]) if f is None else f + 1))
    scale = max(float(v.abs().max()) for v in a.logits.values())
    return Comparison(sum(f is None for f in firsts), first, diff, scale)
