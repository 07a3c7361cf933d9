"""Accepting proposed tokens so that the output is exactly what plain decoding would give.

The target model scored the request's last token and its k proposals in one forward, so row j
of `logits` is the target distribution p_j for the token after draft j-1 (row 0: after the last
known token). Proposals from n-gram lookup are deterministic (q is one-hot on the draft t), and
for a one-hot q vLLM's rejection rule, accept with min(1, p(t)/q(t)) and otherwise draw from the
normalised residual max(0, p - q), is the same as: draw x from p_j; accept the draft when x = t,
else emit x and stop. P(accept) = p_j(t), and a rejected position emits x ~ p_j given x != t,
which is the normalised residual: the target distribution, position by position.

Realised that way, each emitted token is drawn by the plain sampler's own draw with the request's
next random number (one per emitted token, as plain decoding uses), so a seeded request draws
the same tokens with speculation as without (up to the forward's rounding), whatever the step
granted it. Greedy is the same rule at temperature 0: accept while the draft is the argmax.
"""
from __future__ import annotations

from typing import Callable

import torch

from kvserve.backend.engine import greedy_tokens

Draw = Callable[[torch.Tensor], int]  # one row [1, vocab] of scaled, filtered logits -> a token


def verify_proposals(logits: torch.Tensor, drafts: list[int], greedy: bool, draw: Draw | None = None) -> list[int]:
    """The tokens this step emits: the accepted prefix of `drafts`, then one more (the target's
    own token at the first rejection, or a bonus token after the last draft).

    `logits` [len(drafts) + 1, vocab]: raw for a greedy request; for a sampled one temperature-
    scaled and filtered (top-k/top-p/min-p as -inf), and `draw` is the sampler's draw for one row,
    called once per emitted token, in order (it takes the request's next random number)."""
    if greedy:
        best = greedy_tokens(logits).tolist()
        for j, draft in enumerate(drafts):
            if best[j] != draft:
                return drafts[:j] + [best[j]]
        return drafts + [best[-1]]
    if draw is None:
        raise ValueError("draw: a sampled request needs the sampler's draw")
    run = []
    for j, draft in enumerate(drafts):
        token = draw(logits[j:j + 1])
        run.append(token)
        if token != draft:
            return run
    run.append(draw(logits[-1:]))
    return run


def verify_with_draft_probs(target: torch.Tensor, drafts: list[int], q: torch.Tensor,
                            generator: torch.Generator | None = None) -> list[int]:
    """The rejection rule for proposals drawn from a known distribution q (a draft model's):
    draft d_j ~ q_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first
    rejection the token is drawn from the normalised residual max(0, p_j - q_j), and after k
    acceptances a bonus token is drawn from p_k. Each emitted token then has exactly the target's
    distribution p (Leviathan et al. 2023; vLLM's rejection sampler), whatever q is.

    `target` [k + 1, vocab]: temperature-scaled, filtered logits (`target_logits`); `q` [k, vocab]:
    the draft's probabilities after the same scaling and filters. Random numbers come from the
    request's generator when it has one, so a seeded request reproduces itself."""
    p = target.double().softmax(dim=-1)
    q = q.double()
    run: list[int] = []
    for j, draft in enumerate(drafts):
        # On the target's device: a seeded request's generator lives there (a CUDA one on a GPU).
        u = float(torch.rand((), generator=generator, dtype=torch.float64, device=p.device))
        if u * float(q[j, draft]) <= float(p[j, draft]):
            run.append(draft)
            continue
        residual = (p[j] - q[j]).clamp_min_(0.0)
        total = float(residual.sum())
        # p == q everywhere (up to rounding) cannot reject; if rounding did, p itself is the residual.
        run.append(_draw_from(residual / total if total > 0 else p[j], generator))
        return run
    run.append(_draw_from(p[-1], generator))
    return run


def _draw_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))
