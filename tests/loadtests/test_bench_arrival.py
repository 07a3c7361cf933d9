"""Request pacing: gamma inter-arrivals with a fixed seed."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kvserve.loadtests.bench.arrival import inter_arrival_gaps, paced, send_offsets


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_right_mean_and_spread(burstiness):
    gaps = inter_arrival_gaps(20_000, rate=10.0, burstiness=burstiness, rng=np.random.default_rng(7))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)  # mean stays 1/rate whatever k
    # gamma CV is 1/sqrt(k): 1 for Poisson, larger when bursty, smaller when steady
    assert _cv(gaps) == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_poisson_counts_per_second_look_poisson():
    offsets = send_offsets(30_000, rate=20.0, burstiness=1.0, seed=3)
    counts = np.bincount(offsets.astype(int))[:-1]  # drop the partial last second
    # a Poisson process has variance == mean in its per-interval counts
    assert counts.mean() == pytest.approx(20, rel=0.03)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)


def test_offsets_are_seeded_and_start_at_zero():
    a = send_offsets(100, 5.0, 1.0, seed=1)
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0)
    assert np.array_equal(a, send_offsets(100, 5.0, 1.0, seed=1))
    assert not np.array_equal(a, send_offsets(100, 5.0, 1.0, seed=2))


def test_infinite_rate_sends_everything_at_once():
    assert not send_offsets(50, float("inf"), 1.0, seed=0).any()


def test_invalid_rates_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="burstiness"):
        inter_arrival_gaps(3, 1.0, 0.0, rng)
    with pytest.raises(ValueError, match="request-rate"):
        inter_arrival_gaps(3, -1.0, 1.0, rng)


def test_paced_yields_on_schedule():
    async def go() -> list[float]:
        start = time.perf_counter()
        return [time.perf_counter() - start async for _ in paced([1, 2, 3], np.array([0.0, 0.05, 0.1]), start)]

    times = asyncio.run(go())
    assert times[0] < 0.03
    assert times[1] >= 0.05 and times[2] >= 0.1
    assert times[2] < 0.3  # no accumulated drift beyond scheduler noise
