"""The peer harness's results: one record per (server, client, workload), the
ratios kvserve / vLLM and kvserve / llama.cpp, the printed table and the JSON.

Both clients write vLLM-style result JSON (same key names), so one reader
serves both. A ratio is kvserve's figure over the peer's, for every metric:
above 1 is better for throughput, below 1 is better for latencies.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

# (result key, label, higher is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("output_throughput", "output tok/s", True),
    ("median_tpot_ms", "TPOT median ms", False),
    ("median_ttft_ms", "TTFT median ms", False),
    ("p99_tpot_ms", "TPOT p99 ms", False),
)
PEERS: tuple[tuple[str, str], ...] = (("vllm", "kvserve / vLLM"), ("llama.cpp", "kvserve / llama.cpp"))


@dataclass(frozen=True, slots=True)
class RunRecord:
    server: str
    client: str
    workload: str  # Workload.key: name@cN
    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    metrics: Mapping[str, float]  # the METRICS keys that the result had
    result_file: str = ""
    error: str = ""  # why there are no figures (server did not start, client failed)
    warning: str = ""  # why the figures are not to be trusted; such a run is left out of the ratios


def read_result(path: Path) -> dict[str, Any]:
    """A result file of either client; raises ValueError when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read result {path}: {exc}") from exc
    if not isinstance(doc, dict) or "completed" not in doc or "output_throughput" not in doc:
        raise ValueError(f"{path} is not a bench result (no completed / output_throughput)")
    return doc


def record_from_result(server: str, client: str, workload: str, concurrency: int, num_prompts: int,
                       doc: Mapping[str, Any], result_file: str = "", output_len: int | None = None) -> RunRecord:
    """`output_len`: the tokens each request must return (the runs use --ignore-eos);
    a client that counted fewer lost part of the streams, and its figures are wrong.
    (vllm bench serve 0.32 does on llama-server when it is slow: the server then
    sends SSE comment lines as keep-alives, and the client's parser, which strips
    each read, stops finding event boundaries after one.)"""
    completed = int(doc.get("completed", 0))
    # vllm bench serve reports failed only in newer versions; what did not complete failed.
    failed = int(doc["failed"]) if "failed" in doc else max(num_prompts - completed, 0)
    metrics = {k: float(doc[k]) for k, _, _ in METRICS if isinstance(doc.get(k), (int, float))}
    warning = ""
    if output_len is not None and isinstance(doc.get("total_output_tokens"), int):
        expected = completed * output_len
        if doc["total_output_tokens"] < expected:
            warning = (f"the client counted {doc['total_output_tokens']} output tokens of {expected}: "
                       "it lost stream chunks, so these figures are left out")
    return RunRecord(server, client, workload, concurrency, num_prompts, completed, failed, metrics, result_file,
                     warning=warning)


def failed_record(server: str, client: str, workload: str, concurrency: int, num_prompts: int,
                  error: str) -> RunRecord:
    return RunRecord(server, client, workload, concurrency, num_prompts, 0, num_prompts, {}, error=error)


def ratio(kv: float | None, peer: float | None) -> float | None:
    if kv is None or peer is None or peer == 0 or not math.isfinite(kv) or not math.isfinite(peer):
        return None
    return kv / peer


@dataclass(frozen=True, slots=True)
class RatioRow:
    workload: str
    client: str
    metric: str
    kvserve: float | None
    vllm: float | None
    llama: float | None
    kv_over_vllm: float | None
    kv_over_llama: float | None


def build_ratios(records: Iterable[RunRecord]) -> list[RatioRow]:
    """One row per (workload, client, metric), in the order the runs came.
    A run with failed requests still counts (its failures show in the table);
    a run with no figures leaves its cells empty."""
    by_key: dict[tuple[str, str, str], RunRecord] = {}
    order: list[tuple[str, str]] = []
    for r in records:
        if not r.warning:
            by_key[(r.workload, r.client, r.server)] = r
        if (r.workload, r.client) not in order:
            order.append((r.workload, r.client))
    rows = []
    for workload, client in order:
        def get(server: str, key: str) -> float | None:
            rec = by_key.get((workload, client, server))
            return None if rec is None else rec.metrics.get(key)

        for key, _, _ in METRICS:
            kv, vl, ll = get("kvserve", key), get("vllm", key), get("llama.cpp", key)
            rows.append(RatioRow(workload, client, key, kv, vl, ll, ratio(kv, vl), ratio(kv, ll)))
    return rows


def _num(x: float | None, width: int) -> str:
    if x is None:
        return f"{'-':>{width}}"
    return f"{x:>{width}.1f}" if abs(x) >= 10 else f"{x:>{width}.2f}"


def _ratio(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width - 1}.2f}x"


def format_table(records: Sequence[RunRecord]) -> str:
    """The one table: figures of each server and the two ratios, per workload and client,
    then a line per run that failed requests or gave no figures."""
    labels = {k: label for k, label, _ in METRICS}
    head = (f"{'workload':<26}{'client':<15}{'metric':<16}{'kvserve':>10}{'vLLM-CPU':>10}{'llama.cpp':>10}"
            f"{'kv/vLLM':>10}{'kv/llama':>10}")
    lines = [head, "-" * len(head)]
    last: tuple[str, str] | None = None
    for row in build_ratios(records):
        first = (row.workload, row.client) != last
        last = (row.workload, row.client)
        lines.append(f"{row.workload if first else '':<26}{row.client if first else '':<15}{labels[row.metric]:<16}"
                     f"{_num(row.kvserve, 10)}{_num(row.vllm, 10)}{_num(row.llama, 10)}"
                     f"{_ratio(row.kv_over_vllm, 10)}{_ratio(row.kv_over_llama, 10)}")
    notes = [r for r in records if r.failed or r.error or r.warning]
    if notes:
        lines.append("")
        for r in notes:
            why = f": {r.error or r.warning}" if r.error or r.warning else ""
            lines.append(f"{r.server} / {r.client} / {r.workload}: {r.failed} of {r.num_prompts} failed{why}")
    lines.append("ratios are kvserve / peer: above 1 is better for tok/s, below 1 is better for latencies")
    return "\n".join(lines)


def build_document(records: Sequence[RunRecord], config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "config": dict(config),
        "runs": [asdict(r) for r in records],
        "ratios": [asdict(r) for r in build_ratios(records)],
    }


def write_document(doc: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path
