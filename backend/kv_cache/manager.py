"""KV cache manager: which physical blocks each request holds, and prefix reuse.

Pure Python, no torch. The scheduler asks it two things: "how much of this
prompt is already cached?" (`get_computed_blocks`) and "give this request room
for n more tokens" (`allocate_slots`, None when memory is short, which the
scheduler answers by preemption).

A request holds one block table per KV cache group (kv_groups.py), all from one
pool. In a sliding group the blocks that no query from the request's next token
on can see go back to the pool at once (their table entries become None, and
the runner's stale ids there are masked by the window); their hashes stay
indexed until the pool reuses them. A prefix hit needs each group's block of
each hit position: hashes are keyed by group, since a token block holds other
layers' KV in each.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.backend.engine import Request
from kvserve.backend.kv_cache.block_hash import extend_hash_chain, extra_key
from kvserve.backend.kv_cache.block_pool import BlockPool, KVBlock
from kvserve.backend.kv_cache.kv_groups import KVCacheGroup


@dataclass(slots=True)
class _RequestBlocks:
    tables: list[list[KVBlock | None]]  # per group; None where a sliding group let a block go
    hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0  # blocks of this request already registered in the hash index


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 groups: list[KVCacheGroup] | None = None) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.groups = groups or [KVCacheGroup((), None)]
        self.pool = BlockPool(num_blocks)
        self._reqs: dict[str, _RequestBlocks] = {}
        # Prefix-cache statistics in tokens (read by the metrics exporter).
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def usage(self) -> float:
        return self.pool.usage()

    @property
    def num_touched_blocks(self) -> int:
        return self.pool.num_touched_blocks

    def block_ids(self, request_id: str, group: int = 0) -> list[int]:
        """The request's live blocks in one group (a copy; for tests and tools, the runner keeps
        its own tables)."""
        state = self._reqs.get(request_id)
        return [] if state is None else [b.block_id for b in state.tables[group] if b is not None]

    def num_held_blocks(self, request_id: str) -> int:
        state = self._reqs.get(request_id)
        return 0 if state is None else sum(b is not None for table in state.tables for b in table)

    def _extend_hashes(self, state: _RequestBlocks, req: Request, tokens: list[int]) -> None:
        # The adapter joins the hash: blocks never cross adapters, nor adapter and base model.
        extend_hash_chain(state.hashes, tokens, self.block_size, extra_key(req.cache_key, req.lora_int_id))

    def _state(self, req: Request) -> _RequestBlocks:
        state = self._reqs.get(req.request_id)
        if state is None:
            state = self._reqs[req.request_id] = _RequestBlocks([[] for _ in self.groups])
        return state

    @staticmethod
    def _key(block_hash: bytes, group: int) -> bytes:
        return block_hash + group.to_bytes(2, "little")

    def get_computed_blocks(self, req: Request) -> tuple[list[list[KVBlock]], int]:
        """Longest cached prefix of req in whole blocks, per group; never the whole prompt (the
        last token must run through the model to produce logits). None for a request whose group
        scores its prompt (prompt logprobs): every prompt position's logits must be computed."""
        hits: list[list[KVBlock]] = [[] for _ in self.groups]
        if req.cache_key is None or req.no_prefix_reads:
            return hits, 0
        state = self._state(req)
        tokens = req.all_token_ids
        self._extend_hashes(state, req, tokens)
        max_blocks = (len(tokens) - 1) // self.block_size
        for i in range(max_blocks):
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            found = [self.pool.lookup(self._key(state.hashes[i], g), chunk) for g in range(len(self.groups))]
            if any(block is None for block in found):
                break
            for group_hits, block in zip(hits, found):
                group_hits.append(block)
        return hits, len(hits[0]) * self.block_size

    def record_prefix_lookup(self, req: Request, num_hit_tokens: int) -> None:
        """Count a request's prompt once, when it is admitted (not at every admission attempt,
        and not again after a preemption, whose hits are its own freed blocks)."""
        if self.enable_caching and req.num_preemptions == 0:
            self.prefix_queries += req.num_prompt_tokens
            self.prefix_hits += min(num_hit_tokens, req.num_prompt_tokens)

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       new_computed_blocks: list[list[KVBlock]] | None = None,
                       num_lookahead_tokens: int = 0) -> list[list[int]] | None:
        """Room for req's next num_new_tokens tokens (after any new cache hits), or None.
        Returns, per group, the block ids appended to req's table: the hits taken, then fresh blocks.
        `num_lookahead_tokens` (speculative proposals) get slots too but are never hashed: a block
        is registered in the prefix cache only once every token in it is known, never while it may
        hold a proposal that verification rejects."""
        hits = new_computed_blocks or [[] for _ in self.groups]
        state = self._state(req)
        num_computed = req.num_computed_tokens + len(hits[0]) * self.block_size
        total = num_computed + num_new_tokens
        num_required = -(-(total + num_lookahead_tokens) // self.block_size)
        self._release_behind_windows(state, hits, num_computed)
        wanted = [max(num_required - len(table) - len(group_hits), 0)
                  for table, group_hits in zip(state.tables, hits)]
        # Hits that sit in the free list stop being allocatable once we take them.
        num_free_hits = sum(1 for group_hits in hits for b in group_hits if b is not None and b.ref_cnt == 0)
        if sum(wanted) > self.pool.num_free_blocks - num_free_hits:
            return None
        # Every group's hits come out of the free list before any fresh block is drawn: drawing
        # evicts from the free list's head, which may hold another group's hit.
        for group_hits in hits:
            self.pool.touch([b for b in group_hits if b is not None])
        new_ids = []
        for table, group_hits, count in zip(state.tables, hits, wanted):
            table.extend(group_hits)
            fresh = self.pool.get_new_blocks(count)
            table.extend(fresh)
            # A hit the window does not see is not taken: the runner's table gets the null block
            # there, a position only masked queries point at.
            new_ids.append([0 if b is None else b.block_id for b in group_hits] + [b.block_id for b in fresh])
        if hits[0]:  # the hits are indexed already
            state.num_cached_blocks = max(state.num_cached_blocks, len(state.tables[0]) - wanted[0])
        self._cache_full_blocks(req, state, total)
        return new_ids

    def _release_behind_windows(self, state: _RequestBlocks, hits: list[list[KVBlock | None]],
                                num_computed: int) -> None:
        """In each sliding group, let go of the blocks before the first position the query at
        num_computed (and every later one) can see; hits there are not taken at all."""
        for g, group in enumerate(self.groups):
            if group.window is None:
                continue
            first_live = max(0, num_computed - group.window + 1) // self.block_size
            table = state.tables[g]
            gone = [b for b in table[:first_live] if b is not None]
            table[:first_live] = [None] * min(first_live, len(table))
            self.pool.free_blocks(gone[::-1], forget_hashes=not self.enable_caching)
            skip = max(0, first_live - len(table))
            hits[g] = [None] * min(skip, len(hits[g])) + hits[g][skip:]

    def _cache_full_blocks(self, req: Request, state: _RequestBlocks, num_tokens: int) -> None:
        if req.cache_key is None:
            return
        num_full = num_tokens // self.block_size
        if num_full <= state.num_cached_blocks:
            return
        tokens = req.token_ids_slice(0, num_full * self.block_size)
        self._extend_hashes(state, req, tokens)
        for i in range(state.num_cached_blocks, num_full):
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            for g, table in enumerate(state.tables):
                # A block whose prefix another block already indexes stays private.
                if table[i] is not None:
                    self.pool.cache_block(table[i], self._key(state.hashes[i], g), chunk)
        state.num_cached_blocks = num_full

    def free(self, req: Request) -> None:
        """Return every block of req; the tail goes last into the free list so it is evicted first."""
        state = self._reqs.pop(req.request_id, None)
        if state is None:
            return
        for table in state.tables:
            self.pool.free_blocks([b for b in reversed(table) if b is not None], forget_hashes=not self.enable_caching)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix; returns how many blocks were forgotten. A running request's
        blocks so far are never registered again (after a fault they may be unwritten); those it
        fills from now on are."""
        forgotten = self.pool.reset_prefix_cache()
        for state in self._reqs.values():
            state.num_cached_blocks = len(state.tables[0])
        return forgotten
