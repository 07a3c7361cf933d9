"""Accepting proposed tokens so that the output is exactly what plain decoding would give.

The target model scored the request's last token and its k proposals in one forward, so row j
of `logits` is the target distribution for the token after draft j-1 (row 0: after the last
known token). Proposals from n-gram lookup are deterministic (q is one-hot on the draft t), so
vLLM's rejection rule, accept with min(1, p(t)/q(t)) and otherwise draw from the normalised
residual max(0, p - q), becomes: accept t with probability p(t); otherwise draw from p with t
removed and renormalised. Then P(token = x) = p(t)[x = t] + (1 - p(t)) p(x)/(1 - p(t))[x != t]
= p(x): the target distribution, position by position. Greedy is the same rule at temperature
0: accept while the draft is the argmax.

Every random number comes from the request's own generator (when it has one), so a seeded
request reproduces itself whatever shares its batch.
"""
from __future__ import annotations

import torch


def verify_proposals(logits: torch.Tensor, drafts: list[int], greedy: bool,
                     generator: torch.Generator | None) -> list[int]:
    """The tokens this step emits: the accepted prefix of `drafts`, then one more (the target's
    correction at the first rejection, or a bonus token after the last draft).

    `logits` [len(drafts) + 1, vocab] are the target's for each row, already temperature-scaled
    and filtered (top-k/top-p/min-p as -inf) for a sampled request; raw for a greedy one."""
    if greedy:
        best = logits.argmax(dim=-1).tolist()
        for j, draft in enumerate(drafts):
            if best[j] != draft:
                return drafts[:j] + [best[j]]
        return drafts + [best[-1]]
    probs = logits.double().softmax(dim=-1)
    for j, draft in enumerate(drafts):
        if _uniform(generator, probs.device) < float(probs[j, draft]):
            continue
        residual = probs[j].clone()
        residual[draft] = 0.0
        return drafts[:j] + [_draw(residual, generator)]
    return drafts + [_draw(probs[-1], generator)]


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand(1, generator=generator, dtype=torch.float64, device=device))


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from unnormalised non-negative weights: a uniform inverted through the CDF."""
    cdf = weights.cumsum(dim=0)
    total = float(cdf[-1])
    if not total > 0.0:  # the draft held all the mass up to rounding: the best other token
        return int(weights.argmax())
    u = _uniform(generator, weights.device) * total
    index = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True))
    index = min(index, len(weights) - 1)
    # u * total can round onto the total itself, past the last token with mass.
    while weights[index] <= 0.0 and index > 0:
        index -= 1
    return index
