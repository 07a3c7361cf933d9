"""The result table printed at the end and the `--json` document.

The table mirrors vllm bench serve's layout so numbers can be read side by
side with a vLLM run; the JSON holds every metric (flat, vLLM key names) plus
the full configuration, so a result file alone says how it was produced.
"""
from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Sequence

from kvserve.loadtests.bench.bench_request import RequestRecord
from kvserve.loadtests.bench.bench_metrics import BenchmarkMetrics

WIDTH = 50
_TITLES = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def _row(label: str, value: object) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<40}{value!s:>10}"


def format_table(m: BenchmarkMetrics, max_concurrency: int | None, request_rate: float) -> str:
    lines = [" Serving Benchmark Result ".center(WIDTH, "=")]
    lines += [
        _row("Successful requests:", m.completed),
        _row("Failed requests:", m.failed),
        _row("Maximum request concurrency:", max_concurrency if max_concurrency else "None"),
        _row("Request rate (req/s):", "inf" if math.isinf(request_rate) else float(request_rate)),
        _row("Benchmark duration (s):", m.duration),
        _row("Total input tokens:", m.total_input_tokens),
        _row("Total generated tokens:", m.total_output_tokens),
        _row("Request throughput (req/s):", m.request_throughput),
    ]
    if m.request_goodput is not None:
        lines.append(_row("Request goodput (req/s):", m.request_goodput))
    lines += [
        _row("Output token throughput (tok/s):", m.output_throughput),
        _row("Total token throughput (tok/s):", m.total_token_throughput),
        _row("Peak concurrent requests:", m.max_concurrent_requests),
    ]
    for name, dist in m.latencies.items():
        title, short = _TITLES[name]
        lines.append(title.center(WIDTH, "-"))
        lines.append(_row(f"Mean {short} (ms):", dist.mean))
        lines.append(_row(f"Median {short} (ms):", dist.median))
        lines.append(_row(f"Std {short} (ms):", dist.std))
        for key, value in dist.percentiles.items():
            lines.append(_row(f"{key.upper()} {short} (ms):", value))
    lines.append("=" * WIDTH)
    if m.errors:
        lines.append("Errors (count: message):")
        lines += [f"  {count}: {msg}" for msg, count in sorted(m.errors.items(), key=lambda kv: -kv[1])[:5]]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    # JSON has no infinity; "inf" keeps --request-rate inf readable.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def request_details(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    return [
        {
            "index": r.index,
            "success": r.success,
            "error": r.error,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "start_s": r.start,
            "ttft_ms": r.ttft * 1000,
            "tpot_ms": (r.tpot() or 0.0) * 1000,
            "e2el_ms": r.e2el * 1000,
            "itl_ms": [g * 1000 for g in r.itl],
        }
        for r in records
    ]


def build_document(
    metrics: BenchmarkMetrics,
    config: dict[str, Any],
    dataset: dict[str, Any],
    extra: dict[str, Any] | None = None,
    records: Sequence[RequestRecord] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        **metrics.to_dict(),
        **(extra or {}),
        "config": config,
        "dataset": dataset,
    }
    if records is not None:
        doc["requests"] = request_details(records)
    return _jsonable(doc)


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out
