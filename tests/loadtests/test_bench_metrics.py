"""Metric definitions on hand-made records, where the answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvserve.loadtests.bench.bench_request import RequestRecord
from kvserve.loadtests.bench.bench_metrics import (
    compute_metrics, meets_slos, parse_goodput, parse_percentiles, percentile_key, summarize,
)
from kvserve.loadtests.bench.timeline import build_timeline


def rec(i: int, ttft: float, e2el: float, out: int, itl: list[float] | None = None,
        ok: bool = True, prompt: int = 10, start: float = 0.0) -> RequestRecord:
    return RequestRecord(index=i, success=ok, error="" if ok else "boom", prompt_tokens=prompt,
                         output_tokens=out, ttft=ttft, e2el=e2el, itl=itl or [], start=start)


def test_percentiles_on_known_data():
    d = summarize([x / 1000 for x in range(1, 101)], (50, 90, 99, 99.9))  # 1..100 ms
    assert d.mean == pytest.approx(50.5) and d.median == pytest.approx(50.5)
    # linear interpolation between closest ranks
    assert d.percentiles == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "p99.9": 99.901})
    assert d.std == pytest.approx(np.std(np.arange(1, 101)))
    assert d.count == 100
    assert percentile_key(99.0) == "p99" and percentile_key(99.5) == "p99.5"


def test_empty_series_are_zero_not_nan():
    d = summarize([], (50, 99))
    assert (d.mean, d.median, d.std, d.count) == (0.0, 0.0, 0.0, 0)
    assert d.percentiles == {"p50": 0.0, "p99": 0.0}


def test_tpot_is_vllm_definition():
    r = rec(0, ttft=0.1, e2el=1.1, out=11)
    assert r.tpot() == pytest.approx(0.1)  # (1.1 - 0.1) / (11 - 1)
    assert rec(1, 0.1, 0.2, out=1).tpot() is None  # no decode phase
    assert rec(2, 0.1, 1.0, out=5, ok=False).tpot() is None


def test_goodput_counts_requests_meeting_every_slo():
    records = [
        rec(0, ttft=0.100, e2el=1.100, out=11),  # ttft 100, tpot 100, e2el 1100: good
        rec(1, ttft=0.300, e2el=0.500, out=3),   # ttft 300 > 200: bad
        rec(2, ttft=0.200, e2el=2.200, out=11),  # exactly at ttft SLO; tpot 200 > 150: bad
        rec(3, ttft=0.200, e2el=0.350, out=2),   # ttft == SLO (<= passes); tpot 150 == SLO: good
        rec(4, ttft=0.050, e2el=0.050, out=1),   # single token: TPOT counts as 0: good
        rec(5, ttft=0.010, e2el=0.020, out=3, ok=False),  # failed: never good
    ]
    slos = parse_goodput(["ttft:200", "tpot:150"])
    assert [meets_slos(r, slos) for r in records] == [True, False, False, True, True, False]
    m = compute_metrics(records, duration=2.0, slos=slos)
    assert m.good_requests == 3 and m.request_goodput == pytest.approx(1.5)
    # an E2EL SLO additionally removes request 0 (1100 ms > 1000 ms)
    m2 = compute_metrics(records, duration=2.0, slos=parse_goodput(["ttft:200", "tpot:150", "e2el:1000"]))
    assert m2.good_requests == 2
    assert compute_metrics(records, 2.0).request_goodput is None  # no SLO: no goodput


def test_throughputs_and_token_totals_count_successes_only():
    records = [rec(0, 0.1, 1.1, out=11, prompt=20, itl=[0.1] * 10),
               rec(1, 0.2, 0.6, out=5, prompt=30, itl=[0.05, 0.1, 0.1, 0.15]),
               rec(2, 0.0, 0.0, out=99, prompt=99, ok=False)]
    m = compute_metrics(records, duration=4.0, percentiles=(50, 99))
    assert (m.completed, m.failed) == (2, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (50, 16)
    assert m.request_throughput == pytest.approx(0.5)
    assert m.output_throughput == pytest.approx(4.0)
    assert m.total_token_throughput == pytest.approx(66 / 4)
    assert m.latencies["itl"].count == 14  # pooled over requests
    assert m.latencies["tpot"].mean == pytest.approx((100 + 100) / 2)  # (0.4/4, 1.0/10) s
    assert m.latencies["ttft"].mean == pytest.approx(150)
    assert m.errors == {"boom": 1}
    flat = m.to_dict()
    assert flat["p99_itl_ms"] == pytest.approx(np.percentile([100] * 10 + [50, 100, 100, 150], 99))


def test_parsers_reject_nonsense():
    with pytest.raises(ValueError, match="NAME:MS"):
        parse_goodput(["ttft=5"])
    with pytest.raises(ValueError, match="milliseconds"):
        parse_goodput(["tpot:fast"])
    with pytest.raises(ValueError, match=">= 0"):
        parse_goodput(["e2el:-1"])
    assert parse_percentiles("50, 90,99.9") == (50.0, 90.0, 99.9)
    with pytest.raises(ValueError):
        parse_percentiles("0,50")


def test_timeline_spreads_tokens_and_tracks_running():
    # two requests, 10 tokens each, first chunk at 0.5 s then 0.1 s apart
    records = [rec(i, ttft=0.5, e2el=1.5, out=10, itl=[0.1] * 9, start=0.0) for i in range(2)]
    tl = build_timeline(records, duration=2.0, bins=4)  # 0.5 s bins
    assert tl.output_tokens_per_s.sum() * 0.5 == pytest.approx(20)  # all tokens land somewhere
    assert tl.output_tokens_per_s[0] == 0.0  # nothing before the first token
    assert list(tl.running) == [2, 2, 2, 0]
    assert tl.completed_per_s.sum() * 0.5 == pytest.approx(2)
    assert tl.peak_output_tokens_per_s == pytest.approx(max(tl.output_tokens_per_s))
    assert not math.isnan(tl.peak_output_tokens_per_s)
