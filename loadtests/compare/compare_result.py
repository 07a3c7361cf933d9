"""What one compare baseline produces, in the serving benchmark's own terms.

Every baseline, offline or over HTTP, ends as one `RequestRecord` per request
(the record the HTTP client fills), so TTFT, TPOT, ITL, E2EL and throughput go
through the same `compute_metrics` and mean the same thing in every row. For
the offline baselines every request arrives at the start of the run (t = 0),
exactly like `--request-rate inf` over HTTP: TTFT therefore includes the time
a request waits behind others, which is what a user of that server would see.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from kvserve.loadtests.bench.bench_request import RequestRecord
from kvserve.loadtests.bench.bench_metrics import BenchmarkMetrics, compute_metrics


@dataclass(slots=True)
class BaselineRun:
    key: str  # "a" | "b" | "c" | "d"
    name: str  # hf-serial, hf-static, kvserve-offline, kvserve-serve
    label: str  # one line for the table
    records: list[RequestRecord]
    duration: float  # seconds, the whole run (estimated when `extrapolated`)
    measured_requests: int
    peak_concurrency: int = 0  # most requests in progress at once (a: 1, b: B, c: engine batch, d: on the wire)
    extrapolated: bool = False
    # Greedy output ids by request index (offline baselines), for agreement checks.
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)  # baseline-specific facts, into the JSON
    # For an extrapolated run: what was really measured on the subset.
    measured_records: list[RequestRecord] | None = None
    measured_duration: float | None = None

    def metrics(self, percentiles: Sequence[float]) -> BenchmarkMetrics:
        return compute_metrics(self.records, self.duration, percentiles, max_concurrent=self.peak_concurrency)

    def measured_metrics(self, percentiles: Sequence[float]) -> BenchmarkMetrics | None:
        if self.measured_records is None or self.measured_duration is None:
            return None
        return compute_metrics(self.measured_records, self.measured_duration, percentiles,
                               max_concurrent=self.peak_concurrency)


class TokenClock:
    """Wall-clock arrival of each output token, per request, from one run start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.times: dict[int, list[float]] = {}
        self.done: dict[int, float] = {}

    def tokens(self, index: int, count: int = 1, at: float | None = None) -> None:
        """`count` tokens of request `index` arrived at `at` (perf_counter; default now)."""
        t = (time.perf_counter() if at is None else at) - self.start
        self.times.setdefault(index, []).extend([t] * count)

    def token_times(self, index: int, absolute: Sequence[float]) -> None:
        self.times[index] = [t - self.start for t in absolute]

    def finish(self, index: int, at: float | None = None) -> None:
        self.done[index] = (time.perf_counter() if at is None else at) - self.start

    def record(self, index: int, prompt_tokens: int, output_tokens: int | None = None) -> RequestRecord:
        """The request as the HTTP client would have recorded it, arrival at t = 0."""
        times = self.times.get(index, [])
        if output_tokens is not None:
            times = times[:output_tokens]
        rec = RequestRecord(index=index, prompt_tokens=prompt_tokens, usage_reported=True, start=0.0)
        if not times:
            rec.error = "no output tokens"
            return rec
        rec.success = True
        rec.output_tokens = len(times)
        rec.ttft = times[0]
        rec.itl = [b - a for a, b in zip(times, times[1:])]
        rec.e2el = self.done.get(index, times[-1])
        return rec


def agreement(reference: dict[int, list[int]], other: dict[int, list[int]]) -> dict[str, object] | None:
    """How many requests both ran got identical greedy ids, and the share of
    matching tokens up to the first divergence. Random-weight models have
    near-ties, so float differences may flip a late token; a low score means a bug."""
    common = sorted(set(reference) & set(other))
    if not common:
        return None
    same = sum(reference[i] == other[i] for i in common)
    matched = total = 0
    for i in common:
        a, b = reference[i], other[i]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        matched += n
        total += len(a)
    return {"requests_compared": len(common), "identical_requests": same,
            "prefix_token_match": matched / total if total else 1.0}
