"""From a measured subset of the one-at-a-time baseline to the whole workload.

Serving 64 long-tailed requests one at a time through transformers takes
many minutes on a CPU, so baseline (a) runs only `--naive-max-requests` of
them. Its tokens/s on the subset alone would be biased by that subset's mix
of prompt and output lengths, and its TTFT would miss most of the queue (in a
one-at-a-time server the 64th request waits for the 63 before it). So we fit
a per-request service time to the subset,

    service(L, n) = prefill_fixed + prefill_per_token * L      (first token)
                    + decode_per_token * (n - 1)                (the rest)
                    + overhead                                  (return, next call)

and replay the full list in arrival order on that model. The result is
labelled an estimate everywhere it is shown; the subset's own measurements are
reported beside it, and the fit's error on the subset is in the JSON.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from kvserve.loadtests.bench.bench_request import RequestRecord
from kvserve.loadtests.compare.compare_prompts import CompareRequest


@dataclass(slots=True)
class ServiceSample:
    prompt_len: int
    output_len: int
    prefill_s: float  # request start (previous one returned) -> first token
    decode_s: float  # first token -> last token
    overhead_s: float  # last token -> generate() returned


@dataclass(slots=True)
class ServiceModel:
    prefill_fixed_s: float
    prefill_per_token_s: float
    decode_per_token_s: float
    overhead_s: float

    def prefill(self, prompt_len: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * prompt_len

    def service(self, prompt_len: int, output_len: int) -> float:
        return self.prefill(prompt_len) + self.decode_per_token_s * max(output_len - 1, 0) + self.overhead_s

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def fit_service_model(samples: Sequence[ServiceSample]) -> ServiceModel:
    if not samples:
        raise ValueError("no measured requests to extrapolate from")
    lens = np.array([s.prompt_len for s in samples], dtype=np.float64)
    prefill = np.array([s.prefill_s for s in samples])
    fixed, per_token = 0.0, float(prefill.sum() / lens.sum())
    if len(set(lens.tolist())) >= 2:
        slope, intercept = np.polyfit(lens, prefill, 1)
        # A noisy shared CPU can tilt a line through few points below zero; a
        # negative cost is not physical, so fall back to the plain mean rate.
        if slope >= 0 and intercept >= 0:
            fixed, per_token = float(intercept), float(slope)
    decode_tokens = sum(max(s.output_len - 1, 0) for s in samples)
    decode = sum(s.decode_s for s in samples) / decode_tokens if decode_tokens else 0.0
    overhead = float(np.mean([s.overhead_s for s in samples]))
    return ServiceModel(fixed, per_token, decode, overhead)


def replay_serial(requests: Sequence[CompareRequest], model: ServiceModel) -> tuple[list[RequestRecord], float]:
    """Records for every request served one at a time in arrival order, all
    arriving at t = 0, with token times spaced by the fitted decode time."""
    records: list[RequestRecord] = []
    clock = 0.0
    for r in requests:
        first = clock + model.prefill(r.prompt_len)
        service = model.service(r.prompt_len, r.output_len)
        records.append(RequestRecord(
            index=r.index, success=True, prompt_tokens=r.prompt_len, output_tokens=r.output_len,
            usage_reported=True, start=0.0, ttft=first,
            itl=[model.decode_per_token_s] * max(r.output_len - 1, 0), e2el=clock + service,
        ))
        clock += service
    return records, clock


def subset_indices(n: int, k: int) -> list[int]:
    """k positions spread evenly over n (all when k <= 0 or k >= n): an even
    spread of a randomly ordered dataset keeps the subset's lengths representative."""
    if k <= 0 or k >= n:
        return list(range(n))
    return sorted(set(int(round(x)) for x in np.linspace(0, n - 1, k)))
