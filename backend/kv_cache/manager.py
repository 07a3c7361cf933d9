"""KV cache manager: which physical blocks each request holds, and prefix reuse.

Pure Python, no torch. The scheduler asks it two things: "how much of this
prompt is already cached?" (`get_computed_blocks`) and "give this request room
for n more tokens" (`allocate_slots`, None when memory is short, which the
scheduler answers by preemption).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.backend.engine import Request
from kvserve.backend.kv_cache.block_hash import extend_hash_chain
from kvserve.backend.kv_cache.block_pool import BlockPool, KVBlock


@dataclass(slots=True)
class _RequestBlocks:
    blocks: list[KVBlock] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0  # blocks of this request already registered in the hash index


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
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

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a copy; for tests and tools, the runner keeps its own)."""
        state = self._reqs.get(request_id)
        return [] if state is None else [b.block_id for b in state.blocks]

    def get_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of req in whole blocks; never the whole prompt (the last token
        must run through the model to produce logits)."""
        if req.cache_key is None:
            return [], 0
        state = self._reqs.setdefault(req.request_id, _RequestBlocks())
        tokens = req.all_token_ids
        extend_hash_chain(state.hashes, tokens, self.block_size, req.cache_key)
        max_blocks = (len(tokens) - 1) // self.block_size
        hits: list[KVBlock] = []
        for i in range(max_blocks):
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            block = self.pool.lookup(state.hashes[i], chunk)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, req: Request, num_hit_tokens: int) -> None:
        """Count a request's prompt once, when it is admitted (not at every admission attempt,
        and not again after a preemption, whose hits are its own freed blocks)."""
        if self.enable_caching and req.num_preemptions == 0:
            self.prefix_queries += req.num_prompt_tokens
            self.prefix_hits += min(num_hit_tokens, req.num_prompt_tokens)

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] | None = None) -> list[int] | None:
        """Room for req's next num_new_tokens tokens (after any new cache hits), or None.
        Returns the block ids appended to req's table: the cache hits taken, then fresh blocks."""
        new_computed_blocks = new_computed_blocks or []
        state = self._reqs.setdefault(req.request_id, _RequestBlocks())
        num_computed = req.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        num_required = -(-total // self.block_size)
        num_new_blocks = num_required - len(state.blocks) - len(new_computed_blocks)
        # Hits that sit in the free list stop being allocatable once we take them.
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_free_hits:
            return None
        self.pool.touch(new_computed_blocks)
        state.blocks.extend(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(max(num_new_blocks, 0))
        state.blocks.extend(new_blocks)
        if new_computed_blocks:
            state.num_cached_blocks = max(state.num_cached_blocks,
                                          len(state.blocks) - len(new_blocks))
        self._cache_full_blocks(req, state, total)
        return [b.block_id for b in (*new_computed_blocks, *new_blocks)]

    def _cache_full_blocks(self, req: Request, state: _RequestBlocks, num_tokens: int) -> None:
        if req.cache_key is None:
            return
        num_full = num_tokens // self.block_size
        if num_full <= state.num_cached_blocks:
            return
        tokens = req.token_ids_slice(0, num_full * self.block_size)
        extend_hash_chain(state.hashes, tokens, self.block_size, req.cache_key)
        for i in range(state.num_cached_blocks, num_full):
            chunk = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            # A block whose prefix another block already indexes stays private.
            self.pool.cache_block(state.blocks[i], state.hashes[i], chunk)
        state.num_cached_blocks = num_full

    def free(self, req: Request) -> None:
        """Return every block of req; the tail goes last into the free list so it is evicted first."""
        state = self._reqs.pop(req.request_id, None)
        if state is None:
            return
        self.pool.free_blocks(list(reversed(state.blocks)), forget_hashes=not self.enable_caching)

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        for state in self._reqs.values():
            state.num_cached_blocks = len(state.blocks)  # never re-register possibly-unwritten blocks
