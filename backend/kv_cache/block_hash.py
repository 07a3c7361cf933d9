"""Prefix hash chain over full blocks: h_i = sha256(h_{i-1} || tokens_i || extra_keys).

Starting from a fixed root and chaining through the parent makes a block's hash
name its whole prefix, so a lookup walks the chain and stops at the first miss.
The extra key carries the tenant's cache_salt and the LoRA adapter's id (`extra_key`): different
salts or adapters never collide, and base-model blocks are shared by base-model requests only.
"""
from __future__ import annotations

import hashlib
from array import array

ROOT_HASH = hashlib.sha256(b"kvserve-prefix-root-v1").digest()


def extra_key(cache_key: str, lora_int_id: int = 0) -> str:
    """A request's extra hash key: its cache key (salt, or a siblings' key) and its adapter (0: the
    base model), length-prefixed so that no salt can spell another salt's key with an adapter."""
    return f"{len(cache_key)}:{cache_key}:lora={lora_int_id}"


def hash_block(parent: bytes, token_ids: tuple[int, ...] | list[int], extra_key: str) -> bytes:
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    h.update(extra_key.encode("utf-8", "surrogatepass"))
    return h.digest()


def extend_hash_chain(hashes: list[bytes], token_ids: list[int], block_size: int, extra_key: str) -> None:
    """Append the hashes of the full blocks of token_ids not yet in `hashes` (in place)."""
    num_full = len(token_ids) // block_size
    parent = hashes[-1] if hashes else ROOT_HASH
    for i in range(len(hashes), num_full):
        chunk = token_ids[i * block_size:(i + 1) * block_size]
        parent = hash_block(parent, chunk, extra_key)
        hashes.append(parent)
