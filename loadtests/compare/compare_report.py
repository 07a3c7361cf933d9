"""The `--compare` table and its JSON document.

One row per baseline: duration, output and total tokens/s, TTFT p50/p99 (all
requests arrive at t = 0, so TTFT includes queueing), then the output-token
throughput ratios. Every row's metrics come from `compute_metrics`, the same
function the serving benchmark uses, so the JSON has the same flat vLLM key
names per baseline (`output_throughput`, `p99_ttft_ms`, ...).
"""
from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Sequence

from kvserve.loadtests.compare.compare_result import BaselineRun
from kvserve.loadtests.compare.compare_run import agreements, ratios
from kvserve.loadtests.bench.bench_metrics import BenchmarkMetrics
from kvserve.loadtests.bench.report import _jsonable, request_details

WIDTH = 96
# What TTFT means in each row, for the JSON reader.
TTFT_NOTES = {
    "a": "start of the run -> first token; requests served one at a time in arrival order",
    "b": "start of the run -> first token, shared by a whole batch after its prefill and all earlier batches",
    "c": "start of the run -> first engine step that returned a token for the request",
    "d": "send -> first SSE chunk with text, measured by the streaming client",
}


def _fmt(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def _row(label: str, m: BenchmarkMetrics) -> str:
    ttft = m.latencies["ttft"].percentiles
    return (f"{label:<44}{_fmt(m.duration, 2):>9}{_fmt(m.output_throughput):>11}{_fmt(m.total_token_throughput):>11}"
            f"{_fmt(ttft.get('p50', 0.0), 0):>11}{_fmt(ttft.get('p99', 0.0), 0):>11}")


def _label(run: BaselineRun, request_rate: float) -> str:
    text = {"a": "(a) hf-serial, one at a time", "b": f"(b) hf-static, B={run.extra.get('batch_size')}",
            "c": "(c) kvserve-offline, LLM.generate",
            "d": f"(d) kvserve-serve, HTTP, rate {request_rate:g}"}[run.key]
    if run.key == "d" and run.extra.get("stream_interval", 1) != 1:
        text += f", interval {run.extra['stream_interval']}"
    if run.extrapolated:
        text += " [est.*]"
    return text


def format_compare(runs: Sequence[BaselineRun], header: Sequence[str], percentiles: Sequence[float],
                   request_rate: float) -> str:
    lines = [" kvserve bench --compare ".center(WIDTH, "="), *header]
    lines.append(f"{'baseline':<44}{'dur (s)':>9}{'out tok/s':>11}{'tot tok/s':>11}{'TTFT p50':>11}{'TTFT p99':>11}")
    lines.append(f"{'':<44}{'':>9}{'':>11}{'':>11}{'(ms)':>11}{'(ms)':>11}")
    outputs: dict[str, float] = {}
    for run in runs:
        m = run.metrics(percentiles)
        outputs[run.key] = m.output_throughput
        lines.append(_row(_label(run, request_rate), m))
        measured = run.measured_metrics(percentiles)
        if measured is not None:
            lines.append(_row(f"    measured: {run.measured_requests} of {len(run.records)} requests", measured))
        if m.failed:
            lines.append(f"    {m.failed} request(s) failed: {next(iter(m.errors), '')[:70]}")
    lines.append("-" * WIDTH)
    found = ratios(outputs)
    if found:
        lines.append("output tok/s ratios: " + "  ".join(
            f"({k.split('_over_')[0]})/({k.split('_over_')[1]}) {v:.2f}x" for k, v in found.items()))
    by_key = {r.key: r for r in runs}
    if "b" in by_key:
        x = by_key["b"].extra
        gen = int(x["generated_tokens_incl_waste"]) or 1
        lines.append(f"(b) generated {int(x['wasted_output_tokens']):,} tokens nobody asked for "
                     f"({100 * int(x['wasted_output_tokens']) / gen:.0f}% of its decode work) and padded "
                     f"{int(x['padded_prompt_tokens']):,} prompt tokens; they are not counted as output")
    for key, a in agreements(runs).items():
        lines.append(f"({key[0]}) greedy ids identical to (a) for {a['identical_requests']}/{a['requests_compared']} "
                     f"requests ({100 * float(a['prefix_token_match']):.1f}% of tokens before any divergence)")
    repeats = by_key["d"].extra.get("repeats") if "d" in by_key else None
    if repeats:
        pair_ratios = [float(r["d_over_c"]) for r in repeats]  # type: ignore[index,union-attr]
        lines.append(f"(d)/(c) in {len(pair_ratios)} alternating pairs: "
                     f"{' '.join(f'{x:.2f}' for x in pair_ratios)}; median {statistics.median(pair_ratios):.2f}x "
                     f"(the rows above are pair {by_key['d'].extra['repeats_shown_pair']})")
    for run in runs:
        if run.extrapolated:
            err = float(run.extra.get("fit_duration_error", 0.0))
            lines.append(f"* ({run.key}) measured {run.measured_requests} of {len(run.records)} requests; its row replays "
                         f"all of them on a service-time model fitted to those (fit error {100 * err:+.1f}% on the subset)")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def run_document(run: BaselineRun, percentiles: Sequence[float], detailed: bool) -> dict[str, Any]:
    m = run.metrics(percentiles)
    doc: dict[str, Any] = {
        "key": run.key, "name": run.name, "label": run.label,
        "num_requests": len(run.records), "measured_requests": run.measured_requests,
        "extrapolated": run.extrapolated, "ttft_definition": TTFT_NOTES[run.key],
        **m.to_dict(), **run.extra,
    }
    measured = run.measured_metrics(percentiles)
    if measured is not None:
        doc["measured_subset"] = measured.to_dict()
        if detailed and run.measured_records is not None:
            doc["measured_subset"]["requests"] = request_details(run.measured_records)
    if detailed:
        doc["requests"] = request_details(run.records)
    return doc


def build_compare_document(runs: Sequence[BaselineRun], percentiles: Sequence[float], config: dict[str, Any],
                           dataset: dict[str, Any], workload: dict[str, Any], model: dict[str, Any],
                           detailed: bool = False) -> dict[str, Any]:
    docs = {run.key: run_document(run, percentiles, detailed) for run in runs}
    outputs = {k: float(d["output_throughput"]) for k, d in docs.items()}
    totals = {k: float(d["total_token_throughput"]) for k, d in docs.items()}
    return _jsonable({
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "model": model,
        "workload": workload,
        "baselines": docs,
        "ratios": ratios(outputs),  # output tokens/s
        "total_token_ratios": ratios(totals),
        "greedy_agreement": agreements(runs),
        "config": config,
        "dataset": dataset,
    })
