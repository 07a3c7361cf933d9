"""Which decode batch sizes get a CUDA graph, and which graph a batch runs on. No torch.

A graph replays fixed shapes, so decode steps are captured at a ladder of batch
sizes (vLLM's: 1, 2, 4, then every 8) and a batch of B runs on the smallest
captured size >= B, the extra rows being padding. Bigger batches than the
ladder's top run eagerly: there, launch overhead is small beside the work.
"""
from __future__ import annotations

import bisect

MAX_CAPTURE_SIZE = 256


def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> tuple[int, ...]:
    """The ladder up to min(max_num_seqs, limit), its top always included."""
    top = min(max_num_seqs, limit)
    if top < 1:
        return ()
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    if sizes[-1] != top:
        sizes.append(top)  # every batch up to max_num_seqs finds a graph
    return tuple(sizes)


def bucket(batch: int, sizes: tuple[int, ...]) -> int | None:
    """The captured size a batch of `batch` decodes runs on, or None (run eagerly)."""
    if batch < 1:
        return None
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None
