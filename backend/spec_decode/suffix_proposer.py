"""Suffix decoding (vLLM's `suffix` method, after Arctic Inference): guess a request's next tokens
from what followed its latest tokens before, in its own prompt and output and in the outputs of
requests that finished before it.

Two kinds of tree (suffix_tree.py) are kept:
- one per running request over its prompt + output, grown token by token as the output grows;
- one per tenant over the outputs of its last finished requests (at most `max_cached_requests`
  of them over all tenants, the oldest forgotten first). A tenant is a `cache_salt`: what one
  tenant's requests wrote is never proposed to another's, just as their KV blocks are never
  shared.

A proposal starts at the node of the context's last m tokens (m up to max_depth) and follows the
most frequent continuation while the estimated probability of the whole run, the product of each
step's count share, stays at or above `min_token_prob`; it proposes at most
ceil(max_spec_factor * m) tokens, so a long match earns a long guess and a short one a short
guess. Of the match lengths and the two trees, the guess with the most expected accepted tokens
(the sum of those run probabilities) wins. Unlike a fixed n-gram, the length of a guess follows the
evidence: a run that is always followed by the same text gets a long proposal, an ambiguous one
none at all.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from kvserve.backend.spec_decode.suffix_tree import ROOT, SuffixTree


@dataclass(slots=True)
class _Guess:
    tokens: list[int] = field(default_factory=list)
    score: float = 0.0  # expected number of accepted tokens


@dataclass(slots=True)
class _RequestTree:
    tree: SuffixTree
    tenant: str | None
    request: object  # the engine's Request: read for its tokens and status, never written
    frontier: list[int] = field(default_factory=list)
    num_inserted: int = 0


class SuffixProposer:
    def __init__(self, max_depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float) -> None:
        self.max_depth = max_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self._requests: dict[str, _RequestTree] = {}
        self._tenants: dict[str | None, SuffixTree] = {}
        # (tenant, request id) -> the output it added to its tenant's tree, oldest first.
        self._cached: OrderedDict[tuple[str | None, str], list[int]] = OrderedDict()

    @property
    def num_cached_requests(self) -> int:
        return len(self._cached)

    # ---- lifecycle -------------------------------------------------------------------------
    def sync(self, running) -> None:
        """Once per step, before proposing: requests that finished since the last step leave their
        tree, and those that finished by a stop or a length cap give their output to their tenant's
        tree. A preempted request keeps its tree (its tokens stay valid while it waits)."""
        live = {req.request_id for req in running}
        for rid in [rid for rid in self._requests if rid not in live]:
            state = self._requests[rid]
            status = state.request.status
            if not status.finished:
                continue
            del self._requests[rid]
            if status.value in ("stop", "length") and state.request.output_token_ids:
                self._cache_output(state.tenant, rid, list(state.request.output_token_ids))

    def _cache_output(self, tenant: str | None, request_id: str, tokens: list[int]) -> None:
        if self.max_cached_requests <= 0:
            return
        tree = self._tenants.get(tenant)
        if tree is None:
            tree = self._tenants[tenant] = SuffixTree(self.max_depth)
        tree.insert(tokens)
        self._cached[(tenant, request_id)] = tokens
        while len(self._cached) > self.max_cached_requests:
            (old_tenant, _), old_tokens = self._cached.popitem(last=False)
            old_tree = self._tenants[old_tenant]
            old_tree.remove(old_tokens)
            if old_tree.num_nodes == 0:
                del self._tenants[old_tenant]

    def _own_tree(self, req) -> _RequestTree:
        state = self._requests.get(req.request_id)
        if state is None:
            state = self._requests[req.request_id] = _RequestTree(
                SuffixTree(self.max_depth), req.sampling_params.cache_salt, req)
        total = req.num_tokens
        if state.num_inserted < total:
            new = req.token_ids_slice(state.num_inserted, total)
            state.frontier = state.tree.insert(new, state.frontier)
            state.num_inserted = total
        return state

    # ---- proposing -------------------------------------------------------------------------
    def propose(self, req, k: int) -> list[int]:
        """Up to k tokens to verify after `req`'s last token ([] when nothing is likely enough)."""
        if k <= 0:
            return []
        own = self._own_tree(req)
        best = _Guess()
        # Own tree: frontier[j] is the node of the last len(frontier) - j tokens, for free.
        for j, node in enumerate(own.frontier):
            best = self._better(best, own.tree, node, len(own.frontier) - j, k)
        shared = self._tenants.get(own.tenant)
        if shared is not None:
            context = req.token_ids_slice(max(0, req.num_tokens - self.max_depth), req.num_tokens)
            for m in range(_longest_match(shared, context), 0, -1):
                best = self._better(best, shared, shared.find(context[len(context) - m:]), m, k)
        return best.tokens

    def _better(self, best: _Guess, tree: SuffixTree, node: int | None, match_len: int, k: int) -> _Guess:
        limit = min(k, math.ceil(self.max_spec_factor * match_len))
        if node is None or node == ROOT or limit <= best.score:
            return best  # even a sure run of `limit` tokens could not beat the best guess so far
        guess = self._follow(tree, node, limit)
        return guess if guess.score > best.score else best

    def _follow(self, tree: SuffixTree, node: int, limit: int) -> _Guess:
        """The likeliest run below `node`: at each node its most frequent child (the first of equals,
        in insertion order), while the run's probability stays above min_token_prob. One pass over
        the children finds the best and the total: this runs for every request each step."""
        guess, prob = _Guess(), 1.0
        while len(guess.tokens) < limit:
            kids = tree.children(node)
            if not kids:
                break
            token, child, top, total = None, None, -1, 0
            for kid_token, kid in kids.items():
                count = tree.count(kid)
                total += count
                if count > top:
                    token, child, top = kid_token, kid, count
            prob *= top / total
            if prob < self.min_token_prob:
                break
            guess.tokens.append(token)
            guess.score += prob
            node = child
        return guess


def _longest_match(tree: SuffixTree, context: list[int]) -> int:
    """The most trailing tokens of `context` found in `tree`. Found-ness only shrinks as m grows
    (a found substring's suffixes are found too), so a binary search finds the edge."""
    lo, hi = 0, len(context)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tree.find(context[len(context) - mid:]) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo
