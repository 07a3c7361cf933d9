"""KV cache groups: the layers of a model split by attention type, as vLLM's hybrid allocator does.

A group is a set of layers that share one block table per request. Groups are of
equal size, so that one block id names the same amount of memory in every group:
layer j of each group reads and writes physical KV tensor j.

    Gemma 3 270M: 18 layers, every sixth full, window 512   ->   6 groups of 3 layers
      full:     layers  5 11 17        tensors 0 1 2
      sliding:  layers  0  1  2        tensors 0 1 2     (and four more sliding groups)

A full group keeps every block of a request. A sliding group keeps only those its
window still sees: a request holds about window / block_size blocks there, however
long it grows. Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    layers: tuple[int, ...]
    window: int | None  # tokens each query sees (itself included); None: the whole context


def plan_groups(layer_windows: list[int | None]) -> list[KVCacheGroup]:
    """Group layers by window; every group holds the same number of layers (the gcd of the kinds'
    counts), full-attention groups first. A model of one kind is one group."""
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        kinds.setdefault(window, []).append(layer)
    size = math.gcd(*(len(layers) for layers in kinds.values()))
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    return [KVCacheGroup(tuple(kinds[w][i:i + size]), w) for w in order for i in range(0, len(kinds[w]), size)]


def layer_slots(groups: list[KVCacheGroup], num_layers: int) -> list[tuple[int, int]]:
    """Per layer: (its group, its place in the group = the physical KV tensor it uses)."""
    slots = [(-1, -1)] * num_layers
    for g, group in enumerate(groups):
        for j, layer in enumerate(group.layers):
            slots[layer] = (g, j)
    return slots


def blocks_for_request(groups: list[KVCacheGroup], num_tokens: int, block_size: int) -> int:
    """Block ids one request of num_tokens holds between steps at most (each sliding group: the
    blocks a window can touch; a step's chunk may need more for the time of the step)."""
    full = -(-num_tokens // block_size)
    return sum(full if g.window is None else min(full, -(-(g.window - 1) // block_size) + 1) for g in groups)
