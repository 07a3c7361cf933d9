"""Physical KV blocks: ref counts, the free list in eviction (LRU) order, the prefix-hash index.

The free list is an intrusive doubly linked list so that a cache hit can pull a
free block out of the middle in O(1)::

    head <-> b7 <-> b3 <-> b9 <-> tail
    (evicted first)        (evicted last)

A free block may still hold a valid cached prefix (its hash stays in the
index) until it is handed out again: that is what makes a freed prefix
reusable by the next request. Block 0 is the null block: never handed out, it
pads block tables.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None  # kept to verify a hash hit token by token
    handed_out: bool = False  # ever given to a request (BlockPool.num_touched_blocks counts these)
    prev: "KVBlock | None" = None
    next: "KVBlock | None" = None


class FreeBlockQueue:
    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.size = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None and block.prev is None and block.next is None
        last.next, block.prev = block, last
        block.next, self._tail.prev = self._tail, block
        self.size += 1

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None, "block is not in the free list"
        prev.next, nxt.prev = nxt, prev
        block.prev = block.next = None
        self.size -= 1

    def popleft(self) -> KVBlock:
        first = self._head.next
        if first is None or first is self._tail:
            raise IndexError("no free block")
        self.remove(first)
        return first

    def __iter__(self):
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next


class BlockPool:
    NULL_BLOCK_ID = 0

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError("num_kv_blocks: need at least 2 blocks (block 0 is reserved)")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}
        # Blocks handed out at least once. On the CPU the cache's pages are committed on their
        # first write (worker/kv_cache_tensors.py), and the free list hands out every never-used
        # block before it reuses a freed one (freed blocks keep their prefixes for as long as it
        # can), so the resident cache grows with this count up to its whole size. A block counts
        # whole: where it spans several pages and a request wrote only its first tokens, fewer are
        # resident, so this bounds the cache's memory from above.
        self.num_touched_blocks = 0

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.size

    def usage(self) -> float:
        """Fraction of usable blocks held by live requests (free cached blocks count as free)."""
        return 1.0 - self.free_queue.size / self.num_usable_blocks

    def get_new_blocks(self, count: int) -> list[KVBlock]:
        if count > self.free_queue.size:
            raise ValueError(f"cannot allocate {count} blocks, {self.free_queue.size} free")
        out = []
        for _ in range(count):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            if not block.handed_out:
                block.handed_out = True
                self.num_touched_blocks += 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: list[KVBlock], forget_hashes: bool = False) -> None:
        for block in blocks_in_eviction_order:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                if forget_hashes:
                    self._evict(block)
                self.free_queue.append(block)

    def lookup(self, block_hash: bytes, token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def cache_block(self, block: KVBlock, block_hash: bytes, token_ids: tuple[int, ...]) -> bool:
        """Index a full block by its prefix hash; False if another block already holds that prefix."""
        if block_hash in self.cached:
            return False
        block.block_hash, block.token_ids = block_hash, token_ids
        self.cached[block_hash] = block
        return True

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (after a failed forward pass left some blocks unwritten, or
        when asked to); blocks in use stay with their requests. Returns how many were forgotten."""
        forgotten = list(self.cached.values())
        for block in forgotten:
            self._evict(block)
        return len(forgotten)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = block.token_ids = None
