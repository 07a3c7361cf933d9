"""The engine's grammar matchers: one per constrained sequence, touched only on the engine thread.

Per step, for the rows that sample:  fill the bitmask of the constrained rows only, hand the
sampler a function that applies it (before penalties, temperature, top-k/top-p), then advance
each matcher by the token its row accepted. A step with no constrained row does none of this.

Preemption by recompute keeps a sequence's output tokens (the scheduler recomputes their KV
from prompt + output), so its matcher, which has accepted exactly those tokens, stays where it
is: there is nothing to roll back. Every finish path (stop, length, abort, error) calls `free`.
"""
from __future__ import annotations

from typing import Callable


class GrammarMatchers:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._matchers: dict[str, object] = {}  # sequence id -> xgrammar.GrammarMatcher

    def __len__(self) -> int:
        return len(self._matchers)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._matchers

    def add(self, seq_id: str, compiled_grammar) -> None:
        import xgrammar as xgr
        self._matchers[seq_id] = xgr.GrammarMatcher(compiled_grammar, max_rollback_tokens=-1)

    def free(self, seq_id: str) -> None:
        self._matchers.pop(seq_id, None)

    def mask_for(self, seq_ids: list[str]) -> Callable | None:
        """None when no row is constrained; else a function that masks a [rows, vocab] logits tensor."""
        if not self._matchers:
            return None
        rows = [i for i, sid in enumerate(seq_ids) if sid in self._matchers]
        if not rows:
            return None
        import xgrammar as xgr
        bitmask = xgr.allocate_token_bitmask(len(seq_ids), self.vocab_size)
        for i in rows:
            self._matchers[seq_ids[i]].fill_next_token_bitmask(bitmask, i)

        def apply(logits) -> None:
            mask = bitmask if bitmask.device == logits.device else bitmask.to(logits.device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1], indices=rows)
        return apply

    def accept(self, seq_id: str, token_id: int) -> bool:
        """Advance by the sampled token; False if the grammar refuses it (nothing was allowed)."""
        matcher = self._matchers.get(seq_id)
        return True if matcher is None else bool(matcher.accept_token(token_id))

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepts (speculative verification tried a run of drafts)."""
        matcher = self._matchers.get(seq_id)
        if matcher is not None and num_tokens > 0:
            matcher.rollback(num_tokens)

    def is_terminated(self, seq_id: str) -> bool:
        """The grammar is complete and its end was accepted: only a stop may follow."""
        matcher = self._matchers.get(seq_id)
        return matcher is not None and bool(matcher.is_terminated())
