"""Benchmark metrics, defined as vllm bench serve defines them.

- TTFT, E2EL: per successful request.
- TPOT: (E2EL - TTFT) / (output_tokens - 1), only for requests with more than
  one output token (a single token has no decode phase).
- ITL: every gap between content chunks, pooled over all requests.
- Throughputs divide by the wall-clock duration of the whole run; token totals
  count successful requests only.
- Goodput: successful requests per second that meet every given SLO
  (value <= SLO). For the TPOT SLO a one-token request counts as TPOT 0.
Latencies are reported in milliseconds; empty series report 0, not NaN, so
the JSON stays valid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from kvserve.loadtests.bench.bench_request import RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--goodput takes NAME:MS with NAME in {'/'.join(SLO_METRICS)}, got {item!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {name}: {value!r} is not a number of milliseconds") from None
        if ms < 0:
            raise ValueError(f"--goodput {name}: SLO must be >= 0 ms, got {ms}")
        slos[name] = ms
    return slos


def parse_percentiles(text: str) -> tuple[float, ...]:
    values = tuple(float(p) for p in text.split(",") if p.strip())
    if not values or any(not 0 < p <= 100 for p in values):
        raise ValueError(f"--metric-percentiles takes values in (0, 100], got {text!r}")
    return values


def percentile_key(p: float) -> str:
    return f"p{int(p)}" if float(p).is_integer() else f"p{p:g}"


@dataclass(slots=True)
class Distribution:
    """Summary of one latency series, in milliseconds."""

    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    percentiles: dict[str, float] = field(default_factory=dict)
    count: int = 0


def summarize(seconds: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Distribution:
    if len(seconds) == 0:
        return Distribution(percentiles={percentile_key(p): 0.0 for p in percentiles})
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    # numpy's default ("linear") interpolation between closest ranks, as vLLM.
    return Distribution(
        mean=float(ms.mean()),
        median=float(np.median(ms)),
        std=float(ms.std()),
        percentiles={percentile_key(p): float(np.percentile(ms, p)) for p in percentiles},
        count=int(ms.size),
    )


def slo_values(record: RequestRecord) -> dict[str, float]:
    """The values an SLO is checked against, in milliseconds."""
    return {
        "ttft": record.ttft * 1000.0,
        "tpot": (record.tpot() or 0.0) * 1000.0,
        "e2el": record.e2el * 1000.0,
    }


def meets_slos(record: RequestRecord, slos: dict[str, float]) -> bool:
    if not record.success:
        return False
    values = slo_values(record)
    return all(values[name] <= limit for name, limit in slos.items())


@dataclass(slots=True)
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    duration: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None  # None when no SLO was given
    good_requests: int | None
    latencies: dict[str, Distribution]
    max_concurrent_requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """Flat keys in vLLM's naming: mean_ttft_ms, p99_itl_ms, ..."""
        out: dict[str, object] = {
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "duration": self.duration,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "good_requests": self.good_requests,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name, dist in self.latencies.items():
            out[f"mean_{name}_ms"] = dist.mean
            out[f"median_{name}_ms"] = dist.median
            out[f"std_{name}_ms"] = dist.std
            for key, value in dist.percentiles.items():
                out[f"{key}_{name}_ms"] = value
        out["errors"] = dict(self.errors)
        return out


def _error_counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.success:
            key = r.error[:200] or "unknown error"
            counts[key] = counts.get(key, 0) + 1
    return counts


def compute_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slos: dict[str, float] | None = None,
    max_concurrent: int = 0,
) -> BenchmarkMetrics:
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    tpots = [t for t in (r.tpot() for r in ok) if t is not None]
    latencies = {
        "ttft": summarize([r.ttft for r in ok], percentiles),
        "tpot": summarize(tpots, percentiles),
        "itl": summarize([gap for r in ok for gap in r.itl], percentiles),
        "e2el": summarize([r.e2el for r in ok], percentiles),
    }
    good = sum(meets_slos(r, slos) for r in ok) if slos else None
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(records) - len(ok),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        duration=duration,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        request_goodput=per_s(good) if good is not None else None,
        good_requests=good,
        latencies=latencies,
        max_concurrent_requests=max_concurrent,
        errors=_error_counts(records),
    )
