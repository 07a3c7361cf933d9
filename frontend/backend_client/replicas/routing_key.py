"""The affinity key of a request: its first full prompt block.

The engine's prefix cache hashes full blocks in a chain from the first one, so
two prompts can share cached blocks only if their first block is the same.
Keying on that block (plus the tenant's `cache_salt`, which the engine mixes
into its hashes too) sends every request that could hit a replica's cache to
that replica, while keeping the key cheap: at most one short tokenization.

Token-id prompts are used as they are. Text prompts are tokenized here the way
the engine does (`add_special_tokens=True`), but only a leading slice of the
text: tokens far from the cut do not depend on what follows it, so the first
block is stable once the slice yields a few tokens more than a block.
"""
from __future__ import annotations

import hashlib
from typing import Callable

from kvserve.frontend.backend_client.protocol import GenerateRequest
from kvserve.seam.tokenizer import ModelTokenizer

DEFAULT_BLOCK_SIZE = 16
_SLICE_CHARS_PER_TOKEN = 16  # generous: tokens rarely span more characters than this
_STABLE_MARGIN = 4  # tokens beyond the block that must come out of the slice
_WIDE_SLICE_FACTOR = 16

KeyFunction = Callable[[GenerateRequest], "bytes | None"]


class PrefixKey:
    def __init__(self, tokenizer: ModelTokenizer | None, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self._tokenizer = tokenizer
        self.block_size = block_size

    def first_block(self, prompt: str | list[int]) -> list[int] | None:
        """The first `block_size` prompt tokens, or None when the prompt has no full block."""
        if isinstance(prompt, list):
            ids = prompt
        elif self._tokenizer is None:
            return None
        else:
            cut = self.block_size * _SLICE_CHARS_PER_TOKEN
            ids = self._tokenizer.encode(prompt[:cut], add_special_tokens=True)
            if len(prompt) > cut and len(ids) < self.block_size + _STABLE_MARGIN:
                # Runs of characters that make few tokens: one wider slice, never the whole
                # prompt (this runs on the event loop; a megabyte takes a second). A prompt
                # whose first block is not stable even then gets no affinity key.
                wide = cut * _WIDE_SLICE_FACTOR
                ids = self._tokenizer.encode(prompt[:wide], add_special_tokens=True)
                if len(prompt) > wide and len(ids) < self.block_size + _STABLE_MARGIN:
                    return None
        return list(ids[: self.block_size]) if len(ids) >= self.block_size else None

    def __call__(self, request: GenerateRequest) -> bytes | None:
        block = self.first_block(request.prompt)
        if block is None:
            return None
        salt = request.sampling.get("cache_salt") or ""
        h = hashlib.blake2b(digest_size=16, person=b"kvserve-prefix")
        h.update(str(salt).encode())
        h.update(b"\0")
        h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in block))
        return h.digest()
