"""Throughput over time, rebuilt from per-request chunk times.

A content chunk may carry several tokens; we spread a request's output tokens
evenly over its chunks, which is exact for one-token chunks (the usual case)
and close otherwise. Used by the plot and for the peak-throughput figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kvserve.loadtests.bench.bench_request import RequestRecord


@dataclass(slots=True)
class Timeline:
    bin_starts: np.ndarray  # seconds from the benchmark start
    output_tokens_per_s: np.ndarray
    completed_per_s: np.ndarray
    running: np.ndarray  # requests in flight at each bin start

    @property
    def peak_output_tokens_per_s(self) -> float:
        return float(self.output_tokens_per_s.max()) if self.output_tokens_per_s.size else 0.0


def build_timeline(records: Sequence[RequestRecord], duration: float, bins: int = 60) -> Timeline:
    width = max(duration, 1e-9) / bins
    starts = np.arange(bins) * width
    tokens = np.zeros(bins)
    done = np.zeros(bins)
    running = np.zeros(bins)
    for r in records:
        if not r.success:
            continue
        times = np.asarray(r.chunk_times())
        if times.size:
            idx = np.clip((times / width).astype(int), 0, bins - 1)
            np.add.at(tokens, idx, r.output_tokens / times.size)
        end = r.start + r.e2el
        done[min(int(end / width), bins - 1)] += 1
        running += (starts >= r.start) & (starts < end)
    return Timeline(starts, tokens / width, done / width, running)
