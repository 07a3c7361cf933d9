"""When each request is sent.

Inter-arrival gaps are gamma distributed with shape k (`--burstiness`) and
mean 1/rate: k=1 is a Poisson process, k<1 burstier, k>1 more regular. This is
how vllm bench serve paces requests. We precompute absolute send offsets
rather than sleeping gap by gap, so scheduling jitter does not accumulate.
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import AsyncIterator, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def inter_arrival_gaps(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """n gaps in seconds; all zero for an infinite rate (everything at once)."""
    if burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if rate <= 0:
        raise ValueError(f"--request-rate must be > 0, got {rate}")
    if math.isinf(rate):
        return np.zeros(n)
    # Gamma(k, theta) has mean k*theta; theta = 1/(rate*k) keeps the mean at 1/rate.
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def send_offsets(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Offset of each send from the benchmark start; the first goes at 0."""
    gaps = inter_arrival_gaps(n, rate, burstiness, np.random.default_rng([seed, 101]))
    offsets = np.zeros(n)
    if n > 1:
        offsets[1:] = np.cumsum(gaps[: n - 1])
    return offsets


async def paced(items: Sequence[T], offsets: np.ndarray, start: float) -> AsyncIterator[T]:
    """Yields items at `start + offsets[i]` (perf_counter clock)."""
    for item, offset in zip(items, offsets):
        delay = start + float(offset) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield item
